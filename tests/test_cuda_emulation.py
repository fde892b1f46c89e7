"""The CUDA kernels of csrc/yoso run on the CPU, from the very sources nvcc compiles, through the SIMT
layer of csrc/yoso/yoso_simt.h (one host thread per CUDA thread, real barriers, CUDA's launch limits
asserted), under AddressSanitizer (+UBSan) and ThreadSanitizer: equal to the PyTorch path and the CPU
kernels on the kernel tests' shapes, bounded by the workspace, and their global-memory bytes counted."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_zoo import _yoso_ops as ops
from attention_zoo.yoso import draw, hash_codes
from simt import emulation

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")
# A compiler without a sanitizer's runtime skips that variant, saying so (the CI's gcc has both).
VARIANTS = [pytest.param(v, marks=pytest.mark.skipif(bool(emulation.toolchain_lacks(v)),
                                                     reason=emulation.toolchain_lacks(v) or "-"))
            for v in ("asan", "tsan")] if shutil.which("c++") else ["asan", "tsan"]

SHAPES = [  # batch·heads, n, head_dim, value_dim, hashes, τ: the compiled kernels' test shapes, and τ = 20
    (3, 37, 24, 24, 16, 6),
    (2, 61, 32, 40, 32, 8),
    (2, 129, 64, 64, 5, 12),
    (1, 8, 32, 32, 256, 3),
    (2, 23, 16, 16, 4, 20),
]


def problem(batch, n, d, dv, m, tau, seed=0, correlation=1.0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(batch, n, d, generator=g), dim=-1)
    k = F.normalize(correlation * q + F.normalize(torch.randn(batch, n, d, generator=g), dim=-1), dim=-1)
    v, grad = torch.randn(batch, n, dv, generator=g), torch.randn(batch, n, dv, generator=g)
    mask = (torch.rand(batch, n, generator=g) > 0.25).float()
    mask[:, 0] = 1
    torch.manual_seed(seed + 1)
    draws = draw(batch, d, dv, m, tau, "hadamard", dv, None, "cpu")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "torch") for x in (q, k))
    return q, k, v, grad, mask, draws, codes_q, codes_k


def close(emulated, reference, what):
    reference = reference.double().numpy().reshape(-1)
    scale = max(1.0, float(np.abs(reference).max()))
    np.testing.assert_allclose(emulated.astype(np.float64), reference, rtol=1e-4, atol=2e-5 * scale, err_msg=what)


def dims(batch, n, m, tau):
    return {"B": batch, "m": m, "tau": tau}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_emulated_kernels_equal_the_pytorch_path_and_the_cpu_kernels(variant, shape):
    batch, n, d, dv, m, tau = shape
    q, k, v, grad, mask, draws, codes_q, codes_k = problem(*shape)
    size = draws.diagonals.shape[3]
    hashed = emulation.run(variant, "fast_hash", {"x": q.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": d, "R": draws.diagonals.shape[1], "P": size, "m": m, "tau": tau})
    np.testing.assert_array_equal(hashed.outputs["codes"], codes_q.numpy().reshape(-1))  # bit for bit

    both = {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy()}
    sizes = {**dims(batch, n, m, tau), "nq": n, "nk": n, "dv": dv}
    ones = torch.ones(batch, 1, 1, n)
    # Chunked tables: every (batch, hash) pair its own chunk where there are few, else about 3 chunks.
    chunked = 1 if batch * m <= 64 else n * dv * 4 * math.ceil(batch * m / 3)
    minimum = 2 * dv * d // (dv + 2 * d) + 1  # heavy_side_minimum: a table slot per this many positions
    tables_per_pair = 4 * math.ceil(n / minimum) * dv * (2 * d + 1)
    chunked_backward = 1 if batch * m <= 64 else tables_per_pair * math.ceil(batch * m / 3)
    for p, weight_q, weight_k, workspace in (
            (1, ones, mask[:, None, None], 2**24),  # the forward: one channel, one chunk
            (1, ones, mask[:, None, None], chunked),
            (4, torch.randn(batch, m, 4, n), torch.randn(batch, m, 4, n) * mask[:, None, None], 2**24)):  # projections
        out = emulation.run(variant, "cumulation", {**both, "weight_q": weight_q.numpy(), "weight_k": weight_k.numpy(),
                                                    "values": v.numpy()},
                            {**sizes, "p": p, "mq": weight_q.shape[1], "mk": weight_k.shape[1], "workspace_bytes": workspace})
        reference = ops.cumulation_torch(codes_q, codes_k, weight_q, weight_k, v, tau)
        close(out.outputs["out"], reference, f"cumulation p={p} workspace={workspace}")
        close(out.outputs["out"], ops.cumulation(codes_q, codes_k, weight_q, weight_k, v, tau, "kernel"), "vs the CPU kernel")

    arrays = {**both, "q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "key_weight": mask.numpy(), "grad": grad.numpy()}
    for workspace in (2**24, chunked_backward):
        backward = emulation.run(variant, "exact_backward", arrays, {**sizes, "d": d, "workspace_bytes": workspace})
        torch_path = ops.exact_weight_backward_torch(codes_q, codes_k, q, k, v, mask, grad, tau)
        cpu_kernel = ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, "kernel")
        for name, expected, cpu in zip(("grad_q", "grad_k", "grad_v"), torch_path, cpu_kernel):
            close(backward.outputs[name], expected, f"{name}, workspace {workspace}")
            close(backward.outputs[name], cpu, f"{name} vs the CPU kernel")

    pairs = emulation.run(variant, "pair_gradient",
                          {"codes_s": codes_q.numpy(), "codes_o": codes_k.numpy(), "a": q.numpy(), "o": k.numpy(),
                           "s": grad.numpy(), "w": v.numpy(), "mask_o": mask.numpy()},
                          {**dims(batch, n, m, tau), "ns": n, "no": n, "d": d, "dv": dv}, {"clamp": 0.99})
    close(pairs.outputs["out"], ops.pair_gradient_torch(codes_q, codes_k, q, k, grad, v, mask, tau, 0.99),
          "pair gradient")


@pytest.mark.parametrize("variant", VARIANTS)
def test_emulated_backward_takes_heavy_buckets_through_their_tables(variant):
    """τ = 2 and correlated q, k: a few buckets hold most tokens, so the kernels use the d_v × d tables
    (quadratic pairs would be ≥ 14× the table work here) and still equal the pair-by-pair reference."""
    batch, n, d, dv, m, tau = 2, 90, 8, 8, 3, 2
    q, k, v, grad, mask, draws, codes_q, codes_k = problem(batch, n, d, dv, m, tau, correlation=3.0)
    counts = torch.stack([torch.bincount(c, minlength=4) for c in codes_k.reshape(-1, n)])
    assert counts.max() >= 20, counts  # heavy buckets (over 2·8·8 / 24 keys) exist
    arrays = {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
              "key_weight": mask.numpy(), "grad": grad.numpy()}
    backward = emulation.run(variant, "exact_backward", arrays,
                             {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "d": d, "dv": dv, "workspace_bytes": 2**20})
    assert backward.traffic("key_tables_kernel")[1] > 0 and backward.traffic("query_tables_kernel")[1] > 0
    for name, expected in zip(("grad_q", "grad_k", "grad_v"),
                              ops.exact_weight_backward_torch(codes_q, codes_k, q, k, v, mask, grad, tau)):
        close(backward.outputs[name], expected, name)


def test_tau_20_with_head_dim_128_stays_within_the_workspace():
    """2^20 rows per (batch, hash) × d_v would be 512 MiB a table (64 GiB with d_v × d channels);
    compact rows keep every path under a 4 MiB workspace, the emulated CUDA launchers (the workspace
    they ask for, and the driver's peak memory) and the PyTorch path (peak memory, in a subprocess)."""
    batch, n, d, dv, m, tau = 2, 200, 128, 128, 4, 20
    q, k, v, grad, mask, _, codes_q, codes_k = problem(batch, n, d, dv, m, tau)
    assert codes_q.max() >= 2**16  # the codes do use the high bits
    budget = 4 * 2**20
    arrays = {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
              "key_weight": mask.numpy(), "grad": grad.numpy()}
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": dv, "workspace_bytes": budget}
    backward = emulation.run("plain", "exact_backward", arrays, {**sizes, "d": d})
    ones = torch.ones(batch, 1, 1, n)
    forward = emulation.run("plain", "cumulation", {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(),
                                                    "weight_q": ones.numpy(), "weight_k": mask[:, None, None].numpy(),
                                                    "values": v.numpy()}, {**sizes, "p": 1, "mq": 1, "mk": 1})
    for result in (forward, backward):
        assert 0 < result.workspace_floats * 4 <= budget
        assert result.max_rss_kb * 1024 < 64 * 2**20, result.max_rss_kb  # inputs are ~1 MiB; a 2^20-row table 512 MiB
    close(forward.outputs["out"], ops.cumulation_torch(codes_q, codes_k, ones, mask[:, None, None], v, tau), "forward")
    import subprocess
    import sys

    probe = ("import resource, torch, torch.nn.functional as F\n"
             "from attention_zoo import _yoso_ops as ops\n"
             "g = torch.Generator().manual_seed(0)\n"
             f"B, n, d, m, tau, budget = {batch}, {n}, {d}, {m}, {tau}, {budget}\n"
             "codes = torch.randint(0, 2**tau, (B, m, n), generator=g, dtype=torch.int32)\n"
             "q, v = (torch.randn(B, n, d, generator=g) for _ in range(2))\n"
             "w = torch.ones(B, n)\n"
             "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
             "ops.cumulation_torch(codes, codes, torch.ones(B, 1, 1, n), w[:, None, None], v, tau, budget)\n"
             "ops.exact_weight_backward_torch(codes, codes, q, q, v, w, v, tau, budget)\n"
             "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)\n")
    grown = int(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout)
    assert grown < 3 * budget, grown


@pytest.mark.parametrize("grid, block, shared, opt_in, expected", [
    ((1, 65_536, 1), (32, 1, 1), 0, 0, "grid.y or grid.z over 65,535"),
    ((1, 1, 1), (64, 32, 1), 0, 0, "more than 1,024 threads per block"),
    ((1, 1, 1), (32, 1, 1), 64 * 1024, 0, "more dynamic shared memory than the kernel may use"),
    ((1, 1, 1), (32, 1, 1), 64 * 1024, 100 * 1024, None),  # opted in with cudaFuncSetAttribute: allowed
    ((2**31 - 1, 1, 1), (0, 1, 1), 0, 0, "an empty grid or block"),
], ids=["grid.y", "threads", "shared", "shared opt-in", "empty block"])
def test_every_emulated_launch_asserts_cudas_limits(grid, block, shared, opt_in, expected):
    ints = dict(zip(("gx", "gy", "gz"), grid)) | dict(zip(("bx", "by", "bz"), block)) | {"shared": shared,
                                                                                         "opt_in": opt_in}
    result = emulation.run("plain", "probe", {}, ints, check=False)
    if expected is None:
        assert result.returncode == 0 and result.outputs["codes"][0] == 1, result.stderr
    else:
        assert result.returncode != 0 and f"breaks CUDA's limits: {expected}" in result.stderr, result.stderr


def test_the_cost_models_byte_counts_match_the_emulated_kernels():
    """python -m lra.benchmarks.yoso_cost projects the GPU time from each kernel's global loads and
    stores; here its counts (with the bucket statistics of these codes) meet the emulation's, which
    counts every yoso::load/store: exact where nothing is data-dependent, within a few percent where
    the model takes a binary search's average length."""
    from lra.benchmarks import yoso_cost as cost

    batch, n, d, dv, m, tau = 2, 200, 32, 32, 8, 8
    q, k, v, grad, _, draws, codes_q, codes_k = problem(batch, n, d, dv, m, tau, correlation=0.0)
    every = torch.ones(batch, n)
    call = cost.measured(cost.Call(batch, n, d, dv, m, tau), codes_q.numpy(), codes_k.numpy())
    hashed = emulation.run("plain", "fast_hash", {"x": q.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": d, "R": draws.diagonals.shape[1], "P": draws.diagonals.shape[3],
                            "m": m, "tau": tau})
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": dv, "workspace_bytes": 2**24}
    forward = emulation.run("plain", "cumulation", {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(),
                                                    "weight_q": torch.ones(batch, 1, 1, n).numpy(),
                                                    "weight_k": every[:, None, None].numpy(), "values": v.numpy()},
                            {**sizes, "p": 1, "mq": 1, "mk": 1})
    backward = emulation.run("plain", "exact_backward", {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(),
                                                         "q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
                                                         "key_weight": every.numpy(), "grad": grad.numpy()},
                             {**sizes, "d": d})
    both_sides = cost.fast_hash(call)  # the model counts q and k; one launch hashes one of them
    assert hashed.traffic("fast_hash_kernel") == (both_sides.loaded / 2, both_sides.stored / 2)
    modelled = cost.bucket_rows(call)
    assert forward.traffic("bucket_rows_kernel") == (modelled.loaded, pytest.approx(modelled.stored))
    tables = np.add(backward.traffic("key_tables_kernel"), backward.traffic("query_tables_kernel"))
    for (loaded, stored), model, tolerance in (
            (forward.traffic("gather_rows_kernel"), cost.gather_rows(call), 0.05),
            (tables, cost.heavy_tables(call), 0.05),
            (backward.traffic("query_gradients_kernel"), cost.token_gradients(call, "query"), 0.05),
            (backward.traffic("key_gradients_kernel"), cost.token_gradients(call, "key"), 0.05)):
        assert loaded == pytest.approx(model.loaded, rel=tolerance), model.kernel
        assert stored == pytest.approx(model.stored, rel=1e-9), model.kernel
