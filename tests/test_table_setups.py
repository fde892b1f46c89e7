"""A table cell is one setup: runs of one label trained differently are separate rows named by what differs;
``--reference`` draws a paper delta only for runs trained as the paper's preset trains that row (else it says
why not); ``--efficiency`` compares each row's parameters with the Softmax row of its own setup; cost columns
say when they were measured on a CPU. Each run folder holds its resolved config as lra-train writes it
(``.hydra/resolved.yaml``, composed here from the real presets) beside its record."""

from __future__ import annotations

import json
import re
import statistics
from functools import lru_cache

import pandas as pd
import pytest
from omegaconf import OmegaConf

from helpers import compose_config
from lra.commands.table import main as table_main
from lra.results.table import collect, comparison, numbers, side_by_side

QUICKSTART = ("experiment=quickstart",)
CPU = "cpu (x86_64, 2 threads)"
H100 = "cuda (NVIDIA H100 80GB HBM3)"


@lru_cache(maxsize=None)
def resolved(overrides: tuple) -> tuple:
    """(the resolved config as lra-train saves it, the run's label, its parameter count)."""
    from lra.model import Classifier, input_length
    from lra.validation import attention_spec, run_label

    cfg = compose_config(*overrides)
    spec = attention_spec(cfg)
    model = Classifier(cfg.model, cfg.task, spec, input_length(cfg.task.max_length, cfg.trainer.max_length))
    return OmegaConf.to_yaml(cfg, resolve=True), run_label(cfg), sum(p.numel() for p in model.parameters())


def write_run(folder, overrides, seed, accuracy, config=True, **fields):
    """A run folder as lra-train leaves it: its record, and (unless ``config`` is False, as in a record from before
    configs were saved) .hydra/resolved.yaml and overrides.yaml."""
    text, label, parameters = resolved(tuple(overrides))
    folder.mkdir(parents=True)
    if config:
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "resolved.yaml").write_text(re.sub(r"(?m)^seed: 0$", f"seed: {seed}", text))
        (folder / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml([*overrides, f"seed={seed}"]))
    record = {"label": label, "task": "listops", "seed": seed, "status": "completed", "test_accuracy": accuracy,
              "num_parameters": parameters, "device": CPU} | fields
    (folder / "metrics.json").write_text(json.dumps(record))


def test_two_setups_of_one_label_are_two_rows_named_by_what_differs(tmp_path, capsys):
    """The quickstart's 300-step Softmax and a 40-step plumbing run of it were one cell (the latest won, "the
    same Softmax"): now two rows, each its own seeds' mean ± std, and a note lists the difference."""
    for seed, accuracy in enumerate((18.8, 19.4, 20.1)):
        write_run(tmp_path / f"quick{seed}", [*QUICKSTART, "attention=softmax"], seed, accuracy)
    write_run(tmp_path / "plumbing", [*QUICKSTART, "attention=softmax", "trainer.max_steps=40"], 0, 16.8)
    warnings = []
    runs = collect([tmp_path], warnings.append)
    assert not [w for w in warnings if "dropped" in w], "no run is a duplicate of another setup's"
    table = comparison(runs)
    assert list(table.index) == ["Softmax", "Softmax (trainer.max_steps=40)"]
    assert table.loc["Softmax", "listops"] == f"19.43 ± {statistics.stdev([18.8, 19.4, 20.1]):.2f} (3)"
    assert table.loc["Softmax (trainer.max_steps=40)", "listops"] == "16.80 (1)"
    (note,) = [n for n in table.attrs["notes"] if n.startswith("setups")]
    assert "- Softmax on listops, 2 setups (against Softmax's, the most runs):" in note
    assert note.splitlines()[-1].startswith("  - Softmax (trainer.max_steps=40): 1 run, setup ")
    assert note.splitlines()[-1].endswith(": trainer.max_steps 40 ≠ 300")
    table_main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| Softmax (trainer.max_steps=40) | 16.80 (1)" in out and "2 setups" in out
    assert "a row is one setup" in out  # the cell notation, said under the table


def test_equal_counts_name_every_setup_and_a_rerun_of_one_setup_is_still_one_run(tmp_path):
    """No setup outnumbers the other: both rows say what sets them apart. The same setup and seed twice is one run
    (the completed one kept, the other named)."""
    write_run(tmp_path / "a", [*QUICKSTART, "attention=softmax", "trainer.lr=0.002"], 0, 20.0)
    write_run(tmp_path / "b", [*QUICKSTART, "attention=softmax", "trainer.lr=0.0005"], 0, 18.0)
    write_run(tmp_path / "c", [*QUICKSTART, "attention=softmax", "trainer.lr=0.0005"], 0, None, status="failed")
    warnings = []
    table = comparison(collect([tmp_path], warnings.append))
    assert sorted(table.index) == ["Softmax (trainer.lr=0.0005)", "Softmax (trainer.lr=0.002)"]
    assert table.loc["Softmax (trainer.lr=0.0005)", "listops"] == "18.00 (1)"
    (dropped,) = [w for w in warnings if "dropped" in w]
    assert dropped.startswith(f"dropped {tmp_path / 'c'}: the same Softmax on listops with seed 0, the same setup (")
    assert dropped.endswith(f"), as {tmp_path / 'b'}")


def test_a_record_without_a_config_joins_its_labels_one_setup_or_is_a_row_of_its_own(tmp_path):
    write_run(tmp_path / "new", [*QUICKSTART, "attention=none"], 0, 17.0)
    write_run(tmp_path / "old", [*QUICKSTART, "attention=none"], 1, 18.0, config=False)
    write_run(tmp_path / "s0", [*QUICKSTART, "attention=softmax"], 0, 19.0)
    write_run(tmp_path / "s1", [*QUICKSTART, "attention=softmax", "trainer.max_steps=40"], 0, 16.0)
    write_run(tmp_path / "s2", [*QUICKSTART, "attention=softmax"], 1, 20.0, config=False)
    table = comparison(collect([tmp_path]))
    assert table.loc["None", "listops"] == "17.50 ± 0.71 (2)"  # with the one setup None has
    assert table.loc["Softmax (no config recorded)", "listops"] == "20.00 (1)"  # Softmax has two: unknown which
    assert any(n.startswith("no config recorded: 2 of the runs hold no config") for n in table.attrs["notes"]), \
        table.attrs["notes"]


def test_a_quickstart_run_gets_no_paper_delta_and_says_why(tmp_path, capsys):
    """--reference yoso printed Δ −4.70 for the quickstart's Softmax (300 steps, length 256); a run of
    experiment=yoso_table3 gets its delta, and one that changed a single key of it says which."""
    from lra.results.formats import to_latex
    from lra.results.reference import load_reference

    write_run(tmp_path / "quick", [*QUICKSTART, "attention=softmax"], 0, 32.4)
    preset = ["experiment=yoso_table3", "task=listops", "row=yoso_table3/softmax"]
    write_run(tmp_path / "paper", preset, 0, 37.0, device=H100)
    write_run(tmp_path / "short", [*preset, "trainer.max_steps=300"], 0, 20.0, device=H100)
    table = comparison(collect([tmp_path]), reference=load_reference("yoso"))
    row = table.attrs["numbers"].set_index("mean")["backend"]  # each setup's row, by its one run's accuracy
    assert table.loc[row[20.0], "listops"] == "20.00 (1) [Δ — not the paper's setup: trainer.max_steps 300 ≠ 5000]"
    assert table.loc[row[37.0], "listops"] == "37.00 (1) [Δ -0.10]"
    latex = to_latex(table)  # LaTeX's words for ≠ and —, and what a cell holds
    assert "300 $\\neq$ 5000" in latex and "≠" not in latex and "std over seeds (in parentheses: n" in latex
    quick = table.loc[row[32.4], "listops"]
    assert quick.startswith("32.40 (1) [Δ — not the paper's setup: trainer.max_steps 300 ≠ 5000, task.max_length "
                            "256 ≠ 2048, +") and quick.endswith(" more]")
    table_main([str(tmp_path), "--reference", "yoso"])
    out = capsys.readouterr().out
    assert "- Δ (in brackets after a cell): the cell minus the paper's number, where the runs are " \
           "experiment=yoso_table3's setup" in out
    assert "| 37.00** (1) [Δ -0.10]" in out.replace("**37.00", "37.00**") or "**37.00** (1) [Δ -0.10]" in out
    table_main([str(tmp_path), "--reference", "yoso", "--format", "json"])
    cells = {cell["mean"]: cell for cell in json.loads(capsys.readouterr().out)}
    assert cells[37.0]["delta"] == pytest.approx(37.0 - 37.10) and cells[37.0]["paper_setup"] == "the paper's setup"
    assert cells[32.4]["delta"] is None and cells[32.4]["paper"] == 37.10
    assert cells[32.4]["paper_setup_why"].startswith("not the paper's setup: trainer.max_steps 300 ≠ 5000")


def test_a_row_absent_from_the_preset_and_an_unchecked_record_say_so(tmp_path):
    """A label the paper has whose setup cannot be checked (no config) keeps its delta, with a note; the
    average's delta needs every task at the paper's setup."""
    from lra.results.reference import load_reference

    write_run(tmp_path / "old", [*QUICKSTART, "attention=softmax"], 0, 36.0, config=False)
    table = comparison(collect([tmp_path]), reference=load_reference("yoso"))
    assert table.loc["Softmax", "listops"] == "36.00 (1) [Δ -1.10]"
    assert any(n.startswith("Δ not checked against the paper's setup: the runs of Softmax on listops record no "
                            "config") for n in table.attrs["notes"])


def test_parameters_are_compared_with_the_softmax_row_of_the_same_setup(tmp_path):
    """The quickstart's Linformer against the quickstart's Softmax (its E and F projections, 2 × 256 × 256 per
    layer, are real parameters: +275.6 %), never against a Softmax-labelled LRA Table 1 Transformer of another
    model; a row whose setup has no Softmax run says so."""
    write_run(tmp_path / "softmax", [*QUICKSTART, "attention=softmax"], 0, 19.0)
    write_run(tmp_path / "softmax1", [*QUICKSTART, "attention=softmax"], 1, 19.5)
    write_run(tmp_path / "linformer", [*QUICKSTART, "attention=linformer"], 0, 17.5)
    lra = ["experiment=lra_table1", "setup=lra_table1/listops"]
    write_run(tmp_path / "transformer", [*lra, "row=lra_table1/transformer"], 0, 36.0)
    write_run(tmp_path / "performer", [*lra, "row=lra_table1/performer"], 0, 18.0)
    write_run(tmp_path / "yoso", [*QUICKSTART, "attention=yoso", "trainer.max_steps=40"], 0, 17.0)
    write_run(tmp_path / "none", [*QUICKSTART, "attention=none"], 0, 17.0)
    table = comparison(collect([tmp_path]), efficiency=True)
    budget = table["listops params vs Softmax"]
    counts = {name: resolved(tuple(overrides))[2] for name, overrides in (
        ("softmax", [*QUICKSTART, "attention=softmax"]), ("linformer", [*QUICKSTART, "attention=linformer"]),
        ("transformer", [*lra, "row=lra_table1/transformer"]), ("performer", [*lra, "row=lra_table1/performer"]))}
    assert budget["Linformer"] == f"{100 * (counts['linformer'] / counts['softmax'] - 1):+.1f} % (outside ±10 %)"
    assert budget["Linformer"] == "+275.6 % (outside ±10 %)"
    (transformer,) = [name for name in table.index if name.startswith("Softmax (")]  # LRA Table 1's
    assert budget["Softmax"] == "+0.0 %" and budget[transformer] == "+0.0 %"
    change = counts["performer"] / counts["transformer"] - 1
    assert budget["Performer"] == f"{100 * change:+.1f} %" + (" (outside ±10 %)" if abs(change) > 0.1 else "")
    assert budget["YOSO-32"] == "— (no Softmax run of this setup)"
    (note,) = [n for n in table.attrs["notes"] if n.startswith("rows of different setups")]
    assert note.splitlines()[1:3] == ["- listops: 3 setups besides the attention:", "  - None, Softmax, Linformer"]
    assert "  - YOSO-32: trainer.max_steps 40 ≠ 300" in note.splitlines()  # not a peer of the 300-step rows


def test_mean_std_and_n_per_cell_and_stuck_seeds_counted_per_cell(tmp_path, capsys):
    """Each setup's cell counts its own seeds stuck at chance; the median view says so in its legend."""
    for seed, (accuracy, stuck) in enumerate([(20.0, False), (22.0, False), (17.1, True)]):
        write_run(tmp_path / f"a{seed}", [*QUICKSTART, "attention=none"], seed, accuracy, stuck_at_chance=stuck)
    write_run(tmp_path / "b", [*QUICKSTART, "attention=none", "trainer.max_steps=40"], 0, 17.0, stuck_at_chance=True)
    runs = collect([tmp_path])
    table = comparison(runs)
    every = [20.0, 22.0, 17.1]
    assert table.loc["None", "listops"] == \
        f"{statistics.mean(every):.2f} ± {statistics.stdev(every):.2f} (3; 1 of 3 at chance)"
    assert table.loc["None (trainer.max_steps=40)", "listops"] == "17.00 (1; 1 of 1 at chance)"
    summary = table.attrs["numbers"].set_index("backend")
    assert summary.loc["None", "stuck"] == 1 and summary.loc["None", "seeds"] == 3
    table_main([str(tmp_path), "--statistic", "median"])
    out = capsys.readouterr().out
    cell = f"**{statistics.median(every):.2f}** ± {statistics.stdev(every):.2f} (3; 1 of 3 at chance)"
    assert f"| None                        | {cell}" in out, out
    assert "- median ± std over seeds (n): n is the number of seeds in the median" in out


def test_cost_columns_say_cpu_and_process_memory_and_never_average_two_devices(tmp_path, capsys):
    write_run(tmp_path / "cpu", [*QUICKSTART, "attention=softmax"], 0, 19.0, train_tokens_per_second=5123.0,
              peak_memory_mb=474.0)
    write_run(tmp_path / "gpu", [*QUICKSTART, "attention=none"], 0, 17.0, device=H100, train_tokens_per_second=9e5,
              peak_memory_mb=512.0)
    write_run(tmp_path / "mix0", [*QUICKSTART, "attention=yoso"], 0, 18.0, train_tokens_per_second=4e3)
    write_run(tmp_path / "mix1", [*QUICKSTART, "attention=yoso"], 1, 18.0, device=H100, train_tokens_per_second=8e5)
    table = comparison(collect([tmp_path]), efficiency=True)
    assert table.loc["Softmax", "listops tokens/s"] == "5,123 (CPU)"
    assert table.loc["Softmax", "listops peak MB"] == "474 (CPU process)"
    assert table.loc["None", "listops tokens/s"] == "900,000" and table.loc["None", "listops peak MB"] == "512"
    assert table.loc["YOSO-32", "listops tokens/s"] == "— (CPU and GPU runs)"
    legend = table.attrs["legend"]
    assert "- (CPU): measured on a CPU, in wall-clock time" in legend and "(CPU process): the process's peak" in legend
    summary = table.attrs["numbers"].set_index("backend")
    assert summary.loc["Softmax", "device"] == "CPU" and pd.isna(summary.loc["YOSO-32", "tokens_per_s"])


def test_cost_columns_name_yosos_pytorch_path_and_never_average_it_with_its_kernels(tmp_path, capsys):
    """A record's attention_engine: YOSO's PyTorch path (impl=auto where the kernels could not be built) is not
    the kernels' speed; a cell of both has no mean."""
    write_run(tmp_path / "k0", [*QUICKSTART, "attention=yoso"], 0, 18.0, device=H100, train_tokens_per_second=8e5,
              peak_memory_mb=300.0, attention_engine="kernel")
    write_run(tmp_path / "t0", [*QUICKSTART, "attention=yoso_c"], 0, 18.0, device=H100, train_tokens_per_second=2e5,
              peak_memory_mb=900.0, attention_engine="torch")
    write_run(tmp_path / "m0", [*QUICKSTART, "attention=yoso", "attention.num_hashes=16"], 0, 18.0, device=H100,
              train_tokens_per_second=8e5, attention_engine="kernel")
    write_run(tmp_path / "m1", [*QUICKSTART, "attention=yoso", "attention.num_hashes=16"], 1, 18.0, device=H100,
              train_tokens_per_second=2e5, attention_engine="torch")
    write_run(tmp_path / "s0", [*QUICKSTART, "attention=softmax"], 0, 19.0, device=H100, train_tokens_per_second=9e5)
    table = comparison(collect([tmp_path]), efficiency=True)
    assert table.loc["YOSO-32", "listops tokens/s"] == "800,000" and table.loc["YOSO-32", "listops peak MB"] == "300"
    assert table.loc["YOSO-C-16", "listops tokens/s"] == "200,000 (PyTorch path)"
    assert table.loc["YOSO-C-16", "listops peak MB"] == "900 (PyTorch path)"
    assert table.loc["YOSO-16", "listops tokens/s"] == "— (runs on different YOSO engines: kernel, torch)"
    assert table.loc["Softmax", "listops tokens/s"] == "900,000"
    summary = table.attrs["numbers"].set_index("backend")
    assert pd.isna(summary.loc["YOSO-16", "tokens_per_s"]) and summary.loc["YOSO-16", "engine"] == "kernel,torch"
    assert "- (PyTorch path): YOSO computed on its PyTorch path, not its compiled kernels" in table.attrs["legend"]
    kernels_only = comparison(collect([tmp_path / "k0", tmp_path / "s0"]), efficiency=True)
    assert "(PyTorch path)" not in kernels_only.attrs["legend"]
    mixed_only = comparison(collect([tmp_path / "m0", tmp_path / "m1", tmp_path / "s0"]), efficiency=True)
    assert "(PyTorch path)" not in mixed_only.attrs["legend"]  # no cell says it: the mixed cell has no number
    write_run(tmp_path / "old", [*QUICKSTART, "attention=yoso"], 1, 18.0, device=H100, train_tokens_per_second=4e5)
    unrecorded = comparison(collect([tmp_path / "k0", tmp_path / "old"]), efficiency=True)  # a record from before
    assert unrecorded.loc["YOSO-32", "listops tokens/s"] == "— (runs on different YOSO engines: kernel, unrecorded)"
    assert comparison(collect([tmp_path / "old"]), efficiency=True).loc["YOSO-32", "listops tokens/s"] == "400,000"


def test_the_chart_labels_cpu_runs_and_draws_each_rows_spread_over_seeds(tmp_path, capsys):
    from lra.results import chart

    for seed, accuracy in enumerate((19.0, 21.0)):
        write_run(tmp_path / f"s{seed}", [*QUICKSTART, "attention=softmax"], seed, accuracy,
                  train_tokens_per_second=5000.0, peak_memory_mb=474.0)
        write_run(tmp_path / f"y{seed}", [*QUICKSTART, "attention=yoso"], seed, accuracy - 1,
                  train_tokens_per_second=2500.0, peak_memory_mb=500.0)
    write_run(tmp_path / "other", [*QUICKSTART, "attention=linformer", "trainer.max_steps=40"], 0, 17.0,
              train_tokens_per_second=1000.0, peak_memory_mb=480.0)
    table = comparison(collect([tmp_path]))
    warnings = []
    points = chart.plot(table.attrs["numbers"], tmp_path / "chart.png", "listops", warnings.append)
    assert list(points.index) == ["Softmax", "YOSO-32"]
    assert warnings == ["not in the chart (no Softmax run of its setup on listops, on the same kind of device, to "
                        "measure it against): Linformer"]
    assert points.loc["YOSO-32", "speed"] == 0.5 and points.loc["YOSO-32", "memory"] == 500 / 474
    assert points.loc["YOSO-32", "accuracy_std"] == pytest.approx(statistics.stdev([18.0, 20.0]))
    assert "(CPU, wall clock)" in points.attrs["xlabel"]
    title = points.attrs["title"]
    assert "coloured: these runs, on a CPU" in title and "grey: the YOSO paper on a GPU" in title
    assert (tmp_path / "chart.png").stat().st_size > 10_000


def test_the_chart_names_yosos_pytorch_path_and_why_a_row_of_mixed_engines_is_left_out(tmp_path):
    from lra.results import chart

    write_run(tmp_path / "s0", [*QUICKSTART, "attention=softmax"], 0, 19.0, device=H100, train_tokens_per_second=9e5,
              peak_memory_mb=400.0)
    write_run(tmp_path / "t0", [*QUICKSTART, "attention=yoso"], 0, 18.0, device=H100, train_tokens_per_second=2e5,
              peak_memory_mb=300.0, attention_engine="torch")
    for seed, engine in enumerate(("kernel", "torch")):
        write_run(tmp_path / f"m{seed}", [*QUICKSTART, "attention=yoso_c"], seed, 18.0, device=H100,
                  train_tokens_per_second=8e5, peak_memory_mb=200.0, attention_engine=engine)
    warnings = []
    points = chart.plot(comparison(collect([tmp_path])).attrs["numbers"], tmp_path / "chart.png", "listops",
                        warnings.append)
    assert list(points.index) == ["Softmax", "YOSO-32"] and "YOSO-32 (PyTorch path)" in points.attrs["labels"]
    assert warnings == ["not in the chart (its seeds' speed has no mean: efficiency cells say why): YOSO-C-16"]


def test_side_by_side_pairs_rows_of_the_same_setup(tmp_path):
    write_run(tmp_path / "scratch", [*QUICKSTART, "attention=softmax"], 0, 19.0)
    write_run(tmp_path / "scratch1", [*QUICKSTART, "attention=softmax"], 1, 19.0)
    write_run(tmp_path / "spt", [*QUICKSTART, "attention=softmax", "pretrain=masked"], 0, 25.0)
    write_run(tmp_path / "short", [*QUICKSTART, "attention=softmax", "trainer.max_steps=40"], 0, 16.0)
    paired = side_by_side(comparison(collect([tmp_path])))
    assert list(paired.index) == ["Softmax", "Softmax (trainer.max_steps=40)"]
    assert paired.loc["Softmax", "listops +SPT Δ"] == "+6.00"
    assert paired.loc["Softmax (trainer.max_steps=40)", "listops +SPT"] == "—"
    assert numbers(comparison(collect([tmp_path])))["backend"].tolist().count("Softmax +SPT") == 1


def test_a_record_naming_another_task_than_its_config_trained_is_in_no_column(tmp_path, capsys):
    """An edited record (task text, config listops) was tabled in the text column: now a note, and the run is
    in no column; a record that agrees with its config counts."""
    write_run(tmp_path / "agrees", [*QUICKSTART, "attention=softmax"], 0, 18.8)
    write_run(tmp_path / "edited", [*QUICKSTART, "attention=softmax"], 1, 19.4, task="text")
    table_main([str(tmp_path), "--format", "json"])
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert [(row["task"], row["seeds"]) for row in rows] == [("listops", 1)], out
    assert (f"note: skipped {tmp_path / 'edited'}: its record says task 'text', its config trained 'listops'"
            in err), err


def test_runs_of_one_config_on_different_data_are_different_rows(tmp_path, capsys):
    """task.source=auto chose the generator for one run and a release prepared since for another: one cell
    averaged two datasets. The source each record names is part of its setup (the paper's check leaves it to
    auto, as the presets do)."""
    write_run(tmp_path / "g0", [*QUICKSTART, "attention=softmax"], 0, 18.0, data_source="generate")
    write_run(tmp_path / "g1", [*QUICKSTART, "attention=softmax"], 1, 20.0, data_source="generate")
    write_run(tmp_path / "r0", [*QUICKSTART, "attention=softmax"], 0, 40.0, data_source="lra_release")
    table_main([str(tmp_path), "--format", "json"])
    out, err = capsys.readouterr()
    cells = {row["backend"]: (row["mean"], row["seeds"]) for row in json.loads(out)}
    assert cells == {"Softmax": (19.0, 2), "Softmax (task.source=lra_release)": (40.0, 1)}, out
    assert "dropped" not in err, err


def test_a_fine_tune_from_a_stage_1_run_is_set_up_by_that_run_not_by_its_own_unused_pretrain_keys(tmp_path):
    """pretrain.max_steps=50 beside pretrain.from= trains nothing (the stage 1 ran in the other run, as set
    there), yet named a row of its own, "Softmax +SPT (pretrain.max_steps=50, pretrain.lr=0.01)"."""
    source = ["attention=softmax", "pretrain=masked", "pretrain.from=/runs/stage1"]
    write_run(tmp_path / "a", source, 0, 20.0)
    write_run(tmp_path / "b", [*source, "pretrain.max_steps=50", "pretrain.lr=0.01"], 1, 22.0)
    write_run(tmp_path / "c", [*source, "trainer.lr=0.01"], 0, 25.0)  # the fine-tuning's own keys still count
    table = comparison(collect([tmp_path], lambda warning: None))
    assert list(table.index) == ["Softmax +SPT", "Softmax +SPT (trainer.lr=0.01)"], table
    assert table.loc["Softmax +SPT", "listops"] == "21.00 ± 1.41 (2)"


def test_side_by_side_gives_no_spt_change_across_setups_that_differ_in_more_than_pretraining(tmp_path):
    """A scratch Softmax at lr 1e-4 beside a self-pretrained one at 3e-3 read "+SPT Δ -8.33", a change the
    learning rate may have made; a pair that differs only in pretraining keeps its Δ."""
    write_run(tmp_path / "scratch", ["attention=softmax"], 0, 30.0)
    write_run(tmp_path / "spt", ["attention=softmax", "pretrain=masked", "trainer.lr=0.003"], 0, 21.67)
    write_run(tmp_path / "none", ["attention=none"], 0, 20.0)
    write_run(tmp_path / "none_spt", ["attention=none", "pretrain=masked"], 0, 25.5)
    paired = side_by_side(comparison(collect([tmp_path], lambda warning: None)))
    assert paired.loc["Softmax", "listops +SPT"] == "21.67 (1)" and paired.loc["Softmax", "listops +SPT Δ"] == "—"
    assert paired.loc["None", "listops +SPT Δ"] == "+5.50"
    (note,) = [n for n in paired.attrs["notes"] if n.startswith("no +SPT Δ")]
    assert note.splitlines()[1] == "- Softmax on listops: trainer.lr 0.0001 ≠ 0.003", note
