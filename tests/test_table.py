"""Comparison tables: mean ± std over seeds against an independent computation, missing and failed
cells never shown as numbers, and the table a real multirun prints at its end."""

import json
import statistics

import pytest

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
    assert table.loc["YOSO-32", "text"] == "— (1 unfinished)", "a running job is not a result, but a run"


def test_lra_table_command_formats(tmp_path, capsys):
    write_run(tmp_path / "a", "Softmax", "listops", 0, "completed", 36.0)
    write_run(tmp_path / "b", "None", "listops", 0, "completed", 20.0)
    table_main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| Softmax   | **36.00** (1)" in out and "| None      | 20.00 (1)" in out and "runs: 2 completed" in out
    table_main([str(tmp_path), "--format", "csv", "--output", str(tmp_path / "t.csv")])
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0].startswith("backend,task,mean,std,seeds,failed") and len(lines) == 3
    table_main([str(tmp_path), "--format", "json", "--reference", "yoso"])
    numbers = {r["backend"]: r for r in json.loads(capsys.readouterr().out)}
    assert numbers["Softmax"]["paper"] == 37.10 and abs(numbers["Softmax"]["delta"] - (36.0 - 37.10)) < 1e-9
    assert numbers["Softmax"]["std"] is None  # one seed: no spread, never a made-up 0


def test_best_bold_deltas_partial_failures_and_efficiency(tmp_path):
    from lra.results.formats import to_markdown
    from lra.results.reference import load_reference

    for i, (label, seed, status, accuracy) in enumerate([("Softmax", 0, "completed", 36.0), ("Softmax", 1, "completed", 38.0),
                                                          ("None", 0, "completed", 19.0), ("None", 1, "failed", None)]):
        write_run(tmp_path / str(i), label, "listops", seed, status, accuracy)
        record = json.loads((tmp_path / str(i) / "metrics.json").read_text())
        record.update(train_tokens_per_second=1000.0 * (i + 1), peak_memory_mb=10.0 * (i + 1))
        (tmp_path / str(i) / "metrics.json").write_text(json.dumps(record))
    table = comparison(collect([tmp_path]), reference=load_reference("lra"), efficiency=True)
    # Softmax is the paper's "Transformer" row (36.37); None has no row in that table: no delta.
    assert table.loc["Softmax", "listops"] == f"37.00 ± {statistics.stdev([36.0, 38.0]):.2f} (2) [Δ +0.63]"
    assert table.loc["None", "listops"] == "19.00 (1, 1 failed)"
    assert table.loc["Softmax", "listops tokens/s"] == "1,500" and table.loc["None", "listops peak MB"] == "30"
    markdown = to_markdown(table)
    assert "**37.00** ±" in markdown and "**19.00**" not in markdown


def test_latex_is_booktabs_and_compiles(tmp_path):
    import shutil
    import subprocess

    from lra.results.formats import to_latex

    write_run(tmp_path / "a", "*YOSO-16", "listops", 0, "completed", 36.0)
    write_run(tmp_path / "b", "YOSO_E", "text", 0, "failed")
    latex = to_latex(comparison(collect([tmp_path])))
    lines = latex.splitlines()
    assert lines.count("\\toprule") == 1 and lines.count("\\midrule") == 1 and lines.count("\\bottomrule") == 1
    assert "\\begin{tabular}{lrrr}" in latex and "Backend & listops & text & average \\\\" in latex
    assert "\\textbf{36.00} (1) & -- & --" in latex and "YOSO\\_E" in latex  # escaped, missing as --
    if shutil.which("pdflatex") is None:
        return  # structure checked above; compiling needs a LaTeX toolchain
    document = "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n" + latex + "\n\\end{document}\n"
    (tmp_path / "table.tex").write_text(document)
    result = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "table.tex"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and (tmp_path / "table.pdf").stat().st_size > 0, result.stdout[-2000:]


def test_a_multirun_prints_the_table_of_its_own_runs(tmp_path, data_dir):
    result = run_command(["lra-train", "-m", "attention=softmax,none", "seed=0,1", "trainer=smoke",
                          "trainer.max_steps=4", "trainer.eval_every=2", *SMALL_LISTOPS], tmp_path, data_dir)
    runs = [read_json(r / "metrics.json") for r in run_dirs(tmp_path)]
    assert len(runs) == 4 and all(r["status"] == "completed" for r in runs)
    for label in ("Softmax", "None"):
        accuracies = [r["test_accuracy"] for r in runs if r["label"] == label]
        stuck = sum(r["stuck_at_chance"] is True for r in runs if r["label"] == label)  # 4 steps: usually all
        note = f"; {stuck} of 2 at chance" if stuck else ""
        mean, spread = f"{statistics.mean(accuracies):.2f}", f" ± {statistics.stdev(accuracies):.2f} (2{note})"
        assert f"| {label:<9} | {mean}{spread}" in result.stdout or f"| {label:<9} | **{mean}**{spread}" in result.stdout, \
            result.stdout
    (sweep,) = {r.parent for r in run_dirs(tmp_path)}
    assert (sweep / "table.md").is_file()
    table = run_command(["lra-table", str(sweep), "--format", "json"], tmp_path, data_dir)
    assert "note:" not in table.stderr and "note:" not in result.stderr, table.stderr  # lra-train's records: whole
    numbers = {r["backend"]: r for r in json.loads(table.stdout)}
    assert sorted(numbers) == ["None", "Softmax"]
    for label in ("Softmax", "None"):  # lra-table on the directory = an independent computation from the files
        accuracies = [r["test_accuracy"] for r in runs if r["label"] == label]
        assert numbers[label]["seeds"] == 2
        assert abs(numbers[label]["mean"] - statistics.mean(accuracies)) < 1e-9
        assert abs(numbers[label]["std"] - statistics.stdev(accuracies)) < 1e-9


def test_a_sweep_with_failing_jobs_finishes_the_others_and_tables_them_as_failed(tmp_path, data_dir):
    # The text jobs fail for real: no prepared text data in this data directory.
    result = run_command(["lra-train", "-m", "task=listops,text", "attention=softmax,none", "seed=0", "trainer=smoke",
                          "trainer.max_steps=2", "trainer.eval_every=2", "trainer.max_length=256"], tmp_path, data_dir,
                         check=False)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
        "error: 2 of the sweep's 4 runs failed; the table above and "), result.stderr  # every job ran first
    runs = {(r["task"], r["label"]): r for r in (read_json(d / "metrics.json") for d in run_dirs(tmp_path))}
    assert {k: r["status"] for k, r in runs.items()} == {
        ("listops", "Softmax"): "completed", ("listops", "None"): "completed",
        ("text", "Softmax"): "failed", ("text", "None"): "failed"}
    assert "lra-prepare text" in runs[("text", "None")]["error"]
    table = comparison(collect({d.parent for d in run_dirs(tmp_path)}))
    assert table.loc["None", "text"] == "failed" and table.loc["None", "average"] == "—"
    note = "; 1 of 1 at chance" if runs[("listops", "None")]["stuck_at_chance"] else ""
    assert table.loc["None", "listops"] == f"{runs[('listops', 'None')]['test_accuracy']:.2f} (1{note})"
    assert "failed" in result.stdout  # the table printed at the end of the sweep


def test_the_papers_none_row_is_a_row_not_a_missing_value(tmp_path):
    from lra.results.reference import load_reference

    write_run(tmp_path / "a", "None", "listops", 0, "completed", 20.2)
    reference = load_reference("yoso")
    assert reference.loc["None", "listops"] == 19.20
    table = comparison(collect([tmp_path]), reference=reference)
    assert "+1.00" in table.loc["None", "listops"], table.loc["None", "listops"]


def test_lra_chart_points_are_relative_to_softmax_and_the_paper_layer_comes_from_its_two_tables(tmp_path, capsys):
    """The LRA Figure 3 chart from the same records (lra-table --plot)."""
    from PIL import Image

    from lra.results import chart

    runs = {"Softmax": (37.0, 20_000, 800), "YOSO-32": (36.0, 50_000, 100), "None": (19.0, 80_000, 60)}
    for task in ("listops", "text"):
        for seed in (0, 1):
            for label, (accuracy, speed, memory) in runs.items():
                folder = tmp_path / f"{task}-{label}-{seed}"
                write_run(folder, label, task, seed, "completed", accuracy + seed + (task == "text") * 20)
                record = read_json(folder / "metrics.json")
                record.update(train_tokens_per_second=speed * (1 + seed), peak_memory_mb=memory)
                (folder / "metrics.json").write_text(json.dumps(record))
    write_run(tmp_path / "failed", "Linformer", "listops", 0, "failed")
    table_main([str(tmp_path), "--plot", str(tmp_path / "lra.png")])
    assert "not in the chart (no completed run on every task it needs): Linformer" in capsys.readouterr().err
    with Image.open(tmp_path / "lra.png") as image:
        assert image.size == (1125, 825)

    points = chart.relative(chart.our_points(comparison(collect([tmp_path])).attrs["numbers"], None))
    assert points.loc["YOSO-32", "accuracy"] == (36.5 + 56.5) / 2  # the average over both tasks
    assert points.loc["YOSO-32", "speed"] == 2.5 and points.loc["None", "memory"] == 60 / 800  # on listops
    paper = chart.paper_points("listops")
    # YOSO paper, Table 4 at n = 4096: Softmax 21.2 + 29.73 ms, YOSO-32 6.31 + 9.89 ms, peaks 3918 / 355 MB.
    assert abs(paper.loc["YOSO-32", "speed"] - (21.2 + 29.73) / (6.31 + 9.89)) < 1e-12
    assert abs(paper.loc["YOSO-32", "memory"] - 355 / 3918) < 1e-12 and paper.loc["YOSO-32", "accuracy"] == 37.25
    assert set(paper.index) == {"Softmax", "YOSO-32", "Longformer", "Reformer"}  # Linformer: -128 or -256, not drawn


def test_seeds_stuck_at_chance_are_counted_and_can_be_left_out(tmp_path, capsys):
    """A seed whose record says stuck_at_chance stays in the mean by default, and the cell says
    "k of n at chance"; --exclude-stuck leaves it out of the statistic and still counts it;
    --statistic median; records written before the field existed count as not stuck."""
    for seed, (accuracy, stuck) in enumerate([(80.0, False), (82.0, False), (50.1, True), (90.0, None)]):
        write_run(tmp_path / str(seed), "Softmax", "pathfinder", seed, "completed", accuracy)
        record = json.loads((tmp_path / str(seed) / "metrics.json").read_text())
        if stuck is not None:
            record["stuck_at_chance"] = stuck
        (tmp_path / str(seed) / "metrics.json").write_text(json.dumps(record))
    write_run(tmp_path / "only", "None", "pathfinder", 0, "completed", 50.0)
    record = json.loads((tmp_path / "only" / "metrics.json").read_text())
    (tmp_path / "only" / "metrics.json").write_text(json.dumps(record | {"stuck_at_chance": True}))
    runs = collect([tmp_path])
    every = [80.0, 82.0, 50.1, 90.0]
    assert comparison(runs).loc["Softmax", "pathfinder"] == \
        f"{statistics.mean(every):.2f} ± {statistics.stdev(every):.2f} (4; 1 of 4 at chance)"
    learned = [80.0, 82.0, 90.0]
    assert comparison(runs, exclude_stuck=True).loc["Softmax", "pathfinder"] == \
        f"{statistics.mean(learned):.2f} ± {statistics.stdev(learned):.2f} (3; 1 of 4 at chance, excluded)"
    assert comparison(runs, exclude_stuck=True).loc["None", "pathfinder"] == "stuck (1 of 1 at chance, excluded)"
    assert comparison(runs, statistic="median").loc["Softmax", "pathfinder"].startswith(
        f"{statistics.median(every):.2f} ± ")
    table_main([str(tmp_path), "--exclude-stuck", "--statistic", "median"])
    assert f"{statistics.median(learned):.2f}" in capsys.readouterr().out


def test_the_efficiency_view_checks_the_parameter_budget_against_softmax(tmp_path):
    """LRA's protocol keeps every model within ±10 % of the Softmax baseline's parameters."""
    for label, parameters in (("Softmax", 1000), ("YOSO-32", 1050), ("Nystromformer", 1200)):
        write_run(tmp_path / label, label, "listops", 0, "completed", 30.0)
        record = json.loads((tmp_path / label / "metrics.json").read_text())
        (tmp_path / label / "metrics.json").write_text(json.dumps(record | {"num_parameters": parameters}))
    table = comparison(collect([tmp_path]), efficiency=True)
    column = table["listops params vs Softmax"]
    assert column["Softmax"] == "+0.0 %" and column["YOSO-32"] == "+5.0 %"
    assert column["Nystromformer"] == "+20.0 % (outside ±10 %)"


def test_self_pretrained_rows_stay_apart_and_show_side_by_side(tmp_path, capsys):
    """Self-pretrained ("+SPT") rows form their own block after the from-scratch rows; --side-by-side
    puts each task's from-scratch cell beside its SPT cell and the change; each row's parameters are
    checked against the Softmax row of its own setup."""
    rows = [("Softmax", 0, 36.0, 1000), ("Softmax", 1, 38.0, 1000), ("YOSO-32", 0, 30.0, 1000),
            ("Softmax +SPT", 0, 50.0, 2000), ("Softmax +SPT", 1, 52.0, 2000), ("YOSO-32 +SPT", 0, 41.0, 2100),
            ("None +SPT", 0, 20.0, 2000)]
    for label, seed, accuracy, parameters in rows:
        folder = tmp_path / f"{label}-{seed}"
        write_run(folder, label, "listops", seed, "completed", accuracy)
        record = json.loads((folder / "metrics.json").read_text())
        (folder / "metrics.json").write_text(json.dumps(record | {"num_parameters": parameters}))
    runs = collect([tmp_path])
    table = comparison(runs, efficiency=True)
    assert list(table.index) == ["Softmax", "YOSO-32", "None +SPT", "Softmax +SPT", "YOSO-32 +SPT"]
    assert table.loc["Softmax +SPT", "listops"] == f"51.00 ± {statistics.stdev([50.0, 52.0]):.2f} (2)"
    budget = table["listops params vs Softmax"]
    assert budget["YOSO-32"] == "+0.0 %" and budget["YOSO-32 +SPT"] == "+5.0 %", "each setup has its own baseline"
    table_main([str(tmp_path), "--side-by-side", "--format", "csv"])
    csv_numbers = capsys.readouterr().out
    assert "Softmax +SPT" in csv_numbers
    from lra.results.table import side_by_side

    paired = side_by_side(comparison(runs))
    assert list(paired.index) == ["None", "Softmax", "YOSO-32"]
    assert list(paired.columns) == ["listops", "listops +SPT", "listops +SPT Δ"]
    assert paired.loc["Softmax", "listops +SPT Δ"] == "+14.00" and paired.loc["YOSO-32", "listops +SPT Δ"] == "+11.00"
    assert paired.loc["None", "listops"] == "—" and paired.loc["None", "listops +SPT Δ"] == "—"
    table_main([str(tmp_path), "--side-by-side"])
    assert "| listops +SPT Δ" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ lra-table
def write_record(folder, content):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.json").write_text(content if isinstance(content, str) else json.dumps(content))


def test_lra_table_counts_each_run_once_and_reads_any_file(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    write_record(sweep / "0", {"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "test_accuracy": 30.0})
    write_record(sweep / "1", {"label": "Softmax", "task": "listops", "seed": 1, "status": "completed", "test_accuracy": 34.0})
    write_record(sweep / "2", {"label": "Softmax", "task": "listops", "seed": 1, "status": "failed", "test_accuracy": None})
    write_record(sweep / "3", "{ not json")
    write_record(sweep / "4", "")
    write_record(sweep / "5", "[1, 2]")
    write_record(sweep / "6", {"task": "listops"})
    result = run_command(["lra-table", str(sweep), str(sweep / "0"), str(sweep / "0" / "metrics.json"), "--format", "csv"],
                         tmp_path, data_dir)
    assert "Traceback" not in result.stderr
    row = [line for line in result.stdout.splitlines() if line.startswith("Softmax,listops")][0]
    assert ",32.0," in row and ",2,0" in row, row  # mean 32 over 2 seeds, the failed duplicate dropped
    notes = result.stderr
    assert "dropped" in notes and "seed 1" in notes
    for bad in ("3", "4", "5", "6"):
        assert f"skipped {sweep / bad / 'metrics.json'}" in notes


@pytest.mark.parametrize("args,code,expected", [
    (["--metric", "test_acc"], 2, "no run record has the metric 'test_acc'; choose --metric from "),
    (["--reference", "nowhere.csv"], 2, "cannot read the reference table 'nowhere.csv'"),
    (["--metric", "label"], 2, "--metric label is not a number in the run records; choose --metric from "),  # a traceback
    (["--reference", "words.csv"], 2, "its listops value for Softmax is 'high', not a number"),  # a traceback
    (["--efficiency", "text"], 2, "no runs of task 'text' for --efficiency; choose one of listops"),  # empty columns
    (["--plot-task", "text", "--plot", "p.png"], 2, "no runs of task 'text' to plot"),
])
def test_lra_table_mistakes_are_one_line(tmp_path, data_dir, args, code, expected):
    write_record(tmp_path / "r", {"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "test_accuracy": 30.0})
    (tmp_path / "words.csv").write_text("method,listops,avg\nSoftmax,high,1\n")
    result = run_command(["lra-table", str(tmp_path / "r"), *args], tmp_path, data_dir, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == code and last.startswith("error: ") and expected in last, result.stderr


def test_lra_table_wandb_without_a_key_is_one_line(tmp_path, data_dir):
    env = {"WANDB_API_KEY": "", "HOME": str(tmp_path), "WANDB_CONFIG_DIR": str(tmp_path / "wandb")}
    result = run_command(["lra-table", "--wandb", "someone/project"], tmp_path, data_dir, env_extra=env, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "cannot read the W&B project 'someone/project'" in last and "wandb login" in last


def test_every_run_is_listed_with_its_seed_status_wall_time_device_and_commit(tmp_path, capsys):
    """lra-table --runs (what docs/results.md carries per run): a row per counted run, in the table's row
    order and then by seed, each field as its record has it (the steps a run was resumed at, "none" where it
    never was), a missing one as —; markdown only."""
    runs = [("b", "YOSO-32", 1, "completed", 37.5, 5000, [3850, 4300], 357.0, "cuda (NVIDIA H100 80GB HBM3)",
             "d2dbcc1"),
            ("a", "YOSO-32", 0, "completed", 36.25, 5000, [], 420.0, "cuda (NVIDIA H100 80GB HBM3)", "d2dbcc1-dirty"),
            ("c", "Softmax", 0, "failed", None, 12, None, None, "cpu|gVisor", None)]  # a "|" kept inside its cell
    for folder, label, seed, status, accuracy, steps, resumed, wall, device, commit in runs:
        write_run(tmp_path / folder, label, "listops", seed, status, accuracy)
        record = json.loads((tmp_path / folder / "metrics.json").read_text())
        record.update(steps=steps, wall_time_seconds=wall, device=device, git_commit=commit, error="boom")
        record.pop("resumed_at_steps", None)
        record.update({} if resumed is None else {"resumed_at_steps": resumed})
        (tmp_path / folder / "metrics.json").write_text(json.dumps(record))
    table_main([str(tmp_path), "--runs", "--reference", "yoso"])
    out = capsys.readouterr().out
    listed = out[out.index("every run (3):"):].splitlines()[4:]
    assert listed == ["| Softmax | listops | 0 | failed | — | 12 | — | — | cpu\\|gVisor | — |",
                      "| YOSO-32 | listops | 0 | completed | 36.25 | 5000 | none | 7.0 | cuda (NVIDIA H100 80GB HBM3) | "
                      "d2dbcc1-dirty |",
                      "| YOSO-32 | listops | 1 | completed | 37.50 | 5000 | 3850, 4300 | 6.0 | "
                      "cuda (NVIDIA H100 80GB HBM3) | d2dbcc1 |"]
    table_main([str(tmp_path)])
    assert "every run" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path), "--runs", "--format", "csv"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == "error: --runs lists the runs in markdown, not csv; drop --format or --runs"


@pytest.mark.parametrize("steps, resumed, why", [
    ("x", ["a"], ["steps is 'x', not a number", "resumed_at_steps is ['a'], not a list of steps"]),
    (2.5, "abc", ["steps is 2.5, not a whole number", "resumed_at_steps is 'abc', not a list of steps"]),
    (-1, [True, 3], ["steps is -1, below 0", "resumed_at_steps is [True, 3], not a list of steps"]),
])
def test_the_run_list_leaves_a_damaged_step_count_out_with_a_note(tmp_path, capsys, steps, resumed, why):
    """A record whose steps or resumed_at_steps is no step count is listed with — there, and a note names the
    value (lra.results.validity), as for any value a table cannot use; it does not stop lra-table."""
    write_run(tmp_path / "a", "YOSO-32", "listops", 0, "completed", 36.25)
    record = json.loads((tmp_path / "a" / "metrics.json").read_text())
    record.update(steps=steps, resumed_at_steps=resumed, wall_time_seconds=120.0, device="cpu", git_commit="abc1234")
    (tmp_path / "a" / "metrics.json").write_text(json.dumps(record))
    table_main([str(tmp_path), "--runs"])
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "| YOSO-32 | listops | 0 | completed | 36.25 | — | — | 2.0 | cpu | abc1234 |"
    assert [f"note: {tmp_path / 'a' / 'metrics.json'}: {w}; left out of the table" for w in why] == \
        [line for line in captured.err.splitlines() if "steps" in line]
