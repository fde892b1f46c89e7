"""Comparison tables: mean ± std over seeds against an independent computation, missing and failed
cells never shown as numbers, and the table a real multirun prints at its end."""

import json
import statistics

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from lra.commands.table import main as table_main
from lra.results.table import collect, comparison


def write_run(folder, label, task, seed, status, accuracy=None):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(
        {"label": label, "task": task, "seed": seed, "status": status, "test_accuracy": accuracy}))


def test_cells_mean_std_missing_failed_and_complete_row_averages(tmp_path):
    write_run(tmp_path / "a", "Softmax", "listops", 0, "completed", 36.0)
    write_run(tmp_path / "b", "Softmax", "listops", 1, "completed", 38.5)
    write_run(tmp_path / "c", "Softmax", "text", 0, "completed", 64.0)
    write_run(tmp_path / "d", "None", "listops", 0, "completed", 19.0)
    write_run(tmp_path / "e", "None", "text", 0, "failed")
    write_run(tmp_path / "f", "YOSO-32", "text", 0, "running", 99.0)
    table = comparison(collect([tmp_path]))
    assert list(table.index) == ["None", "Softmax", "YOSO-32"]  # the paper's row order, then others
    std = statistics.stdev([36.0, 38.5])
    assert table.loc["Softmax", "listops"] == f"{37.25:.2f} ± {std:.2f} (2)"
    assert table.loc["Softmax", "average"] == f"{(37.25 + 64.0) / 2:.2f}"
    assert table.loc["None", "text"] == "failed" and table.loc["None", "average"] == "—"
    assert table.loc["YOSO-32", "text"] == "—", "a running job is not a result"


def test_lra_table_command_formats(tmp_path, capsys):
    write_run(tmp_path / "a", "Softmax", "listops", 0, "completed", 36.0)
    table_main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| Softmax   | 36.00 (1)" in out and "runs: 1 completed" in out
    table_main([str(tmp_path), "--format", "csv", "--output", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().splitlines()[1] == "Softmax,36.00 (1),36.00"


def test_a_multirun_prints_the_table_of_its_own_runs(tmp_path, data_dir):
    result = run_command(["lra-train", "-m", "attention=softmax,none", "seed=0,1", "trainer=smoke",
                          "trainer.max_steps=4", "trainer.eval_every=2", *SMALL_LISTOPS], tmp_path, data_dir)
    runs = [read_json(r / "metrics.json") for r in run_dirs(tmp_path)]
    assert len(runs) == 4 and all(r["status"] == "completed" for r in runs)
    for label in ("Softmax", "None"):
        accuracies = [r["test_accuracy"] for r in runs if r["label"] == label]
        cell = f"{statistics.mean(accuracies):.2f} ± {statistics.stdev(accuracies):.2f} (2)"
        assert f"| {label:<9} | {cell}" in result.stdout, result.stdout
    (sweep,) = {r.parent for r in run_dirs(tmp_path)}
    assert (sweep / "table.md").is_file()
