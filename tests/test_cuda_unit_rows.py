"""The CUDA kernels of unit rows (yoso_cuda_rows.cu), emulated on the CPU. The default backward on rows of any
length: the unit rows made on the device in one launch for both sides (float32, or rounded to bfloat16 as torch
rounds), the estimator taken on them, its gradients pulled back through x ↦ x / max(‖x‖, eps) in one more
launch, in place; equal to the PyTorch path, which normalizes around the estimator in ~20 launches. The output's
normalization: one side, a launch each way, equal to F.normalize and its gradient. A zero row and a row shorter
than eps included (divided by eps, as F.normalize does)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from attention_zoo import _yoso_ops as ops
from attention_zoo._common import UNIT_ROWS_EPS, gradients_through_unit_rows
from simt import emulation
from test_cuda_emulation import backward_arrays, problem, seed_of
from test_yoso_bf16_rows import rounded

pytestmark = pytest.mark.skipif(shutil.which("c++") is None or bool(emulation.toolchain_lacks("asan")),
                                reason="no C++ compiler with AddressSanitizer")

SHAPES = [  # batch·heads, n, head_dim, value_dim, hashes, τ, correlation of q and k
    (2, 37, 24, 24, 8, 6, 1.0),  # the generic team
    (1, 70, 32, 32, 4, 10, 1.0),  # 8-lane teams: float4 rows, four bfloat16s to a store
    (2, 90, 8, 8, 3, 2, 3.0),  # heavy buckets: their tables read the unit rows the device made
]


def rows_of_any_length(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Unit rows scaled to lengths from 1e-3 to 1e3, with a zero row."""
    g = torch.Generator().manual_seed(seed)
    x = x * torch.exp(torch.empty(*x.shape[:2], 1).uniform_(-7, 7, generator=g))
    x[0, 0] = 0.0
    return x


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_the_kernels_normalize_the_rows_themselves_as_the_pytorch_path_does(shape):
    *dims, correlation = shape
    batch, n, d, dv, m, tau = dims
    unit_q, unit_k, v, grad, mask, _, codes_q, codes_k = problem(*dims, correlation=correlation)
    q, k = rows_of_any_length(unit_q, 1), rows_of_any_length(unit_k, 2)
    # A query shorter than eps (half of it: divided by eps, a unit row of length 0.5, its gradient
    # (g − y(g·y)·0) / eps) in key 2's buckets under every hash (key 2 kept), so that its gradient is not 0
    q[-1, 1], codes_q[-1, :, 1], mask[-1, 2] = unit_k[-1, 2] * (0.5 * UNIT_ROWS_EPS), codes_k[-1, :, 2], 1.0
    arrays = backward_arrays(codes_q, codes_k, q, k, v, mask, grad)

    # The bf16 backward with float32 unit rows: what the kernels would give had they not rounded theirs
    unrounded_units = gradients_through_unit_rows(q, k, lambda uq, uk: ops.exact_weight_backward_torch(
        codes_q, codes_k, uq, uk, rounded(v), mask, rounded(grad), tau))
    for bf16 in (False, True):
        reference = ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, "torch", normalize=True,
                                              bf16_rows=bf16)
        for deterministic in (1, 0):
            rows = {**arrays, **({"v": emulation.bf16_bits(v), "grad": emulation.bf16_bits(grad)} if bf16 else {})}
            result = emulation.run("asan", "exact_backward", rows,
                                   {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "d": d, "dv": dv,
                                    "workspace_bytes": 2**20, "deterministic": deterministic, "normalize": 1,
                                    "bf16_units": int(bf16), "seed": seed_of(shape, bf16, deterministic)},
                                   {"eps": UNIT_ROWS_EPS})
            kernels = [kernel.split("<")[0] for kernel in result.kernels()]
            assert kernels[0] == "unit_rows_kernel" and kernels[-1] == "through_unit_rows_kernel", kernels
            assert kernels.count("unit_rows_kernel") == kernels.count("through_unit_rows_kernel") == 1
            for name, expected in zip(("grad_q", "grad_k", "grad_v"), reference):
                got = result.outputs[name].astype(np.float64).reshape(expected.shape)
                want = expected.double().numpy()
                # bfloat16: a unit row whose norm differs in its last float32 bit may round to the other neighbour
                scale = np.abs(want).max(axis=-1, keepdims=True) + 1e-30
                tolerance = 2**-7 if bf16 else 1e-5
                assert (np.abs(got - want) <= tolerance * scale).all(), (name, bf16, deterministic,
                                                                         float((np.abs(got - want) / scale).max()))
            # the row shorter than eps, from the kernels: ~1/eps times the others'
            assert np.abs(result.outputs["grad_q"].reshape(batch, n, d)[-1, 1]).max() > 1e9
            if bf16:  # the kernels did round the unit rows they made: far nearer the rounded reference than not
                got = np.concatenate([result.outputs[x] for x in ("grad_q", "grad_k")])
                rounded_ref, unrounded = (np.concatenate([t[0].numpy().reshape(-1), t[1].numpy().reshape(-1)])
                                          for t in (reference, unrounded_units))
                assert np.linalg.norm(got - rounded_ref) < 0.25 * np.linalg.norm(unrounded - rounded_ref)


@pytest.mark.parametrize("width", [16, 32, 64, 128, 24], ids=lambda w: f"width{w}")
def test_the_output_is_normalized_in_one_launch_each_way_as_f_normalize(width):
    """N-YOSO's output on the CUDA kernels (emulated): its unit rows and norms in one launch of one grid row, and
    the gradient pulled back through them in one more, reading the unit rows it made; equal to F.normalize and
    its autograd gradient (float64), on rows 1e-3 … 1e3 long, a zero row and a row shorter than eps. Every team
    layout: 4, 8, 16 and 32 lanes of float4 rows, the generic team."""
    g = torch.Generator().manual_seed(width)
    x = rows_of_any_length(torch.nn.functional.normalize(torch.randn(3, 41, width, generator=g), dim=-1), seed=width)
    x[1, 5] *= 0.5 * UNIT_ROWS_EPS  # shorter than eps: divided by eps
    incoming = torch.randn(3, 41, width, generator=g)
    rows = {"rows": 3 * 41, "width": width, "seed": seed_of("output", width)}
    made = emulation.run("asan", "unit_rows", {"x": x.numpy()}, rows, {"eps": UNIT_ROWS_EPS})
    pulled = emulation.run("asan", "through_unit_rows", {"unit": made.outputs["unit"], "norms": made.outputs["norms"],
                                                         "incoming": incoming.numpy()}, rows, {"eps": UNIT_ROWS_EPS})
    for result, kernel in ((made, "unit_rows_kernel"), (pulled, "through_unit_rows_kernel")):
        assert [(launch.kernel.split("<")[0], launch.grid[1]) for launch in result.launches] == [(kernel, 1)]

    leaf = x.double().requires_grad_()
    unit = torch.nn.functional.normalize(leaf, dim=-1)
    (expected_grad,) = torch.autograd.grad(unit, leaf, incoming.double())
    checks = (("unit", unit.detach(), 1e-6), ("norms", leaf.detach().norm(dim=-1), 1e-6),
              ("grad", expected_grad, 1e-5))
    for name, expected, tolerance in checks:
        result = made if name != "grad" else pulled
        got = torch.from_numpy(result.outputs[name].astype(np.float64)).reshape(expected.shape)
        wide = expected if expected.dim() == 3 else expected[..., None]
        row_scale = wide.abs().amax(-1, keepdim=True) + 1e-300  # per row: the short row's gradient is ~1e12
        assert ((got - expected).abs().reshape(wide.shape) <= tolerance * row_scale).all(), name
    assert np.abs(pulled.outputs["grad"].reshape(3, 41, width)[1, 5]).max() > 1e9  # (g − y (g·y)·0) / eps
    assert np.array_equal(pulled.outputs["grad"].reshape(3, 41, width)[0, 0], incoming[0, 0].numpy() / UNIT_ROWS_EPS)


def test_the_output_kernels_keep_a_nan_row_nan_and_give_rows_without_coordinates_norm_0():
    """A NaN in a row makes its unit row and norm NaN, as F.normalize and the CPU kernels' max(‖x‖, eps) give
    (fmaxf would divide the row by eps), and the gradient through it NaN; rows of width 0: every norm 0, no
    launch."""
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    x[0, 1, 3] = float("nan")
    rows = {"rows": 10, "width": 32}
    made = emulation.run("asan", "unit_rows", {"x": x.numpy()}, rows, {"eps": UNIT_ROWS_EPS})
    expected = torch.nn.functional.normalize(x, dim=-1).numpy().reshape(-1)
    np.testing.assert_allclose(made.outputs["unit"], expected, rtol=1e-6, atol=1e-7, equal_nan=True)
    assert np.isnan(made.outputs["norms"][1]) and not np.isnan(np.delete(made.outputs["norms"], 1)).any()
    pulled = emulation.run("asan", "through_unit_rows", {"unit": made.outputs["unit"], "norms": made.outputs["norms"],
                                                         "incoming": np.ones((2, 5, 32), np.float32)}, rows,
                           {"eps": UNIT_ROWS_EPS})
    grad = pulled.outputs["grad"].reshape(10, 32)
    assert np.isnan(grad[1]).all() and not np.isnan(np.delete(grad, 1, axis=0)).any()
    empty = emulation.run("asan", "unit_rows", {"x": np.zeros((2, 5, 0), np.float32)}, {"rows": 10, "width": 0},
                          {"eps": UNIT_ROWS_EPS})
    assert empty.launches == [] and np.array_equal(empty.outputs["norms"], np.zeros(10, np.float32))
