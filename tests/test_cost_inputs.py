"""``lra-table --cost`` on runs a table tells apart and on values it must not trust: runs of one label in
different setups are different rows, as in the table, and only a run of the preset's setup measures its
cell; a record's processes, train_tokens and gpu_seconds are screened (a note naming the record and the
value, the GPU time or tokens shown as unknown, never guessed); --gpu-share and --cost-seeds out of range
are one error line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from lra.commands.table import main as table_main
from lra.results import cost, setups
from lra.results.cost_preset import Cell
from test_cost import CELLS, H100, OLD_CONFIG, REPO, cost_report, write_run

# A packed reference run's config (Softmax on ListOps, 5,000 steps): a setup as lra-train saves it.
REFERENCE_CONFIG = (REPO / "docs" / "gpu" / "2026-11-27c" / "records" / "softmax-seed0" / "resolved.yaml").read_text()
ON_H100 = {"device": f"cuda ({H100})", "gpu_name": H100}


def config(task: str = "listops", **changes) -> dict:
    """The reference config on ``task``, with ``changes`` ({"trainer.max_steps": 10}, keys dotted)."""
    raw = yaml.safe_load(REFERENCE_CONFIG)
    raw["task"]["name"] = task
    if task != "listops":
        raw["task"].pop("generator")  # ListOps's own
    for key, value in {**changes}.items():
        group, name = key.split(".")
        raw[group][name] = value
    return raw


def run(folder: Path, label: str, task: str, seed: int, raw: dict, **fields) -> Path:
    return write_run(folder, label, task, seed, config=yaml.safe_dump(raw), **fields)


def per_cell(out: str) -> list:
    """The lines of the row × task table, to the notes under it."""
    start = out.index("H100-seconds of a completed run, row × task")
    return out[start:].split("\n\n")[1].splitlines()


def test_runs_of_one_label_in_another_setup_are_their_own_row_named_as_the_table_names_it(tmp_path, capsys):
    run(tmp_path / "a0", "Softmax", "listops", 0, config(), preset=None, wall_time_seconds=100.0, gpu_seconds=100.0,
        **ON_H100)
    run(tmp_path / "a1", "Softmax", "listops", 1, config(), preset=None, wall_time_seconds=300.0, gpu_seconds=300.0,
        **ON_H100)
    run(tmp_path / "b0", "Softmax", "listops", 0, config(**{"trainer.max_steps": 10}), preset=None,
        wall_time_seconds=10.0, gpu_seconds=10.0, **ON_H100)  # a 10-step run beside the 5,000-step ones
    out = cost_report(capsys, tmp_path)
    assert per_cell(out) == ["| backend | listops |", "|:--|--:|", "| Softmax | 200 measured (2) |",
                             "| Softmax (trainer.max_steps=10) | 10 measured (1) |"]  # not 137 (3)
    assert f"| Softmax (trainer.max_steps=10) | listops | 0 | completed | {H100} | 10 | 1.00 | 10 measured |" in out
    assert "- Softmax on listops, 2 setups (against Softmax's, the most runs):" in out
    assert "trainer.max_steps 10 ≠ 5000" in out
    table_main([str(tmp_path)])  # the table's own rows: the same names
    table = capsys.readouterr().out
    assert "| Softmax (trainer.max_steps=10) |" in table and "\n| Softmax " in table


def test_only_runs_of_the_presets_setup_measure_its_cell(tmp_path, capsys, monkeypatch):
    """A run of the preset with another model (the same training tokens) is no measurement of the preset's cell:
    beside a run of the preset's setup it is left out of the cell; alone it projects the cell, which says so."""
    made = setups.Setups()
    listops, text = (made.setup_of(config(task))[0] for task in ("listops", "text"))
    monkeypatch.setattr(cost, "preset_cells", lambda preset: [
        Cell("Softmax", "listops", 1000, setup=setups.fingerprint(listops), setup_config=listops),
        Cell("Softmax", "text", 2000, setup=setups.fingerprint(text), setup_config=text)])
    tokens = {"train_tokens": 1000, **ON_H100}
    run(tmp_path / "own", "Softmax", "listops", 0, config(), wall_time_seconds=3600.0, gpu_seconds=3600.0, **tokens)
    run(tmp_path / "wide", "Softmax", "listops", 0, config(**{"model.dim": 128}), wall_time_seconds=36000.0,
        gpu_seconds=36000.0, **tokens)  # 36 s/token where the preset's setup took 3.6
    run(tmp_path / "wide_text", "Softmax", "text", 0, config("text", **{"model.dim": 128}), wall_time_seconds=7200.0,
        gpu_seconds=7200.0, **{**tokens, "train_tokens": 2000})
    out = cost_report(capsys, tmp_path, "--cost-seeds", "1")
    projection = out[out.index("Projection"):]
    assert "| Softmax | 1.00 measured | 2.00 projected | 3.00 |" in projection  # not 5.50 measured, 2.00 measured
    assert "**Total: 3.0 H100-hours** for 2 cells × 1 seeds: 1.00 measured (1 cell, the mean of their runs), 2.0 " \
           "projected (1 cell)." in projection
    assert "- another setup than the preset's (a run's against the preset's job): Softmax on text (model.dim 128 ≠ " \
           "64)" in projection
    assert per_cell(out)[2:] == ["| Softmax | — | 7,200 measured (1) |",
                                 "| Softmax (model.dim=128) | 36,000 measured (1) | — |",
                                 "| Softmax (model.dim=64) | 3,600 measured (1) | — |"]  # as the table names them


@pytest.mark.parametrize("processes, shown", [(float("inf"), "inf"), (2.5, "2.5"), ("4", "'4'"), (0, "0"), (-1, "-1"),
                                              (True, "True")])
@pytest.mark.parametrize("measured", [False, True])
def test_a_processes_that_is_no_whole_number_of_at_least_1_makes_the_gpu_time_unknown_with_a_note(
        tmp_path, capsys, processes, shown, measured):
    write_run(tmp_path / "a", "Softmax", "listops", 0, preset=None, wall_time_seconds=10.0, processes=processes,
              device=f"cuda ({H100})", **({"gpu_seconds": 5.0, "gpu_name": H100} if measured else {}))
    table_main([str(tmp_path), "--cost"])
    out, err = capsys.readouterr()
    assert f"| Softmax | listops | 0 | completed | {H100} | 10 | — | unknown | — |" in out  # not as 1 process
    assert f"note: {tmp_path / 'a' / 'metrics.json'}: processes is {shown}, not a whole number ≥ 1; its GPU time " \
           "is taken as unknown" in err.splitlines()
    assert "H100-seconds per run, row × task: none (no completed run has a known GPU time)" in out


@pytest.mark.parametrize("processes, row", [(2, "| 10 | 0.25 assumed | 5.00 derived | 5.00 |"),
                                            (4.0, "| 10 | 0.25 assumed | 10 derived | 10 |")])
def test_a_whole_number_of_processes_multiplies_a_derived_gpu_time(tmp_path, capsys, processes, row):
    write_run(tmp_path / "a", "Softmax", "listops", 0, preset=None, wall_time_seconds=10.0, processes=processes,
              device=f"cuda ({H100})")
    table_main([str(tmp_path), "--cost"])
    out, err = capsys.readouterr()
    assert row in out and "processes" not in err


def test_gpu_seconds_beyond_wall_time_times_processes_is_unknown_with_a_note(tmp_path, capsys):
    write_run(tmp_path / "one", "Softmax", "listops", 0, preset=None, wall_time_seconds=100.0, gpu_seconds=150.0,
              **ON_H100)
    write_run(tmp_path / "two", "Softmax", "listops", 1, preset=None, wall_time_seconds=100.0, gpu_seconds=150.0,
              processes=2, **ON_H100)  # two processes on a GPU each: 150 of 200 GPU-seconds
    table_main([str(tmp_path), "--cost"])
    out, err = capsys.readouterr()
    assert f"| Softmax | listops | 0 | completed | {H100} | 100 | — | unknown | — |" in out
    assert f"note: {tmp_path / 'one' / 'metrics.json'}: gpu_seconds is 150 for 100 s of wall time × 1 process: a " \
           "share of its GPU above 1; its GPU time is taken as unknown" in err.splitlines()
    assert f"| Softmax | listops | 1 | completed | {H100} | 100 | 0.75 | 150 measured | 150 |" in out
    assert per_cell(out)[2] == "| Softmax | 150 measured (1) + 1 unknown |"  # seed 0: counted, in no mean


@pytest.mark.parametrize("tokens, why", [(2.5, "train_tokens is 2.5, not a whole number; its training tokens are "
                                                "taken as unknown"),
                                         ("many", "train_tokens is 'many', not a number; its training tokens are "
                                                  "taken as unknown")])
def test_train_tokens_that_are_no_whole_number_are_unknown_not_taken_from_the_config(tmp_path, capsys, tokens, why):
    """The run's config would give 1,000 tokens (10 steps × batch 10 × length 10): a damaged record's count is
    not replaced by a guess."""
    write_run(tmp_path / "a", "Softmax", "listops", 0, preset=None, config=OLD_CONFIG, wall_time_seconds=10.0,
              gpu_seconds=10.0, train_tokens=tokens, **ON_H100)
    write_run(tmp_path / "b", "Softmax", "listops", 1, preset=None, config=OLD_CONFIG, wall_time_seconds=10.0,
              gpu_seconds=10.0, **ON_H100)  # from before train_tokens: from its config
    table_main([str(tmp_path), "--cost"])
    out, err = capsys.readouterr()
    assert f"| Softmax | listops | 0 | completed | {H100} | 10 | 1.00 | 10 measured | 10 | 10 | — |" in out
    assert f"| Softmax | listops | 1 | completed | {H100} | 10 | 1.00 | 10 measured | 10 | 10 | 1 k |" in out
    assert f"note: {tmp_path / 'a' / 'metrics.json'}: {why}" in err.splitlines()


SHARE_LINE = ("give the share of its GPU a run had, a number from 1/1024 to 1 such as 1/4 (four runs at once) or 1 "
              "(alone)")


@pytest.mark.parametrize("argv, line", [
    (["--gpu-share", "1e-400"], f"error: --gpu-share '1e-400': {SHARE_LINE}"),  # a float of 0.0
    (["--gpu-share", "1/2048"], f"error: --gpu-share '1/2048': {SHARE_LINE}"),
    (["--gpu-share", "0"], f"error: --gpu-share '0': {SHARE_LINE}"),
    (["--cost-seeds", str(10 ** 400)], "error: --cost-seeds is above 1000 (a table is run with a few seeds per "
                                       "cell); give --cost-seeds N with 1 <= N <= 1000"),
    (["--cost-seeds", "1001"], "error: --cost-seeds is above 1000 (a table is run with a few seeds per cell); give "
                               "--cost-seeds N with 1 <= N <= 1000"),
])
def test_a_gpu_share_too_small_for_a_float_and_too_many_seeds_are_one_error_line(tmp_path, capsys, monkeypatch, argv,
                                                                                line):
    monkeypatch.setattr(cost, "preset_cells", lambda preset: CELLS)
    write_run(tmp_path / "a", "Softmax", "listops", 0, wall_time_seconds=3600.0, train_tokens=1000,
              device=f"cuda ({H100})")
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path), "--cost", *argv])
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == line


def test_the_bounds_of_gpu_share_and_seeds_are_accepted(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cost, "preset_cells", lambda preset: CELLS)
    write_run(tmp_path / "a", "Softmax", "listops", 0, wall_time_seconds=3600.0, train_tokens=1000,
              device=f"cuda ({H100})")  # derived: 3,600 s × 1/1024
    out = cost_report(capsys, tmp_path, "--gpu-share", "1/1024", "--cost-seeds", "1000")
    assert "| 3,600 | 0.00 assumed | 3.52 derived | 3.52 |" in out
    assert "| Softmax | 0.98 derived | 1.95 projected | 2.93 |" in out  # 3.52 s × 1,000 seeds, in hours
    assert "**Total: 8.8 H100-hours** for 6 cells × 1000 seeds" in out


def test_a_packed_records_unreadable_side_file_is_named_as_it_lies(tmp_path, capsys, monkeypatch):
    """A packed record keeps overrides.yaml beside metrics.json: the note names that file, not .hydra/'s."""
    monkeypatch.setattr(cost, "preset_cells", lambda preset: [])
    folder = write_run(tmp_path / "packed", "Softmax", "listops", 0, preset=None, train_tokens=1000,
                       wall_time_seconds=10.0, gpu_seconds=5.0, **ON_H100)
    (folder / "overrides.yaml").write_text("- experiment=[unclosed\n  : :\n")
    table_main([str(tmp_path), "--cost"])
    err = capsys.readouterr().err
    assert f"skipped {folder / 'overrides.yaml'}: not YAML" in err and ".hydra" not in err, err


# ----------------------------------------------------------------------------- every run counted, every figure labelled
REFERENCE_RECORD = REPO / "docs" / "gpu" / "2026-11-27c" / "records" / "softmax-seed0"  # 545 s on an H100, 4 to it
REFERENCE_TOKENS = 5000 * 32 * 2048  # its steps × batch × length


def test_a_cells_run_of_unknown_gpu_time_is_counted_and_a_mean_with_a_derived_run_is_derived(tmp_path, capsys,
                                                                                            monkeypatch):
    """Copies of a committed reference record: seed 0 with a measured gpu_seconds of 100, seed 1's no number,
    seed 4's absent (derived: 545 s × an assumed 1/4). The cell counts all three; its mean and the projection
    built on it rest on a derived figure, so neither is labelled measured."""
    monkeypatch.setattr(cost, "preset_cells", lambda preset: [Cell("Softmax", "listops", REFERENCE_TOKENS),
                                                              Cell("Softmax", "text", 2 * REFERENCE_TOKENS)])
    for seed, gpu_seconds in ((0, 100), (1, True), (4, None)):
        folder = shutil.copytree(REFERENCE_RECORD, tmp_path / "J" / str(seed))
        record = json.loads((folder / "metrics.json").read_text())
        record.update(seed=seed, **({} if gpu_seconds is None else {"gpu_seconds": gpu_seconds}))
        (folder / "metrics.json").write_text(json.dumps(record))
    table_main([str(tmp_path / "J"), "--cost", "--cost-seeds", "3"])
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'J' / '1' / 'metrics.json'}: gpu_seconds is True, not a number" in err
    for seed, row in ((0, "| 545 | 0.18 | 100 measured | 100 |"), (1, "| 545 | — | unknown | — |"),
                      (4, "| 545 | 0.25 assumed | 136 derived | 136 |")):
        assert f"| Softmax | listops | {seed} | completed | {H100} {row}" in out
    assert per_cell(out)[2] == "| Softmax | 118 derived (2) + 1 unknown |"  # was "118 (2)": seed 1 uncounted
    assert "- derived: some or all of the runs' GPU-seconds derived from wall time at an assumed GPU share" in out
    projection = out[out.index("Projection"):]
    assert "| Softmax | 0.10 derived | 0.20 projected | 0.30 |" in projection and " measured |" not in projection
    assert "**Total: 0.3 H100-hours** for 2 cells × 3 seeds: 0.00 measured (0 cells), 0.10 derived (1 cell, the " \
           "mean of their runs), 0.2 projected (1 cell)." in projection
    assert "- the runs these hours rest on: 2, their GPU-seconds 1 measured and 1 derived (wall time × an assumed " \
           "GPU share: the per-run table's note)" in projection
    assert "- not in these hours, completed runs of yoso_table3's cells: 1 unknown (the per-run table says why)" \
        in projection


def test_a_cell_counts_its_unconverted_unknown_and_cpu_runs_and_the_projection_names_those_it_leaves_out(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cost, "preset_cells", lambda preset: CELLS)
    tokens = {"train_tokens": 1000}
    write_run(tmp_path / "h100", "Softmax", "listops", 0, wall_time_seconds=3600.0, gpu_seconds=3600.0, **tokens,
              **ON_H100)
    write_run(tmp_path / "no_tokens", "Softmax", "listops", 1, wall_time_seconds=1800.0, gpu_seconds=1800.0,
              **ON_H100)  # neither train_tokens nor a config: its rate is unknown
    write_run(tmp_path / "h200", "Softmax", "listops", 2, wall_time_seconds=100.0, gpu_seconds=100.0, **tokens,
              device="cuda (NVIDIA H200)", gpu_name="NVIDIA H200")
    write_run(tmp_path / "no_time", "Softmax", "listops", 3, device=f"cuda ({H100})", **tokens)  # nor wall time
    write_run(tmp_path / "cpu", "Softmax", "listops", 4, wall_time_seconds=50.0, device="cpu (x86_64)", **tokens)
    write_run(tmp_path / "failed", "Softmax", "listops", 5, status="failed", wall_time_seconds=10.0,
              gpu_seconds=10.0, **tokens, **ON_H100)
    out = cost_report(capsys, tmp_path, "--cost-seeds", "1")
    assert per_cell(out)[2] == "| Softmax | 2,700 measured (2) + 1 unconverted + 1 unknown + 1 on CPU |"
    assert "- not in a mean: 1 unconverted, 1 unknown, 1 on CPU (the per-run table says why)\n" \
           "- not in these cells: 1 run not completed (the per-run table lists them)" in out
    projection = out[out.index("Projection"):]
    assert "| Softmax | 1.00 measured | 2.00 projected | 3.00 |" in projection  # 3.6 s/token: the run with tokens
    assert "- not in these hours, completed runs of yoso_table3's cells: 1 unconverted, 1 unknown, 1 on CPU, 1 " \
           "without training tokens (the per-run table says why)" in projection


def test_a_figure_is_measured_only_when_every_run_in_it_is(tmp_path):
    measured, derived = cost.RunCost({}, cost.MEASURED), cost.RunCost({}, cost.DERIVED)
    assert cost.basis_of([measured, measured]) == "measured"
    assert cost.basis_of([measured, derived]) == cost.basis_of([derived]) == "derived"
    for runs in ([], [measured, cost.RunCost({}, cost.UNKNOWN)], [cost.RunCost({}, cost.CPU)]):
        with pytest.raises(ValueError):
            cost.basis_of(runs)
