"""lra-profile's inputs and honesty: sizes bounded with the limit named, repeats refused, a deleted key
or an empty output_dir one line (the dry run too), a batch that does not fit never reported, a failed
cell's error its exception's line, a folder holding one run's outputs, and a YOSO cell without its
compiled kernels a failure naming the fix, never the PyTorch fallback's time under YOSO's label."""

from __future__ import annotations

import json
import sys
import traceback
from types import SimpleNamespace

import pandas as pd
import pytest

from conftest import run_command
from lra.commands import profile
from lra.errors import ConfigError
from test_tool_errors import compose_tool_config

BIG = str(10**400)
QUICK = ["backends=[softmax]", "lengths=[64]", "num_heads=1", "head_dim=8", "repeats=1"]
REFUSED = [
    (["~lengths"], "~lengths deletes a key every run needs; set it instead (lengths=<value>)"),
    (["~backends"], "~backends deletes a key every run needs"),
    (["~device"], "~device deletes a key every run needs"),
    (["backends=[softmax,softmax]"], "invalid value for backends: ['softmax', 'softmax']; it must be a list naming "
                                     "each once (softmax more than once"),
    (["lengths=[64,128,64]"], "invalid value for lengths: [64, 128, 64]; it must be a list naming each once (64"),
    ([f"lengths=[64,{BIG}]"], "invalid value for lengths: [64, 1000"),
    ([f"num_heads={BIG}"], "invalid value for num_heads: 1000"),
    ([f"head_dim={2**31}"], f"invalid value for head_dim: {2**31}; it must be a whole number ≤ 2^31 − 1"),
    ([f"batch_size={2**31}"], "invalid value for batch_size"),
    ([f"fit_min_length={BIG}"], "invalid value for fit_min_length"),
    ([f"timeout_s={BIG}"], "invalid value for timeout_s: 1000"),
    (["repeats=1001"], "invalid value for repeats: 1001; it must be a whole number ≤ 1000"),
    (["output_dir="], "invalid value for output_dir: ''; it must be a folder (an unset shell variable gives the current "
                      "folder): give output_dir a folder, or leave it out"),
    (["output_dir=' '"], "invalid value for output_dir: ' '; it must be a folder"),
]


@pytest.mark.parametrize("overrides,expected", REFUSED, ids=[" ".join(o)[:40] for o, _ in REFUSED])
def test_a_profile_config_outside_the_rules_is_one_line(overrides, expected):
    from lra.validation import validate_tool

    cfg = compose_tool_config("lra-profile", [*QUICK, *overrides])
    with pytest.raises(ConfigError) as error:
        validate_tool(cfg)
    assert str(error.value).startswith(expected) and "\n" not in str(error.value), error.value
    if "invalid value for" in expected and not any(words in expected for words in ("≤", "naming each once", "a folder")):
        assert "≤" in str(error.value), error.value  # the bound is named


def test_the_limits_leave_an_ordinary_profile_alone():
    from lra.validation import validate_tool

    cfg = compose_tool_config("lra-profile", [*QUICK, "lengths=[64,2147483647]", "repeats=1000", "timeout_s=604800"])
    validate_tool(cfg)


def console(monkeypatch, capsys, *args):
    """lra-profile's console entry, in this process: (exit status, the lines on stderr)."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # the entry sets it; restored after the test
    monkeypatch.setattr(sys, "argv", ["lra-profile", *args])
    with pytest.raises(SystemExit) as exited:
        profile.main()
    return exited.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("args,expected", [
    (["~output_dir"], "error: ~output_dir deletes a key every run needs; set it instead (output_dir=<value>)"),
    (["--cfg", "job", "lengths=[0]"], "error: invalid value for lengths: [0]; it must be a non-empty list"),
    (["--cfg", "job", "backends=[softmax,softmax]"], "error: invalid value for backends: ['softmax', 'softmax']"),
])
def test_the_console_refuses_before_composing_or_showing(monkeypatch, capsys, args, expected):
    """``~output_dir`` (which Hydra cannot compose) and a dry run: one line, exit 2, as the run refuses."""
    code, lines = console(monkeypatch, capsys, *args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(expected), lines


def test_the_dry_run_refuses_what_the_run_refuses():
    with pytest.raises(ConfigError, match=r"^invalid value for lengths: \[0\]; it must be a non-empty list"):
        profile.check_dry_run([*QUICK, "lengths=[0]"])
    with pytest.raises(ConfigError, match=r"^~lengths deletes a key"):
        profile.check_dry_run([*QUICK, "~lengths"])
    with pytest.raises(ConfigError, match=r"^invalid value for backends: \['softmax', 'softmax'\]"):
        profile.check_dry_run(["backends=[softmax,softmax]"])
    profile.check_dry_run(QUICK)


def largest(monkeypatch, peaks_mb):
    """largest_batch over cells whose training peak per instance at batch 1, 2, 4, … is ``peaks_mb``."""
    tried = []

    def fake_cell(spec, timeout_s):
        tried.append(spec["batch"])
        return {"backend": spec["backend"], "n": spec["n"], "batch": spec["batch"], "error": None,
                "training_peak_mb": peaks_mb[len(tried) - 1]}

    monkeypatch.setattr(profile, "run_cell", fake_cell)
    cfg = SimpleNamespace(memory_budget_mb=10.0, max_batch=64, timeout_s=5)
    return profile.largest_batch({"backend": "softmax", "n": 64, "device": "cpu"}, cfg), tried


def test_largest_mode_keeps_the_last_batch_that_fits(monkeypatch):
    row, tried = largest(monkeypatch, [1.0, 1.0, 2.0, 2.0])  # 1, 2 MB fit; 4 × 2 MB fits; 8 × 2 MB does not
    assert row["batch"] == 4 and row["error"] is None and tried == [1, 2, 4, 8]


def test_largest_mode_never_reports_a_batch_that_does_not_fit(monkeypatch):
    row, tried = largest(monkeypatch, [11.0])
    assert tried == [1] and row["batch"] is None
    assert row["error"] == ("no batch fits the memory budget: batch 1's training peak is 11 MB, over "
                            "memory_budget_mb=10; raise memory_budget_mb")


def test_a_failed_cell_s_error_is_its_exception_s_line():
    from lra.profiling.measure import error_line

    def formatted(exc):
        try:
            raise exc
        except Exception as caught:  # noqa: BLE001
            return "".join(traceback.format_exception(caught))

    multi = formatted(ValueError('first line of it\nsecond line\n"'))
    assert error_line("a warning first\n" + multi) == "ValueError: first line of it"
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise OverflowError("the one that ended it") from None
    except OverflowError as outer:
        assert error_line("".join(traceback.format_exception(outer))) == "OverflowError: the one that ended it"
    assert error_line("killed by something\n\n") == "killed by something" and error_line("") is None


def test_a_run_removes_only_the_previous_run_s_outputs(tmp_path):
    for name in (*profile.OUTPUTS, "notes.txt"):
        (tmp_path / name).write_text("old")
    assert profile.start_folder(tmp_path) == list(profile.OUTPUTS)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def no_kernels(monkeypatch):
    """The compiled YOSO kernels cannot be built here (as without a compiler), before any warning of them."""
    from attention_zoo import _yoso_build, _yoso_ops

    def load(kind):
        raise _yoso_build.KernelUnavailable(f"no C++ compiler to build the YOSO {kind} kernels (simulated)")

    monkeypatch.setattr(_yoso_build, "load", load)
    monkeypatch.setattr(_yoso_ops, "_warned", set())


def test_a_yoso_cell_without_its_kernels_fails_at_every_length(monkeypatch, capsys):
    from lra.profiling import cell

    no_kernels(monkeypatch)
    spec = {"backend": "yoso", "batch": 1, "device": "cpu", "num_heads": 1, "head_dim": 8, "repeats": 1,
            "lengths": [64, 32]}
    monkeypatch.setattr(sys, "argv", ["cell", json.dumps(spec)])
    cell.main()
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["n"] for row in rows] == [32, 64] and not any("step_ms" in row for row in rows), rows
    for row in rows:
        assert row["error"].startswith("the compiled YOSO kernels are unavailable, so this cell would time the "
                                       "PyTorch fallback, not them: no C++ compiler to build the YOSO cpu kernels")
        assert row["error"].endswith("(build them first: lra-build-kernels cpu)")


def test_the_kernel_benchmark_s_yoso_cells_fail_without_their_kernels(monkeypatch):
    from lra.benchmarks import yoso_speed

    no_kernels(monkeypatch)
    with pytest.raises(Exception) as error:
        yoso_speed.measure("YOSO-32", 32, "cpu", 1, 8, 1)
    row = yoso_speed.error_row("YOSO-32", 32, error.value, "cpu")
    assert row["error"].startswith("failed: the compiled YOSO kernels are unavailable: no C++ compiler")
    assert "lra-build-kernels cpu" in row["error"] and "'YOSO-32 (PyTorch)'" in row["error"]
    assert yoso_speed.measure("YOSO-32 (PyTorch)", 32, "cpu", 1, 8, 1)["forward_ms"] > 0  # asked for by name


def test_a_profile_without_the_kernels_fails_and_its_folder_holds_this_run_alone(tmp_path):
    """End to end: no compiler for the kernels; the folder held another run's outputs."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("profile.md", "profile.png", "profile.json", "exponents.csv", "profile_config.yaml"):
        (out / name).write_text("the previous run's")
    result = run_command(["lra-profile", "backends=[yoso]", "lengths=[64]", "num_heads=1", "head_dim=8", "repeats=1",
                          f"output_dir={out}", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, tmp_path,
                         env_extra={"CXX": str(tmp_path / "no-compiler"), "LRA_KERNEL_CACHE": str(tmp_path / "kc")},
                         check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and last.startswith("error: every cell failed (the first: yoso at n = 64: the "
                                                      "compiled YOSO kernels are unavailable"), result.stderr
    assert "lra-build-kernels cpu" in last and "Traceback" not in result.stderr
    frame = pd.read_csv(out / "profile.csv")
    assert frame["step_ms"].isna().all() and frame["error"].str.contains("kernels are unavailable").all()
    assert "the previous run's" not in (out / "profile.md").read_text() + (out / "profile_config.yaml").read_text()
    assert "- yoso" in (out / "profile_config.yaml").read_text()
    assert (f"removed the previous run's profile.json, exponents.csv, profile.md, profile.png, profile_config.yaml "
            f"from {out}") in result.stdout + result.stderr
    mixed = run_command(["lra-profile", "backends=[yoso,none]", "lengths=[64]", "num_heads=1", "head_dim=8",
                         "repeats=1", f"output_dir={tmp_path / 'mixed'}", f"hydra.run.dir={tmp_path / 'run2'}"],
                        tmp_path, tmp_path, check=False,
                        env_extra={"CXX": str(tmp_path / "no-compiler"), "LRA_KERNEL_CACHE": str(tmp_path / "kc")})
    last = mixed.stderr.strip().splitlines()[-1]  # one cell measured, one that should have been: not a success
    assert mixed.returncode == 1 and last.startswith("error: 1 of 2 cells failed (the first: yoso at n = 64: the "
                                                     "compiled YOSO kernels are unavailable"), mixed.stderr
    assert last.endswith(f"; see {tmp_path / 'mixed' / 'profile.md'}")
    assert pd.read_csv(tmp_path / "mixed" / "profile.csv").set_index("backend").loc["none", "step_ms"] > 0
