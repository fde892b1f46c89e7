"""The CUDA kernels of csrc/yoso run on the CPU, from the very sources nvcc compiles and through the very
host logic the torch wrapper calls (yoso_cuda_host.cpp, with a CPU stand-in for torch's allocator, sort
and scan), on the SIMT runtime of tests/simt (CUDA threads as fibers, a launch's blocks on two host
threads in a seeded random order, a block's threads interleaved closely or one warp run ahead of the
others, real barriers and warp exchanges, CUDA's launch limits asserted), under AddressSanitizer
(+UBSan) and ThreadSanitizer: equal to the PyTorch path and the CPU kernels on both cumulation paths
(deterministic and atomic), bounded by the workspace, and able to catch a race between blocks, a
missing barrier (before a read or before an overwrite) and a read of shared memory nothing wrote."""

from __future__ import annotations

import math
import shutil
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attention_zoo import _yoso_ops as ops
from attention_zoo.yoso import draw, hash_codes
from lra.benchmarks.yoso_cost.kernels import counting_sort_fits, instance_lanes, table_rows, token_lanes
from simt import emulation

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


def variant(name):
    """A sanitizer variant, skipped (saying why) where the compiler lacks its runtime (the CI's gcc has both)."""
    lacks = emulation.toolchain_lacks(name) if shutil.which("c++") else "no C++ compiler"
    return pytest.param(name, marks=pytest.mark.skipif(bool(lacks), reason=lacks or "-"), id=name)


SHAPES = [  # batch·heads, n, head_dim, value_dim, hashes, τ: every team layout (generic, 16 … 128), τ = 20
    (3, 37, 24, 24, 16, 6),
    (2, 61, 32, 40, 32, 8),
    (2, 129, 64, 64, 5, 12),
    (1, 8, 32, 32, 256, 3),
    (2, 23, 16, 16, 4, 20),
    (1, 1030, 16, 16, 2, 11),  # p = 4: a table of 64 codes a slice, 32 slices a pair
    (2, 50, 16, 16, 3, 9),  # the shared-memory tables in 2 slices a pair
    (1, 70, 32, 32, 2, 10),  # in 4 slices
    (1, 40, 16, 16, 2, 13),  # 32 slices a pair (p = 4: 128, the most), most of them empty
    (1, 45, 128, 128, 3, 5),  # the widest team: 32 lanes of float4 rows
]
# ThreadSanitizer costs ~20x: the shapes that cover the generic team (SHAPES[0]'s, 12 hash pairs, not 48) and a
# templated one, launches of 2 to 128 table slices (a pair's blocks racing on its lists), no shared tables (τ = 20).
RACE_SHAPES = [(2, 37, 24, 24, 6, 6), SHAPES[4], SHAPES[6], SHAPES[7], SHAPES[8]]
CASES = [pytest.param(v.values[0], s, marks=v.marks, id=f"{'x'.join(map(str, s))}-{v.id}")
         for v, shapes in ((variant("asan"), SHAPES), (variant("tsan"), RACE_SHAPES)) for s in shapes]


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


def seed_of(*key) -> int:
    """The emulation's seed for one case (its block and thread orders), different per case."""
    return zlib.crc32(repr(key).encode())


def backward_arrays(codes_q, codes_k, q, k, v, mask, grad):
    return {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
            "key_weight": mask.numpy(), "grad": grad.numpy()}


@pytest.mark.parametrize("name, shape", CASES)
def test_emulated_kernels_equal_the_pytorch_path_and_the_cpu_kernels(name, shape):
    batch, n, d, dv, m, tau = shape
    seed = seed_of(name, shape)
    q, k, v, grad, mask, draws, codes_q, codes_k = problem(*shape)
    hashed = emulation.run(name, "fast_hash", {"x": q.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": d, "R": draws.diagonals.shape[1], "P": draws.diagonals.shape[3],
                            "m": m, "tau": tau, "seed": seed})
    np.testing.assert_array_equal(hashed.outputs["codes"], codes_q.numpy().reshape(-1))  # bit for bit

    both = {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy()}
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": dv, "seed": seed}
    ones = torch.ones(batch, 1, 1, n)
    direct = 2**tau <= 2 * n  # the atomic path's rows: by code (no sort), else by sorted position
    rows = 2**tau if direct else n
    for deterministic in (1, 0):
        rows_here = n if deterministic else rows
        about_three = rows_here * dv * 4 * math.ceil(batch * m / 3)  # chunks of about a third of the pairs
        for p, weight_q, weight_k, workspace in (
                (1, ones, mask[:, None, None], 2**24),  # the forward: one channel, one chunk
                (1, ones, mask[:, None, None], about_three),
                (4, torch.randn(batch, m, 4, n), torch.randn(batch, m, 4, n) * mask[:, None, None], 2**24)):
            out = emulation.run(name, "cumulation", {**both, "weight_q": weight_q.numpy(), "weight_k": weight_k.numpy(),
                                                     "values": v.numpy()},
                                {**sizes, "p": p, "mq": weight_q.shape[1], "mk": weight_k.shape[1],
                                 "workspace_bytes": workspace, "deterministic": deterministic})
            what = f"cumulation p={p} workspace={workspace} deterministic={deterministic}"
            close(out.outputs["out"], ops.cumulation_torch(codes_q, codes_k, weight_q, weight_k, v, tau), what)
            close(out.outputs["out"], ops.cumulation(codes_q, codes_k, weight_q, weight_k, v, tau, "kernel"), what)
            launched = [launch.kernel.split("<")[0] for launch in out.launches]
            if not deterministic and table_rows(tau, p):  # one launch, the tables in shared memory
                assert launched == ["slice_lists_kernel", "table_cumulation_kernel"], what
                continue
            chunks = math.ceil(batch * m / max(1, min(batch * m, workspace // (rows_here * p * dv * 4))))
            kernel = "bucket_rows_kernel" if deterministic else "scatter_rows_kernel"
            assert launched.count(kernel) == chunks

    torch_path = ops.exact_weight_backward_torch(codes_q, codes_k, q, k, v, mask, grad, tau)
    cpu_kernel = ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, "kernel")
    for deterministic in (1, 0):
        backward = emulation.run(name, "exact_backward", backward_arrays(codes_q, codes_k, q, k, v, mask, grad),
                                 {**sizes, "d": d, "workspace_bytes": 2**24, "deterministic": deterministic})
        for output, expected, cpu in zip(("grad_q", "grad_k", "grad_v"), torch_path, cpu_kernel):
            close(backward.outputs[output], expected, f"{output}, deterministic={deterministic}")
            close(backward.outputs[output], cpu, f"{output} vs the CPU kernel, deterministic={deterministic}")
        launched = [launch.kernel.split("<")[0] for launch in backward.launches]
        # Both sides sorted by the counting sort (run starts with it), or by the device's sort, then the run starts
        # of the keys (looked up by code where 2^τ ≤ 2n), and of the queries where deterministic
        sorts = (["counting_sort_kernel"] * 2 if counting_sort_fits(tau, n) else
                 ["run_starts_kernel"] * (2**tau <= 2 * n) * (2 if deterministic else 1))
        assert launched[:len(sorts)] == sorts
        launched = launched[len(sorts):]
        heavy_possible = batch * m * (n // (2 * dv * d // (dv + 2 * d) + 1)) > 0  # a run can reach the minimum
        assert launched[:3] == (["find_heavy_kernel", "number_heavy_kernel", "heavy_tables_kernel"] if heavy_possible
                                else launched[:3] and [k for k in launched[:3] if "heavy" not in k])
        gradients = [k for k in launched if "heavy" not in k or k == "heavy_apply_kernel"]
        assert gradients == (["query_gradients_kernel", "key_gradients_kernel"] if deterministic else
                             ["scatter_pairs_kernel"] + ["heavy_apply_kernel"] * heavy_possible)
        # the templated team (8 coordinates a lane deterministic, 4 atomic), else the generic one
        lanes = token_lanes(d, dv) if deterministic else instance_lanes(d, dv)
        first = next(launch for launch in backward.launches if launch.kernel.split("<")[0] == gradients[0])
        assert first.grid[0] == math.ceil(batch * n * (1 if deterministic else m) * lanes / 128)
        assert (backward.atomics("scatter_pairs_kernel") > 0) == (not deterministic)

    pairs = emulation.run(name, "pair_gradient",
                          {"codes_s": codes_q.numpy(), "codes_o": codes_k.numpy(), "a": q.numpy(), "o": k.numpy(),
                           "s": grad.numpy(), "w": v.numpy(), "mask_o": mask.numpy()},
                          {"B": batch, "m": m, "tau": tau, "ns": n, "no": n, "d": d, "dv": dv, "seed": seed},
                          {"clamp": 0.99})
    close(pairs.outputs["out"], ops.pair_gradient_torch(codes_q, codes_k, q, k, grad, v, mask, tau, 0.99),
          "pair gradient")


@pytest.mark.parametrize("head_dim", [1, 2, 3, 8, 16, 32, 50, 100, 200, 1000, 2100])
def test_emulated_hash_is_bitwise_the_pytorch_paths_for_every_lane_split(head_dim):
    """P = 1 … 32 (one lane a token, every stage in its registers), 64 … 1,024 (32 coordinates a lane, shuffles
    over 2 … 32 lanes), 4,096 (128 coordinates a lane: the token read again each product, the bits gathered in
    shared memory, shuffles a chunk at a time): the transforms pair the same coordinates in the same order as
    the PyTorch path."""
    batch, n, m, tau = (2, 21, 7, 5) if head_dim <= 256 else (1, 3, 7, 2)
    x = torch.randn(batch, n, head_dim, generator=torch.Generator().manual_seed(head_dim))
    torch.manual_seed(head_dim)
    draws = draw(batch, head_dim, head_dim, m, tau, "hadamard", head_dim, None, "cpu")
    hashed = emulation.run("plain", "fast_hash", {"x": x.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": head_dim, "R": draws.diagonals.shape[1],
                            "P": draws.diagonals.shape[3], "m": m, "tau": tau})
    np.testing.assert_array_equal(hashed.outputs["codes"], hash_codes(x, draws, m, tau, "torch").numpy().reshape(-1))


@pytest.mark.parametrize("name", ["plain", variant("tsan")])
@pytest.mark.parametrize("head_dim, hashes", [(8, 20), (32, 70), (64, 150), (2100, 8197)],
                         ids=["P8-3groups", "P32-3groups", "P64-3groups", "P4096-3groups"])
def test_emulated_hash_reuses_its_staged_codes_safely_over_several_groups(name, head_dim, hashes):
    """More hashes than padded coordinates (m > P): a block stages several groups of P codes through one
    shared buffer. Up to P = 32 a lane holds a token and stores its own codes; from P = 64 each is read back by
    other warps than wrote it (P = 64: 2 lanes a token, 64 tokens on 4 warps). Bitwise the PyTorch path's
    codes, and under ThreadSanitizer no read of one group races with the next group's writes (a barrier
    removed between them on purpose was caught by no other test). P = 4,096 gathers each group's bits in
    the staging buffer itself, cleared after the group is stored."""
    batch, n, tau = (2, 40, 3) if head_dim <= 256 else (1, 3, 1)
    x = torch.randn(batch, n, head_dim, generator=torch.Generator().manual_seed(hashes))
    torch.manual_seed(hashes)
    draws = draw(batch, head_dim, head_dim, hashes, tau, "hadamard", head_dim, None, "cpu")
    P = draws.diagonals.shape[3]
    assert hashes > 2 * P  # three groups through the staging buffer
    hashed = emulation.run(name, "fast_hash", {"x": x.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": head_dim, "R": draws.diagonals.shape[1], "P": P, "m": hashes,
                            "tau": tau, "seed": seed_of(name, head_dim)})
    np.testing.assert_array_equal(hashed.outputs["codes"],
                                  hash_codes(x, draws, hashes, tau, "torch").numpy().reshape(-1))


@pytest.mark.parametrize("name", [variant("asan"), variant("tsan")])
def test_emulated_backward_takes_heavy_buckets_through_their_tables(name):
    """τ = 2 and correlated q, k: a few buckets hold most tokens, so the kernels use the d_v × d tables
    (quadratic pairs would be ≥ 14× the table work here) and still equal the pair-by-pair reference, on
    both paths, and with a workspace that holds only 3 tables (the other heavy buckets walked pair by pair)."""
    batch, n, d, dv, m, tau = 2, 90, 8, 8, 3, 2
    q, k, v, grad, mask, draws, codes_q, codes_k = problem(batch, n, d, dv, m, tau, correlation=3.0)
    counts = torch.stack([torch.bincount(c, minlength=4) for c in codes_k.reshape(-1, n)])
    assert counts.max() >= 20, counts  # heavy buckets (over 2·8·8 / 24 keys) exist
    reference = ops.exact_weight_backward_torch(codes_q, codes_k, q, k, v, mask, grad, tau)
    table_bytes = 4 * dv * (2 * d + 1)
    workspaces = (2**20, 3 * table_bytes) if name == "asan" else (2**20,)  # (walking pairs is costly under TSan)
    for deterministic in (1, 0):
        stored = []
        for workspace in workspaces:
            backward = emulation.run(name, "exact_backward", backward_arrays(codes_q, codes_k, q, k, v, mask, grad),
                                     {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "d": d, "dv": dv,
                                      "workspace_bytes": workspace, "deterministic": deterministic,
                                      "seed": seed_of(name, workspace, deterministic)})
            stored.append(backward.traffic("heavy_tables_kernel")[1])
            assert backward.workspace_floats * 4 <= max(workspace, 4)
            for output, expected in zip(("grad_q", "grad_k", "grad_v"), reference):
                close(backward.outputs[output], expected, f"{output}, workspace {workspace}")
            if not deterministic:
                assert backward.atomics("heavy_apply_kernel") > 0
        assert stored[0] > 3 * table_bytes and stored[1:] in ([], [3 * table_bytes])  # every bucket's tables, or 3


def walked_backward_equals_pytorch(codes_q, codes_k, q, k, v, mask, grad, tau, seed):
    """The emulated deterministic backward with no room for heavy tables (every bucket's pairs read from its runs,
    ASan) equals the PyTorch path."""
    (batch, m, n), d = codes_q.shape, q.shape[-1]
    reference = ops.exact_weight_backward_torch(codes_q, codes_k, q, k, v, mask, grad, tau)
    backward = emulation.run(variant("asan").values[0], "exact_backward",
                             backward_arrays(codes_q, codes_k, q, k, v, mask, grad),
                             {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "d": d, "dv": d,
                              "workspace_bytes": 4, "deterministic": 1, "seed": seed})
    assert "heavy_tables_kernel" not in [launch.kernel.split("<")[0] for launch in backward.launches]
    for output, expected in zip(("grad_q", "grad_k", "grad_v"), reference):
        close(backward.outputs[output], expected, output)


@pytest.mark.parametrize("d", [16, 32, 64, 128, 24])
def test_emulated_backward_walks_runs_longer_than_a_team_in_chunks(d):
    """τ = 1 and no room for heavy tables: every bucket is walked pair by pair, its runs of ~50 tokens read a
    team's width of positions at a time (2, 4, 8, 16 and 32 lanes, templated and generic), some chunks holding
    padded keys (weight 0) and the run's end; a chunk too few or a position read twice changes the sums."""
    batch, n, m, tau = 2, 100, 3, 1
    q, k, v, grad, mask, draws, codes_q, codes_k = problem(batch, n, d, d, m, tau)
    lanes = token_lanes(d, d)
    runs = torch.stack([torch.bincount(c, minlength=2) for c in codes_k.reshape(-1, n)])
    assert runs.max() > 1 + lanes and (mask == 0).any()  # a walk past the first chunk, padded keys in runs
    walked_backward_equals_pytorch(codes_q, codes_k, q, k, v, mask, grad, tau, seed_of("chunks", d))


@pytest.mark.parametrize("d", [16, 32, 64, 128, 24])
def test_emulated_backward_walks_runs_ending_at_every_place_in_a_chunk(d):
    """Runs built to end everywhere a chunk of a team's width can: of 1, 2, L, L + 1 (filling the first chunk
    after the bucket's first token, the next chunk empty), L + 2, 2L + 1 and 3 keys, the last one of L + 1 ending
    at n, under two hashes in two orders, 30 % padded keys, some queries in no bucket; equal to the PyTorch path
    on both gradient kernels (a query's run of keys, a key's run of queries)."""
    lanes = token_lanes(d, d)
    lengths = [1, 2, lanes, lanes + 1, lanes + 2, 2 * lanes + 1, 3, lanes + 1]
    n, batch, m, tau = sum(lengths), 2, 2, 5
    g = torch.Generator().manual_seed(d)
    codes_k = torch.empty(batch, m, n, dtype=torch.int32)
    for b in range(batch):
        for h in range(m):
            runs = lengths if h == 0 else lengths[-2::-1] + lengths[-1:]  # the last run, L + 1, at n in both
            codes = torch.cat([torch.full((length,), 3 * i + 1, dtype=torch.int32) for i, length in enumerate(runs)])
            codes_k[b, h] = codes[torch.randperm(n, generator=g)]  # any token order: the sort makes the runs
    used = codes_k.unique()
    codes_q = used[torch.randint(len(used), (batch, m, n), generator=g)].to(torch.int32)
    codes_q[:, :, :3] = 0  # in no bucket
    q, k = (F.normalize(torch.randn(batch, n, d, generator=g), dim=-1) for _ in range(2))
    v, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    mask = (torch.rand(batch, n, generator=g) > 0.3).float()
    walked_backward_equals_pytorch(codes_q, codes_k, q, k, v, mask, grad, tau, seed_of("run ends", d))


def test_deterministic_paths_are_bitwise_the_same_in_any_block_order():
    """The default paths have one writer per output in one order: other block and thread interleavings
    (seeds) give the same bits. The atomic paths agree to rounding."""
    batch, n, d, dv, m, tau = 2, 90, 8, 8, 3, 2
    q, k, v, grad, mask, draws, codes_q, codes_k = problem(batch, n, d, dv, m, tau, correlation=3.0)
    arrays = backward_arrays(codes_q, codes_k, q, k, v, mask, grad)
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "d": d, "dv": dv, "workspace_bytes": 2**20}
    ones = torch.ones(batch, 1, 1, n)
    forward = {"codes_q": arrays["codes_q"], "codes_k": arrays["codes_k"], "weight_q": ones.numpy(),
               "weight_k": mask[:, None, None].numpy(), "values": v.numpy()}
    for deterministic in (1, 0):
        runs = [(emulation.run("plain", "exact_backward", arrays, {**sizes, "deterministic": deterministic, "seed": s}),
                 emulation.run("plain", "cumulation", forward, {**sizes, "p": 1, "mq": 1, "mk": 1,
                                                                "deterministic": deterministic, "seed": s}))
                for s in (1, 2, 3)]
        for backward, out in runs[1:]:
            for output in ("grad_q", "grad_k", "grad_v"):
                if deterministic:
                    np.testing.assert_array_equal(backward.outputs[output], runs[0][0].outputs[output])
                else:
                    np.testing.assert_allclose(backward.outputs[output], runs[0][0].outputs[output], rtol=1e-5,
                                               atol=1e-6)
            if deterministic:
                np.testing.assert_array_equal(out.outputs["out"], runs[0][1].outputs["out"])
            else:
                np.testing.assert_allclose(out.outputs["out"], runs[0][1].outputs["out"], rtol=1e-5, atol=1e-5)


def test_tau_20_with_head_dim_128_stays_within_the_workspace():
    """2^20 rows per (batch, hash) × d_v would be 512 MiB a table (64 GiB with d_v × d channels);
    compact rows keep every path under a 4 MiB workspace, the emulated CUDA host logic (the workspace it
    allocates, and the driver's peak memory) and the PyTorch path (peak memory, in a subprocess)."""
    batch, n, d, dv, m, tau = 2, 200, 128, 128, 4, 20
    q, k, v, grad, mask, _, codes_q, codes_k = problem(batch, n, d, dv, m, tau)
    assert codes_q.max() >= 2**16  # the codes do use the high bits
    budget = 4 * 2**20
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": dv, "workspace_bytes": budget}
    ones = torch.ones(batch, 1, 1, n)
    forward_arrays = {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "weight_q": ones.numpy(),
                      "weight_k": mask[:, None, None].numpy(), "values": v.numpy()}
    for deterministic in (1, 0):
        backward = emulation.run("plain", "exact_backward", backward_arrays(codes_q, codes_k, q, k, v, mask, grad),
                                 {**sizes, "d": d, "deterministic": deterministic})
        forward = emulation.run("plain", "cumulation", forward_arrays,
                                {**sizes, "p": 1, "mq": 1, "mk": 1, "deterministic": deterministic})
        for result in (forward, backward):
            assert result.workspace_floats * 4 <= budget
            assert result.max_rss_kb * 1024 < 64 * 2**20, result.max_rss_kb  # inputs ~1 MiB; a 2^20-row table 512 MiB
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


@pytest.mark.parametrize("name", ["plain", variant("tsan")])
@pytest.mark.parametrize("tau", [9, 10, 13])
def test_every_update_counts_when_the_tokens_collide_on_a_few_codes(name, tau):
    """Every token on one of four codes, one in each quarter of the code space (so in different slices of
    the shared-memory tables where there are several), values and weights 1: each output is the count of
    keys on its query's code averaged over the m = 4 hashes, a multiple of 1/4 the sums hold exactly, compared
    bit for bit. A lost update (a race between blocks adding into one row) changes a count by one."""
    batch, m, n, dv = 2, 4, 120, 8
    g = torch.Generator().manual_seed(tau)
    quarter = 2**tau // 4
    codes = torch.tensor([0, quarter + 1, 2 * quarter + 2, 3 * quarter + 3], dtype=torch.int32)
    codes_q, codes_k = (codes[torch.randint(0, 4, (batch, m, n), generator=g)] for _ in range(2))
    ones, v = torch.ones(batch, 1, 1, n), torch.ones(batch, n, dv)
    expected = ops.cumulation_torch(codes_q, codes_k, ones, ones, v, tau).double().numpy().reshape(-1)
    assert np.array_equal(expected * m, np.round(expected * m)) and expected.max() > 20  # counts, many updates each
    for deterministic in (0, 1):
        out = emulation.run(name, "cumulation", {"codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(),
                                                 "weight_q": ones.numpy(), "weight_k": ones.numpy(), "values": v.numpy()},
                            {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": dv, "p": 1, "mq": 1, "mk": 1,
                             "workspace_bytes": 2**24, "deterministic": deterministic, "seed": seed_of(name, tau)})
        np.testing.assert_array_equal(out.outputs["out"].astype(np.float64), expected, err_msg=f"deterministic={deterministic}")


SORTS = [  # rows, n, τ, how many distinct codes the tokens take (None: any of the 2^τ)
    (2, 1, 0, None),  # one token, one code
    (3, 37, 3, None),  # fewer codes than a block's threads, n short of a warp's multiple
    (2, 300, 8, 2),  # long runs of two codes, several rounds of 128 tokens with a part-round
    (2, 300, 8, 1),  # a single run
    (1, 1030, 11, None),  # the reference setup's τ, n past 1,024
    (2, 77, 13, None),  # the most codes a block's counters hold: runs starts not made (2^τ > 2n)
    (1, 4100, 12, 40),  # 2^τ ≤ 2n: run starts made with the sort
    (1, 8200, 14, None),  # past 48 KB of counters, 2^τ ≤ 2n: the counting sort in the shared memory opted into
    (1, 4100, 14, None),  # past 48 KB, 2^τ > 2n: the device's sort, then launch_run_starts
]


@pytest.mark.parametrize("name", ["plain", variant("asan"), variant("tsan")])
def test_emulated_counting_sort_is_a_stable_sort_with_its_run_starts(name):
    """Each pair's codes sorted as numpy's stable argsort sorts them, bit for bit (ties in token order, in
    any block and thread order), with each code's first sorted position (or -1) where 2^τ ≤ 2n: by one
    launch of the counting sort up to τ = 13 and, with 2^τ ≤ 2n, in an H100's opted-in shared memory up to
    τ = 15; by the device's sort and the run-starts kernel above."""
    rng = np.random.default_rng(7)
    for rows, n, tau, distinct in SORTS:
        if name == "tsan" and n > 2000:
            continue  # the costly shapes once, under AddressSanitizer and plainly
        pool = rng.choice(2**tau, size=distinct, replace=False) if distinct else np.arange(2**tau)
        codes = rng.choice(pool, size=(rows, n)).astype(np.int32)
        result = emulation.run(name, "sort", {"codes": codes}, {"rows": rows, "n": n, "tau": tau, "with_starts": 1,
                                                              "seed": seed_of(name, rows, n, tau)})
        order = np.argsort(codes, axis=1, kind="stable")
        np.testing.assert_array_equal(result.outputs["order"].reshape(rows, n), order)
        np.testing.assert_array_equal(result.outputs["sorted"].reshape(rows, n), np.take_along_axis(codes, order, 1))
        if 2**tau <= 2 * n:
            starts = np.full((rows, 2**tau), -1)
            for row in range(rows):
                present, first = np.unique(codes[row][order[row]], return_index=True)
                starts[row, present] = first
            np.testing.assert_array_equal(result.outputs["starts"].reshape(rows, 2**tau), starts)
        else:
            assert result.outputs["starts"].size == 0
        assert result.kernels() == (["counting_sort_kernel"] if counting_sort_fits(tau, n) else
                                    ["run_starts_kernel"] * (2**tau <= 2 * n))


def test_the_counting_sort_past_48_kb_takes_the_shared_memory_the_device_lets_a_block_opt_into():
    """A pair's 2^14 counters (64 KB and the scan's totals) fit an H100's block (227 KB opted into) but not a
    2080 Ti's (64 KB): the same codes sorted by the counting sort on one and the device's sort on the other,
    bit for bit equal; at τ = 15 the H100's counting sort takes 128 KB. The launch passes the emulation's
    check of its dynamic shared memory only after cudaFuncSetAttribute opted into it."""
    rng = np.random.default_rng(15)
    for rows, n, tau, most_shared_bytes, kernels in [(2, 8200, 14, 227 * 1024, ["counting_sort_kernel"]),
                                                     (1, 8200, 14, 64 * 1024, ["run_starts_kernel"]),
                                                     (1, 16400, 15, 227 * 1024, ["counting_sort_kernel"])]:
        codes = rng.integers(0, 2**tau, size=(rows, n), dtype=np.int32)
        result = emulation.run("plain", "sort", {"codes": codes}, {"rows": rows, "n": n, "tau": tau, "with_starts": 1,
                                                                   "most_shared_bytes": most_shared_bytes, "seed": tau})
        order = np.argsort(codes, axis=1, kind="stable")
        np.testing.assert_array_equal(result.outputs["order"].reshape(rows, n), order)
        np.testing.assert_array_equal(result.outputs["sorted"].reshape(rows, n), np.take_along_axis(codes, order, 1))
        for row, starts in enumerate(result.outputs["starts"].reshape(rows, 2**tau)):
            present, first = np.unique(codes[row][order[row]], return_index=True)
            assert (starts[present] == first).all() and (np.delete(starts, present) == -1).all()
        assert result.kernels() == kernels, (n, tau, most_shared_bytes)


@pytest.mark.parametrize("name", [variant("tsan")])
def test_a_race_between_blocks_is_reported(name):
    """Every block adds 1 to one float with a plain read and write: on a GPU a lost update now and then.
    The emulation deals a launch's blocks to two host threads, so ThreadSanitizer sees the race (one
    host thread running the blocks in turn, as before, saw none)."""
    result = emulation.run(name, "racing_blocks", {}, {"blocks": 8}, check=False)
    assert result.returncode != 0 and "WARNING: ThreadSanitizer: data race" in result.stderr, result.stderr[-2000:]
    assert "racing_blocks_kernel" in result.stderr


@pytest.mark.parametrize("name", ["plain", variant("tsan")])
def test_a_missing_barrier_is_caught(name):
    """Each thread reads what its neighbour wrote to shared memory. With the barrier every value arrives;
    without it, threads resumed in a random order read the garbage of slots not yet written (plain), and
    ThreadSanitizer reports the unordered write and read."""
    ints = {"blocks": 2, "threads": 64, "seed": 5}
    fenced = emulation.run(name, "neighbours", {}, {**ints, "barrier": 1})
    np.testing.assert_array_equal(fenced.outputs["out"], np.tile((np.arange(64) + 1) % 64, 2).astype(np.float32))
    unfenced = emulation.run(name, "neighbours", {}, {**ints, "barrier": 0}, check=False)
    if name == "plain":
        assert unfenced.returncode == 0 and np.isnan(unfenced.outputs["out"]).sum() >= 16
    else:
        assert unfenced.returncode != 0 and "WARNING: ThreadSanitizer: data race" in unfenced.stderr


def test_unwritten_shared_memory_reads_as_a_pattern_no_kernel_uses_as_a_sentinel():
    """0x7FA5A5A5: a NaN as a float; as an int neither 0 nor -1 (the kernels' "none") nor negative."""
    result = emulation.run("plain", "unwritten_shared", {}, {"blocks": 3, "threads": 96})
    assert (result.outputs["codes"] == 0x7FA5A5A5).all()


@pytest.mark.parametrize("op, ints, message", [
    ("fast_hash", {"B": 0, "n": 2**31, "d": 4, "R": 1, "P": 4, "m": 1, "tau": 1},
     "yoso: n = 2147483648 exceeds the 32-bit range of the CUDA kernels"),
    ("cumulation", {"B": 1, "m": 1, "nq": 1, "nk": 1, "dv": 257, "p": 1, "mq": 1, "mk": 1, "tau": 1,
                    "workspace_bytes": 1024}, "yoso: the CUDA cumulation takes head and value dims up to 256"),
    ("exact_backward", {"B": 0, "m": 2**31, "nq": 1, "nk": 1, "d": 4, "dv": 4, "tau": 1, "workspace_bytes": 1024},
     "yoso: num_hashes = 2147483648 exceeds the 32-bit range"),
], ids=["narrow", "value dim", "hashes"])
def test_the_host_logic_refuses_what_the_kernels_cannot_index(op, ints, message):
    """yoso_cuda_host.cpp's checks, through the driver's CPU stand-in for torch: one error line, no launch."""
    result = emulation.run("plain", op, {}, ints, check=False)
    assert result.returncode == 3 and f"error: {message}" in result.stderr, result.stderr


def test_head_dim_0_returns_early_on_the_host():
    """q, k, v of 0 coordinates (and value dim 0): every gradient is empty or 0, and nothing divides by
    the head dim (the heavy bucket's minimum side, 2·dv·d/(dv + 2d), would)."""
    codes = np.zeros((2, 3, 5), dtype=np.int32)
    empty = np.zeros((2, 5, 0), dtype=np.float32)
    ones = np.ones((2, 5), dtype=np.float32)
    result = emulation.run("plain", "exact_backward",
                           {"codes_q": codes, "codes_k": codes, "q": empty, "k": empty, "v": empty,
                            "key_weight": ones, "grad": empty},
                           {"B": 2, "m": 3, "nq": 5, "nk": 5, "d": 0, "dv": 0, "tau": 3, "workspace_bytes": 2**20})
    assert all(result.outputs[name].size == 0 for name in ("grad_q", "grad_k", "grad_v")) and not result.launches
