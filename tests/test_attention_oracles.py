"""Limits in which an efficient backend must equal exact softmax attention (float64 reference)."""

import pytest
import torch

import attention_zoo


def qkv(batch=2, heads=2, n=40, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64).float() for _ in range(3)]


def softmax_reference(q, k, v, mask=None, self_mask=False, scale=None):
    q, k, v = q.double(), k.double(), v.double()
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    if self_mask:
        eye = torch.eye(q.shape[2], dtype=torch.bool)
        scores = scores.masked_fill(eye, -1e5)
    return torch.softmax(scores, dim=-1) @ v


def build(name, n, d=16, **options):
    torch.manual_seed(0)
    return attention_zoo.build(name, num_heads=2, head_dim=d, max_seq_len=n, **options).eval()


def padded(n=40):
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - 9 :] = False
    return mask


def assert_real_rows_close(out, expected, mask, **tolerance):
    rows = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[rows], expected[rows], **tolerance)


@pytest.mark.parametrize("n", [7, 40, 65])
def test_longformer_with_a_window_of_2n_is_softmax(n):
    q, k, v = qkv(n=n)
    mask = padded(n) if n > 9 else None
    out = build("longformer", n, window_size=2 * n)(q, k, v, mask)
    expected = softmax_reference(q, k, v, mask)
    assert_real_rows_close(out, expected, mask if mask is not None else torch.ones(2, n, dtype=torch.bool),
                           rtol=1e-5, atol=1e-5)


def test_longformer_matches_a_dense_band_mask():
    n, window = 50, 12
    q, k, v = qkv(n=n)
    mask = padded(n)
    out = build("longformer", n, window_size=window, num_global_tokens=2)(q, k, v, mask)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    band = ((i - j).abs() <= window // 2) | (i < 2) | (j < 2)
    scores = (q.double() @ k.double().transpose(-1, -2)) / 4.0
    scores = scores.masked_fill(~band, float("-inf")).masked_fill(~mask[:, None, None, :], float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v.double()
    assert_real_rows_close(out, expected, mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [16, 23])
def test_nystrom_with_n_landmarks_and_no_conv_is_softmax(n):
    q, k, v = qkv(n=n, d=16)
    q, k = q * 0.5, k * 0.5  # a well-conditioned A, so the iterative pinv converges in the budget
    out = build("nystrom", n, num_landmarks=n, conv_kernel_size=0, pinv_iterations=30)(q, k, v, None)
    torch.testing.assert_close(out.double(), softmax_reference(q, k, v), rtol=1e-4, atol=1e-4)


def test_nystrom_pinv_is_the_moore_penrose_inverse_per_matrix():
    from attention_zoo.nystrom import iterative_pinv

    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(3, 8, 8, generator=g, dtype=torch.float64), dim=-1)
    a[1] *= 1000  # a batch-wide initialisation would start the other matrices 10^6 too small
    torch.testing.assert_close(iterative_pinv(a, 12), torch.linalg.pinv(a), rtol=1e-6, atol=1e-6)


def test_nystrom_landmarks_ignore_padding_and_accept_any_n():
    n = 37  # not a multiple of the landmark count
    q, k, v = qkv(n=n)
    mask = padded(n)
    attn = build("nystrom", n, num_landmarks=8)
    out = attn(q, k, v, mask)
    # The padded example must equal the same example cut to its real length.
    short = attn(q[1:, :, : n - 9], k[1:, :, : n - 9], v[1:, :, : n - 9], None)
    torch.testing.assert_close(out[1:, :, : n - 9], short, rtol=1e-5, atol=1e-5)


def test_linformer_with_identity_projections_of_size_n_is_softmax():
    n = 24
    q, k, v = qkv(n=n)
    attn = build("linformer", n, proj_dim=n)
    with torch.no_grad():
        attn.key_projection.copy_(torch.eye(n))
        attn.value_projection.copy_(torch.eye(n))
    torch.testing.assert_close(attn(q, k, v, None).double(), softmax_reference(q, k, v), rtol=1e-5, atol=1e-5)


def test_linformer_shorter_inputs_use_the_first_columns_and_layers_can_share():
    attn = build("linformer", 64, proj_dim=8)
    q, k, v = qkv(n=20)
    keys = attn.key_projection[:, :20] @ k
    expected = torch.softmax(q @ keys.transpose(-1, -2) / 4.0, dim=-1) @ (attn.value_projection[:, :20] @ v)
    torch.testing.assert_close(attn(q, k, v, None), expected, rtol=1e-5, atol=1e-6)
    second = build("linformer", 64, proj_dim=8, share_across_layers=True)
    second.share_parameters_with(attn)
    assert second.key_projection is attn.key_projection
    separate = build("linformer", 64, proj_dim=8)
    separate.share_parameters_with(attn)
    assert separate.key_projection is not attn.key_projection


def test_performer_converges_to_softmax_as_features_grow():
    q, k, v = qkv(n=64, d=16)
    q, k = q * 0.5, k * 0.5
    exact = softmax_reference(q, k, v)

    def error(features):
        out = build("performer", 64, num_features=features)(q, k, v, None).double()
        return ((out - exact).norm() / exact.norm()).item()

    small, large = error(64), error(4096)
    assert large <= small / 4, (small, large)


def test_performer_redraws_features_only_when_asked_and_only_in_training():
    attn = build("performer", 16, num_features=32, redraw_interval=2).train()
    q, k, v = qkv(n=16)
    first = attn.features.clone()
    attn(q, k, v, None)
    attn(q, k, v, None)
    assert torch.equal(attn.features, first)
    attn(q, k, v, None)
    assert not torch.equal(attn.features, first)
    frozen = build("performer", 16, num_features=32).train()
    before = frozen.features.clone()
    for _ in range(3):
        frozen(q, k, v, None)
    assert torch.equal(frozen.features, before)


@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("score_scale", ["none", "sqrt_d"])
@pytest.mark.parametrize("n", [30, 100])
def test_reformer_with_one_bucket_is_shared_qk_softmax_with_the_self_mask(rounds, score_scale, n):
    """One bucket and one chunk per round: every round is shared-QK softmax over all tokens, logits
    q·k̂ (the reference) or q·k̂/√d; keys k̂ are the unit queries."""
    q, k, v = qkv(n=n)
    mask = padded(n)
    out = build("reformer", n, num_hashes=rounds, chunk_size=128, num_buckets=1, score_scale=score_scale)(q, k, v, mask)
    keys = torch.nn.functional.normalize(q, dim=-1)
    scale = 1.0 if score_scale == "none" else q.shape[-1] ** -0.5
    expected = softmax_reference(q, keys, v, mask, self_mask=True, scale=scale)
    assert_real_rows_close(out, expected, mask, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("before,after", [(1, 0), (1, 1), (0, 2)])
def test_reformer_chunks_attend_only_to_neighbouring_chunks(before, after):
    n = 64
    q, k, v = qkv(n=n)
    attn = build("reformer", n, num_hashes=1, chunk_size=8, num_buckets=1, chunks_before=before, chunks_after=after)
    out = attn(q, k, v, None)  # one bucket: the sorted order is the positions
    i, j = torch.arange(n)[:, None] // 8, torch.arange(n)[None, :] // 8
    near = torch.zeros(n, n, dtype=torch.bool)
    for offset in range(-before, after + 1):
        near |= (j - i) % 8 == offset % 8  # wrapping
    assert torch.equal(attn.attended_keys(q, k, torch.ones(2, n, dtype=torch.bool))[0, 0], near & ~torch.eye(n, dtype=torch.bool))
    keys = torch.nn.functional.normalize(q, dim=-1).double()
    scores = q.double() @ keys.transpose(-1, -2)
    scores = scores.masked_fill(torch.eye(n, dtype=torch.bool), -1e5).masked_fill(~near, float("-inf"))
    torch.testing.assert_close(out.double(), torch.softmax(scores, -1) @ v.double(), rtol=1e-5, atol=1e-5)


def test_lsh_with_one_bucket_is_softmax():
    n = 33
    q, k, v = qkv(n=n)
    mask = padded(n)
    out = build("lsh", n, num_buckets=1)(q, k, v, mask)
    assert_real_rows_close(out, softmax_reference(q, k, v, mask), mask, rtol=1e-5, atol=1e-5)


def test_lsh_chunks_are_balanced_and_match_the_attended_key_sets():
    n = 64
    q, k, v = qkv(n=n)
    mask = torch.ones(2, n, dtype=torch.bool)
    attn = build("lsh", n, num_buckets=8)
    keys = attn.attended_keys(q, k, mask)
    assert (keys.sum(-1) == 8).all(), "every query sees exactly n / buckets keys"
    scores = ((q.double() @ k.double().transpose(-1, -2)) / 4.0).masked_fill(~keys, float("-inf"))
    torch.testing.assert_close(attn(q, k, v, mask).double(), torch.softmax(scores, -1) @ v.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_lsh_with_padding_gives_every_real_query_real_keys(seed):
    """Padded queries used to sort among the real ones while padded keys went last, so real queries
    landing in the last chunks saw only padding and got a zero output (11 of 48 at seed 0)."""
    n, real = 64, 48 - 7 * seed
    torch.manual_seed(seed)
    attn = attention_zoo.build("lsh", num_heads=1, head_dim=16, max_seq_len=n, num_buckets=8).eval()
    q, k, v = (torch.randn(2, 1, n, 16) for _ in range(3))
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[0, real:] = False
    out = attn(q, k, v, mask)
    assert int((out[mask[:, None, :]].abs().sum(-1) == 0).sum()) == 0
    keys = attn.attended_keys(q, k, mask)
    assert keys[mask[:, None, :]].any(-1).all(), "every real query attends to at least one real key"
    scores = ((q.double() @ k.double().transpose(-1, -2)) / 4.0).masked_fill(~keys, float("-inf"))
    assert_real_rows_close(out, torch.softmax(scores, -1) @ v.double(), mask, rtol=1e-5, atol=1e-5)
