"""Differential tests: each backend against an independent implementation that the papers' code
used (the ``oracles`` extra: Hugging Face transformers, performer-pytorch, linformer,
nystrom-attention, with pinned versions). The reference module computes q, k, v with its own
projections; ours attends over the same q, k, v (weights, random features and hash rotations
copied across); outputs and the gradients with respect to the input must agree to float32
rounding. A deliberate deviation of ours is a named option, set here to the reference's behaviour.
"""

import math

import pytest
import torch

import attention_zoo

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def hidden(batch, n, dim, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, dim, generator=g, dtype=dtype).requires_grad_()


def heads(x, num_heads):
    batch, n, _ = x.shape
    return x.view(batch, n, num_heads, -1).transpose(1, 2)


def merged(x):
    batch, h, n, d = x.shape
    return x.transpose(1, 2).reshape(batch, n, h * d)


def ours(name, num_heads, head_dim, n, **options):
    torch.manual_seed(0)
    return attention_zoo.build(name, num_heads=num_heads, head_dim=head_dim, max_seq_len=n, **options).eval()


def assert_same_outputs_and_gradients(x, reference_out, our_out, real=None, rtol=1e-4, atol=1e-5):
    """Outputs on real positions, and d(Σ out²)/dx, equal within float32 rounding."""
    real = torch.ones(reference_out.shape[:2], dtype=torch.bool) if real is None else real
    weight = real[..., None].to(reference_out.dtype)
    torch.testing.assert_close(our_out[real], reference_out[real], rtol=rtol, atol=atol)
    (grad_reference,) = torch.autograd.grad((reference_out * weight).square().sum(), x)
    (grad_ours,) = torch.autograd.grad((our_out * weight).square().sum(), x)
    torch.testing.assert_close(grad_ours, grad_reference, rtol=rtol, atol=atol)


# ------------------------------------------------------------------ Hugging Face transformers
@pytest.mark.parametrize("heads_, head_dim, n, rounds, chunk, padding", [
    (2, 16, 256, 2, 32, 56),  # 16 buckets, padding in one sequence
    (2, 16, 1024, 3, 8, 30),  # 256 buckets: factorized into 16 × 16 as the reference does
    (1, 8, 96, 1, 32, 0),
])
def test_reformer_equals_hugging_face_lsh_self_attention(heads_, head_dim, n, rounds, chunk, padding):
    """HF ``LSHSelfAttention`` (the port of trax that the YOSO and LRA tables ran), default
    configuration: q·k̂ logits, one chunk before, rounds concatenated before chunking."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    config = transformers.ReformerConfig(
        hidden_size=heads_ * head_dim, num_attention_heads=heads_, attention_head_size=head_dim,
        num_hashes=rounds, lsh_attn_chunk_length=chunk, num_buckets=None, hash_seed=7, is_decoder=False,
        lsh_attention_probs_dropout_prob=0.0, max_position_embeddings=n, attn_layers=["lsh"])
    reference = LSHSelfAttention(config).eval()
    attention = ours("reformer", heads_, head_dim, n, num_hashes=rounds, chunk_size=chunk)

    def reference_rotations(dim, factors, device):  # HF draws them after seeding with hash_seed
        torch.manual_seed(7)
        return torch.randn(heads_, dim, rounds, sum(f // 2 for f in factors))

    attention.rotations = reference_rotations
    x = hidden(2, n, heads_ * head_dim)
    mask = torch.ones(2, n, dtype=torch.long)
    if padding:
        mask[1, n - padding:] = 0
    expected = reference(x, attention_mask=mask).hidden_states
    q, v = heads(reference.query_key(x), heads_), heads(reference.value(x), heads_)
    out = merged(attention(q, q, v, mask.bool()))
    assert_same_outputs_and_gradients(x, expected, out, mask.bool())


def test_reformer_row_projections_equal_hugging_face_lsh_self_attention():
    """With ``projection_bias=false`` the model's whole attention block, projections included, is
    HF ``LSHSelfAttention`` (bias-free ``query_key`` and ``value``, as the YOSO code ties them to its
    W_q and W_v weights) followed by our output projection (set to the identity here)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.reformer.modeling_reformer import LSHSelfAttention

    from lra.model import MultiHeadAttention

    n, heads_, head_dim, rounds, chunk = 128, 2, 16, 2, 32
    config = transformers.ReformerConfig(
        hidden_size=heads_ * head_dim, num_attention_heads=heads_, attention_head_size=head_dim,
        num_hashes=rounds, lsh_attn_chunk_length=chunk, num_buckets=None, hash_seed=7, is_decoder=False,
        lsh_attention_probs_dropout_prob=0.0, max_position_embeddings=n, attn_layers=["lsh"])
    reference = LSHSelfAttention(config).eval()
    spec = attention_zoo.spec("reformer", num_hashes=rounds, chunk_size=chunk, projection_bias=False)
    block = MultiHeadAttention(heads_ * head_dim, heads_, head_dim, n, spec, attention_fp32=True).eval()
    assert all(layer.bias is None for layer in (block.query, block.key, block.value)) and block.output.bias is not None
    with torch.no_grad():
        block.query.weight.copy_(reference.query_key.weight)
        block.value.weight.copy_(reference.value.weight)
        block.output.weight.copy_(torch.eye(heads_ * head_dim))
        block.output.bias.zero_()

    def reference_rotations(dim, factors, device):
        torch.manual_seed(7)
        return torch.randn(heads_, dim, rounds, sum(f // 2 for f in factors))

    block.backend.rotations = reference_rotations
    x = hidden(2, n, heads_ * head_dim)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 40:] = 0
    expected = reference(x, attention_mask=mask).hidden_states
    assert_same_outputs_and_gradients(x, expected, block(x, mask.bool()), mask.bool())


@pytest.mark.parametrize("padding", [0, 9])
def test_yoso_e_equals_hugging_face_yoso_expectation(padding):
    """HF ``YosoSelfAttention`` with ``use_expectation``: (1 − arccos(q̂·k̂)/π)^τ, normalized
    output, and the authors' lower-bound backward (our default for YOSO-E), in float64."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.yoso.modeling_yoso import YosoSelfAttention

    n, heads_, head_dim, tau = 48, 2, 16, 6
    config = transformers.YosoConfig(hidden_size=heads_ * head_dim, num_attention_heads=heads_, use_expectation=True,
                                     hash_code_len=tau, conv_window=None, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    reference = YosoSelfAttention(config).double().eval()
    attention = ours("yoso_e", heads_, head_dim, n, hash_code_len=tau)
    assert attention.options.backward == "lower_bound"
    x = hidden(2, n, heads_ * head_dim, dtype=torch.float64)
    real = torch.ones(2, n, dtype=torch.bool)
    real[0, n - padding:] = padding == 0
    additive = torch.where(real, 0.0, -10000.0).double()  # what YosoModel hands its layers
    (expected,) = reference(x, attention_mask=additive)
    q, k, v = (heads(layer(x), heads_) for layer in (reference.query, reference.key, reference.value))
    from attention_zoo.yoso_e import expectation_attention

    out = merged(expectation_attention(q, k, v, real.double(), tau, attention.options.backward))
    assert_same_outputs_and_gradients(x, expected, out, real, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the module itself, in float32
        module_out = merged(attention(q.float(), k.float(), v.float(), real))
    torch.testing.assert_close(module_out[real], expected.float()[real], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("conv", [3, 33])
def test_nystrom_equals_hugging_face_nystromformer(conv):
    """HF ``NystromformerSelfAttention`` (the authors' code): landmarks are segment means of the
    padded length, pinv(A) starts from the batch-wide maximum (``landmarks=padded_segments``,
    ``pinv_init=batch``). HF does not mask padded queries and keys, so the inputs have none."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.nystromformer.modeling_nystromformer import NystromformerSelfAttention

    n, heads_, head_dim, landmarks = 64, 2, 16, 8
    config = transformers.NystromformerConfig(
        hidden_size=heads_ * head_dim, num_attention_heads=heads_, segment_means_seq_len=n, num_landmarks=landmarks,
        conv_kernel_size=conv, inv_coeff_init_option=False, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    reference = NystromformerSelfAttention(config).eval()
    attention = ours("nystrom", heads_, head_dim, n, num_landmarks=landmarks, conv_kernel_size=conv,
                     landmarks="padded_segments", pinv_init="batch")
    attention.conv.weight.data.copy_(reference.conv.weight.data)
    x = hidden(3, n, heads_ * head_dim)
    (expected,) = reference(x)
    q, k, v = (heads(layer(x), heads_) for layer in (reference.query, reference.key, reference.value))
    out = merged(attention(q, k, v, torch.ones(3, n, dtype=torch.bool)))
    assert_same_outputs_and_gradients(x, expected, out)


@pytest.mark.parametrize("window, globals_, padding", [(8, 1, 5), (16, 0, 0), (8, 2, 11)])
def test_longformer_equals_hugging_face_longformer_self_attention(window, globals_, padding):
    """HF ``LongformerSelfAttention``: window // 2 keys each side, the first tokens global (their
    separate global projections set to the local ones), padded keys masked."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    n, heads_, head_dim = 48, 2, 8
    config = transformers.LongformerConfig(hidden_size=heads_ * head_dim, num_attention_heads=heads_,
                                           attention_window=[window], attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    reference = LongformerSelfAttention(config, layer_id=0).eval()
    for local, global_ in ((reference.query, reference.query_global), (reference.key, reference.key_global),
                           (reference.value, reference.value_global)):
        global_.load_state_dict(local.state_dict())
    attention = ours("longformer", heads_, head_dim, n, window_size=window, num_global_tokens=globals_)
    x = hidden(2, n, heads_ * head_dim)
    real = torch.ones(2, n, dtype=torch.bool)
    if padding:
        real[1, n - padding:] = False
    code = torch.where(real, 0.0, -10000.0)
    code[:, :globals_] = 10000.0
    expected = reference(x, attention_mask=code, is_index_masked=code < 0, is_index_global_attn=code > 0,
                         is_global_attn=bool(globals_))[0]
    q, k, v = (heads(layer(x), heads_) for layer in (reference.query, reference.key, reference.value))
    out = merged(attention(q, k, v, real))
    assert_same_outputs_and_gradients(x, expected, out, real)


# ---------------------------------------------------------------------- lucidrains' packages
def test_performer_equals_performer_pytorch_fast_attention():
    """performer-pytorch ``FastAttention`` (the YOSO/Nyströmformer LRA code's Performer) with its
    random features copied: the same FAVOR+ estimator, stabilizers and feature ε (1e-4). It lets
    padded keys into the normalizer, so the inputs have no padding."""
    performer_pytorch = pytest.importorskip("performer_pytorch")

    n, heads_, head_dim, features = 40, 2, 16, 64
    torch.manual_seed(0)
    reference = performer_pytorch.FastAttention(dim_heads=head_dim, nb_features=features)
    attention = ours("performer", heads_, head_dim, n, num_features=features)
    attention.features.copy_(reference.projection_matrix)
    x = hidden(2, n, 3 * heads_ * head_dim)
    q, k, v = (heads(part, heads_) for part in x.chunk(3, dim=-1))
    expected = merged(reference(q, k, v))
    out = merged(attention(q, k, v, torch.ones(2, n, dtype=torch.bool)))
    assert_same_outputs_and_gradients(x, expected, out)


@pytest.mark.parametrize("padding", [0, 13])
def test_performer_with_the_mlpen_options_equals_the_mlpen_call_of_fast_attention(padding):
    """The YOSO/Nyströmformer LRA code's ``PerformerAttention``: ``FastAttention(Q / d^{1/4},
    K / d^{1/4} · mask, V · mask)``, so performer-pytorch's own d^{1/4} makes it exp(q·k/d), and padded
    keys enter its normalizer as zero vectors: ``kernel_scale=d padded_keys=zero_vectors``."""
    performer_pytorch = pytest.importorskip("performer_pytorch")

    n, heads_, head_dim, features = 40, 2, 32, 64
    torch.manual_seed(0)
    reference = performer_pytorch.FastAttention(dim_heads=head_dim, nb_features=features)
    attention = ours("performer", heads_, head_dim, n, num_features=features, kernel_scale="d",
                     padded_keys="zero_vectors")
    attention.features.copy_(reference.projection_matrix)
    x = hidden(2, n, 3 * heads_ * head_dim)
    q, k, v = (heads(part, heads_) for part in x.chunk(3, dim=-1))
    real = torch.ones(2, n, dtype=torch.bool)
    real[1, n - padding:] = padding == 0
    gate, quarter = real[:, None, :, None].float(), head_dim ** 0.25
    expected = merged(reference(q / quarter, k / quarter * gate, v * gate))
    out = merged(attention(q, k, v, real))
    assert_same_outputs_and_gradients(x, expected, out, real)
    default = merged(ours("performer", heads_, head_dim, n, num_features=features)(q, k, v, real))
    assert (default - expected).norm() > 0.1 * expected.norm()  # the options matter


@pytest.mark.parametrize("n", [64, 40])
def test_linformer_equals_the_linformer_package(n):
    """linformer ``LinformerSelfAttention``: keys and values projected along the sequence by
    E, F (the first n columns for shorter inputs), shared by the heads."""
    linformer = pytest.importorskip("linformer")

    max_len, heads_, head_dim, k = 64, 2, 16, 32
    torch.manual_seed(0)
    reference = linformer.LinformerSelfAttention(dim=heads_ * head_dim, seq_len=max_len, k=k, heads=heads_)
    attention = ours("linformer", heads_, head_dim, max_len, proj_dim=k)
    attention.key_projection.data.copy_(reference.proj_k.data.T)
    attention.value_projection.data.copy_(reference.proj_v.data.T)
    x = hidden(2, n, heads_ * head_dim)
    expected = reference(x)
    q, k_, v = (heads(layer(x), heads_) for layer in (reference.to_q, reference.to_k, reference.to_v))
    out = reference.to_out(merged(attention(q, k_, v, torch.ones(2, n, dtype=torch.bool))))
    assert_same_outputs_and_gradients(x, expected, out)


def test_nystrom_equals_the_nystrom_attention_package():
    """nystrom-attention ``NystromAttention``: segment means, the batch-wide pinv start, the
    residual convolution (weights copied); n a multiple of the landmarks, no padding."""
    nystrom_attention = pytest.importorskip("nystrom_attention")

    n, heads_, head_dim, landmarks = 64, 2, 16, 8
    torch.manual_seed(0)
    reference = nystrom_attention.NystromAttention(dim=heads_ * head_dim, dim_head=head_dim, heads=heads_,
                                                   num_landmarks=landmarks, residual=True, residual_conv_kernel=33)
    attention = ours("nystrom", heads_, head_dim, n, num_landmarks=landmarks, pinv_init="batch")
    attention.conv.weight.data.copy_(reference.res_conv.weight.data)
    x = hidden(2, n, heads_ * head_dim)
    expected = reference(x)
    q, k, v = (heads(part, heads_) for part in reference.to_qkv(x).chunk(3, dim=-1))
    out = reference.to_out(merged(attention(q, k, v, torch.ones(2, n, dtype=torch.bool))))
    assert_same_outputs_and_gradients(x, expected, out)


def test_every_deliberate_deviation_is_an_option_whose_default_is_documented():
    """The options these tests turn to the reference's behaviour exist, with our defaults."""
    assert attention_zoo.make_options("nystrom").landmarks == "real_tokens"
    assert attention_zoo.make_options("nystrom").pinv_init == "per_matrix"
    assert attention_zoo.make_options("reformer").score_scale == "none"
    assert attention_zoo.make_options("reformer").projection_bias is True
    assert attention_zoo.make_options("performer").kernel_scale == "sqrt_d"
    assert attention_zoo.make_options("performer").padded_keys == "excluded"
    assert attention_zoo.make_options("yoso_e").backward == "lower_bound"
    assert math.isclose(attention_zoo.make_options("performer").feature_epsilon, 1e-4)
