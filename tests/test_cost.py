"""What a run cost on a GPU and what a table would: the record's gpu_seconds (lra.gpus: wall time × the run's
share of its GPU, counted from the runs registered on it), and ``lra-table --cost`` (lra/results/cost.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import SMALL_LISTOPS
from lra import gpus
from lra.commands.table import main as table_main
from lra.results import cost
from lra.results.cost_preset import Cell

REPO = Path(__file__).resolve().parent.parent
TINY = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=1", "trainer.checkpoint_every=2",
        "trainer.eval_subset=8", "attention=none", *(o for o in SMALL_LISTOPS if not o.startswith("task.max_length=")),
        "task.max_length=64"]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


# ----------------------------------------------------------------------------- the share of a GPU
def test_runs_registered_on_a_gpu_are_counted_while_held_and_a_dead_ones_file_is_removed(tmp_path):
    gpu, other_gpu = gpus.Occupancy("GPU-1234", tmp_path), gpus.Occupancy("GPU-5678", tmp_path)
    assert gpu.runs() == 0
    with gpu.registered():
        assert gpu.runs() == 1 and other_gpu.runs() == 0
        with gpu.registered(), other_gpu.registered():
            assert gpu.runs() == 2 and other_gpu.runs() == 1
        assert gpu.runs() == 1
    assert gpu.runs() == 0 and not list(gpu.folder.iterdir())
    killed = gpu.folder / "killed-run.run"  # a run killed outright leaves its file, unlocked
    killed.write_text("")
    assert gpu.runs() == 0 and not killed.exists()


def test_a_run_is_charged_its_share_of_the_gpu_for_each_stretch_of_wall_time(tmp_path):
    clock, neighbour = gpus.GpuClock("GPU-1", H100, folder=tmp_path), gpus.Occupancy("GPU-1", tmp_path)
    assert clock.advance(None, 5.0) is None, "before its session nothing is charged"
    with clock.running(wall_seconds=0.0, gpu_seconds=None):
        assert clock.share() == 1.0
        spent = clock.advance(None, 10.0)  # alone: the whole GPU
        assert spent == 10.0
        with neighbour.registered():
            assert clock.share() == 0.5
            spent = clock.advance(spent, 30.0)  # 20 s at half the GPU
        assert spent == 20.0 and clock.advance(spent, 35.0) == 25.0
    assert clock.advance(25.0, 100.0) == 25.0, "outside a training session nothing is charged"
    assert clock.occupancy.runs() == 0, "the registration ends with the session"


def test_a_run_of_several_processes_counts_each_processs_gpu_and_a_resume_continues_its_gpu_time(tmp_path):
    clock = gpus.GpuClock("GPU-2", H100, processes=4, folder=tmp_path)
    with clock.running(wall_seconds=100.0, gpu_seconds=250.0):  # resumed from a checkpoint at 100 s
        assert clock.advance(250.0, 110.0) == 290.0
    unknown = gpus.GpuClock("GPU-2", H100, folder=tmp_path)
    with unknown.running(wall_seconds=100.0, gpu_seconds=None):  # a checkpoint from before gpu_seconds
        assert unknown.advance(None, 110.0) is None, "its earlier GPU time is unknown: never a partial sum"


def test_off_a_gpu_there_is_no_gpu_time(tmp_path):
    clock = gpus.GpuClock.of(torch.device("cpu"))
    assert clock.name is None and clock.occupancy is None
    with clock.running(wall_seconds=0.0, gpu_seconds=None):
        assert clock.advance(None, 10.0) is None


def test_a_cpu_run_records_no_gpu_time_and_its_training_tokens(tmp_path, data_dir, capsys):
    from helpers import train_in_process

    record = train_in_process(tmp_path / "run", *TINY, f"data_dir={data_dir}")
    assert record["status"] == "completed" and record["device"].startswith("cpu")
    assert record["gpu_seconds"] is None and record["gpu_name"] is None
    assert record["train_tokens"] == 2 * 4 * 64  # steps × the smoke batch × task.max_length
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["gpu_seconds"] is None
    out = cost_report(capsys, tmp_path / "run")
    wall = record["wall_time_seconds"]
    wall = f"{wall:.2f}" if wall < 10 else f"{wall:,.0f}"
    assert f"| None | listops | 0 | completed | CPU | {wall} | — | none (CPU) | — | 2 | 512 |" in out
    assert "H100-seconds per run, row × task: none (no completed run has a known GPU time)" in out
    assert out.rstrip().endswith("no projection: the records name no preset (their overrides hold no experiment=); "
                                 "pass --cost-preset NAME")


def test_a_run_on_a_gpu_records_its_share_of_the_gpus_time(tmp_path, data_dir, monkeypatch):
    """The record writer's wiring, on CPU: the trainer's clock stands for a GPU's (same code but the device's
    UUID and name), with another run registered on that GPU for the whole run."""
    from helpers import train_in_process

    monkeypatch.setattr(gpus.GpuClock, "of", classmethod(lambda cls, device, processes=1: cls(
        "GPU-test", H100, processes, folder=tmp_path / "locks")))
    with gpus.Occupancy("GPU-test", tmp_path / "locks").registered():
        record = train_in_process(tmp_path / "run", *TINY, f"data_dir={data_dir}")
    assert record["gpu_name"] == H100
    assert record["gpu_seconds"] == pytest.approx(record["wall_time_seconds"] / 2, rel=1e-9)
    assert not list((tmp_path / "locks" / "occupancy" / "GPU-test").iterdir()), "the run's registration is gone"


# ----------------------------------------------------------------------------- lra-table --cost
def write_run(folder: Path, label: str, task: str, seed: int, preset="yoso_table3", config=None, **fields) -> Path:
    folder.mkdir(parents=True)
    record = {"task": task, "attention": label.lower(), "label": label, "seed": seed, "status": "completed",
              "steps": 10, "test_accuracy": 40.0, "processes": 1, **fields}
    (folder / "metrics.json").write_text(json.dumps(record))
    if preset is not None:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(f"- experiment={preset}\n- task={task}\n- seed={seed}\n")
    if config is not None:  # a packed record's config, beside it
        (folder / "resolved.yaml").write_text(config)
    return folder


OLD_CONFIG = "task:\n  max_length: 10\n  dual_encoder: false\ntrainer:\n  batch_size: 10\n  max_length: null\n"
CELLS = [Cell(label, task, tokens) for label in ("Softmax", "YOSO-32", "None")
         for task, tokens in (("listops", 1000), ("text", 2000))]


def cost_report(capsys, *argv) -> str:
    table_main([*map(str, argv), "--cost"])
    return capsys.readouterr().out


def test_runs_measured_derived_on_other_gpus_and_on_cpu_each_say_what_they_cost(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cost, "preset_cells", lambda preset: CELLS)
    gpu = {"device": f"cuda ({H100})", "gpu_name": H100}
    write_run(tmp_path / "a", "Softmax", "listops", 0, wall_time_seconds=2000.0, gpu_seconds=1000.0, train_tokens=1000,
              **gpu)
    write_run(tmp_path / "b", "YOSO-32", "listops", 0, preset=None, config=OLD_CONFIG, wall_time_seconds=3600.0,
              device=f"cuda ({H100})")  # a record from before gpu_seconds, packed with its config
    write_run(tmp_path / "c", "None", "listops", 0, wall_time_seconds=100.0, gpu_seconds=100.0, train_tokens=1000,
              device=f"cuda ({H200})", gpu_name=H200)
    write_run(tmp_path / "d", "None", "text", 0, wall_time_seconds=50.0, gpu_seconds=None, gpu_name=None,
              train_tokens=2000, device="cpu (x86_64, 2 threads)")
    out = cost_report(capsys, tmp_path)
    assert f"| Softmax | listops | 0 | completed | {H100} | 2,000 | 0.50 | 1,000 measured | 1,000 | 10 | 1 k |" in out
    assert f"| YOSO-32 | listops | 0 | completed | {H100} | 3,600 | 0.25 assumed | 900 derived | 900 | 10 | 1 k |" \
        in out
    assert f"| None | listops | 0 | completed | {H200} | 100 | 1.00 | 100 measured | unconverted | 10 | 1 k |" in out
    assert "| None | text | 0 | completed | CPU | 50 | — | none (CPU) | — | 10 | 2 k |" in out
    assert "an assumed GPU share of 1/4 (the default: 4 runs to a GPU" in out
    assert "no H100 factor is known for NVIDIA H200" in out
    per_cell = out[out.index("H100-seconds of a completed run, row × task"):out.index("Projection")]
    assert per_cell.split("\n\n")[1].splitlines() == [  # the H200 run and the CPU run: counted, in no mean
        "| backend | listops | text |", "|:--|--:|--:|", "| None | — + 1 unconverted | — + 1 on CPU |",
        "| Softmax | 1,000 measured (1) | — |", "| YOSO-32 | 900 derived (1) | — |"]
    assert "- not in a mean: 1 unconverted, 1 on CPU (the per-run table says why)" in per_cell
    out = cost_report(capsys, tmp_path / "b", "--gpu-share", "1/2")
    assert "| 3,600 | 0.50 assumed | 1,800 derived | 1,800 |" in out
    assert "an assumed GPU share of 1/2 (--gpu-share)" in out


def test_a_preset_is_projected_from_its_measured_cells_and_the_total_says_how_much_is_measured(tmp_path, capsys,
                                                                                            monkeypatch):
    monkeypatch.setattr(cost, "preset_cells", lambda preset: CELLS)
    gpu = {"device": f"cuda ({H100})", "gpu_name": H100, "train_tokens": 1000}
    write_run(tmp_path / "s0", "Softmax", "listops", 0, wall_time_seconds=1800.0, gpu_seconds=1800.0, **gpu)
    write_run(tmp_path / "s1", "Softmax", "listops", 1, wall_time_seconds=3600.0, gpu_seconds=3600.0, **gpu)
    write_run(tmp_path / "y0", "YOSO-32", "listops", 0, config=OLD_CONFIG, wall_time_seconds=3600.0,
              device=f"cuda ({H100})")  # derived: 3,600 × 1/4 = 900 H100-seconds for 10 × 10 × 10 tokens
    write_run(tmp_path / "other", "None", "listops", 0, preset="lra_table1", wall_time_seconds=10.0, gpu_seconds=10.0,
              **gpu)  # another preset's run: in the per-run table only
    out = cost_report(capsys, tmp_path, "--cost-seeds", "2", "--cost-preset", "yoso_table3")
    projection = out[out.index("Projection"):]
    # Softmax: 2.7 s/token (listops 2,700 s a run) → text 5,400 s; YOSO-32: 0.9 → 900 and 1,800 s; None, not
    # measured: the mean of the measured cells, 1.8 s/token; × 2 seeds, in hours.
    assert "| Softmax | 1.50 measured | 3.00 projected | 4.50 |" in projection
    assert "| YOSO-32 | 0.50 derived | 1.00 projected | 1.50 |" in projection  # its run: from wall time
    assert "| None | 1.00 projected | 2.00 projected | 3.00 |" in projection
    assert "| all rows | 3.00 | 6.00 | 9.00 |" in projection
    assert "**Total: 9.0 H100-hours** for 6 cells × 2 seeds: 1.50 measured (1 cell, the mean of their runs), 0.50 " \
           "derived (1 cell, the mean of their runs), 7.0 projected (4 cells)." in projection
    assert "- the runs these hours rest on: 3, their GPU-seconds 2 measured and 1 derived (wall time × an assumed " \
           "GPU share: the per-run table's note)" in projection
    assert "- projected: the H100-seconds per training token of the cell's own runs where they trained another " \
           "setup than the preset's, else of the row's cells with runs (Softmax 2.7, YOSO-32 0.9 s/token), else the " \
           "mean over every cell with runs (1.8 s/token), × the cell's training tokens" in projection
    assert "training tokens of a run: listops 1 k, text 2 k" in projection


def test_a_cell_whose_runs_trained_another_schedule_is_projected_from_them_not_measured(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cost, "preset_cells", lambda preset: CELLS)
    write_run(tmp_path / "smoke", "Softmax", "listops", 0, wall_time_seconds=72.0, gpu_seconds=72.0, train_tokens=100,
              device=f"cuda ({H100})", gpu_name=H100)  # 100 tokens where the cell trains 1,000: 0.72 s/token
    out = cost_report(capsys, tmp_path, "--cost-seeds", "1")
    projection = out[out.index("Projection"):]
    assert "| Softmax | 0.20 projected | 0.40 projected | 0.60 |" in projection
    assert "| None | 0.20 projected | 0.40 projected | 0.60 |" in projection
    assert "**Total: 1.8 H100-hours** for 6 cells × 1 seeds: 0.00 measured (0 cells), 1.8 projected (6 cells)." \
        in projection
    assert "- the runs these hours rest on: 1, their GPU-seconds 1 measured and 0 derived\n" in projection


def test_the_preset_is_the_one_the_records_name_and_records_of_two_presets_are_refused(tmp_path, capsys, monkeypatch):
    named = []
    monkeypatch.setattr(cost, "preset_cells", lambda preset: named.append(preset) or CELLS)
    gpu = {"device": f"cuda ({H100})", "gpu_name": H100, "train_tokens": 1000}
    write_run(tmp_path / "a", "Softmax", "listops", 0, preset="lha_table3", wall_time_seconds=10.0, gpu_seconds=10.0,
              **gpu)
    out = cost_report(capsys, tmp_path)
    assert named == ["lha_table3"] and "Projection: experiment=lha_table3 × 3 seeds" in out
    write_run(tmp_path / "b", "Softmax", "text", 0, preset="lra_table1", wall_time_seconds=10.0, gpu_seconds=10.0,
              **gpu)
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path), "--cost"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("error: the records come from the presets lha_table3, "
                                                        "lra_table1; choose the one to project with --cost-preset NAME")
    out = cost_report(capsys, tmp_path / "a", "--cost-preset", "lra_table1")
    assert "Projection: experiment=lra_table1 × 3 seeds, in H100-hours: none, as no completed run of lra_table1's " \
           "cells has H100 time" in out
    (tmp_path / "a" / ".hydra" / "overrides.yaml").write_text("- experiment=yoso_table9\n")  # a preset since removed
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path / "a"), "--cost"])
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "error: the records name the preset yoso_table9, which is no table this checkout knows; choose the one to "
        "project with --cost-preset NAME (lha_table3, lra_table1, quickstart, spt, spt_quickstart, yoso_table3)")
    (tmp_path / "a" / ".hydra" / "overrides.yaml").write_text("- task=listops\n")  # a run of no preset
    out = cost_report(capsys, tmp_path / "a")
    assert out.rstrip().endswith("no projection: the records name no preset (their overrides hold no experiment=); "
                                 "pass --cost-preset NAME")


@pytest.mark.parametrize("gpu_seconds, why", [(-3, "gpu_seconds is -3, below 0"),
                                               (0, "gpu_seconds is 0 for a run that trained 10 steps")])
def test_an_invalid_gpu_time_is_unknown_with_a_note(tmp_path, capsys, gpu_seconds, why):
    """A negative GPU time, or none at all for a run that trained (which would cost its row nothing)."""
    write_run(tmp_path / "a", "Softmax", "listops", 0, preset=None, wall_time_seconds=10.0, gpu_seconds=gpu_seconds,
              device=f"cuda ({H100})", gpu_name=H100)
    table_main([str(tmp_path), "--cost"])
    out, err = capsys.readouterr()
    assert "| Softmax | listops | 0 | completed | NVIDIA H100 80GB HBM3 | 10 | — | unknown | — |" in out
    assert f"note: {tmp_path / 'a' / 'metrics.json'}: {why}; its GPU time is taken as unknown" in err


def test_a_wall_time_of_0_for_a_run_that_trained_is_left_out_of_the_table_with_a_note(tmp_path, capsys):
    write_run(tmp_path / "a", "Softmax", "listops", 0, preset=None, wall_time_seconds=0)
    table_main([str(tmp_path), "--metric", "wall_time_seconds"])
    out, err = capsys.readouterr()
    assert f"note: {tmp_path / 'a' / 'metrics.json'}: wall_time_seconds is 0 for a run that trained 10 steps; left " \
           f"out of the table" in err and "| Softmax   | invalid (1) |" in out, out + err


@pytest.mark.parametrize("argv, line", [
    (["--cost-seeds", "0"], "error: --cost-seeds 0: a preset's table needs at least 1 seed; give --cost-seeds N with "
                            "N >= 1"),
    (["--gpu-share", "2"], "error: --gpu-share '2': give the share of its GPU a run had, a number from 1/1024 to 1 "
                           "such as 1/4 (four runs at once) or 1 (alone)"),
    (["--gpu-share", "a/b"], "error: --gpu-share 'a/b': give the share of its GPU a run had, a number from 1/1024 to "
                             "1 such as 1/4 (four runs at once) or 1 (alone)"),
    (["--cost-preset", " "], "error: --cost-preset is empty (an unset shell variable?); give it a preset, or leave it "
                             "out (default: the preset the records name)"),
    (["--format", "csv", "--runs"], "error: --runs lists the runs in markdown, not csv; drop --format or --runs"),
    (["--format", "csv"], "error: --cost prints what the runs cost (markdown), not the table that --format shapes; run "
                          "lra-table twice, with --cost and without"),
])
def test_cost_options_that_cannot_be_used_are_one_error_line(tmp_path, capsys, argv, line):
    write_run(tmp_path / "a", "Softmax", "listops", 0, wall_time_seconds=10.0, device=f"cuda ({H100})")
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path), "--cost", *argv])
    assert stopped.value.code == 2 and capsys.readouterr().err.splitlines()[-1] == line


def test_cost_options_without_cost_and_an_unknown_preset_are_refused(tmp_path, capsys):
    write_run(tmp_path / "a", "Softmax", "listops", 0, wall_time_seconds=10.0, device=f"cuda ({H100})")
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path), "--gpu-share", "1/4", "--cost-seeds", "3"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("error: --cost-seeds, --gpu-share only go with --cost; add "
                                                        "--cost, or leave them out")
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path), "--cost", "--cost-preset", "yoso_table4"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == ("error: --cost-preset yoso_table4: no such preset; choose one "
                                                        "of lha_table3, lra_table1, quickstart, spt, spt_quickstart, "
                                                        "yoso_table3")


# ----------------------------------------------------------------------------- the committed GPU records
def test_the_committed_gpu_records_cost_and_the_yoso_table3_projection_are_in_the_docs(capsys):
    """`lra-table docs/gpu --cost`: the four reference ListOps runs of 2026-11-27 (4 to an H100, records from
    before gpu_seconds: derived), and YOSO Table 3 × 3 seeds composed from the preset; docs/benchmarks.md
    prints this very projection. Only Softmax's run is today's preset's setup: the YOSO rows' ran before the
    preset's attention.eval_hashes (and *YOSO-16's backward) changed, so their cells are projected from them."""
    out = cost_report(capsys, REPO / "docs" / "gpu")
    for row in (f"| Softmax | listops | 0 | completed | {H100} | 545 | 0.25 assumed | 136 derived | 136 | 5,000 | "
                "328 M |",
                f"| *YOSO-16 | listops | 0 | completed | {H100} | 472 | 0.25 assumed | 118 derived | 118 | 5,000 | "
                "328 M |"):
        assert row in out
    projection = out[out.index("Projection: experiment=yoso_table3 × 3 seeds"):]
    # every GPU-second here is derived (wall time × an assumed 1/4): no cell of it is measured
    assert projection.count(" measured |") == 0 and projection.count(" derived |") == 1
    assert projection.count(" projected |") == 59
    assert "| Softmax | 0.11 derived |" in projection and "| YOSO-32 | 0.11 projected |" in projection
    assert ": 0.00 measured (0 cells), 0.11 derived (1 cell, the mean of their runs), 143.5 projected (59 cells)." \
        in projection
    assert "- the runs these hours rest on: 4, their GPU-seconds 0 measured and 4 derived" in projection
    assert "- another setup than the preset's (a run's against the preset's job): YOSO-32 on listops " \
           "(attention.eval_hashes fixed ≠ fresh);" in projection
    assert "training tokens of a run: listops 328 M, text 2.62 G, retrieval 7.86 G, image 9.18 G, pathfinder 16.4 G" \
           in projection
    total = re.search(r"\*\*Total: ([0-9.]+) H100-hours\*\* for 60 cells × 3 seeds", projection)
    assert total and 100 < float(total.group(1)) < 200
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    assert projection.strip() in docs, "docs/benchmarks.md, 'What a table costs': paste this projection there"
