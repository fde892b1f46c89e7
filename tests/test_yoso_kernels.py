"""The compiled YOSO kernels against the pure-PyTorch implementation of the same algorithm, their
limits and errors, and the statistics of YOSO's hashing and sampled gradients."""

import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F

import attention_zoo
from attention_zoo import _yoso_ops as ops
from attention_zoo.yoso import Setup, draw, hash_codes, yoso_cumulation
from attention_zoo.yoso_e import collision_probability
from helpers import needs_kernels

# "cuda" cases carry the cuda marker (`pytest -m cuda`, lra-gpu-check) and skip without a CUDA device.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                  reason="no CUDA device")])]
SHAPES = [  # batch·heads, n, head_dim, value_dim, hashes, τ
    (3, 37, 24, 24, 16, 6),
    (2, 61, 32, 40, 32, 8),
    (4, 129, 64, 64, 5, 12),
    (1, 8, 32, 32, 256, 3),
]


def unit_rows(shape, generator, device="cpu"):
    return F.normalize(torch.randn(*shape, generator=generator), dim=-1).to(device)


def problem(batch, n, d, dv, seed=0, device="cpu", correlation=0.0):
    g = torch.Generator().manual_seed(seed)
    q = unit_rows((batch, n, d), g)
    k = F.normalize(correlation * q + unit_rows((batch, n, d), g), dim=-1)
    v, grad = torch.randn(batch, n, dv, generator=g), torch.randn(batch, n, dv, generator=g)
    mask = (torch.rand(batch, n, generator=g) > 0.25).float()
    mask[:, 0] = 1
    return [t.to(device) for t in (q, k, v, grad, mask)]


def sampled_gradients(q, k, v, grad, mask, draws, tau, backward, engine, m, normalize=False):
    codes_q, codes_k = (hash_codes(x, draws, m, tau, engine) for x in (q, k))
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    setup = Setup(tau, backward, engine, 0.99, 2**24, normalize)
    out = yoso_cumulation(q, k, v, mask, codes_q, codes_k, draws.projections, setup)
    out.backward(grad)
    return out.detach(), q.grad, k.grad, v.grad


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kernels_equal_the_pytorch_implementation(device, shape):
    """Same draws ⇒ identical codes, and forward and both backward estimates equal to float32 rounding,
    on unit rows and on rows of any length normalized inside (Setup.normalize)."""
    batch, n, d, dv, m, tau = shape
    q, k, v, grad, mask = problem(batch, n, d, dv, device=device, correlation=1.0)
    torch.manual_seed(1)
    draws = draw(batch, d, dv, m, tau, "hadamard", 4, None, device)
    assert torch.equal(hash_codes(q, draws, m, tau, "kernel"), hash_codes(q, draws, m, tau, "torch"))
    lengths = torch.rand(batch, n, 1, generator=torch.Generator().manual_seed(2)).to(device) * 5 + 0.1
    for backward, normalize in itertools.product(("lower_bound", "exact"), (False, True)):
        rows = (q * lengths, k * lengths.flip(1)) if normalize else (q, k)
        compiled = sampled_gradients(*rows, v, grad, mask, draws, tau, backward, "kernel", m, normalize)
        reference = sampled_gradients(*rows, v, grad, mask, draws, tau, backward, "torch", m, normalize)
        for a, b in zip(compiled, reference):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * max(1.0, b.abs().max().item()))
        assert compiled[3][mask == 0].abs().max() == 0  # padded values get no gradient


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
def test_limits_are_errors_not_garbage(device):
    q, k, v, grad, mask = problem(2, 19, 24, 24, device=device)
    draws = draw(2, 24, 24, 4, 16, "hadamard", 1, None, device)  # τ = 16: 65,536 rows per table
    codes = hash_codes(q, draws, 4, 16, "kernel")
    assert 0 <= codes.min() and codes.max() < 2**16
    ones = torch.ones(2, 1, 1, 19, device=device)
    torch.testing.assert_close(ops.cumulation(codes, codes, ones, ones, v, 16, "kernel"),
                               ops.cumulation(codes, codes, ones, ones, v, 16, "torch"))
    with pytest.raises(RuntimeError, match="hash_code_len must be in"):
        ops.cumulation(codes, codes, ones, ones, v, 21, "kernel")
    with pytest.raises(ValueError, match="hash_code_len=21 is invalid: it must be a whole number between 1 and 20"):
        attention_zoo.build("yoso", num_heads=1, head_dim=8, max_seq_len=8, hash_code_len=21)
    with pytest.raises(ValueError, match="hash_code_len=0 is invalid"):  # never silently the default τ
        attention_zoo.build("yoso", num_heads=1, head_dim=8, max_seq_len=8, hash_code_len=0)
    with pytest.raises(ValueError, match="backward='exat' is invalid: it must be one of lower_bound"):
        attention_zoo.build("yoso", num_heads=1, head_dim=8, max_seq_len=8, backward="exat")
    other = "cuda" if device == "cpu" else "cpu"
    with pytest.raises(ValueError, match=f"impl={other} but the tensors are on {device}"):
        ops.resolve_engine(other, torch.device(device))


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
def test_a_failed_check_raises_its_message_with_numbers_shapes_and_types(device):
    """Every check's message is joined without an iostream (yoso_checks.h): on the GPU machine of 2026-11-27 the
    CUDA build died with SIGSEGV formatting the first number of a failed check, instead of raising it."""
    from attention_zoo import _yoso_build

    extension = _yoso_build.load(device)
    codes = torch.zeros(2, 4, 19, dtype=torch.int32, device=device)
    ones, values = torch.ones(2, 1, 1, 19, device=device), torch.zeros(2, 19, 24, device=device)
    cases = [
        ((codes, codes, ones, ones, values, 21), "yoso: hash_code_len must be in [1, 20], got 21"),
        ((codes, codes, ones, ones, values.double(), 4), "yoso: values must be float32 or bfloat16 (the wrapper casts), got Double"),
        ((codes, codes, ones, ones, values[0], 4), "yoso: values must have 3 dimensions, got [19, 24]"),
        ((codes, codes[:, :3], ones, ones, values, 4), "yoso: codes_k must be [2, 4, n], got [2, 3, 19]"),
        ((codes, codes[..., :18].contiguous(), ones, ones, values, 4), "yoso: codes_k has 18 keys, values 19"),
        ((codes, codes, ones, ones[..., :5].contiguous(), values, 4), "yoso: weight_k must be [2, 1 or 4, 1, 19], got [2, 1, 1, 5]"),
    ]
    if device == "cuda":
        cases.append(((codes.cpu(), codes, ones, ones, values, 4), "yoso: cumulation inputs on different devices"))
    for arguments, message in cases:
        with pytest.raises(RuntimeError, match=re.escape(message)):
            extension.cumulation(*arguments, 1 << 20)


def test_every_check_in_the_kernel_sources_hands_torch_one_finished_c_string():
    """TORCH_CHECK joins two or more message parts with a std::ostringstream (c10::str), the path that crashed
    on the GPU machine; the kernels' checks go through YOSO_CHECK, which passes one C string."""
    from attention_zoo._yoso_build import SOURCE_DIR

    checks = []
    for source in sorted(SOURCE_DIR.glob("*.*")):
        text = source.read_text()
        for start in (match.end() for match in re.finditer(r"\bTORCH_CHECK\(", text)):
            depth, arguments, current = 1, [], ""
            for char in text[start:]:
                depth += {"(": 1, ")": -1}.get(char, 0)
                if depth == 0:
                    break
                if char == "," and depth == 1:
                    arguments, current = arguments + [current], ""
                else:
                    current += char
            checks.append((source.name, [*arguments, current]))
    assert len(checks) >= 3  # the macro and the CUDA wrapper's two
    for name, arguments in checks:
        assert len(arguments) == 2 and arguments[1].strip().endswith(".c_str()"), (name, arguments)


@needs_kernels
@pytest.mark.parametrize("tau, code", [(4, 16), (4, -1), (16, 2**16), (16, -2**31)], ids=["4-high", "4-negative",
                                                                                          "16-high", "16-negative"])
def test_codes_outside_tau_bits_are_an_error_in_every_cpu_kernel(tau, code):
    """A code outside [0, 2^τ) (codes made with another τ) is one clear error, never a write past the
    sort's counters: τ = 4 sorts in one counting pass, τ = 16 at n = 19 in two."""
    q, k, v, grad, mask = problem(2, 19, 8, 8)
    codes = torch.randint(0, 2**tau, (2, 3, 19), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    bad = codes.clone()
    bad[1, 2, 7] = code
    ones = torch.ones(2, 1, 1, 19)
    calls = [lambda: ops.cumulation(codes, bad, ones, ones, v, tau, "kernel"),
             lambda: ops.cumulation(bad, codes, ones, ones, v, tau, "kernel"),
             lambda: ops.exact_weight_backward(codes, bad, q, k, v, mask, grad, tau, "kernel"),
             lambda: ops.pair_gradient(bad, codes, q, k, grad, v, mask, tau, 0.99, "kernel")]
    for call in calls:
        with pytest.raises(ValueError, match=rf"every hash code must lie in \[0, 2\^{tau}\)"):
            call()
    ops.cumulation(codes, codes, ones, ones, v, tau, "kernel")  # the same call with codes in range runs


@needs_kernels
@pytest.mark.parametrize("nq, nk, tau", [(5000, 100, 14), (100, 5000, 14), (300, 310, 12), (64, 64, 18)])
def test_cross_lengths_match_however_each_side_is_sorted(nq, nk, tau):
    """The CPU kernels sort a side in one counting pass while 2^τ ≤ 4n (its buckets then found by
    their counters) and in two radix passes otherwise (buckets found by merging sorted codes): queries
    and keys of different lengths may take different ways, and the results equal the PyTorch path."""
    g = torch.Generator().manual_seed(nq + nk)
    codes_q = torch.randint(0, 2**tau, (2, 3, nq), generator=g, dtype=torch.int32)
    codes_k = torch.randint(0, 2**tau, (2, 3, nk), generator=g, dtype=torch.int32)
    codes_k[:, :, : min(nq, nk) // 2] = codes_q[:, :, : min(nq, nk) // 2]  # half the keys collide
    q, k, v, grad = (torch.randn(2, n, 8, generator=g) for n in (nq, nk, nk, nq))
    key_weight = (torch.rand(2, nk, generator=g) > 0.3).float()
    ones = torch.ones(2, 1, 1, nq)
    compiled, reference = (ops.cumulation(codes_q, codes_k, ones, key_weight[:, None, None], v, tau, engine)
                           for engine in ("kernel", "torch"))
    torch.testing.assert_close(compiled, reference)
    compiled, reference = (ops.exact_weight_backward(codes_q, codes_k, q, k, v, key_weight, grad, tau, engine)
                           for engine in ("kernel", "torch"))
    for mine, theirs in zip(compiled, reference):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5 * theirs.abs().max().item())


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
def test_the_default_backward_differentiates_through_the_normalization(device):
    """normalize=True: q and k of any length give the gradients of the rows themselves, the unit-row
    estimator's gradients pulled back through F.normalize by autograd, in the kernels (the CPU's fused into
    its packing, the CUDA's in a launch before and one after the estimator) and the PyTorch path; a zero row
    gets ∇/ε, as F.normalize's."""
    batch, n, d, m, tau = 2, 61, 32, 8, 5
    g = torch.Generator().manual_seed(9)
    q, k = (torch.randn(batch, n, d, generator=g) * (torch.rand(batch, n, 1, generator=g) * 8 + 0.05) for _ in range(2))
    q[0, 3] = 0.0
    v, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    mask = (torch.rand(batch, n, generator=g) > 0.2).float()
    q, k, v, grad, mask = (x.to(device) for x in (q, k, v, grad, mask))
    draws = draw(batch, d, d, m, tau, "hadamard", d, g, device)
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "kernel") for x in (q, k))
    leaf_q, leaf_k = q.clone().requires_grad_(), k.clone().requires_grad_()
    unit_q, unit_k = F.normalize(leaf_q, dim=-1), F.normalize(leaf_k, dim=-1)
    grad_unit_q, grad_unit_k, grad_v = ops.exact_weight_backward_torch(codes_q, codes_k, unit_q.detach(),
                                                                       unit_k.detach(), v, mask, grad, tau)
    torch.autograd.backward([unit_q, unit_k], [grad_unit_q, grad_unit_k])
    for engine in ("kernel", "torch"):
        ours = ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, engine, normalize=True)
        for name, mine, expected in zip(("grad_q", "grad_k", "grad_v"), ours, (leaf_q.grad, leaf_k.grad, grad_v)):
            mine, expected = mine.clone(), expected.clone()
            if name == "grad_q":  # the zero row: ∇ of the unit row / ε, compared on its own scale
                torch.testing.assert_close(mine[0, 3], grad_unit_q[0, 3] / 1e-12, rtol=1e-5, atol=0)
                mine[0, 3] = expected[0, 3] = 0
            torch.testing.assert_close(mine, expected, rtol=1e-4, atol=1e-5 * expected.abs().max().item(),
                                       msg=lambda text: f"{engine} {name}: {text}")


@needs_kernels
@pytest.mark.parametrize("device", DEVICES)
def test_the_output_unit_rows_are_f_normalize_of_the_sample_on_every_engine(device):
    """unit_output (the forward of YOSO and YOSO-C): the operator's output is F.normalize of its unnormalized
    sample and its gradients those of autograd through F.normalize, on the kernels (the CUDA ones normalizing in
    one launch each way, the CPU's output through PyTorch) and the PyTorch path, on q of any length."""
    batch, n, d, m, tau = 2, 61, 32, 8, 5
    g = torch.Generator().manual_seed(4)
    q, k, v, grad = (torch.randn(batch, n, d, generator=g) for _ in range(4))
    q = q * (torch.rand(batch, n, 1, generator=g) * 8 + 0.05)
    mask = (torch.rand(batch, n, generator=g) > 0.2).float()
    q, k, v, grad, mask = (x.to(device) for x in (q, k, v, grad, mask))
    draws = draw(batch, d, d, m, tau, "hadamard", d, g, device)
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "kernel") for x in (q, k))
    for engine in ("kernel", "torch"):
        results = []
        for unit_output in (True, False):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            setup = Setup(tau, "lower_bound", engine, 0.99, 2**20, normalize=True, unit_output=unit_output)
            y = yoso_cumulation(*leaves, mask, codes_q, codes_k, draws.projections, setup)
            y = y if unit_output else F.normalize(y, dim=-1)
            y.backward(grad)
            results.append([y.detach(), *(leaf.grad for leaf in leaves)])
        for name, fused, composed in zip(("y", "grad_q", "grad_k", "grad_v"), *results):
            row_scale = composed.abs().amax(-1, keepdim=True)  # (autograd through F.normalize rounds otherwise)
            assert ((fused - composed).abs() <= 1e-5 * row_scale).all(), (engine, name)


def test_a_graph_of_the_gradient_can_be_made_through_the_output_unit_rows():
    """create_graph=True through the output's unit rows takes PyTorch's passes (differentiable; the operator is
    not), giving the gradients the operator gives without a graph; with the expectation backward, whose own
    gradients are PyTorch's, a second-order backward then runs (float64)."""
    batch, n, d, m, tau = 2, 23, 16, 8, 4
    g = torch.Generator().manual_seed(6)
    q, k, v, weights = (torch.randn(batch, n, d, generator=g, dtype=torch.float64) for _ in range(4))
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    mask = torch.ones(batch, n, dtype=torch.float64)
    draws = draw(batch, d, d, m, tau, "hadamard", d, g, "cpu")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "torch") for x in (q, k))
    setup = Setup(tau, "expectation", "torch", 0.99, 2**20, unit_output=True)
    first, graphed = [], None
    for graph in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        y = yoso_cumulation(*leaves, mask, codes_q, codes_k, draws.projections, setup)
        first.append(torch.autograd.grad((y * weights).sum(), leaves, create_graph=graph))
        graphed = graphed or leaves
    for with_graph, without in zip(*first):
        torch.testing.assert_close(with_graph, without, rtol=1e-12, atol=1e-12)
    second = torch.autograd.grad(first[0][0].square().sum(), graphed, allow_unused=True)
    assert any(t is not None for t in second) and all(t is None or torch.isfinite(t).all() for t in second)


@needs_kernels
@pytest.mark.parametrize("batch, n", [(0, 5), (2, 0)], ids=["no-sequences", "empty-sequences"])
def test_empty_inputs_give_empty_results_on_every_engine(batch, n):
    d, m, tau = 8, 4, 3
    x, v = torch.randn(batch, n, d), torch.randn(batch, n, d)
    codes, weights, ones = torch.zeros(batch, m, n, dtype=torch.int32), torch.ones(batch, n), torch.ones(batch, 1, 1, n)
    for engine, hashing in itertools.product(("kernel", "torch"), ("hadamard", "gaussian")):
        draws = draw(batch, d, d, m, tau, hashing, d, torch.Generator().manual_seed(0), "cpu")
        assert hash_codes(x, draws, m, tau, engine).shape == (batch, m, n)
    for engine in ("kernel", "torch"):
        assert ops.cumulation(codes, codes, ones, ones, v, tau, engine).shape == (batch, n, d)
        for normalize in (False, True):
            grads = ops.exact_weight_backward(codes, codes, x, x, v, weights, v, tau, engine, normalize=normalize)
            assert [g.shape for g in grads] == [(batch, n, d)] * 3
        assert ops.pair_gradient(codes, codes, x, x, v, v, weights, tau, 0.99, engine).shape == (batch, n, d)


@needs_kernels
@pytest.mark.parametrize("hashing", ["hadamard", "gaussian"])
def test_collision_frequency_matches_the_closed_form(hashing):
    """P[codes of x and y agree] = (1 − θ/π)^τ within 4 binomial sigmas, 40,000 independent draws per angle."""
    trials, d, tau = 40_000, 32, 4
    g = torch.Generator().manual_seed(3)
    for angle in (0.25, 0.75, 1.25, 2.0):
        x = unit_rows((trials, d), g)
        r = torch.randn(trials, d, generator=g)
        u = F.normalize(r - (r * x).sum(-1, keepdim=True) * x, dim=-1)
        pair = torch.stack([x, math.cos(angle) * x + math.sin(angle) * u], dim=1)  # [trials, 2, d]
        torch.manual_seed(int(angle * 100))
        draws = draw(trials, d, d, 1, tau, hashing, 1, None, "cpu")
        codes = hash_codes(pair, draws, 1, tau, "kernel")[:, 0]
        rate = (codes[:, 0] == codes[:, 1]).double().mean().item()
        p = (1 - angle / math.pi) ** tau
        assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / trials), (angle, rate, p)


def yoso_e_output(q, k, v, mask, tau):
    return F.normalize((collision_probability(q, k, tau) * mask[:, None, :]) @ v, dim=-1)


@needs_kernels
def test_yoso_m_approaches_yoso_e_like_one_over_sqrt_m():
    q, k, v, _, mask = problem(4, 128, 32, 32, seed=4, correlation=1.5)
    tau = 6
    target = yoso_e_output(q, k, v, mask, tau)
    errors = {}
    for m in (8, 16, 32, 64, 128, 256):
        angles = []
        for seed in range(4):
            torch.manual_seed(seed)
            out = sampled_gradients(q, k, v, torch.zeros_like(v), mask, draw(4, 32, 32, m, tau, "hadamard", 1, None, "cpu"),
                                    tau, "lower_bound", "kernel", m)[0]
            cosine = (F.normalize(out, dim=-1) * target).sum(-1).clamp(-1, 1)
            angles.append(torch.arccos(cosine).mean().item())
        errors[m] = sum(angles) / len(angles)
    values = list(errors.values())
    assert all(a > b for a, b in zip(values, values[1:])), errors
    assert 0.6 * math.sqrt(32) < errors[8] / errors[256] < 1.5 * math.sqrt(32), errors


def dense_targets(q, k, v, grad, mask, tau, clamp=0.99):
    """float64 lower-bound (eq. 4) and exact (eq. 3, derivative ratio at the clamp) gradients of (E ⊙ mask) V."""
    q, k, v, grad, mask = (t.double() for t in (q, k, v, grad, mask))
    x = q @ k.transpose(-1, -2)
    probability = (1 - torch.arccos(x.clamp(-1, 1)) / math.pi) ** tau * mask[:, None, :]
    xc = x.clamp(-clamp, clamp)
    ratio = tau / ((math.pi - torch.arccos(xc)) * torch.sqrt(1 - xc * xc))
    weights = grad @ v.transpose(-1, -2)
    lower = weights * probability * tau / 2
    exact = weights * probability * ratio
    return {"lower_bound": (lower @ k, lower.transpose(-1, -2) @ q), "exact": (exact @ k, exact.transpose(-1, -2) @ q),
            "value": probability.transpose(-1, -2) @ grad}


@needs_kernels
def test_default_lower_bound_backward_is_the_papers_per_pair_estimator():
    """The yoso preset's ∇Q: (1/m) Σ_h Σ_j [c_h(q_i) = c_h(k_j)] mask_j (g_i·v_j)(τ/2) k_j exactly, with
    the forward's own hashes (float64 enumeration of colliding pairs); p projections differ from it."""
    n, d, m, tau = 40, 16, 8, 3
    q, k, v, grad, mask = problem(1, n, d, d, seed=7, correlation=1.0)
    attention = attention_zoo.build("yoso", num_heads=1, head_dim=d, max_seq_len=n, num_hashes=m, hash_code_len=tau)
    assert attention.options.backward == "lower_bound" and attention.options.backward_projections is None

    def gradient(module):
        torch.manual_seed(3)
        leaf = q.clone().requires_grad_()
        module.sample(leaf[:, None], k[:, None], v[:, None], mask.bool()).backward(grad)
        return leaf.grad.double()

    torch.manual_seed(3)
    draws = draw(1, d, d, m, tau, "hadamard", d, None, "cpu")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "torch")[0] for x in (q, k))
    collide = (codes_q[:, :, None] == codes_k[:, None, :]).double().mean(0) * mask[0].double()  # [n, n]
    pair = (grad[0].double() @ v[0].double().T) * collide * tau / 2
    surrogate = pair @ k[0].double()  # the gradient of the unit q; then through q ↦ q/‖q‖ (q is unit)
    expected = surrogate - (surrogate * q[0].double()).sum(-1, keepdim=True) * q[0].double()
    torch.testing.assert_close(gradient(attention)[0], expected, rtol=1e-4, atol=1e-5)
    projected = attention_zoo.build("yoso", num_heads=1, head_dim=d, max_seq_len=n, num_hashes=m, hash_code_len=tau,
                                    backward_projections=2)
    assert not torch.allclose(gradient(projected)[0], expected, rtol=1e-2, atol=1e-3)


@needs_kernels
@pytest.mark.parametrize("backward", ["lower_bound", "exact"])
def test_sampled_gradients_are_unbiased(backward):
    """The mean over 600 seeds approaches the dense expression, with error shrinking like 1/√seeds."""
    tau, m, seeds = 3, 8, 600
    q, k, v, grad, mask = problem(1, 24, 16, 16, seed=5, correlation=1.0)
    target_q, target_k = dense_targets(q, k, v, grad, mask, tau)[backward]
    target_v = dense_targets(q, k, v, grad, mask, tau)["value"]
    total_q, total_k, total_v, single = 0, 0, 0, None
    for seed in range(seeds):
        torch.manual_seed(seed)
        _, gq, gk, gv = sampled_gradients(q, k, v, grad, mask, draw(1, 16, 16, m, tau, "hadamard", 2, None, "cpu"),
                                          tau, backward, "kernel", m)
        total_q, total_k, total_v = total_q + gq.double(), total_k + gk.double(), total_v + gv.double()
        single = single if single is not None else (gq.double() - target_q).norm() / target_q.norm()

    def error(total, target):
        return ((total / seeds - target).norm() / target.norm()).item()

    for total, target in ((total_q, target_q), (total_k, target_k), (total_v, target_v)):
        assert error(total, target) < max(0.05, 3 * single.item() / math.sqrt(seeds))


@needs_kernels
def test_yoso_trains_on_the_kernels_and_is_deterministic_in_eval():
    attn = attention_zoo.build("yoso", num_heads=2, head_dim=32, max_seq_len=64, num_hashes=8).eval()
    q, k, v = (torch.randn(2, 2, 50, 32) for _ in range(3))
    torch.testing.assert_close(attn(q, k, v, None), attn(q, k, v, None))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert attn(q.bfloat16(), k.bfloat16(), v.bfloat16(), None).dtype == torch.bfloat16


def test_lra_train_runs_yoso_and_star_yoso_with_their_paper_labels(tmp_path, data_dir):
    from conftest import SMALL_LISTOPS
    from helpers import train_in_process

    records = [train_in_process(tmp_path / backward, "task=listops", "attention=yoso", "attention.num_hashes=16",
                                f"attention.backward={backward}", "trainer=smoke", "trainer.max_steps=4",
                                "trainer.eval_every=2", "trainer.progress_bar=false", f"data_dir={data_dir}",
                                *SMALL_LISTOPS)
               for backward in ("lower_bound", "exact")]
    assert sorted(r["label"] for r in records) == ["*YOSO-16", "YOSO-16"]
    assert all(r["status"] == "completed" and r["steps"] == 4 for r in records), records


@needs_kernels
def test_lra_text_shapes_never_hold_every_hash_table_at_once():
    """batch·heads 64, m = 32, τ = 12, n = 4096, d = 32: all 2,048 tables at once would be 1 GiB
    (4 GiB with the backward's 4 channels); forward + backward must stay well under that."""
    from lra.benchmarks.attention_memory import measure_in_subprocess

    row = measure_in_subprocess("yoso", n=4096, device="cpu", heads=64, head_dim=32)
    assert row.get("peak_mb") is not None, row
    assert row["peak_mb"] < 700, row


@needs_kernels
@pytest.mark.parametrize("batch, n, d, dv, m, tau", [(3, 37, 24, 24, 16, 6), (2, 61, 32, 40, 32, 8),
                                                      (2, 129, 64, 64, 5, 12), (7, 24, 8, 8, 3, 2)])
def test_exact_weight_backward_equals_a_dense_float64_reference(batch, n, d, dv, m, tau):
    """The default backward (colliding pairs from the sorted codes, heavy buckets through tables) in
    the CPU kernel and the PyTorch path equals the same estimator written densely in float64 from the
    collision fractions C: ∇Q = (τ/2) (C ⊙ ∇Y Vᵀ ⊙ w) K, ∇K its transpose against Q, ∇V = w ⊙ Cᵀ∇Y.
    τ = 2 puts most tokens in a few buckets: the heavy-bucket tables are taken there."""
    q, k, v, grad, mask = problem(batch, n, d, dv, seed=3)
    draws = draw(batch, d, dv, m, tau, "hadamard", dv, torch.Generator().manual_seed(1), "cpu")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "kernel") for x in (q, k))
    fraction = (codes_q[:, :, :, None] == codes_k[:, :, None, :]).double().mean(1)  # [B, nq, nk]: C of eq. 2
    c, g, vv, kk, qq, w = (t.double() for t in (fraction, grad, v, k, q, mask))
    weights = c * (g @ vv.transpose(1, 2)) * w[:, None, :] * (tau / 2)
    reference = (weights @ kk, weights.transpose(1, 2) @ qq, w[..., None] * (c.transpose(1, 2) @ g))
    for engine in ("kernel", "torch"):
        ours = ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, engine, workspace_bytes=2**16)
        for name, mine, exact in zip(("grad_q", "grad_k", "grad_v"), ours, reference):
            torch.testing.assert_close(mine.double(), exact, rtol=1e-5, atol=1e-5, msg=lambda m: f"{engine} {name}: {m}")
