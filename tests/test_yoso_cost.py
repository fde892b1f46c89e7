"""The GPU cost model (the lra.benchmarks.yoso_cost package): its terms against closed forms, its
calibration against the YOSO paper's Table 4 (every YOSO cell within ±50 %), its projections monotonic
in n, the command's report with the calibration table and the crossover, and its per-kernel load,
store and atomic counts against the CPU emulation of the CUDA kernels."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import main_in_process
from lra.benchmarks.yoso_cost import gpu, hashing, kernels, report, softmax_h100
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


def test_a_streaming_kernel_takes_the_bytes_l2_does_not_hold_over_the_sustained_bandwidth_plus_its_launch():
    """The model now keeps up to 80 % of L2 between kernels: of 8 GB, all but 0.8 × 50 MB go through DRAM;
    a tensor that fits L2 moves at L2's bandwidth."""
    moved = 8e9
    kernel = gpu.streaming("copy", moved, H100)
    expected = (moved - 0.8 * H100.l2_bytes) / (H100.dram_bytes_per_s * H100.dram_efficiency) + H100.launch_s
    assert gpu.seconds(kernel, H100) == pytest.approx(expected, rel=1e-12)
    assert gpu.bound(kernel, H100) == "DRAM"
    small = gpu.streaming("copy", 16e6, H100)
    assert small.dram_bytes == 0 and gpu.terms(small, H100)["L2"] == pytest.approx(16e6 / H100.l2_bytes_per_s)


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
    loaded = H100.latency_factor  # the fitted factor of a chain under load
    assert gpu.terms(one, H100)["latency"] == pytest.approx(loaded * chain / H100.clock_hz)
    resident = gpu.resident_blocks(one, H100)
    many = Kernel("many blocks", blocks=10 * H100.sms * resident, threads=128, registers=32, chain=chain)
    assert gpu.terms(many, H100)["latency"] == pytest.approx(10 * loaded * chain / H100.clock_hz)


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


def test_projections_grow_with_n_and_the_two_paths_are_within_a_tenth_at_the_listops_call():
    lengths = [512, 1024, 2048, 4096, 8192, 16384, 32768]
    for batch_heads, d in ((12, 64), (16, 32)):
        rows = report.sweep(batch_heads, d, lengths)
        for column in (*report.DESIGNS, "SDPA", "eager"):
            values = [row[column] for row in rows]
            assert all(b > a for a, b in zip(values, values[1:])), column
        # SDPA grows with n², YOSO about with n: the ratio falls by more than half from 512 to 32,768
        assert rows[-1]["atomic"] / rows[-1]["SDPA"] < 0.5 * rows[0]["atomic"] / rows[0]["SDPA"]
    # The sorted forward's team kernels against the atomic forward's L2 atomics, the atomic backward's
    # parallelism over hashes against the sorted one's chains, whose first pairs come with their buckets and whose
    # further pairs are read a chunk at a time, a token's rows 8 coordinates a lane: at the default τ the sorted
    # call (the trainer's default) is the faster, by two fifths to a half (docs/benchmarks.md: "the faster at the
    # fitted constants")
    listops = {design: sum(report.yoso_seconds(report.LISTOPS, design).values()) for design in report.DESIGNS}
    assert 0.5 < listops["sorted"] / listops["atomic"] < 0.6


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


@pytest.mark.parametrize("out, status, line", [
    ("", 2, "python -m lra.benchmarks.yoso_cost: error: --out is empty (an unset shell variable?); give --out a file, "
            "or leave it out"),
    ("{tmp}/a file/x.md", 1, "error: --out: {tmp}/a file is a file, not a folder; give --out a path in another folder "
                             "(a missing one is created)"),
    ("{tmp}", 1, "error: --out: {tmp} is a folder; give --out a file name (e.g. {tmp}/table.md)"),
])
def test_a_bad_out_path_is_refused_in_one_line_before_the_report_is_made(out, status, line, tmp_path, monkeypatch,
                                                                        capsys):
    (tmp_path / "a file").write_text("kept")
    monkeypatch.setattr(report, "report", lambda *a: pytest.fail("reported despite a bad --out"))
    code, printed, errors = main_in_process(report.main, ["--out", out.format(tmp=tmp_path)], capsys)
    assert code == status and errors.strip().splitlines()[-1] == line.format(tmp=tmp_path), errors
    assert not printed and (tmp_path / "a file").read_text() == "kept"


def test_a_uniform_call_meets_one_token_per_hash_at_the_default_code_length():
    c = Call(4, 2048, 32, 32)
    assert c.bits == 11 and c.stats.per_query == pytest.approx(1.0)
    assert c.stats.hit == pytest.approx(1 - math.exp(-1), abs=1e-3)


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the CUDA emulation cannot be built")
def test_the_models_counts_match_the_emulated_output_normalization():
    """The output's unit rows and the gradient through them (one side, a team per row): the model's loads and
    stores against the emulation's, exactly."""
    from simt import emulation

    from attention_zoo._common import UNIT_ROWS_EPS

    batch, n, d = 2, 200, 32
    g = torch.Generator().manual_seed(0)
    y, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    rows = {"rows": batch * n, "width": d}
    made = emulation.run("plain", "unit_rows", {"x": y.numpy()}, rows, {"eps": UNIT_ROWS_EPS})
    pulled = emulation.run("plain", "through_unit_rows", {"unit": made.outputs["unit"], "norms": made.outputs["norms"],
                                                          "incoming": grad.numpy()}, rows, {"eps": UNIT_ROWS_EPS})
    call = Call(batch, n, d, d, 8, 8)
    for result, kernel, through in ((made, "unit_rows_kernel", False), (pulled, "through_unit_rows_kernel", True)):
        model = kernels.unit_rows(call, through=through, output=True)
        assert result.traffic(kernel) == (model.loaded, model.stored), kernel


@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler: the CUDA emulation cannot be built")
@pytest.mark.parametrize("bf16", [False, True], ids=["float32-rows", "bf16-rows"])
def test_the_models_counts_match_every_emulated_kernel_on_both_paths(bf16):
    """The cost model's loads, stores and atomic adds per kernel against the CPU emulation of the very
    .cu sources (tests/simt), which counts every yoso::load/store/atomic_add: exact where nothing is
    data-dependent, within 1 % where the model averages a binary search's length; with float32 rows and
    with bf16 rows (half the bytes of every row the kernels read)."""
    from dataclasses import replace

    from simt import emulation

    from attention_zoo.yoso import draw, hash_codes

    batch, n, d, m, tau = 2, 200, 32, 8, 8
    g = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, n, d, generator=g), dim=-1) for _ in range(2))
    v, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    torch.manual_seed(1)
    draws = draw(batch, d, d, m, tau, "hadamard", d, None, "cpu")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "torch") for x in (q, k))
    call = replace(measured(Call(batch, n, d, d, m, tau), codes_q.numpy(), codes_k.numpy()), bf16_rows=bf16)
    rows = {"v": emulation.bf16_bits(v), "grad": emulation.bf16_bits(grad)} if bf16 else {"v": v.numpy(),
                                                                                        "grad": grad.numpy()}
    every = np.ones((batch, n), np.float32)
    sizes = {"B": batch, "m": m, "tau": tau, "nq": n, "nk": n, "dv": d, "workspace_bytes": 2**24}

    hashed = emulation.run("plain", "fast_hash", {"x": q.numpy(), "diagonals": draws.diagonals.numpy()},
                           {"B": batch, "n": n, "d": d, "R": draws.diagonals.shape[1], "P": draws.diagonals.shape[3],
                            "m": m, "tau": tau})
    both_sides = hashing.fast_hash(call)  # the model counts q and k; one launch hashes one of them
    assert hashed.traffic("fast_hash_kernel") == (both_sides.loaded / 2, both_sides.stored / 2)
    for deterministic in (1, 0):
        forward = emulation.run("plain", "cumulation", {
            "codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "weight_q": np.ones((batch, 1, 1, n), np.float32),
            "weight_k": every[:, None, None], "values": rows["v"]},
            {**sizes, "p": 1, "mq": 1, "mk": 1, "deterministic": deterministic})
        backward = emulation.run("plain", "exact_backward", {
            "codes_q": codes_q.numpy(), "codes_k": codes_k.numpy(), "q": q.numpy(), "k": k.numpy(), "key_weight": every,
            **rows}, {**sizes, "d": d, "deterministic": deterministic, "normalize": 1, "bf16_units": int(bf16)},
            {"eps": 1e-12})  # as the module calls it
        if deterministic:
            checks = [(forward, "counting_sort_kernel", kernels.counting_sort(call, 1, 1)),
                      (forward, "bucket_rows_kernel", kernels.bucket_rows(call)),
                      (forward, "gather_rows_kernel", kernels.gather_rows(call)),
                      (backward, "counting_sort_kernel", kernels.counting_sort(call, 2, 2)),
                      (backward, "query_gradients_kernel", kernels.token_gradients(call, "query")),
                      (backward, "key_gradients_kernel", kernels.token_gradients(call, "key"))]
        else:
            checks = [(forward, "table_cumulation_kernel", kernels.table_cumulation(call)),
                      (forward, "slice_lists_kernel", kernels.slice_lists(call)),
                      (backward, "counting_sort_kernel", kernels.counting_sort(call, 2, 1)),  # the keys' starts only
                      (backward, "scatter_pairs_kernel", kernels.scatter_pairs(call))]
        checks += [(backward, "find_heavy_kernel", kernels.find_heavy(call)),
                   (backward, "number_heavy_kernel", kernels.number_heavy(call)),
                   (backward, "unit_rows_kernel", kernels.unit_rows(call, through=False)),
                   (backward, "through_unit_rows_kernel", kernels.unit_rows(call, through=True))]
        for result, kernel, model in checks:
            loaded, stored = result.traffic(kernel)
            assert loaded == pytest.approx(model.loaded, rel=0.01), kernel
            assert stored == pytest.approx(model.stored, rel=1e-9), kernel
            assert result.atomics(kernel) == pytest.approx(model.added, rel=1e-9), kernel
    # Past the counting sort's counters on a device whose blocks opt into 64 KB (τ = 14), the run starts after
    # the device's sort: a pair of 8,200 tokens
    wide = torch.randint(0, 2**14, (1, 1, 8200), generator=g, dtype=torch.int32)
    sorted_wide = emulation.run("plain", "sort", {"codes": wide.numpy()}, {"rows": 1, "n": 8200, "tau": 14,
                                                                          "with_starts": 1,
                                                                          "most_shared_bytes": 64 * 1024})
    model = kernels.run_starts(measured(Call(1, 8200, d, d, 1, 14), wide.numpy(), wide.numpy()), 1)[1]
    assert sorted_wide.traffic("run_starts_kernel") == (model.loaded, pytest.approx(model.stored, rel=1e-9))
    # … and on an H100, whose blocks opt into 227 KB, by the counting sort
    counted_wide = emulation.run("plain", "sort", {"codes": wide.numpy()}, {"rows": 1, "n": 8200, "tau": 14,
                                                                           "with_starts": 1})
    model = kernels.counting_sort(measured(Call(1, 8200, d, d, 1, 14), wide.numpy(), wide.numpy()), 1, 1)
    assert counted_wide.traffic("counting_sort_kernel") == (model.loaded, pytest.approx(model.stored, rel=1e-9))


def test_the_docs_hold_the_models_projection_tables_as_it_prints_them_today():
    """docs/benchmarks.md's projection tables are the report's, row for row (the sensitivity table is summed up in
    its prose): a change to the kernels' model shows in the docs once they are regenerated."""
    lengths = [512, 1024, 2048, 4096, 8192, 16384, 32768]
    docs = set((Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md").read_text().splitlines())
    tables = [report.calibration_table(report.calibration()), report.listops_table(), report.targets_table(),
              report.sweep_table("BERT-base attention module", 12, 64, lengths),
              report.sweep_table("yoso_speed's default shape", 16, 32, lengths), report.paths_table(),
              report.bf16_table(lengths)]
    printed = [line for table in tables for line in table.splitlines() if line.startswith(("|", "- crossover"))]
    missing = [line for line in printed if line not in docs]
    assert not missing, f"docs/benchmarks.md is stale (python -m lra.benchmarks.yoso_cost): {missing[:3]}"


# ----------------------------------------------------------------------------- against the H100 measurements
def test_the_readers_take_the_committed_numbers_as_the_files_print_them():
    from lra.benchmarks.yoso_cost import measured

    trace = measured.trace("2026-11-27b/trace.md")
    assert (trace.n, trace.batch_heads, trace.head_dim, trace.m, trace.atomic) == (4096, 16, 32, 32, True)
    assert (trace.queued_s, trace.synchronized_s, trace.profiled_steps) == pytest.approx((2.927e-3, 3.240e-3, 5))
    assert trace.total_cuda_s == pytest.approx(8.223e-3)
    assert trace.row("void yoso::(anonymous namespace)::scatter_pairs_kernel") == pytest.approx((3.366e-3, 0, 0, 5))
    assert trace.row("aten::mul") == pytest.approx((167.367e-6, 977.091e-6, 611.790e-6, 30))
    assert trace.row("void at::native::reduce_kernel") is None  # two rows start so: neither is taken
    assert not measured.trace("2026-11-27b/trace_deterministic.md").atomic
    cells = measured.kernel_benchmark("2026-11-27b/kernels.md")
    assert cells["YOSO-32 (CUDA graphs)", 4096] == pytest.approx((0.57e-3, 1.71e-3))
    assert cells["YOSO-32", 32768] == pytest.approx((9.25e-3, 22.35e-3))
    assert ("softmax (eager)", 16384) not in cells  # out of memory: no numbers
    bert = measured.kernel_benchmark("2026-11-27b/kernels_bert.md")
    assert max(n for _, n in bert) == 4096 and bert["YOSO-32", 2048] == pytest.approx((0.60e-3, 1.91e-3))


def test_the_rows_fit_only_the_calibration_trace_and_compare_main_s_kernels_only():
    from lra.benchmarks.yoso_cost import compare, measured

    rows = compare.rows()
    fitted = [row for row in rows if row.role.startswith("fitted")]
    assert fitted and {row.source for row in fitted} == {measured.CALIBRATION}
    assert {row.source for row in rows} == set(measured.FILES)
    skipped = [row for row in rows if row not in compare.compared(rows)]
    assert [(row.source, row.what.split(" ")[0]) for row in skipped] == [("2026-11-27c/trace.md", "slice_lists")]
    calls = [row for row in rows if row.source.endswith("kernels.md") and row.what.startswith("YOSO-32 (CUDA graphs)")]
    assert len(calls) == 2 * 2 * 7  # two sessions, forward and forward + backward, n = 512 … 32,768


def test_a_measurement_committed_from_now_on_is_modelled_with_today_s_kernels(tmp_path, monkeypatch):
    """The committed files ran a94d93d's kernels and are modelled with them; a kernels.md added later is
    modelled with the kernels main has (here a copy of 2026-11-27b's numbers under a new folder)."""
    from lra.benchmarks.yoso_cost import compare, host, measured as files

    (tmp_path / "2099-01-01").mkdir()
    shutil.copy(files.GPU_DOCS / "2026-11-27b" / "kernels.md", tmp_path / "2099-01-01" / "kernels.md")
    old = {row.what: row.projected() for row in compare.benchmark_rows("2026-11-27b/kernels.md")}
    monkeypatch.setattr(files, "GPU_DOCS", tmp_path)
    new = {row.what: row.projected() for row in compare.benchmark_rows("2099-01-01/kernels.md")}
    assert new.keys() == old.keys()
    what = "YOSO-32 (CUDA graphs), n = 8,192, forward + backward"
    assert new[what] == pytest.approx(host.call_seconds(Call(16, 8192, 32, 32, 32), True, True, graphs=True))
    assert new[what] < 0.8 * old[what]  # today's atomic forward keeps τ = 13's tables in shared memory


def test_the_fitted_constants_reproduce_the_calibration_trace_within_ten_percent():
    from lra.benchmarks.yoso_cost import compare, fit

    rows = fit.calibration_rows()
    assert {row.what.split(" (")[0] for row in rows} >= {"fast_hash", "slice_lists", "table_cumulation",
                                                         "scatter_pairs", "torch sort", "a step queued"}
    for row in rows:
        assert 0.9 <= row.ratio() <= 1.1, (row.what, row.ratio())
    assert all(0.9 <= row.ratio() <= 1.1 for row in compare.trace_rows(fit.measured.CALIBRATION))


def test_fitting_again_gives_the_constants_in_the_code_and_ignores_every_validation_number():
    from lra.benchmarks.yoso_cost import compare, fit

    rows = compare.rows()
    again = fit.fit(rows)
    for name, value in fit.current().items():
        assert again[name] == pytest.approx(value, rel=0.01), name
    moved = [replace(row, measured_s=row.measured_s * 2) if row.role == "validated" else row for row in rows]
    assert fit.fit(moved) == again  # out-of-sample numbers do not enter the fit
    calibration = [replace(row, measured_s=row.measured_s * 2) if row.what.startswith("scatter_pairs")
                   and row.role == "fitted" else row for row in rows]
    assert fit.fit(calibration)["atomic_sector_cost"] > 1.3 * again["atomic_sector_cost"]  # a fitted row moves it


def test_the_host_weights_of_the_ops_are_the_calibration_trace_s_profiler_columns():
    from lra.benchmarks.yoso_cost import fit, ops

    weights = fit.host_weights()
    code = {"custom op": ops.CUSTOM_OP, "autograd wrapper": ops.AUTOGRAD_WRAPPER, "backward node": ops.BACKWARD_NODE,
            "exact-weight operator": ops.EXACT_BACKWARD_OP, "function": ops.FUNCTION, "sort": ops.SORT_OP}
    for name, value in code.items():
        assert weights[name] == pytest.approx(value, abs=0.05), name


def test_a_warp_s_shared_atomic_takes_the_rounds_of_its_busiest_address():
    from lra.benchmarks.yoso_cost.call import most_on_one

    rng = np.random.default_rng(0)
    for addresses in (2, 16):
        lanes = rng.integers(0, addresses, size=(50_000, 32))
        busiest = np.array([np.bincount(row, minlength=addresses).max() for row in lanes]).mean()
        assert most_on_one(32, addresses) == pytest.approx(busiest, abs=0.05)
    assert most_on_one(32, 1) == 32 and most_on_one(1, 16) == 1
    c = Call(16, 4096, 32, 32)  # τ = 12: 16 slices of 256 codes; every token counted and placed
    lists = kernels.slice_lists(c)
    assert lists.shared_rounds == pytest.approx(2 * (2 * c.pairs * c.n / 32) * most_on_one(32, 16))
    assert gpu.terms(lists, H100)["shared memory"] == pytest.approx(
        lists.shared_rounds * H100.shared_atomic_cycles / (H100.sms * H100.clock_hz))


def test_l2_atomics_are_their_own_term_at_the_fitted_sector_cost():
    kernel = Kernel("atomics", blocks=1e4, threads=256, atomic_sectors=1e6, l2_bytes=1e6)
    parts = gpu.terms(kernel, H100)
    assert parts["L2 atomics"] == pytest.approx(1e6 * 32 * H100.atomic_sector_cost / H100.l2_bytes_per_s)
    assert parts["L2"] == pytest.approx(1e6 / H100.l2_bytes_per_s)


def test_a_host_bound_call_takes_the_host_s_time_and_a_device_bound_one_the_gpu_s_after_the_host_s_start():
    from lra.benchmarks.yoso_cost import host
    from lra.benchmarks.yoso_cost.ops import Op

    small, big = Kernel("small", 1, 32), Kernel("big", 1, 32, chain=1e6)
    tiny, long = gpu.seconds(small, H100), gpu.seconds(big, H100)
    ops = [Op("a", 10, (small,)), Op("b", 10, (small,))]
    assert host.wall(ops, H100, 1e-5) == pytest.approx(20e-5 + tiny)  # the last kernel after the host's end
    ops = [Op("a", 1, (big,)), Op("b", 1, (big,))]
    assert host.wall(ops, H100, 1e-5) == pytest.approx(1e-5 + 2 * long)
    raw = Op("c", 0, raw=(small,))
    assert host.host_seconds(raw, 1e-5) == pytest.approx(host.LAUNCH_HOST_S)
    c = Call(16, 512, 32, 32)
    eager, graphs = (host.call_seconds(c, True, True, g) for g in (False, True))
    assert graphs < eager / 2  # the host's ops, not the kernels, set a small call's eager time


def test_the_measured_command_compares_every_row_and_ends_on_the_worst_ratio(tmp_path, monkeypatch, capsys):
    out = tmp_path / "measured.md"
    result = subprocess.run([sys.executable, "-m", "lra.benchmarks.yoso_cost", "--measured", "--out", str(out)],
                            capture_output=True, text=True, check=True)
    lines = result.stdout.rstrip("\n").splitlines()
    assert re.fullmatch(r"worst ratio: \d+\.\d\d–\d+\.\d\d", lines[-1]), lines[-1]
    assert out.read_text() == result.stdout
    for source in ("2026-11-27b/trace.md", "2026-11-27c/kernels.md", "2026-11-27b/kernels_bert.md"):
        assert f"## docs/gpu/{source}" in result.stdout
    assert "| scatter_pairs (1 a step) | 0.673 |" in result.stdout and "| fitted |" in result.stdout
    from lra.benchmarks.yoso_cost import compare, measured, report

    low, high = compare.worst(compare.rows())
    assert lines[-1] == f"worst ratio: {low:.2f}–{high:.2f}"
    monkeypatch.setattr(measured, "GPU_DOCS", tmp_path / "nowhere")
    with pytest.raises(SystemExit) as stopped:
        report.main(["--measured"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "docs/gpu is not installed" in err[0]
