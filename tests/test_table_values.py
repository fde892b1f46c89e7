"""A table never averages a value that cannot be what its record says (an accuracy of Infinity, NaN,
−3 or 250 percent, a throughput below zero, a string): the value is left out of the statistic, the
cell counts it, a note under the table and a ``note:`` line name the run and the value."""

from __future__ import annotations

import json
import statistics

import pytest

from conftest import run_command
from lra.commands.table import main as table_main
from lra.results.table import collect, comparison

BAD_ACCURACIES = {"Infinity": "test_accuracy is inf, not a finite number",
                  "-Infinity": "test_accuracy is -inf, not a finite number",
                  "NaN": "test_accuracy is nan, not a finite number",
                  "-3.0": "test_accuracy is -3.0, outside 0 … 100 (percent)",
                  "250": "test_accuracy is 250, outside 0 … 100 (percent)",
                  '"36.0"': "test_accuracy is '36.0', not a number",
                  "true": "test_accuracy is True, not a number"}


def write_record(folder, seed, accuracy_json: str, **extra):
    folder.mkdir(parents=True)
    fields = ", ".join(f'"{k}": {json.dumps(v)}' for k, v in extra.items())
    (folder / "metrics.json").write_text('{"label": "Softmax", "task": "listops", "seed": %d, "status": "completed", '
                                         '"test_accuracy": %s%s}' % (seed, accuracy_json, ", " + fields if fields else ""))


@pytest.mark.parametrize("value", BAD_ACCURACIES)
def test_an_accuracy_that_is_no_percentage_is_left_out_counted_and_named(tmp_path, value):
    write_record(tmp_path / "good0", 0, "36.0")
    write_record(tmp_path / "good1", 1, "38.5")
    write_record(tmp_path / "bad", 2, value)
    warnings = []
    table = comparison(collect([tmp_path], warnings.append))
    assert table.loc["Softmax", "listops"] == f"{37.25:.2f} ± {statistics.stdev([36.0, 38.5]):.2f} (2, 1 invalid)"
    assert warnings == [f"{tmp_path / 'bad' / 'metrics.json'}: {BAD_ACCURACIES[value]}; left out of the table"]


def test_lra_table_with_an_infinite_accuracy_shows_no_inf_and_names_the_run(tmp_path, data_dir):
    """End to end, in every format: no 'inf ± nan' anywhere, valid JSON."""
    write_record(tmp_path / "runs" / "a", 0, "Infinity")
    write_record(tmp_path / "runs" / "b", 0, "NaN", label="YOSO-32")
    write_record(tmp_path / "runs" / "c", 1, "40.0", label="YOSO-32")
    out = run_command(["lra-table", "runs"], tmp_path, data_dir)
    cells = out.stdout.split("\n\nruns:")[0]
    assert "inf" not in cells.replace("invalid", "") and "nan" not in cells.lower(), cells
    assert "| Softmax   | invalid (1)" in out.stdout and "40.00** (1, 1 invalid)" in out.stdout, out.stdout
    assert "invalid values, left out of the table" in out.stdout and "- runs/a: test_accuracy is inf" in out.stdout
    assert "note: runs/a/metrics.json: test_accuracy is inf, not a finite number" in out.stderr
    numbers = run_command(["lra-table", "runs", "--format", "json"], tmp_path, data_dir).stdout
    assert "Infinity" not in numbers and "NaN" not in numbers
    rows = {row["backend"]: row for row in json.loads(numbers)}
    assert rows["Softmax"]["mean"] is None and rows["Softmax"]["invalid"] == 1
    assert rows["YOSO-32"]["mean"] == 40.0 and rows["YOSO-32"]["invalid"] == 1
    latex = run_command(["lra-table", "runs", "--format", "latex"], tmp_path, data_dir).stdout
    assert "invalid (1)" in latex and "inf" not in latex.replace("invalid", "")


def test_efficiency_values_and_another_metric_are_screened_too(tmp_path, capsys):
    write_record(tmp_path / "a", 0, "36.0", train_tokens_per_second=-5.0, peak_memory_mb=float("inf"),
                 num_parameters=1000, best_val_accuracy=101.0)
    write_record(tmp_path / "b", 1, "38.0", train_tokens_per_second=1000.0, peak_memory_mb=10.0, num_parameters=1000,
                 best_val_accuracy=40.0)
    table_main([str(tmp_path), "--efficiency"])
    captured = capsys.readouterr()
    assert "| 1,000 " in captured.out and "| 10 " in captured.out, captured.out  # the valid run's alone
    assert "train_tokens_per_second is -5.0, below 0" in captured.err and "peak_memory_mb is inf" in captured.err
    table_main([str(tmp_path), "--metric", "best_val_accuracy"])
    captured = capsys.readouterr()
    assert "40.00** (1, 1 invalid)" in captured.out and "best_val_accuracy is 101.0, outside 0 … 100" in captured.err


def test_a_seed_stuck_at_chance_is_counted_among_the_seeds_whose_value_is_valid(tmp_path):
    """'3 of 2 at chance' was printed: the stuck count took in a seed whose accuracy was left out."""
    write_record(tmp_path / "a", 0, "25.0", stuck_at_chance=True)
    write_record(tmp_path / "b", 1, "Infinity", stuck_at_chance=True)
    write_record(tmp_path / "c", 2, "40.0", stuck_at_chance=False)
    table = comparison(collect([tmp_path]))
    assert table.loc["Softmax", "listops"] == f"{32.5:.2f} ± {statistics.stdev([25.0, 40.0]):.2f} (2, 1 invalid; 1 of 2 " \
                                               "at chance)"


def test_a_record_whose_seed_or_status_is_no_seed_or_status_is_left_out_with_a_note(tmp_path):
    """Such a record cannot take a place among (backend, task, seed): it was averaged in as a seed of its own,
    or listed as an unfinished run with a resume command."""
    write_record(tmp_path / "good", 0, "36.0")
    (tmp_path / "words").mkdir()
    (tmp_path / "words" / "metrics.json").write_text('{"label": "Softmax", "task": "listops", "seed": "zero", '
                                                     '"status": "completed", "test_accuracy": 90.0}')
    write_record(tmp_path / "half", 7, "90.0")
    record = json.loads((tmp_path / "half" / "metrics.json").read_text())
    (tmp_path / "half" / "metrics.json").write_text(json.dumps(record | {"seed": 1.5}))
    write_record(tmp_path / "bogus", 3, "90.0")
    record = json.loads((tmp_path / "bogus" / "metrics.json").read_text())
    (tmp_path / "bogus" / "metrics.json").write_text(json.dumps(record | {"status": "done"}))
    warnings = []
    table = comparison(collect([tmp_path], warnings.append))
    assert table.loc["Softmax", "listops"] == "36.00 (1)"
    assert sorted(warnings) == sorted([
        f"skipped {tmp_path / 'words' / 'metrics.json'}: its seed is 'zero', not a whole number ≥ 0 (the record is "
        "damaged or was edited)",
        f"skipped {tmp_path / 'half' / 'metrics.json'}: its seed is 1.5, not a whole number ≥ 0 (the record is damaged "
        "or was edited)",
        f"skipped {tmp_path / 'bogus' / 'metrics.json'}: its status is 'done', not one of running, completed, failed, "
        "interrupted (the record is damaged or was edited)"])


def test_huge_finite_values_are_no_measurement_and_never_overflow_a_mean(tmp_path, capsys):
    """Two records of 1e308 tokens/s averaged to 'inf' (with numpy's overflow warning on stderr) and the JSON
    numbers to null; a fractional parameter count was averaged in."""
    write_record(tmp_path / "a", 0, "36.0", train_tokens_per_second=1e308, peak_memory_mb=10.0, num_parameters=1000)
    write_record(tmp_path / "b", 1, "38.0", train_tokens_per_second=1e308, peak_memory_mb=10.0, num_parameters=1000.5)
    write_record(tmp_path / "c", 2, "40.0", train_tokens_per_second=500.0, peak_memory_mb=1e300, num_parameters=1000)
    table_main([str(tmp_path), "--efficiency"])
    captured = capsys.readouterr()
    assert "| 500 " in captured.out and "| 10 " in captured.out and "inf" not in captured.out, captured.out
    assert "RuntimeWarning" not in captured.err and "overflow" not in captured.err, captured.err
    assert "train_tokens_per_second is 1e+308, beyond 1e+15, no measurement of a run" in captured.err
    assert "num_parameters is 1000.5, not a whole number" in captured.err
    assert "peak_memory_mb is 1e+300, beyond 1e+15" in captured.err


def test_folders_without_a_usable_run_record_are_an_error_not_an_empty_table(tmp_path, data_dir):
    """'(no runs found)' with exit 0 for a folder with no run in it (a wrong path) or only damaged records."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "metrics.json").write_text('{"label": "Softmax"')
    for folder, code, words in (("empty", 2, "error: no run records (metrics.json) under empty; pass run or sweep "),
                                ("damaged", 1, "error: none of the 1 run records under damaged can be tabulated")):
        result = run_command(["lra-table", folder], tmp_path, data_dir, check=False)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == code and len(errors) == 1 and errors[0].startswith(words), result.stderr
        assert result.stdout == "" and "Traceback" not in result.stderr


def test_a_completed_record_without_its_result_is_counted_invalid_not_shown_as_no_run(tmp_path):
    """A completed record whose test_accuracy was removed (or is null) made the cell '—', as if no run had
    completed, without a word."""
    write_record(tmp_path / "a", 0, "36.0")
    write_record(tmp_path / "b", 1, "null")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "metrics.json").write_text('{"label": "Softmax", "task": "listops", "seed": 2, "status": "completed"}')
    warnings = []
    table = comparison(collect([tmp_path], warnings.append))
    assert table.loc["Softmax", "listops"] == "36.00 (1, 2 invalid)"
    assert warnings == [f"{tmp_path / run / 'metrics.json'}: test_accuracy is missing from a completed record; left "
                        "out of the table" for run in ("b", "c")]
