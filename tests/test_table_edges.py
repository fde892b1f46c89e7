"""lra-table at the edges of what it is given: fields a record should not hold, a run folder reached by a
link, a folder name that is no UTF-8, an empty argument, an output over Hydra's own files, metrics where
lower is better or that are no measurement, and runs without a seed."""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest

from test_table_inputs import table_of as table


def record(label="Softmax", seed=0, accuracy=36.0, status="completed", **extra) -> dict:
    return {"label": label, "task": "listops", "seed": seed, "status": status, "test_accuracy": accuracy, **extra}


def write(folder, content: dict):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, b"metrics.json" if isinstance(folder, bytes) else "metrics.json"), "w") as f:
        json.dump(content, f)
    return folder


def cell(out: str, label: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"| {label} ")).split("|")[2].strip()


def test_fields_lra_table_derives_are_never_taken_from_the_file(tmp_path, capsys):
    """A record's own invalid_values (once a list: a TypeError) and setup (which skipped reading its config,
    so it could merge into any row) are dropped with a note; the rest of the record counts."""
    write(tmp_path / "a", record(seed=0, accuracy=30.0, invalid_values=["x"], setup="deadbeef"))
    write(tmp_path / "b", record(seed=1, accuracy=34.0, invalid_values={"test_accuracy": "made up"}))
    code, out, err = table([tmp_path, "--runs"], capsys)
    assert code == 0 and cell(out, "Softmax").startswith("**32.00** ± 2.83 (2)"), out + err
    assert f"{tmp_path / 'a' / 'metrics.json'}: ignored its invalid_values, setup (lra-table derives them" in err
    assert "made up" not in out and "invalid values" not in out


def test_a_link_to_a_run_folder_is_named_not_dropped_silently(tmp_path, capsys):
    write(tmp_path / "sweep" / "0", record(seed=0))
    write(tmp_path / "elsewhere" / "1", record(seed=1, accuracy=38.0))
    os.symlink(tmp_path / "elsewhere" / "1", tmp_path / "sweep" / "1")
    os.makedirs(tmp_path / "sweep" / "0" / "wandb" / "offline-run-1")
    os.symlink("offline-run-1", tmp_path / "sweep" / "0" / "wandb" / "latest-run")  # W&B's own: no run, no note
    code, out, err = table([tmp_path / "sweep"], capsys)
    assert code == 0 and cell(out, "Softmax").startswith("**36.00** (1)"), out
    assert err.splitlines() == [f"note: not followed: {tmp_path / 'sweep' / '1'}, a link to the run folder "
                                f"{tmp_path / 'elsewhere' / '1'}; pass that folder too to count its run"]


def test_a_folder_name_that_is_no_utf8_is_a_note_not_a_crash(tmp_path, capsys):
    sweep = os.fsencode(tmp_path / "sweep")
    write(sweep + b"/run\xff", record(seed=0, status="failed", accuracy=None, error="x"))
    write(sweep + b"/ok", record(seed=1, accuracy=30.0))
    code, out, err = table([sweep, "--runs"], capsys)
    assert code == 0 and cell(out, "Softmax").startswith("**30.00** (1)"), err
    assert f"note: skipped {tmp_path}/sweep/run\\xff/metrics.json: its path is not UTF-8 text" in err
    code, _, err = table([sweep + b"/run\xff"], capsys)
    assert code == 1 and err.splitlines()[-1].startswith(f"error: none of the 1 run records under {tmp_path}/sweep/run"
                                                         "\\xff can be tabulated")


def test_a_bug_report_keeps_an_argument_that_is_no_utf8(tmp_path, monkeypatch):
    from lra.commands.config_errors import bug_line

    monkeypatch.setattr(sys, "argv", ["lra-table", os.fsdecode(b"run\xff")])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])  # no command's log file: the report is a file of its own
    line = bug_line(RuntimeError("boom"))
    (report,) = tmp_path.glob("lra-table-traceback-*.txt")
    assert f"its traceback is in {report}" in line and report.read_bytes().startswith(b"lra-table run\xff\n\n")


def test_an_empty_folder_argument_is_refused_not_read_as_this_folder(tmp_path, capsys, monkeypatch):
    write(tmp_path / "r", record())
    monkeypatch.chdir(tmp_path)
    code, out, err = table([""], capsys)
    assert code == 2 and out == "" and "a directory argument is empty (an unset shell variable?)" in err
    assert table(["."], capsys)[0] == 0


@pytest.mark.parametrize("name", ["multirun.yaml", ".hydra/config.yaml"])
def test_output_never_replaces_hydras_files(tmp_path, capsys, name):
    write(tmp_path / "sweep" / "0", record())
    target = tmp_path / "sweep" / name
    target.parent.mkdir(exist_ok=True)
    target.write_text("hydra: {}\n")
    code, _, err = table([tmp_path / "sweep", "--output", target], capsys)
    assert code == 1 and "a file Hydra keeps of a sweep or run" in err and target.read_text() == "hydra: {}\n"


@pytest.mark.parametrize("metric, bold, legend", [
    ("test_loss", "1.00", "**bold**: the lowest test_loss of a column"),
    ("wall_time_seconds", "10.00", "**bold**: the lowest wall_time_seconds of a column"),
    ("train_tokens_per_second", "900.00", "**bold**: the highest train_tokens_per_second of a column"),
    ("steps", None, "nothing is bold: a higher or lower steps is not better in itself"),
])
def test_bold_is_the_best_in_the_metrics_own_direction(tmp_path, capsys, metric, bold, legend):
    write(tmp_path / "a", record("Softmax", test_loss=1.0, wall_time_seconds=10.0, train_tokens_per_second=500.0,
                                 steps=100))
    write(tmp_path / "b", record("None", test_loss=2.0, wall_time_seconds=20.0, train_tokens_per_second=900.0,
                                 steps=200))
    code, out, err = table([tmp_path, "--metric", metric], capsys)
    bolded = [value for label in ("Softmax", "None") for value in [cell(out, label)] if value.startswith("**")]
    assert code == 0 and legend in out, out + err
    assert bolded == ([f"**{bold}** (1)"] if bold else []), out


def test_a_yes_or_no_field_is_no_metric_and_a_flag_that_is_no_boolean_is_named(tmp_path, capsys):
    write(tmp_path / "a", record(seed=0, accuracy=30.0, stuck_at_chance=False))
    write(tmp_path / "b", record(seed=1, accuracy=34.0, stuck_at_chance=True))
    code, _, err = table([tmp_path, "--metric", "stuck_at_chance"], capsys)
    assert code == 2 and "is not a number in the run records" in err and "stuck_at_chance" not in \
        err.splitlines()[-1].split("choose --metric from")[1]
    write(tmp_path / "c", record(seed=2, accuracy=35.0, stuck_at_chance="yes"))
    code, out, err = table([tmp_path], capsys)
    assert code == 0 and f"{tmp_path / 'c' / 'metrics.json'}: stuck_at_chance is 'yes', not true or false" in err
    assert "1 of 3 at chance" in cell(out, "Softmax"), out


def test_runs_without_a_seed_are_never_merged_as_repeats(tmp_path, capsys):
    """Two jobs refused before they had a seed are two failed runs, in the cell and in the list under it."""
    for name in ("a", "b"):
        write(tmp_path / name, {"label": "Softmax", "task": "listops", "status": "failed", "error": f"refused {name}"})
    write(tmp_path / "c", record(seed=0, accuracy=30.0))
    code, out, err = table([tmp_path], capsys)
    assert code == 0 and cell(out, "Softmax") == "**30.00** (1, 2 failed)", out
    assert "failed runs (2)" in out and "dropped" not in err, err


def test_a_folder_that_cannot_be_listed_is_the_reason_given_not_a_missing_record(tmp_path, capsys, monkeypatch):
    write(tmp_path / "sweep" / "0", record())
    monkeypatch.setenv("LRA_FAULT", "table_list:1:EACCES")
    code, out, err = table([tmp_path / "sweep"], capsys)
    assert code == 1 and out == "" and err.splitlines()[-1] == (
        f"error: no run record found under {tmp_path / 'sweep'}, where 1 folder could not be listed (the note above "
        "names it); give this user read access, or pass folders it can read"), err


def test_plot_task_without_a_plot_is_refused_not_ignored(tmp_path, capsys):
    write(tmp_path / "r", record())
    code, out, err = table([tmp_path, "--plot-task", "listops"], capsys)
    assert code == 2 and out == "" and "add --plot FILE.png, or leave --plot-task out" in err


def test_a_run_stopped_in_its_stage_1_is_listed_at_its_stage_1_step_not_at_step_none(tmp_path):
    from lra.results.listing import unfinished

    stopped = {"run_dir": str(tmp_path / "spt"), "status": "interrupted", "error": "interrupted (SIGTERM)",
               "steps": None, "pretrain_status": "interrupted", "pretrain_steps": 3}
    later = {**stopped, "run_dir": str(tmp_path / "fine"), "pretrain_status": "completed", "steps": 7}
    lines = unfinished([stopped, later]).splitlines()
    assert lines[1].startswith(f"- {tmp_path / 'spt'}: interrupted (SIGTERM) at stage-1 step 3; resume with: ")
    assert lines[2].startswith(f"- {tmp_path / 'fine'}: interrupted (SIGTERM) at step 7; resume with: ")
