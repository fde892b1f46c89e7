"""lra-table --wandb: a W&B project's runs are records like a folder's, screened the same way, and a run
both logged to W&B and given as a folder counts once. W&B itself is a stand-in module (no network)."""

from __future__ import annotations

import json
import sys
from types import ModuleType, SimpleNamespace

import pytest

from test_table_edges import cell, table


def folder_run(folder, seed, accuracy, label="Softmax"):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"label": label, "task": "listops", "seed": seed,
                                                     "status": "completed", "test_accuracy": accuracy}))
    return folder


def wandb_run(name="Softmax", seed=0, accuracy=36.0, state="finished", run_dir=None, task="listops", **summary):
    summary = {**({"test/accuracy": accuracy} if accuracy is not None else {}), **summary}
    if run_dir is not None:
        summary["run_dir"] = str(run_dir)
    config = {"seed": seed, **({"task": {"name": task}} if task is not None else {})}
    return SimpleNamespace(name=name, summary=summary, config=config, state=state,
                           url=f"https://wandb.ai/me/lra/runs/{name}{seed}")


@pytest.fixture
def project(monkeypatch):
    """The runs W&B's public API returns for any project: set ``project.runs``."""
    holder = SimpleNamespace(runs=[])
    module = ModuleType("wandb")
    module.Api = lambda: SimpleNamespace(runs=lambda name: list(holder.runs))
    monkeypatch.setitem(sys.modules, "wandb", module)
    return holder


def test_project_runs_are_rows_and_a_crashed_run_is_failed(project, capsys):
    project.runs = [wandb_run(seed=0, accuracy=36.0), wandb_run(seed=1, accuracy=38.0),
                    wandb_run("None", 0, None, state="crashed")]
    code, out, err = table(["--wandb", "me/lra", "--format", "json"], capsys)
    rows = {row["backend"]: row for row in json.loads(out)}
    assert code == 0 and rows["Softmax"]["mean"] == 37.0 and rows["Softmax"]["seeds"] == 2, err
    assert rows["None"]["failed"] == 1 and rows["None"]["mean"] is None


def test_a_wandb_run_keeps_its_device_and_yoso_engine_in_the_cost_columns(project, capsys):
    """The trainer logs device and attention_engine to the run's summary: its tokens/s is labelled as a run
    folder's is."""
    project.runs = [wandb_run("YOSO-32", 0, 30.0, device="cuda (NVIDIA H100 80GB HBM3)", attention_engine="torch",
                              train_tokens_per_second=2e5),
                    wandb_run("Softmax", 0, 31.0, device="cpu (x86_64, 2 threads)", train_tokens_per_second=5e3)]
    code, out, err = table(["--wandb", "me/lra", "--efficiency"], capsys)
    assert code == 0 and "| 200,000 (PyTorch path) " in out and "| 5,000 (CPU) " in out, out + err


def test_a_run_given_as_folder_and_logged_to_wandb_counts_once(tmp_path, project, capsys):
    """The W&B copy of a run whose folder is in the table is left out with a note; a W&B run of another
    seed joins the cell."""
    zero = folder_run(tmp_path / "sweep" / "0", 0, 30.0)
    folder_run(tmp_path / "sweep" / "1", 1, 34.0)
    project.runs = [wandb_run(seed=0, accuracy=30.0, run_dir=zero), wandb_run(seed=1, accuracy=34.0,
                                                                              run_dir=tmp_path / "sweep" / "1"),
                    wandb_run(seed=2, accuracy=38.0, run_dir="/elsewhere/run")]
    code, out, err = table([tmp_path / "sweep", "--wandb", "me/lra"], capsys)
    assert code == 0 and cell(out, "Softmax").startswith("**34.00** ± 4.00 (3)"), out + err
    assert err.count("left out the W&B run") == 2 and f"it is the run in {zero}" in err


@pytest.mark.parametrize("summary, why", [
    ({"test/accuracy": float("inf")}, "test_accuracy is inf, not a finite number"),
    ({"test/accuracy": 250.0}, "test_accuracy is 250.0, outside 0 … 100"),
    ({"test/accuracy": "Infinity"}, "test_accuracy is 'Infinity', not a number"),
    ({"test/accuracy": 36.0, "peak_memory_mb": -5}, "peak_memory_mb is -5, below 0"),
])
def test_wandb_values_a_table_cannot_use_are_left_out_as_a_files_are(project, capsys, summary, why):
    project.runs = [wandb_run(seed=0, accuracy=30.0), wandb_run(seed=1, accuracy=None, **summary)]
    code, out, err = table(["--wandb", "me/lra", "--efficiency"], capsys)
    assert code == 0 and f"the W&B run https://wandb.ai/me/lra/runs/Softmax1: {why}" in err, err
    accuracy_left_out = "peak_memory_mb" not in why
    assert cell(out, "Softmax").startswith("**30.00**" if accuracy_left_out else "**33.00** ± 4.24 (2)"), out
    assert ("1 invalid" in cell(out, "Softmax")) == accuracy_left_out, out


@pytest.mark.parametrize("run, why", [
    (wandb_run(task=None), "it has no task"),
    (wandb_run(name=None), "it has no label"),
    (wandb_run(seed=-2), "its seed is -2, not a whole number ≥ 0"),
])
def test_a_wandb_run_that_cannot_take_a_place_is_a_note_not_a_login_error(project, capsys, run, why):
    project.runs = [wandb_run(seed=5, accuracy=30.0), run]
    code, out, err = table(["--wandb", "me/lra"], capsys)
    assert code == 0 and f"skipped the W&B run {run.url}: {why}" in err, err
    assert "wandb login" not in err and cell(out, "Softmax").startswith("**30.00**"), out
