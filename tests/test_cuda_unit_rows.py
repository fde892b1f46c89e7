"""The default backward's CUDA kernels on rows of any length (yoso_cuda_rows.cu), emulated on the CPU: the unit
rows made on the device in one launch for both sides (float32, or rounded to bfloat16 as torch rounds), the
estimator taken on them, its gradients pulled back through x ↦ x / max(‖x‖, eps) in one more launch, in place;
equal to the PyTorch path, which normalizes around the estimator in ~20 launches, a zero row and a row shorter
than eps included (divided by eps, as F.normalize does)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from attention_zoo import _yoso_ops as ops
from attention_zoo._common import UNIT_ROWS_EPS
from simt import emulation
from test_cuda_emulation import backward_arrays, problem, seed_of

pytestmark = pytest.mark.skipif(shutil.which("c++") is None or bool(emulation.toolchain_lacks("asan")),
                                reason="no C++ compiler with AddressSanitizer")

SHAPES = [  # batch·heads, n, head_dim, value_dim, hashes, τ, correlation of q and k
    (2, 37, 24, 24, 8, 6, 1.0),  # the generic team
    (1, 70, 32, 32, 4, 10, 1.0),  # 8-lane teams: float4 rows, four bfloat16s to a store
    (2, 90, 8, 8, 3, 2, 3.0),  # heavy buckets: their tables read the unit rows the device made
]


def rows_of_any_length(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Unit rows scaled to lengths from 1e-3 to 1e3, with a zero row and a row shorter than eps."""
    g = torch.Generator().manual_seed(seed)
    x = x * torch.exp(torch.empty(*x.shape[:2], 1).uniform_(-7, 7, generator=g))
    x[0, 0] = 0.0
    x[-1, 1] = x[-1, 1] * 1e-14  # norm below eps = 1e-12: divided by eps, its gradient g / eps
    return x


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:6])))
def test_the_kernels_normalize_the_rows_themselves_as_the_pytorch_path_does(shape):
    *dims, correlation = shape
    batch, n, d, dv, m, tau = dims
    unit_q, unit_k, v, grad, mask, _, codes_q, codes_k = problem(*dims, correlation=correlation)
    q, k = rows_of_any_length(unit_q, 1), rows_of_any_length(unit_k, 2)
    arrays = backward_arrays(codes_q, codes_k, q, k, v, mask, grad)
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
            tiny = np.abs(reference[0][-1, 1].double().numpy()).max()  # the row shorter than eps: g / eps
            assert tiny == 0 or tiny > 1e6  # (0: none of its buckets holds a key)
