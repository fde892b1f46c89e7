"""Every registered backend in float64, as an independent float64 reference runs it (``module.double()``,
float64 q, k, v): it builds, runs forward and backward, computes in float64 end to end, and equals its
float32 twin (same parameters, inputs and draws) to float32 rounding; parameters, buffers and random
draws follow the inputs' dtype; YOSO hashes the same codes whatever the dtype."""

import copy

import pytest
import torch

import attention_zoo
from attention_zoo import _yoso_ops, yoso
from helpers import needs_kernels

N, D = 70, 8  # more than one block, chunk or landmark for every default; batch 1 is padded from 45
HEADS = 2

# Branches the defaults do not take: other engines and backwards of YOSO, BigBird's random blocks,
# the learned parameters of the other Synthesizer modes, LHA's local heads, Performer's mlpen mode,
# Nyströmformer's reference landmarks, Sinkhorn's sorting over several blocks, shared Linformer E = F.
VARIANTS = [
    ("yoso", {"impl": "torch"}),
    ("yoso", {"backward": "exact"}),
    ("yoso", {"backward": "exact_collided"}),
    ("yoso", {"backward": "expectation"}),
    ("yoso", {"backward_projections": 4}),
    ("yoso", {"hashing": "gaussian"}),
    ("bigbird", {"block_size": 8}),
    ("synthesizer", {"mode": "dense+factorized_random"}),
    ("learned_hash", {"local_heads": 1}),
    ("local", {"grouping": "strided", "block_size": 8}),
    ("performer", {"kernel_scale": "d", "padded_keys": "zero_vectors"}),
    ("nystrom", {"num_landmarks": 7, "landmarks": "padded_segments", "pinv_init": "batch"}),
    ("sinkhorn", {"block_size": 8}),
    ("linformer", {"share_kv": True}),
]
CASES = [(name, {}) for name in attention_zoo.names()] + VARIANTS
IDS = [name + "".join(f"-{key}={value}" for key, value in options.items()) for name, options in CASES]
# Inputs a backend does not read: no gradient in any dtype (the others must have one).
UNREAD = {"none": {"q", "k"}, "reformer": {"k"}}  # reformer: shared QK, the keys are the normalized queries
TOLERANCE = 1e-5  # relative (Frobenius) difference of float64 from float32; measured ≤ 1.5e-6 (Nyströmformer's pinv)


def build(name, **options):
    torch.manual_seed(0)
    return attention_zoo.build(name, num_heads=HEADS, head_dim=D, max_seq_len=N, **options).eval()


def inputs(seed=1):
    """q, k, v and a weight w for the loss Σ w ⊙ out, float32, [2, HEADS, N, D]; the padding mask."""
    g = torch.Generator().manual_seed(seed)
    q, k, v, w = (torch.randn(2, HEADS, N, D, generator=g) for _ in range(4))
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 45:] = False
    return q, k, v, w, mask


def run(module, dtype, seed=0):
    """(output, {input: gradient}, {parameter: gradient}) of ``module`` on :func:`inputs` in ``dtype``;
    the loss is Σ w ⊙ out over real query rows, plus the backend's aux_loss."""
    q, k, v, w, mask = inputs()
    leaves = {name: t.to(dtype).requires_grad_() for name, t in zip("qkv", (q, k, v))}
    torch.manual_seed(seed)  # the training draws
    out = module(*leaves.values(), mask)
    loss = (out * w.to(dtype) * mask[:, None, :, None]).sum()
    if module.aux_loss is not None:
        loss = loss + module.aux_loss
    loss.backward()
    return out.detach(), {n: t.grad for n, t in leaves.items()}, {n: p.grad for n, p in module.named_parameters()}


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def real_rows(out):
    return out[inputs()[4][:, None, :, None].expand_as(out)]


def carries_float64_bits(x):
    """Not every value is a float32 cast to float64: x was computed in float64."""
    return not torch.equal(x, x.float().double())


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_float64_runs_in_float64_and_equals_float32(name, options, training):
    first = build(name, **options).train(training)
    second = copy.deepcopy(first).double()
    assert all(t.dtype == torch.float64 for t in second.parameters())
    out32, grads32, params32 = run(first, torch.float32)
    out64, grads64, params64 = run(second, torch.float64)

    assert out64.dtype == torch.float64 and torch.isfinite(out64).all()
    assert relative(real_rows(out64), real_rows(out32)) < TOLERANCE
    assert {n for n, g in grads64.items() if g is None} == UNREAD.get(name, set())
    for n, grad in grads64.items():
        if grad is not None:
            assert grad.dtype == torch.float64 and torch.isfinite(grad).all(), n
            assert relative(grad, grads32[n]) < TOLERANCE, n
    for n, grad in params64.items():
        assert (grad is None) == (params32[n] is None), n
        if grad is not None:
            assert grad.dtype == torch.float64 and torch.isfinite(grad).all(), n
            assert relative(grad, params32[n]) < TOLERANCE, n
    if name != "none":  # the identity: nothing to compute
        assert carries_float64_bits(out64)
        assert all(carries_float64_bits(g) for g in grads64.values() if g is not None)


@pytest.mark.parametrize("name", attention_zoo.names())
def test_parameters_buffers_and_draws_follow_the_inputs_dtype(name):
    """A float32 module given float64 inputs computes what its float64 copy computes, bit for bit (its
    parameters, buffers and draws cast to float64 exactly), and a float64 module given float32 inputs
    what the float32 module computes."""
    module = build(name)
    double = copy.deepcopy(module).double()
    q, k, v, _, mask = inputs()
    torch.testing.assert_close(module(q.double(), k.double(), v.double(), mask),
                               double(q.double(), k.double(), v.double(), mask), rtol=0, atol=0)
    out = double(q, k, v, mask)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, module(q, k, v, mask), rtol=0, atol=0)


def dense_softmax(q, k, v, mask):
    scores = (q.double() @ k.double().transpose(-1, -2)) / D**0.5
    return torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), dim=-1) @ v.double()


@pytest.mark.parametrize("name, options", [
    ("softmax", {}),
    ("bigbird", {}),  # n ≤ 2 blocks of 64: every block is global
    ("longformer", {"window_size": 2 * N}),
    ("local", {"block_size": N}),
    ("nystrom", {"num_landmarks": N, "landmarks": "padded_segments", "conv_kernel_size": 0}),
], ids=["softmax", "bigbird", "longformer", "local", "nystrom"])
def test_in_a_softmax_limit_float64_is_float64_softmax(name, options):
    """Where a backend equals softmax attention, its float64 output equals a float64 softmax to float64
    rounding, ~10⁸ times closer than its float32 output does."""
    module = build(name, **options)
    q, k, v, _, mask = inputs()
    expected = real_rows(dense_softmax(q, k, v, mask))
    error64 = relative(real_rows(module.double()(q.double(), k.double(), v.double(), mask)), expected)
    error32 = relative(real_rows(module.float()(q, k, v, mask)), expected)
    assert error64 < 1e-13 and 1e-8 < error32 < TOLERANCE


def recorded_codes(monkeypatch):
    """Every hash code YOSO computes from now on, in order."""
    codes = []

    def recording(*args, **kwargs):
        codes.append(original(*args, **kwargs))
        return codes[-1]

    original = yoso.hash_codes
    monkeypatch.setattr(yoso, "hash_codes", recording)
    return codes


@pytest.mark.parametrize("options", [{}, {"impl": "torch"}, {"hashing": "gaussian"}], ids=["auto", "torch", "gaussian"])
def test_yoso_hashes_the_same_codes_and_samples_in_float64(monkeypatch, options):
    """YOSO's codes come from the rows rounded to float32 whatever the dtype (float32 is the kernels'
    precision), so a float64 call collides the pairs its float32 twin does; the estimator on those
    codes, (1/m) Σ_h Σ_{j colliding} v_j normalized per row, is then computed in float64: equal to a
    dense float64 evaluation from the codes to float64 rounding."""
    module = build("yoso", **options)
    q, k, v, _, mask = inputs()
    codes = recorded_codes(monkeypatch)
    out32 = module(q, k, v, mask)
    out64 = copy.deepcopy(module).double()(q.double(), k.double(), v.double(), mask)
    codes_q, codes_k, codes_q64, codes_k64 = codes
    assert torch.equal(codes_q, codes_q64) and torch.equal(codes_k, codes_k64)

    collisions = (codes_q[:, :, :, None] == codes_k[:, :, None, :]).double().mean(dim=1)  # [B·H, n, n]
    weighted = (v.double() * mask[:, None, :, None]).reshape(2 * HEADS, N, D)
    sample = collisions @ weighted
    expected = real_rows((sample / sample.norm(dim=-1, keepdim=True).clamp_min(1e-12)).reshape(v.shape))
    assert relative(real_rows(out64), expected) < 1e-13
    assert 1e-9 < relative(real_rows(out32), expected) < TOLERANCE


def test_yoso_float64_takes_the_pytorch_path_and_the_kernels_refuse_it():
    assert _yoso_ops.resolve_engine("auto", torch.device("cpu"), torch.float64) == "torch"
    assert _yoso_ops.resolve_engine("torch", torch.device("cpu"), torch.float64) == "torch"


@needs_kernels
def test_yoso_with_impl_cpu_refuses_float64_inputs():
    module = build("yoso", impl="cpu").double()
    q, k, v, _, mask = inputs()
    with pytest.raises(ValueError, match="impl=torch or impl=auto"):
        module(q.double(), k.double(), v.double(), mask)
