"""The GPU cost model (the lra.benchmarks.yoso_cost package): its terms against closed forms, its
calibration against the YOSO paper's Table 4 (every YOSO cell within ±50 %), its projections monotonic
in n, the command's report with the calibration table and the crossover, and its per-kernel load,
store and atomic counts against the CPU emulation of the CUDA kernels."""

from __future__ import annotations

import math
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from lra.benchmarks.yoso_cost import gpu, kernels, report, softmax_h100
from lra.benchmarks.yoso_cost.call import Call, max_of_poisson, measured
from lra.benchmarks.yoso_cost.gpu import H100, RTX_2080_TI, Kernel


def test_every_yoso_cell_of_table4_is_reproduced_within_half():
    cells = report.calibration()
    yoso = [cell for cell in cells if cell.method.startswith("YOSO")]
    assert {cell.method for cell in yoso} == {"YOSO-16", "YOSO-32", "YOSO-64", "YOSO-128"}
    assert {cell.n for cell in yoso} == {512, 1024, 2048, 4096} and len(yoso) == 16
    for cell in yoso:
        forward, backward = cell.ratios
        assert 0.5 <= forward <= 1.5 and 0.5 <= backward <= 1.5, cell


def test_a_streaming_kernel_takes_its_bytes_over_the_sustained_bandwidth_plus_its_launch():
    moved = 8e9
    kernel = gpu.streaming("copy", moved, H100)
    expected = moved / (H100.dram_bytes_per_s * H100.dram_efficiency) + H100.launch_s
    assert gpu.seconds(kernel, H100) == pytest.approx(expected, rel=1e-12)
    assert gpu.bound(kernel, H100) == "DRAM"


def test_occupancy_takes_the_tightest_of_threads_registers_shared_memory_and_blocks():
    # The authors' ver4 kernel on a 2080 Ti: 256 threads x 63 registers -> 4 blocks (registers and threads)
    assert gpu.resident_blocks(Kernel("ver4", 1, 256, registers=63, shared_bytes=16144), RTX_2080_TI) == 4
    # 32-thread blocks: the 32-block limit of an H100 SM binds before its 2,048 threads
    assert gpu.resident_blocks(Kernel("small", 1, 32, registers=32), H100) == 32
    # 100 KB of shared memory per block: two fit in 228 KB
    assert gpu.resident_blocks(Kernel("shared", 1, 128, registers=32, shared_bytes=100 * 1024), H100) == 2
    # 128 threads x 255 registers: 65,536 / 32,640 -> 2 blocks
    assert gpu.resident_blocks(Kernel("registers", 1, 128, registers=255), H100) == 2


def test_a_grid_smaller_than_one_wave_waits_its_whole_chain_and_a_larger_one_its_waves():
    chain = 1e5
    one = Kernel("few blocks", blocks=48, threads=128, registers=32, chain=chain)
    assert gpu.terms(one, H100)["latency"] == pytest.approx(chain / H100.clock_hz)
    resident = gpu.resident_blocks(one, H100)
    many = Kernel("many blocks", blocks=10 * H100.sms * resident, threads=128, registers=32, chain=chain)
    assert gpu.terms(many, H100)["latency"] == pytest.approx(10 * chain / H100.clock_hz)


def test_the_busiest_lane_matches_a_seeded_simulation_and_the_single_draw_its_mean():
    assert max_of_poisson(1.0, 1) == pytest.approx(1.0, abs=1e-6)
    draws = np.random.default_rng(0).poisson(1.0, size=(200_000, 32)).max(axis=1)
    assert max_of_poisson(1.0, 32) == pytest.approx(draws.mean(), abs=0.01)


def test_softmax_rates_are_the_published_ones_and_head_dim_32_lies_on_their_pair_time_line():
    assert softmax_h100.achieved_tflops("flash2", "forward", 64, 4096) == 321
    assert softmax_h100.achieved_tflops("flash2", "backward", 128, 16384) == 322
    for direction in ("forward", "backward"):
        per_pair = 4 if direction == "forward" else 10
        times = [per_pair * d / softmax_h100.achieved_tflops("flash2", direction, d, 2048) for d in (32, 64, 128)]
        assert times[1] - times[0] == pytest.approx((times[2] - times[1]) / 2)  # a·d + c through 64 and 128
        assert softmax_h100.achieved_tflops("flash2", direction, 32, 2048) < softmax_h100.achieved_tflops(
            "flash2", direction, 64, 2048)


def test_projections_grow_with_n_and_the_atomic_path_is_the_faster_at_the_default_code_length():
    lengths = [512, 1024, 2048, 4096, 8192, 16384, 32768]
    for batch_heads, d in ((12, 64), (16, 32)):
        rows = report.sweep(batch_heads, d, lengths)
        for column in (*report.DESIGNS, "SDPA", "eager"):
            values = [row[column] for row in rows]
            assert all(b > a for a, b in zip(values, values[1:])), column
        for row in rows:
            assert row["atomic"] < row["sorted"], row["n"]
        # SDPA grows with n², YOSO about with n: the ratio falls by more than half from 512 to 32,768
        assert rows[-1]["atomic"] / rows[-1]["SDPA"] < 0.5 * rows[0]["atomic"] / rows[0]["SDPA"]
    listops = {design: sum(report.yoso_seconds(report.LISTOPS, design).values()) for design in report.DESIGNS}
    assert listops["atomic"] < listops["sorted"]


def test_the_atomic_backward_updates_a_rows_sectors_once_with_float4_atomics_and_per_slot_without():
    """csrc/yoso (a63867c): from sm_90 on a lane adds its 4 coordinates with one float4 atomicAdd, so a
    32-float row (8 lanes x 16 bytes) updates its 4 sectors once; before sm_90 four 4-byte atomics 16
    bytes apart touch all 4 sectors per slot (16 updates). The bytes added are the same."""
    c = Call(8, 512, 32, 32)
    b = c.stats
    rows = c.pairs * c.n * b.per_query * 2 + c.pairs * c.n * b.hit  # dK and dV per pair, dQ per query
    hopper = kernels.scatter_pairs(c, H100)
    assert H100.vector_atomics and not RTX_2080_TI.vector_atomics
    assert hopper.atomic_sectors == pytest.approx(rows * 4)
    scalar = kernels.scatter_pairs(c, H100, vector_atomics=False)
    assert scalar.atomic_sectors == pytest.approx(rows * 16)
    assert scalar.added == hopper.added == pytest.approx(rows * 32 * 4)
    assert kernels.scatter_pairs(c, RTX_2080_TI).atomic_sectors == pytest.approx(rows * 16)
    assert gpu.seconds(hopper, H100) < gpu.seconds(scalar, H100)


def test_the_command_prints_the_calibration_and_the_projection_with_its_crossover(tmp_path):
    out = tmp_path / "cost.md"
    result = subprocess.run([sys.executable, "-m", "lra.benchmarks.yoso_cost", "--lengths", "1024", "32768",
                             "--out", str(out)], capture_output=True, text=True, check=True)
    text = result.stdout
    assert out.read_text() == text
    assert "| YOSO-128 | 4,096 |" in text and "within ±50 %" in text
    assert text.count("crossover with SDPA-bf16, YOSO atomic: ") == 2
    assert "| phase | kernel | sorted µs | atomic µs |" in text
    assert "| forward | fast_hash (q, k) |" in text and "**forward + backward**" in text
    (tmp_path / "a file").write_text("kept")
    bad = subprocess.run([sys.executable, "-m", "lra.benchmarks.yoso_cost", "--out", str(tmp_path / "a file" / "x.md")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.startswith("error: cannot write"), bad.stderr
    assert (tmp_path / "a file").read_text() == "kept"


def test_a_uniform_call_meets_one_token_per_hash_at_the_default_code_length():
    c = Call(4, 2048, 32, 32)
    assert c.bits == 11 and c.stats.per_query == pytest.approx(1.0)
    assert c.stats.hit == pytest.approx(1 - math.exp(-1), abs=1e-3)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the CUDA emulation cannot be built")
def test_the_models_counts_match_every_emulated_kernel_on_both_paths():
    """The cost model's loads, stores and atomic adds per kernel against the CPU emulation of the very
    .cu sources (tests/simt), which counts every yoso::load/store/atomic_add: exact where nothing is
    data-dependent, within 1 % where the model averages a binary search's length."""
    from simt import emulation

    from attention_zoo.yoso import draw, hash_codes

    batch, n, d, m, tau = 2, 200, 32, 8, 8
    g = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, n, d, generator=g), dim=-1) for _ in range(2))
    v, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    torch.manual_seed(1)
    draws = draw(batch, d, d, m, tau, "hadamard", d, None, "cpu")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "torch") for x in (q, k))
    call = measured(Call(batch, n, d, d, m, tau), codes_q.numpy(), codes_k.numpy())
    every = np.ones((batch, n), np.float32)
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": d, "workspace_bytes": 2**24}

    hashed = emulation.run("plain", "fast_hash", {"x": q.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": d, "R": draws.diagonals.shape[1], "P": draws.diagonals.shape[3],
                            "m": m, "tau": tau})
    both_sides = kernels.fast_hash(call)  # the model counts q and k; one launch hashes one of them
    assert hashed.traffic("fast_hash_kernel") == (both_sides.loaded / 2, both_sides.stored / 2)
    for deterministic in (1, 0):
        forward = emulation.run("plain", "cumulation", {
            "codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "weight_q": np.ones((batch, 1, 1, n), np.float32),
            "weight_k": every[:, None, None], "values": v.numpy()},
            {**sizes, "p": 1, "mq": 1, "mk": 1, "deterministic": deterministic})
        backward = emulation.run("plain", "exact_backward", {
            "codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "q": q.numpy(), "k": k.numpy(), "v": v.numpy(),
            "key_weight": every, "grad": grad.numpy()}, {**sizes, "d": d, "deterministic": deterministic})
        if deterministic:
            checks = [(forward, "bucket_rows_kernel", kernels.bucket_rows(call)),
                      (forward, "gather_rows_kernel", kernels.gather_rows(call)),
                      (backward, "query_gradients_kernel", kernels.token_gradients(call, "query")),
                      (backward, "key_gradients_kernel", kernels.token_gradients(call, "key"))]
        else:
            checks = [(forward, "table_cumulation_kernel", kernels.table_cumulation(call)),
                      (forward, "slice_lists_kernel", kernels.slice_lists(call)),
                      (backward, "run_starts_kernel", kernels.run_starts(call, 1)[1]),  # the keys' only
                      (backward, "scatter_pairs_kernel", kernels.scatter_pairs(call))]
        checks += [(backward, "find_heavy_kernel", kernels.find_heavy(call)),
                   (backward, "number_heavy_kernel", kernels.number_heavy(call))]
        for result, kernel, model in checks:
            loaded, stored = result.traffic(kernel)
            assert loaded == pytest.approx(model.loaded, rel=0.01), kernel
            assert stored == pytest.approx(model.stored, rel=1e-9), kernel
            assert result.atomics(kernel) == pytest.approx(model.added, rel=1e-9), kernel
