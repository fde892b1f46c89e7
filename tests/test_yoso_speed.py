"""The YOSO kernel benchmark's cells: which run where, and a failing cell is a recorded row and exit 1."""

import importlib
import json
import subprocess
import sys

import pytest
import torch

from helpers import main_in_process
from lra.benchmarks import yoso_speed, yoso_trace


def test_the_cuda_graph_cell_runs_on_cuda_only():
    assert "YOSO-32 (CUDA graphs)" in yoso_speed.default_cells("cuda")
    on_cpu = yoso_speed.default_cells("cpu")
    assert "YOSO-32 (CUDA graphs)" not in on_cpu and "YOSO-32" in on_cpu
    assert all(yoso_speed.CELLS[cell][2] == "fp32" for cell in on_cpu)


def test_a_cell_that_fails_is_a_row_and_the_command_exits_1_keeping_the_others(tmp_path):
    raw = tmp_path / "made" / "rows.json"
    done = subprocess.run([sys.executable, "-m", "lra.benchmarks.yoso_speed", "--lengths", "64", "--repeats", "1",
                           "--cells", "YOSO-16", "YOSO-32 (CUDA graphs)", "--json", str(raw)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert [row["cell"] for row in json.loads(raw.read_text())] == ["YOSO-16", "YOSO-32 (CUDA graphs)"]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| YOSO")]
    assert rows[0].startswith("| YOSO-16 | fp32 | 64 | ") and float(rows[0].split("|")[4]) > 0
    assert "| YOSO-32 (CUDA graphs) | fp32 | 64 | failed: ValueError: YOSO-32 (CUDA graphs) needs a CUDA device" in rows[1]
    assert done.stderr.strip().splitlines()[-1].startswith("error: 1 cells failed: YOSO-32 (CUDA graphs) at n = 64")


def test_the_trace_times_a_step_both_ways_and_tables_the_yoso_operators():
    done = subprocess.run([sys.executable, "-m", "lra.benchmarks.yoso_trace", "--device", "cpu", "--lengths", "32",
                           "--steps", "2", "--rows", "40"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    heading = next(line for line in done.stdout.splitlines() if line.startswith("## n = 32: "))
    queued, synchronized = (float(part.split(" ms")[0]) for part in heading[len("## n = 32: "):].split(", ")[:2])
    assert queued > 0 and synchronized > 0
    for operator in ("attention_zoo::yoso_fast_hash", "attention_zoo::yoso_cumulation",
                     "attention_zoo::yoso_exact_weight_backward"):
        assert operator in done.stdout


def test_bad_benchmark_arguments_are_one_line_before_anything_runs(capsys):
    for main, args, line in ((yoso_speed.main, ["--head-dim", "0"], "--head-dim 0: it must be >= 1"),
                             (yoso_speed.main, ["--lengths", "64", "0"], "--lengths 0: it must be >= 1"),
                             (yoso_trace.main, ["--device", "cpu", "--num-hashes", "0"], "--num-hashes 0: it must be >= 1"),
                             (yoso_trace.main, ["--device", "cpu", "--steps", "0"], "--steps 0: it must be >= 1")):
        status, printed, errors = main_in_process(main, args, capsys)
        assert status == 2 and errors.strip().splitlines()[-1].endswith(line), errors
        assert "Traceback" not in errors and not printed.strip()


NO_CUDA = "--device cuda: no CUDA device here"


@pytest.mark.parametrize("command, args, line", [
    ("yoso_parts", ["--lengths", "-4", "--repeats", "1"], "--lengths -4: it must be >= 2 (τ = log2 n bits a code)"),
    ("yoso_parts", ["--lengths", "64", "1"], "--lengths 1: it must be >= 2 (τ = log2 n bits a code)"),
    ("yoso_parts", ["--lengths", "64", "--repeats", "0"], "--repeats 0: it must be >= 1"),
    ("yoso_parts", ["--lengths", "64", "--hashes", "0"], "--hashes 0: it must be >= 1"),
    ("yoso_parts", ["--lengths", "64", "--device", "cuda"], NO_CUDA),
    ("yoso_backward", ["--n", "0"], "--n 0: it must be >= 2 (τ = log2 n bits a code)"),
    ("yoso_backward", ["--n", "64", "--draws", "0"], "--draws 0: it must be >= 1"),
    ("yoso_backward", ["--n", "64", "--projections", "4", "0"], "--projections 0: it must be >= 1"),
    ("yoso_backward", ["--n", "64", "--device", "cuda"], NO_CUDA),
    ("yoso_backward", ["--n", "64", "--device", "bogus"], "argument --device: invalid choice: 'bogus' (choose from "
                                                          "'cpu', 'cuda')"),
    ("yoso_speed", ["--json", ""], "--json is empty (an unset shell variable?); give --json a file, or leave it out"),
])
def test_the_yoso_benchmarks_refuse_bad_arguments_in_one_line_before_measuring(command, args, line, monkeypatch,
                                                                                 capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    main = importlib.import_module(f"lra.benchmarks.{command}").main
    status, printed, errors = main_in_process(main, args, capsys)
    assert status == 2 and errors.strip().splitlines()[-1].endswith(f": error: {line}"), errors
    assert "Traceback" not in errors and not printed.strip()


def test_an_unwritable_json_path_is_refused_before_any_cell_is_measured(tmp_path, capsys):
    (tmp_path / "a file").write_text("kept")
    status, printed, errors = main_in_process(yoso_speed.main, ["--device", "cpu", "--lengths", "128", "--cells", "YOSO-16",
                                                                "--repeats", "1", "--json",
                                                                str(tmp_path / "a file" / "x.json")], capsys)
    assert status == 1 and errors.strip() == (f"error: --json: {tmp_path / 'a file'} is a file, not a folder; give "
                                              "--json a path in another folder (a missing one is created)"), errors
    assert not printed.strip() and (tmp_path / "a file").read_text() == "kept"
