"""lra-profile: the smoke preset over every backend writes the documented files and columns, an
out-of-memory cell is a recorded row, not a crash, and sparse_pattern_impl sets the patterns' impl alone."""

from __future__ import annotations

import math

import pandas as pd

import attention_zoo
from conftest import run_command
from lra.commands.profile import run_cell
from lra.profiling import report


# One backend of each kind (dense, compiled kernels, sorted buckets, blocks, random features): the
# smoke preset itself covers every backend; the suite keeps its time (each backend is a process).
PROFILED = [n for n in ("softmax", "yoso", "reformer", "local", "rfa") if n in attention_zoo.names()]


def test_smoke_profile_writes_csv_json_plot_and_table(tmp_path):
    result = run_command(["lra-profile", "preset=smoke", f"backends=[{','.join(PROFILED)}]", "hydra.run.dir=out"],
                         tmp_path, tmp_path)
    out = tmp_path / "out"
    frame = pd.read_csv(out / "profile.csv")
    assert list(frame.columns) == report.COLUMNS
    assert sorted(frame["backend"].unique()) == sorted(PROFILED) and sorted(frame["n"].unique()) == [256, 512]
    assert frame["error"].isna().all(), frame[frame["error"].notna()]
    assert (frame["step_ms"] > 0).all() and (frame["step_ms"] >= frame["forward_ms"]).all()
    assert (frame[frame["backend"] == "softmax"]["backward_cache_mb"] > 0).all()
    cache = frame.pivot(index="backend", columns="n", values="backward_cache_mb")  # CPU: saved tensors' bytes
    linear = [name for name in PROFILED if attention_zoo.get(name).cls.subquadratic]
    assert {"local", "rfa"} <= set(linear) and (cache.loc[linear, 512] / cache.loc[linear, 256]).max() <= 2.3
    fits = pd.read_csv(out / "exponents.csv")
    assert set(fits["label"]) == set(frame["label"])
    assert (out / "profile.png").stat().st_size > 10_000 and (out / "profile.json").is_file()
    assert "forward / backward (ms)" in result.stdout and "backward cache / training peak / inference peak" in result.stdout


def test_an_allocation_that_cannot_fit_is_a_recorded_out_of_memory_cell():
    row = run_cell({"backend": "softmax", "n": 2**22, "batch": 64, "device": "cpu", "num_heads": 64, "head_dim": 64,
                    "repeats": 1}, timeout_s=120)
    assert row["error"] == "out of memory" and row["n"] == 2**22


def test_sparse_pattern_impl_reaches_only_the_backends_with_a_flex_path(tmp_path):
    """flex on a CPU is local's error row (FlexAttention has no CPU backward and the cell measures one; the key
    reached it), not a crash, while softmax, which has no impl option, is measured as without the key; a cell
    that failed so makes the command fail, with one line."""
    result = run_command(["lra-profile", "preset=smoke", "sparse_pattern_impl=flex", "backends=[local,softmax]",
                          "lengths=[256]", "hydra.run.dir=flex"], tmp_path, tmp_path, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("error: 1 of 2 cells failed (the first: local at n = 256: "), last
    flex = pd.read_csv(tmp_path / "flex" / "profile.csv").set_index("backend")
    assert "backward" in flex.loc["local", "error"] and "cpu" in flex.loc["local", "error"].lower()
    assert pd.isna(flex.loc["softmax", "error"]) and flex.loc["softmax", "step_ms"] > 0
    assert "Traceback" not in result.stderr


def test_an_unknown_sparse_pattern_impl_is_one_line_naming_the_valid_values(tmp_path):
    result = run_command(["lra-profile", "sparse_pattern_impl=fast"], tmp_path, tmp_path, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: invalid value for sparse_pattern_impl: 'fast'"), lines
    assert "one of auto, eager, flex (or null)" in lines[0]


def test_fitted_exponent_recovers_a_power_law():
    lengths = [2048, 4096, 8192]
    assert math.isclose(report.fit_exponent(lengths, [3e-6 * n**2 for n in lengths]), 2.0, abs_tol=1e-9)
    assert math.isclose(report.fit_exponent(lengths, [0.5 * n for n in lengths]), 1.0, abs_tol=1e-9)
    assert math.isnan(report.fit_exponent([2048], [1.0]))


def test_a_misspelled_profile_key_is_one_line_naming_the_valid_ones(tmp_path):
    result = run_command(["lra-profile", "lenghts=[512]"], tmp_path, tmp_path, check=False)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: unknown key 'lenghts'") and "lengths" in last, last


def test_growth_per_doubling_is_each_length_over_the_one_before():
    rows = [{"backend": "quad", "label": "Quadratic", "n": n, "step_ms": 1e-6 * n**2, "training_peak_mb": 2e-6 * n**2}
            for n in (1024, 2048, 4096)]
    rows += [{"backend": "lin", "label": "Linear", "n": n, "step_ms": 0.01 * n, "training_peak_mb": 0.5 * n}
             for n in (1024, 2048)]
    rows.append({"backend": "lin", "label": "Linear", "n": 4096, "error": "out of memory"})
    table = report.growth_table(pd.DataFrame(rows).reindex(columns=report.COLUMNS))
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines()
             if line.startswith("| Quadratic") or line.startswith("| Linear")}
    assert lines["Quadratic"] == ["4.00× / 4.00×", "4.00× / 4.00×"]
    assert lines["Linear"] == ["2.00× / 2.00×", "—"]  # no growth shown into a failed cell
