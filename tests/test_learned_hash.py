"""LHA (learned_hash) against its paper and its authors' code: the utility target against an exact
float64 computation, the bucket rule against an independent re-implementation of the authors' rule,
the LayerNorm'd output against a float64 reference, coverage at initialisation, feature draws."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attention_zoo
from attention_zoo.learned_hash import one_hot_members, utility_targets
from attention_zoo.performer import orthogonal_gaussian_features


def qkv(batch=2, heads=2, n=40, d=16, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(batch, heads, n, d, generator=g, dtype=torch.float64).float() for _ in range(3)]


def build(n, d=16, heads=2, seed=0, **options):
    torch.manual_seed(seed)
    return attention_zoo.build("learned_hash", num_heads=heads, head_dim=d, max_seq_len=n, **options).eval()


def padded(n, cut=9):
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n - cut:] = False
    return mask


def layer_norm64(x):
    x = x.double()
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.square().mean(-1, keepdim=True) + 1e-6)


def softmax64(q, k, v, mask):
    scores = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), -1) @ v.double()


def assert_real_rows_close(out, expected, mask, **tolerance):
    rows = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[rows], expected[rows], **tolerance)


# --- the authors' rule, re-implemented independently in NumPy (lha_attention.py, mixed_attention.py) ---

def authors_padded_length(n: int, buckets: int, local_block_size: int = 0) -> int:
    """mixed_attention.py: chunk_len = (n − 1) // buckets + 1 is the local block size unless one is given; the
    input is padded by extra_len = max(what makes n a multiple of the block, buckets · block − n)."""
    block = local_block_size or (n - 1) // buckets + 1
    extra = max(block - ((n - 1) % block + 1), buckets * block - n)
    return n + extra


def authors_members(score: np.ndarray, mask: np.ndarray, buckets: int, local_block_size: int = 0) -> np.ndarray:
    """score [B, H, n, buckets] → members [B, H, buckets, k]: softmax over buckets, padded tokens
    pushed down by 1e10, the top int((P // buckets) · 2 ** 0.5) tokens of each bucket (lha_attention.py on
    the padded length P; the positions past n are padding, ranked after every real token: not needed
    while k ≤ n)."""
    n = score.shape[2]
    chunk = int((authors_padded_length(n, buckets, local_block_size) // buckets) * 2 ** 0.5)
    assert chunk <= n
    exp = np.exp(score - score.max(-1, keepdims=True))
    prob = np.swapaxes(exp / exp.sum(-1, keepdims=True), -1, -2)  # [B, H, buckets, n]
    prob = prob + np.where(mask[:, None, None, :], 0.0, -1e10)
    return np.argsort(-prob, axis=-1, kind="stable")[..., :chunk]


def authors_scores(x: np.ndarray, heads: int, buckets: int, rng: np.random.Generator, side: int) -> np.ndarray:
    """Scores of the authors' linear scorer at initialisation: x · (0.9 W + 0.1 W_side), both kernels
    truncated-normal LeCun with JAX's fan-in of a [heads, d, buckets] kernel (heads · d)."""
    d = x.shape[-1]
    std = 1 / math.sqrt(heads * d) / 0.87962566103423978

    def kernel():
        w = rng.standard_normal((heads, d, buckets))
        while (bad := np.abs(w) > 2).any():
            w[bad] = rng.standard_normal(int(bad.sum()))
        return w * std

    shared, own = kernel(), [kernel(), kernel()][side]
    return np.einsum("bhnd,hdk->bhnk", x, 0.9 * shared + 0.1 * own)


def uncovered_share(members: np.ndarray, mask: np.ndarray) -> float:
    batch, heads = members.shape[:2]
    n = mask.shape[1]
    covered = np.zeros((batch, heads, n), dtype=bool)
    for b in range(batch):
        for h in range(heads):
            covered[b, h, members[b, h].ravel()] = True
    real = np.broadcast_to(mask[:, None, :], covered.shape)
    return float((~covered & real).sum() / real.sum())


# --- tests ---

def exact_targets(q, k, mask, query_member, key_member):
    attention = torch.softmax(((q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1]))
                              .masked_fill(~mask[:, None, None, :], float("-inf")), -1)
    utility_q = attention @ key_member.double().transpose(-1, -2)
    utility_k = (query_member.double() @ attention).transpose(-1, -2)
    return [u / u.sum(-1, keepdim=True) for u in (utility_q, utility_k)]


def mean_kl(target, estimate, mask):
    per_token = (target * (target.clamp(min=1e-300).log() - estimate.double().clamp(min=1e-300).log())).sum(-1)
    return per_token[mask[:, None, :].expand_as(per_token)].mean().item()


def test_the_utility_target_converges_to_the_exact_utility_as_features_grow():
    n, buckets, d = 256, 8, 32
    q, k, _ = qkv(n=n, d=d, scale=0.25)
    mask = padded(n, cut=56)
    _, _, query_index, key_index = build(n, d=d, num_buckets=buckets).memberships(q, k, mask)
    real = mask[:, None, None, :].float()
    query_member, key_member = one_hot_members(query_index, n) * real, one_hot_members(key_index, n) * real
    exact_q, exact_k = exact_targets(q, k, mask, query_member, key_member)
    kl = {}
    for features in (64, 1024, 16384):
        draws = []
        for seed in range(3):
            torch.manual_seed(seed)
            estimate_q, estimate_k = utility_targets(q, k, mask, query_member, key_member,
                                                     orthogonal_gaussian_features(features, d))
            draws.append((mean_kl(exact_q, estimate_q, mask), mean_kl(exact_k, estimate_k, mask)))
        kl[features] = np.mean(draws, axis=0)
    assert (kl[64] > 5 * kl[1024]).all() and (kl[1024] > 5 * kl[16384]).all(), kl  # ∝ 1/r: no bias floor
    assert (kl[16384] < 1e-5).all(), kl


def test_padded_tokens_get_no_utility_and_change_no_real_target():
    n, d = 32, 8
    q, k, _ = qkv(n=n, d=d)
    mask = padded(n, cut=10)
    members = torch.zeros(2, 2, 4, n)
    members[..., torch.arange(n) % 4, torch.arange(n)] = 1.0
    members = members * mask[:, None, None, :]
    features = orthogonal_gaussian_features(64, d)
    target_q, target_k = utility_targets(q, k, mask, members, members, features)
    assert torch.equal(target_q[1, :, n - 10:], torch.zeros_like(target_q[1, :, n - 10:]))
    k_garbage = k.clone()
    k_garbage[1, :, n - 10:] = 1e4  # huge padded keys: not in the stabiliser, not in Ẑ
    again_q, again_k = utility_targets(q, k_garbage, mask, members, members, features)
    torch.testing.assert_close(again_q, target_q)
    torch.testing.assert_close(again_k, target_k)
    assert torch.isfinite(target_q).all() and torch.isfinite(target_k).all()


@pytest.mark.parametrize("n, buckets, block, size", [(50, 4, 0, 18), (64, 8, 0, 11), (77, 5, 0, 22), (37, 4, 16, 22),
                                                    (37, 4, 5, 14)])
def test_buckets_follow_the_authors_rule(n, buckets, block, size):
    """The bucket size on the authors' padded length: 18 at n = 50, B = 4 (⌊⌈50/4⌉·√2⌋; ⌊⌊50/4⌋·√2⌋ is 16,
    ⌊√2·50/4⌋ 17); with a local block size of 16, n = 37 pads to 4 · 16 = 64 (⌊16·√2⌋ = 22), of 5 to 40."""
    q, k, _ = qkv(n=n, d=16, scale=2.0)
    mask = padded(n, cut=13)
    attn = build(n, d=16, num_buckets=buckets, local_block_size=block)
    score_q, score_k, query_index, key_index = attn.memberships(q, k, mask)
    assert query_index.shape[-1] == size
    for score, index in ((score_q, query_index), (score_k, key_index)):
        expected = authors_members(score.detach().double().numpy(), mask.numpy(), buckets, block)
        assert np.array_equal(np.sort(index.numpy(), -1), np.sort(expected, -1))


def test_membership_ranks_the_softmax_over_buckets_not_the_raw_score():
    n, buckets = 64, 8
    q, k, _ = qkv(n=n, d=16, scale=2.0)
    mask = torch.ones(2, n, dtype=torch.bool)
    softmax_rule = build(n, num_buckets=buckets).memberships(q, k, mask)[2]
    raw_rule = build(n, num_buckets=buckets, membership="raw").memberships(q, k, mask)
    score_q = raw_rule[0].detach()
    assert torch.equal(raw_rule[2], score_q.transpose(-1, -2).topk(raw_rule[2].shape[-1], dim=-1).indices)
    assert not torch.equal(softmax_rule.sort(-1).values, raw_rule[2].sort(-1).values)


def test_the_scorers_are_the_authors_mixed_linear_kernels_without_bias():
    attn = build(32, d=16, num_buckets=4)
    scorers = attn.scorers
    assert all("bias" not in name for name, _ in scorers.named_parameters())
    q, k, _ = qkv(n=32, d=16)
    score_q, score_k = scorers(q, k)
    shared, own_q, own_k = scorers.shared[0], scorers.query[0], scorers.key[0]
    torch.testing.assert_close(score_q, torch.einsum("bhnd,hdk->bhnk", q, 0.9 * shared + 0.1 * own_q))
    torch.testing.assert_close(score_k, torch.einsum("bhnd,hdk->bhnk", k, 0.9 * shared + 0.1 * own_k))


@pytest.mark.parametrize("buckets", [8, 32])
def test_uncovered_queries_at_initialisation_are_as_few_as_with_the_authors_rule(buckets):
    n, d, heads = 256, 32, 2
    ours, authors, raw = [], [], []
    for seed in range(4):
        q, k, _ = qkv(n=n, d=d, heads=heads, seed=seed)
        mask = torch.ones(2, n, dtype=torch.bool)
        ours.append(uncovered_share(build(n, d=d, seed=seed, num_buckets=buckets).memberships(q, k, mask)[2].numpy(),
                                    mask.numpy()))
        raw.append(uncovered_share(build(n, d=d, seed=seed, num_buckets=buckets, membership="raw")
                                   .memberships(q, k, mask)[2].numpy(), mask.numpy()))
        scores = authors_scores(q.double().numpy(), heads, buckets, np.random.default_rng(seed), side=0)
        authors.append(uncovered_share(authors_members(scores, mask.numpy(), buckets), mask.numpy()))
    assert abs(np.mean(ours) - np.mean(authors)) < 0.03, (np.mean(ours), np.mean(authors))
    assert np.mean(raw) > np.mean(ours) + 0.05, (np.mean(raw), np.mean(ours))  # what raw-score ranking lost


def test_output_is_bucket_attention_on_layer_normed_q_and_k():
    n, buckets = 48, 4
    q, k, v = qkv(n=n, d=16, scale=2.0)  # q, k ~ N(0, 4): LayerNorm changes the scores a lot
    mask = padded(n, cut=11)
    attn = build(n, num_buckets=buckets)
    out = attn(q, k, v, mask)
    _, _, query_index, key_index = attn.memberships(q, k, mask)
    shared = one_hot_members(query_index, n).transpose(-1, -2).double() @ one_hot_members(key_index, n).double()
    shared = shared * mask[:, None, None, :]  # C_ij: buckets holding query i and real key j
    scores = (layer_norm64(q) @ layer_norm64(k).transpose(-1, -2)) / 4.0
    weights = shared * torch.exp(scores - scores.amax(-1, keepdim=True))
    seen = mask[:, None, :] & (shared.sum(-1) > 0)
    expected = (weights @ v.double()) / weights.sum(-1, keepdim=True).clamp(min=1e-300)
    assert seen.sum() > 50
    torch.testing.assert_close(out.double()[seen], expected[seen], rtol=1e-5, atol=1e-5)
    unnormalised = build(n, num_buckets=buckets, normalize_qk=False)(q, k, v, mask)
    assert (unnormalised - out)[seen].norm() > 0.1 * out[seen].norm()


@pytest.mark.parametrize("hidden", [0, 16])
def test_one_bucket_is_softmax_of_the_layer_normed_q_and_k(hidden):
    n = 26
    q, k, v = qkv(n=n)
    mask = padded(n)
    out = build(n, num_buckets=1, hidden_dim=hidden)(q, k, v, mask)
    assert_real_rows_close(out, softmax64(layer_norm64(q), layer_norm64(k), v, mask), mask, rtol=1e-5, atol=1e-5)
    plain = build(n, num_buckets=1, hidden_dim=hidden, normalize_qk=False)(q, k, v, mask)
    assert_real_rows_close(plain, softmax64(q, k, v, mask), mask, rtol=1e-5, atol=1e-5)


def test_buckets_are_balanced_top_k_and_match_the_attended_key_sets():
    n = 64
    q, k, v = qkv(n=n)
    mask = torch.ones(2, n, dtype=torch.bool)
    attn = build(n, num_buckets=8)
    _, _, query_index, key_index = attn.memberships(q, k, mask)
    assert query_index.shape[-1] == key_index.shape[-1] == int(2**0.5 * (n // 8))  # sqrt(2) enlargement (8 | n)
    keys = attn.attended_keys(q, k, mask)
    # Within-bucket softmax merged by log-sum-exp = softmax over the union of the query's buckets,
    # when no key is shared by two of those buckets; check on queries for which that holds.
    out = attn(q, k, v, mask).double()
    scores = ((layer_norm64(q) @ layer_norm64(k).transpose(-1, -2)) / 4.0).masked_fill(~keys, float("-inf"))
    dense = torch.softmax(scores, -1) @ v.double()
    in_q = torch.zeros(2, 2, 8, n).scatter_(-1, query_index, 1.0)
    in_k = torch.zeros(2, 2, 8, n).scatter_(-1, key_index, 1.0)
    overlap = (in_q.transpose(-1, -2) @ in_k)  # buckets a query shares with each key
    single = (overlap <= 1).all(-1) & keys.any(-1)
    assert single.sum() > 20
    torch.testing.assert_close(out[single], dense[single], rtol=1e-5, atol=1e-5)
    unbucketed = ~keys.any(-1)
    assert torch.equal(out[unbucketed], torch.zeros_like(out[unbucketed]))


def test_aux_loss_trains_only_the_scorers_and_falls():
    n = 64
    q, k, v = qkv(n=n)
    attn = build(n, num_buckets=4).train()
    q.requires_grad_()
    optimizer = torch.optim.Adam(attn.parameters(), lr=0.01)
    losses = []
    for _ in range(60):
        attn(q, k, v, None)
        losses.append(attn.aux_loss.item())
        optimizer.zero_grad()
        attn.aux_loss.backward()
        optimizer.step()
    assert q.grad is None, "the hash loss must not reach q (stop-gradient)"
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


def test_features_are_redrawn_every_training_step_from_the_seeded_generator():
    n = 32
    q, k, v = qkv(n=n)
    attn = build(n, num_buckets=4).train()

    def features_of_three_steps(seed):
        torch.manual_seed(seed)
        return [attn.utility_features(q.device) for _ in range(3)]

    first, again = features_of_three_steps(5), features_of_three_steps(5)
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # reproducible
    assert not torch.equal(first[0], first[1]) and first[0].shape == (256, 16)
    assert torch.equal(attn.eval().utility_features(q.device), attn.features)  # evaluation: the fixed draw
    fixed = build(n, num_buckets=4, feature_draws="fixed").train()
    assert torch.equal(fixed.utility_features(q.device), fixed.features)


def test_sliding_local_heads_are_sliding_window_attention():
    n = 30
    q, k, v = qkv(n=n)
    mask = padded(n)
    attn = build(n, num_buckets=1, local_heads=1, local_pattern="sliding", local_window=8)
    out = attn(q, k, v, mask)
    torch.manual_seed(0)
    local = attention_zoo.build("longformer", num_heads=1, head_dim=16, max_seq_len=n, window_size=8,
                                num_global_tokens=0)(q[:, :1], k[:, :1], v[:, :1], mask)
    assert_real_rows_close(out[:, :1], local.double(), mask, rtol=1e-6, atol=1e-6)
    assert_real_rows_close(out[:, 1:], softmax64(layer_norm64(q[:, 1:]), layer_norm64(k[:, 1:]), v[:, 1:], mask), mask,
                           rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("options, field", [({"membership": "argmax"}, "membership"),
                                            ({"feature_draws": "never"}, "feature_draws"),
                                            ({"own_kernel_share": 1.5}, "own_kernel_share"),
                                            ({"normalize_qk": "yes"}, "normalize_qk")])
def test_invalid_options_are_refused(options, field):
    with pytest.raises(attention_zoo.options.InvalidOption, match=field):
        attention_zoo.make_options("learned_hash", **options)


def test_layer_norm_reference_matches_torch():
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(layer_norm64(x), F.layer_norm(x, (16,), eps=1e-6))


def authors_local_attention(query, key, value, padding_mask, block_size):
    """local_attention.py of the authors (non-causal, no relative positions), in float64 numpy as written there:
    query, key, value [bs, length, heads, d] already padded to a multiple of block_size, padding_mask [bs, length]
    bool; the −1e10 bias added in float32, as their dtype=jnp.float32 call adds it."""
    bs, length, heads, d = query.shape
    n_blocks = length // block_size
    query = query.reshape(bs, n_blocks, block_size, heads, d) * d ** -0.5

    def break_into_memory_blocks(x):
        x = x.reshape(x.shape[0], n_blocks, block_size, x.shape[-2], x.shape[-1])
        before = np.concatenate([x[:, -1:], x[:, :-1]], axis=1)
        after = np.concatenate([x[:, 1:], x[:, :1]], axis=1)
        return np.concatenate([x, before, after], axis=2)

    key, value = break_into_memory_blocks(key), break_into_memory_blocks(value)
    scores = np.einsum("bknhd,bkmhd->bknhm", query, key)
    bias = np.where(padding_mask, 0.0, -1e10).astype(np.float32).reshape(bs, -1, 1, 1)
    bias = break_into_memory_blocks(bias).reshape(bs, n_blocks, 1, 1, -1)
    scores = np.where(bias < 0, (scores.astype(np.float32) + bias).astype(np.float64), scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return np.einsum("bknhm,bkmhd->bknhd", weights, value).reshape(bs, length, heads, d)


@pytest.mark.parametrize("n, buckets, block", [(30, 4, 0), (37, 4, 5), (10, 2, 0), (23, 1, 7), (9, 1, 12), (33, 32, 0)])
def test_block_local_heads_are_the_authors_local_attention(n, buckets, block):
    """The default local heads against the authors' local_attention.py, ported: on their padded length, blocks
    of ⌈n/B⌉ (30, 4: 8 blocks of 8 → 32), a given block size (37, 4, 5: 40), two blocks, so the other one is
    both before and after and counts twice (10, 2), four blocks with one bucket (23, 1, 7: 28), a single
    block, listed three times (9, 1, 12), and 32 blocks of 2 of which the last 15 hold only padding (33, 32:
    block 0's "before" is one of them)."""
    q, k, v = (x.double() for x in qkv(n=n, heads=3))
    mask = padded(n, cut=9)
    mask[0, 3] = False  # a padded token inside
    attn = build(n, heads=3, num_buckets=buckets, local_heads=2, local_block_size=block).double()
    out = attn(q, k, v, mask)
    length = authors_padded_length(n, buckets, block)
    size = block or (n - 1) // buckets + 1

    def padded_rows(x):  # [B, H, n, d] → [bs, length, heads, d], zeros past n
        return np.pad(x.transpose(1, 2).numpy(), [(0, 0), (0, length - n), (0, 0), (0, 0)])

    theirs = authors_local_attention(padded_rows(q[:, :2]), padded_rows(k[:, :2]), padded_rows(v[:, :2]),
                                     np.pad(mask.numpy(), [(0, 0), (0, length - n)]), size)[:, :n]
    rows = mask.numpy()
    np.testing.assert_allclose(out[:, :2].transpose(1, 2).detach().numpy()[rows], theirs[rows], rtol=1e-10, atol=1e-12)
    keys = attn.attended_keys(q.float(), k.float(), mask)[:, :2]
    blocks = length // size
    for i in range(n):
        near = [j for j in range(n) if (j // size - i // size) % blocks in (0, 1, blocks - 1)]
        assert keys[0, 0, i].nonzero().flatten().tolist() == [j for j in near if mask[0, j]]


def test_attention_dropout_is_unbiased_and_only_in_training():
    """dropout on the hashed and block-local heads' probabilities: none in evaluation; in training each call
    drops (it differs from evaluation) and the mean over draws is the evaluation output (inverted dropout, and
    the bucket merge is linear in the buckets' outputs)."""
    n = 24
    q, k, v = (x.double() for x in qkv(n=n))
    mask = padded(n, cut=5)
    attn = build(n, num_buckets=3, local_heads=1, dropout=0.3).double()
    expected = attn.eval()(q, k, v, mask)
    attn.train()
    torch.manual_seed(0)
    draws = torch.stack([attn(q, k, v, mask).detach() for _ in range(400)])
    rows = mask[:, None, :, None].expand_as(expected)
    for head in (0, 1):  # the local head, the hashed one
        drawn, exact = draws[:, :, head][:, rows[:, head]], expected[:, head][rows[:, head]]
        assert (drawn[0] - exact).abs().max() > 0.01
        spread = drawn.std(0) / math.sqrt(len(draws))
        assert ((drawn.mean(0) - exact).abs() <= 5 * spread + 1e-9).all()
    with pytest.raises(attention_zoo.options.InvalidOption, match="local_pattern=sliding"):
        attention_zoo.make_options("learned_hash", local_heads=1, local_pattern="sliding", dropout=0.1)
