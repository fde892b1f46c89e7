"""YOSO's bfloat16 rows (``attention.bf16_rows``): the rows the estimator reads (v; unit q and k, v and ∇Y in
the backward) rounded to bfloat16, every sum in float32. The CUDA kernels read them as bfloat16 (emulated
here on the CPU: the values widened exactly, so the deterministic path gives the float32 path's bits on the
rounded rows, in fewer bytes); every engine computes the same estimator; its error against float32 rows
stays within the rounding's closed-form bound, and is far below the estimator's own sampling noise."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from attention_zoo import _yoso_ops as ops
from attention_zoo.options import InvalidOption
from attention_zoo.yoso import YosoAttention, YosoOptions
from simt import emulation
from test_cuda_emulation import backward_arrays, problem, seed_of

# bfloat16 keeps 8 significant bits: rounding to nearest moves a value by at most 2^-8 of itself (relative).
UNIT = 2.0**-8


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x rounded to bfloat16 and widened back to float32: the values the kernels read."""
    return x.to(torch.bfloat16).float()

EMULATED = [  # batch·heads, n, head_dim, value_dim, hashes, τ, correlation of q and k
    (2, 37, 24, 24, 8, 6, 1.0),  # the generic team: a bfloat16 load a coordinate
    (1, 70, 32, 32, 4, 10, 1.0),  # 8-lane teams, four bfloat16s a load; the atomic tables in 4 slices
    (2, 90, 8, 8, 3, 2, 3.0),  # heavy buckets: their tables' outer products read the rows
    (2, 23, 16, 16, 4, 20, 1.0),  # τ = 20: the atomic rows in global memory (scatter_rows' scalar loads)
]


def row_kernel(op: str, deterministic: int, heavy: bool):
    """A kernel that reads the rows on this path (heavy buckets: only their tables do), or None."""
    if op == "exact_backward":
        return "heavy_tables_kernel" if heavy else "query_gradients_kernel" if deterministic else "scatter_pairs_kernel"
    return "bucket_rows_kernel" if deterministic else None  # (atomic: the tables' kernel reads the lists' tokens too)


@pytest.mark.skipif(shutil.which("c++") is None or bool(emulation.toolchain_lacks("asan")),
                    reason="no C++ compiler with AddressSanitizer")
@pytest.mark.parametrize("shape", EMULATED, ids=lambda s: "x".join(map(str, s[:6])))
def test_emulated_kernels_read_bfloat16_rows_as_the_float32_rows_of_their_values(shape):
    """The CUDA kernels given bfloat16 rows equal the same kernels given those values as float32: bit for bit
    on the deterministic path (one order of the same float32 sums), to rounding on the atomic one (arrival
    order), on both cumulation paths and the backward, and the kernels that read the rows load fewer bytes."""
    *dims, correlation = shape
    batch, n, d, dv, m, tau = dims
    q, k, v, grad, mask, _, codes_q, codes_k = problem(*dims, correlation=correlation)
    same_values = {name: rounded(x) for name, x in (("q", q), ("k", k), ("v", v), ("grad", grad))}
    bits = {name: emulation.bf16_bits(x) for name, x in same_values.items()}
    assert not torch.equal(same_values["v"], v)  # the rounding does move the values
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": dv, "d": d, "workspace_bytes": 2**20}
    ones = torch.ones(batch, 1, 1, n)
    forward = {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "weight_q": ones.numpy(),
               "weight_k": mask[:, None, None].numpy()}
    float_backward = backward_arrays(codes_q, codes_k, *(same_values[x] for x in ("q", "k", "v")), mask,
                                     same_values["grad"])
    for deterministic in (1, 0):
        ints = {**sizes, "p": 1, "mq": 1, "mk": 1, "deterministic": deterministic,
                "seed": seed_of(shape, deterministic)}
        runs = {"cumulation": [emulation.run("asan", "cumulation", {**forward, "values": values}, ints)
                               for values in (same_values["v"].numpy(), bits["v"])],
                "exact_backward": [emulation.run("asan", "exact_backward", arrays, ints)
                                   for arrays in (float_backward, {**float_backward, **bits})]}
        for op, (as_float, as_bf16) in runs.items():
            for output, expected in as_float.outputs.items():
                what = f"{op} {output}, deterministic={deterministic}"
                if deterministic:
                    np.testing.assert_array_equal(as_bf16.outputs[output], expected, err_msg=what)
                else:
                    np.testing.assert_allclose(as_bf16.outputs[output], expected, rtol=1e-5, atol=1e-6, err_msg=what)
            kernel = row_kernel(op, deterministic, heavy=correlation > 1)
            if kernel is not None:
                assert as_bf16.traffic(kernel)[0] < as_float.traffic(kernel)[0], (op, kernel)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
def test_the_kernels_round_to_bfloat16_bit_for_bit_as_torch_does():
    """yoso::rounded_bf16 (the unit rows the CUDA backward makes) against torch's rounding on the CPU: ties to
    even both ways, the largest floats to infinity, infinities, zeros of both signs, subnormals, NaNs (to a NaN),
    and a million random bit patterns."""
    ties = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130 + 2**-138]  # halfway: to the even neighbour
    special = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.4028234663852886e38, -3.4028234663852886e38,
               1e-45, -1e-45, 1.1754942e-38, 2**-126, 1.0, -2.5, 1 + 2**-9, 1 + 2**-7 + 2**-9]
    patterns = np.random.default_rng(0).integers(0, 2**32, size=2**20, dtype=np.uint64).astype(np.uint32)
    x = torch.from_numpy(np.concatenate([np.array(ties + special, np.float32), patterns.view(np.float32)]))
    result = emulation.run("plain", "round_bf16", {"x": x.numpy()}, {})
    expected = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).astype(np.int32)
    nan = torch.isnan(x).numpy()  # (a NaN's bits differ between torch's paths: any bfloat16 NaN)
    got = result.outputs["codes"]
    np.testing.assert_array_equal(got[~nan], expected[~nan])
    assert nan.sum() > 1000 and ((got[nan] & 0x7F80) == 0x7F80).all() and ((got[nan] & 0x7F) != 0).all()


def unit_problem(batch=3, n=96, d=32, dv=32, m=16, tau=5, seed=0):
    """Unit rows, values, a gradient and codes with several keys in most buckets (τ = 5, n = 96)."""
    q, k, v, grad, mask, _, codes_q, codes_k = problem(batch, n, d, dv, m, tau, seed=seed)
    return q, k, v, grad, mask, codes_q, codes_k


@pytest.mark.parametrize("engine", ["torch", "kernel"])
def test_bfloat16_rows_stay_within_the_rounding_bound_of_the_float32_estimator(engine):
    """Given the same codes, each output of the estimator on bfloat16 rows is within the rounding's bound of the
    float32 one: a product of r rounded factors moves by at most (1 + 2^-8)^r - 1 of itself, so the forward's
    Y (one rounded factor, v) by 2^-8 · (1/m) Σ |v_j| and ∇Q, ∇K (three: g, v and k or q) by
    ((1 + 2^-8)^3 - 1) · (τ/2m) Σ |w_j| (|g_i|·|v_j|) |k_j| (the estimator on absolute values, in float64), ∇V
    (one: g) by 2^-8 · its own sum of |g|; plus float32 rounding. And the bound is not vacuous: the largest
    error reaches a twentieth of it."""
    q, k, v, grad, mask, codes_q, codes_k = unit_problem()
    tau, slack = 5, 1e-6
    ones = torch.ones(q.shape[0], 1, 1, q.shape[1])
    forward = [ops.cumulation(codes_q, codes_k, ones, mask[:, None, None], v, tau, engine, bf16_rows=bf16)
               for bf16 in (False, True)]
    bound = ops.cumulation_torch(codes_q, codes_k, ones.double(), mask[:, None, None].double(), v.abs().double(), tau)
    backward = [ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, engine, bf16_rows=bf16)
                for bf16 in (False, True)]
    bounds = ops.exact_weight_backward_torch(codes_q, codes_k, *(x.abs().double() for x in (q, k, v)), mask.double(),
                                             grad.abs().double(), tau)
    cases = [("Y", forward[0], forward[1], bound, UNIT)]
    cases += [(name, full, with_bf16, b, (1 + UNIT) ** (1 if name == "∇V" else 3) - 1)
              for name, full, with_bf16, b in zip(("∇Q", "∇K", "∇V"), *backward, bounds)]
    for name, full, with_bf16, absolute, factor in cases:
        error = (with_bf16.double() - full.double()).abs()
        allowed = (factor + slack) * absolute + 1e-12
        assert (error <= allowed).all(), (name, float((error / allowed).max()))
        assert float((error / allowed).max()) > 0.05, name


@pytest.mark.parametrize("engine", ["torch", "kernel"])
def test_off_the_cuda_kernels_bfloat16_rows_are_the_float32_estimator_on_the_rounded_rows(engine):
    """On the CPU every row the estimator reads is rounded, and nothing else: the forward is the float32 one on
    rounded values, the default backward the float32 one on rounded unit q, k, v and ∇Y, bit for bit; with rows
    of any length, on the rounded unit rows of the rows given, pulled back through the float32 normalization."""
    from attention_zoo._common import gradients_through_unit_rows

    q, k, v, grad, mask, codes_q, codes_k = unit_problem()
    tau = 5
    ones = torch.ones(q.shape[0], 1, 1, q.shape[1])
    assert torch.equal(ops.cumulation(codes_q, codes_k, ones, mask[:, None, None], v, tau, engine, bf16_rows=True),
                       ops.cumulation(codes_q, codes_k, ones, mask[:, None, None], rounded(v), tau, engine))
    got = ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, engine, bf16_rows=True)
    want = ops.exact_weight_backward(codes_q, codes_k, *map(rounded, (q, k, v)), mask, rounded(grad), tau, engine)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    long_q, long_k = q * torch.linspace(0.5, 3, q.shape[1])[:, None], k * 2.5
    got = ops.exact_weight_backward(codes_q, codes_k, long_q, long_k, v, mask, grad, tau, engine, normalize=True,
                                    bf16_rows=True)
    want = gradients_through_unit_rows(long_q, long_k, lambda unit_q, unit_k: ops.exact_weight_backward(
        codes_q, codes_k, rounded(unit_q), rounded(unit_k), rounded(v), mask, rounded(grad), tau, engine))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_every_engine_computes_the_same_estimator_on_bfloat16_rows():
    """The CPU kernels (which read float32) and the PyTorch path agree on bfloat16 rows to float32 rounding,
    through the module (unit rows made from the rows given, then rounded) as through the operators; and a
    CPU kernel given bfloat16 rows directly refuses them with one line saying who widens them."""
    from attention_zoo import _yoso_build

    try:
        extension = _yoso_build.load("cpu")
    except _yoso_build.KernelUnavailable as error:
        pytest.skip(str(error))
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 32, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 64, dtype=torch.bool)
    results = []
    for impl in ("torch", "cpu"):
        module = YosoAttention(2, 32, 64, YosoOptions(num_hashes=8, impl=impl, bf16_rows=True))
        torch.manual_seed(1)
        y = module(q, k, v, mask)
        results.append((y, *torch.autograd.grad(y.square().sum(), (q, k, v))))
    for torch_path, kernel in zip(*results):
        torch.testing.assert_close(kernel, torch_path, rtol=1e-4, atol=1e-5)
    codes = torch.zeros(1, 1, 4, dtype=torch.int32)
    widened_here = "the CPU kernels read float32 rows; attention_zoo widens bfloat16 ones"
    with pytest.raises(RuntimeError, match=f"values must be float32 \\({widened_here}\\), got BFloat16"):
        extension.cumulation(codes, codes, torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4),
                             torch.ones(1, 4, 8, dtype=torch.bfloat16), 3, 2**20)


def test_bfloat16_rows_move_a_training_gradient_far_less_than_the_hashes_do():
    """Measured at a ListOps-like call (head dim 32, m = 32, τ = 8, the same random draws): the relative error
    of the output and of ∇q, ∇k, ∇v from bfloat16 rows is ~2^-8 or less, at least 10× below the spread between
    two draws of the hashes (the estimator's own noise, which training already averages over)."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(4, 2, 256, 32, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 256, dtype=torch.bool)

    def run(bf16_rows, draw_seed):
        module = YosoAttention(2, 32, 256, YosoOptions(num_hashes=32, hash_code_len=8, impl="torch",
                                                      bf16_rows=bf16_rows))
        torch.manual_seed(draw_seed)
        y = module(q, k, v, mask)
        return [y.detach(), *torch.autograd.grad((y * torch.linspace(-1, 1, 32)).sum(), (q, k, v))]

    def relative(a, b):
        return float((a - b).norm() / b.norm())

    full, rounded, other_draw = run(False, 1), run(True, 1), run(False, 2)
    for name, x, y, z in zip(("Y", "∇q", "∇k", "∇v"), full, rounded, other_draw):
        rounding, sampling = relative(y, x), relative(z, x)
        assert 0 < rounding < 2 * UNIT, (name, rounding)
        assert rounding * 10 < sampling, (name, rounding, sampling)


def test_bfloat16_rows_are_an_option_of_the_lower_bound_backward_only():
    assert YosoOptions(bf16_rows=True).bf16_rows
    assert YosoOptions(bf16_rows=True, backward_projections=8).bf16_rows
    for backward in ("exact", "exact_collided", "expectation"):
        with pytest.raises(InvalidOption, match=f"false with backward={backward} \\(bfloat16 rows are read by"):
            YosoOptions(bf16_rows=True, backward=backward)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("head_dim", [32, 24], ids=["team-of-8", "generic-team"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["sorted", "atomic"])
def test_cuda_kernels_read_bfloat16_rows_as_the_float32_rows_of_their_values(deterministic, head_dim):
    """On the GPU: the kernels given bfloat16 rows (as bf16_rows passes them) equal the kernels given the same
    values in float32, bit for bit on the sorted path, to rounding on the atomic one, and the PyTorch path's
    estimator on the same rows (τ = 8: light buckets; τ = 12: the atomic forward's tables in slices)."""
    from lra.determinism import deterministic_algorithms

    for tau in (8, 12):
        q, k, v, grad, mask, codes_q, codes_k = (x.cuda() for x in unit_problem(4, 300, head_dim, head_dim, 8, tau,
                                                                               seed=tau))
        ones = torch.ones(4, 1, 1, 300, device="cuda")

        def call(bf16_rows, q, k, v, grad, engine="kernel"):
            return (ops.cumulation(codes_q, codes_k, ones, mask[:, None, None], v, tau, engine, bf16_rows=bf16_rows),
                    *ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, engine,
                                               bf16_rows=bf16_rows))

        with deterministic_algorithms(deterministic):
            as_bf16, as_float = call(True, q, k, v, grad), call(False, *map(rounded, (q, k, v, grad)))
        reference = call(True, q, k, v, grad, engine="torch")
        for got, same_values, want in zip(as_bf16, as_float, reference):
            assert got.dtype == torch.float32
            if deterministic:
                assert torch.equal(got, same_values)
            else:
                torch.testing.assert_close(got, same_values, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(1.0, want.abs().max().item()))
        # Rows of any length: the kernels make (and round) the unit rows themselves; a unit row whose norm differs
        # in its last float32 bit from PyTorch's may round to the other bfloat16 neighbour
        lengths = torch.rand(4, 300, 1, device="cuda") * 5 + 0.1
        with deterministic_algorithms(deterministic):
            fused = ops.exact_weight_backward(codes_q, codes_k, q * lengths, k, v, mask, grad, tau, "kernel",
                                              normalize=True, bf16_rows=True)
        around = ops.exact_weight_backward(codes_q, codes_k, q * lengths, k, v, mask, grad, tau, "torch",
                                           normalize=True, bf16_rows=True)
        for got, want in zip(fused, around):
            assert ((got - want).abs() <= 2**-7 * want.abs().amax(-1, keepdim=True) + 1e-30).all()
        # and the kernels did round the unit rows they made: far nearer that than the float32 unit rows' result
        from attention_zoo._common import gradients_through_unit_rows

        unrounded = gradients_through_unit_rows(q * lengths, k, lambda uq, uk: ops.exact_weight_backward_torch(
            codes_q, codes_k, uq, uk, rounded(v), mask, rounded(grad), tau))
        for got, want, other in zip(fused[:2], around[:2], unrounded[:2]):
            assert (got - want).norm() < 0.25 * (other - want).norm()
