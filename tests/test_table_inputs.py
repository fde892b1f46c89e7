"""lra-table on damaged inputs: every record is read through one reader (lra/results/reading.py) that takes
only a regular file of at most 16 MiB holding JSON nested at most 32 levels, so a named pipe, a device, a
folder, a loop of links, an oversize or deeply nested file is one note and the other runs' table stays
whole; a --reference CSV it cannot use is one error line naming the file, the line and the fix; what a
record holds is escaped for the format it is printed in; an --output that is no regular file is refused."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import run_command
from helpers import main_in_process
from lra.commands.table import main as table_main
from lra.results.reading import MAX_BYTES, MAX_DEPTH, Unreadable, read_json

LRA_TABLE = str(Path(sys.executable).parent / "lra-table")
GOOD = [("s0", "Softmax", 0, 36.0), ("s1", "Softmax", 1, 38.0), ("n0", "None", 0, 20.0)]


def record(label="Softmax", task="listops", seed=0, accuracy=36.0, **extra) -> dict:
    return {"label": label, "task": task, "seed": seed, "status": "completed", "test_accuracy": accuracy, **extra}


def write(folder: Path, content) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "metrics.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def good_runs(folder: Path) -> Path:
    for name, label, seed, accuracy in GOOD:
        write(folder / name, record(label, seed=seed, accuracy=accuracy))
    return folder


def bounded(args, cwd, timeout=120) -> subprocess.CompletedProcess:
    """lra-table as a user runs it, in a process of its own that must end within ``timeout`` seconds (a read
    that waits for ever fails the test instead of hanging the suite)."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.run([LRA_TABLE, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def table_of(args, capsys):
    """lra-table in this process: (exit status, stdout, stderr)."""
    return main_in_process(table_main, [os.fsdecode(a) if isinstance(a, bytes) else str(a) for a in args], capsys)


# ----------------------------------------------------------------------------- damaged records
def test_records_that_are_no_regular_file_or_too_large_or_too_deep_are_notes_and_never_hang(tmp_path, capsys):
    """A named pipe called metrics.json (read, it waits for a writer for ever), JSON nested 200,000 levels (a
    RecursionError that lost the whole table), a file over 16 MiB, a loop of links, a folder, a link to a
    device (/dev/zero never ends), a broken link, bytes that are no UTF-8 and an integer of 5,000 digits: one
    note each, the same table as the good runs alone, exit 0."""
    clean = good_runs(tmp_path / "clean")
    code, expected, _ = table_of([clean], capsys)
    assert code == 0 and "| Softmax   | **37.00** ± 1.41 (2) |" in expected
    sweep = good_runs(tmp_path / "sweep")
    (sweep / "fifo").mkdir()
    os.mkfifo(sweep / "fifo" / "metrics.json")
    write(sweep / "deep", "[" * 200_000 + "]" * 200_000)
    (sweep / "big").mkdir()
    with open(sweep / "big" / "metrics.json", "wb") as handle:  # sparse: its size alone refuses it
        handle.truncate(MAX_BYTES + 1)
    (sweep / "loop").mkdir()
    (sweep / "loop" / "metrics.json").symlink_to("metrics.json")
    (sweep / "folder" / "metrics.json").mkdir(parents=True)
    (sweep / "device").mkdir()
    (sweep / "device" / "metrics.json").symlink_to("/dev/zero")
    (sweep / "dangling").mkdir()
    (sweep / "dangling" / "metrics.json").symlink_to("nowhere.json")
    latin1 = json.dumps(record(label="Café"), ensure_ascii=False).encode("latin-1")
    write(sweep / "latin1", latin1)
    write(sweep / "surrogate", json.dumps(record(label="x\ud800")))  # valid JSON, no character: printing it failed
    write(sweep / "scalar", "5")
    write(sweep / "digits", '{"label": "Softmax", "task": "listops", "seed": 3, "status": "completed", '
                            f'"test_accuracy": {"9" * 5000}}}')
    result = bounded([sweep], tmp_path)
    assert result.returncode == 0, result.stderr
    table, _, unplaced = result.stdout.partition("\n\nruns in no cell (11; counted failed: no usable record, nor a "
                                                 "config that tells the cell):\n")
    assert table + "\n" == expected
    why = {"big": f"{MAX_BYTES + 1:,} bytes, more than the 16 MiB a record or table may hold",
           "dangling": "a broken symbolic link", "deep": "JSON nested deeper than 32 levels",
           "device": "a character device, not a regular file", "digits": "a number of more than 4,300 digits",
           "fifo": "a named pipe, not a regular file", "folder": "a folder, not a regular file",
           "surrogate": "a string that is no Unicode text: it holds '\\ud800', half of a surrogate pair",
           "latin1": f"not UTF-8 text (byte {latin1.index(0xE9)} is b'\\xe9')", "loop": "a loop of symbolic links"}
    notes = [f"note: skipped {sweep / name / 'metrics.json'}: not a readable run record ({reason})"
             for name, reason in why.items()]
    notes.append(f"note: skipped {sweep / 'scalar' / 'metrics.json'}: a run record needs the fields label, task, "
                 "status, each a name")
    assert result.stderr.splitlines() == sorted(notes)
    why["scalar"] = "a run record needs the fields label, task, status, each a name"
    assert unplaced.splitlines() == [f"- {sweep / name}: its run record is damaged ({reason}): the run's result is "
                                     "lost; run this seed again" for name, reason in sorted(why.items())]


RECORDED = Path(__file__).resolve().parent.parent / "docs/gpu/2026-11-27c/records/softmax-seed0"


def recorded_run(folder: Path, seed: int, files=("metrics.json", "resolved.yaml")) -> Path:
    """A copy of a committed reference run (its record and resolved config) as seed ``seed``."""
    import yaml

    folder.mkdir(parents=True)
    if "metrics.json" in files:
        write(folder, {**json.loads((RECORDED / "metrics.json").read_text()), "seed": seed})
    config = {**yaml.safe_load((RECORDED / "resolved.yaml").read_text()), "seed": seed}
    if "resolved.yaml" in files:
        (folder / "resolved.yaml").write_text(yaml.safe_dump(config))
    if ".hydra" in files:  # what a job writes before its record
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        (folder / "train.log").write_text("")
    return folder


def test_a_run_without_a_usable_record_is_counted_failed_in_its_cell_in_every_format(tmp_path, capsys):
    """A job that died before its record (its config files alone) and a run whose record is cut are seeds of
    their config's cell, failed, in Markdown and in the CSV's numbers; a job folder held by a live process is a
    run starting now; one without a config either is named under the table."""
    sweep = tmp_path / "sweep"
    for seed in (0, 1):
        recorded_run(sweep / str(seed), seed)
    recorded_run(sweep / "2", 2, files=(".hydra",))
    cut = recorded_run(sweep / "3", 3) / "metrics.json"
    cut.write_text(cut.read_text()[:200])
    recorded_run(sweep / "4", 4, files=(".hydra",))
    import fcntl

    lock = open(sweep / "4" / ".lock", "w")  # held by a live process, as a job starting there holds it
    fcntl.flock(lock, fcntl.LOCK_EX)
    lock.write(f"process {os.getppid()} on {os.uname().nodename} since now\n")
    lock.flush()
    (sweep / "5").mkdir()
    (sweep / "5" / "train.log").write_text("OSError: [Errno 28] No space left on device\n")
    code, out, err = table_of([sweep], capsys)
    assert code == 0, err
    assert "| Softmax   | **36.10** ± 0.00 (2, 2 failed, 1 unfinished) |" in out, out
    assert f"- {sweep / '2'}: no run record: the job ended before writing one" in out
    assert f"- {sweep / '3'}: its run record is damaged (not JSON: Unterminated string" in out
    assert f"unfinished runs (1):\n- {sweep / '4'}: running (its process is alive)" in out
    assert f"runs in no cell (1; counted failed: no usable record, nor a config that tells the cell):\n- " \
        f"{sweep / '5'}: no run record" in out
    code, csv, _ = table_of([sweep, "--format", "csv"], capsys)
    numbers = pd.read_csv(io.StringIO(csv))
    assert code == 0 and numbers[["seeds", "failed", "unfinished"]].values.tolist() == [[2, 2, 1]], csv
    lock.close()  # its process let it go (an idle worker, the sweep itself): the job was killed as it started
    code, out, _ = table_of([sweep], capsys)
    assert "(2, 3 failed)" in out and f"- {sweep / '4'}: no run record" in out, out


def test_runs_of_one_config_trained_on_different_data_are_different_rows(tmp_path, capsys):
    """The same config pointed at another copy of a release (task.path is no part of a setup): the records'
    digests of the data they trained on differ, so their cell is split and the note names the data."""
    sweep = tmp_path / "sweep"
    for seed, content in ((0, "a" * 16), (1, "b" * 16), (2, "a" * 16)):
        path = recorded_run(sweep / str(seed), seed) / "metrics.json"
        write(sweep / str(seed), {**json.loads(path.read_text()), "data_content": content})
    code, out, err = table_of([sweep], capsys)
    assert code == 0, err
    assert "| Softmax                         | **36.10** ± 0.00 (2) |" in out, out
    assert "| Softmax (data_content=bbbbbbbb) | **36.10** (1)        |" in out, out
    assert "data_content bbbbbbbb ≠ aaaaaaaa" in out
    write(sweep / "1", {**json.loads((sweep / "1" / "metrics.json").read_text()), "data_content": "a" * 16})
    code, out, _ = table_of([sweep], capsys)
    assert code == 0 and "| Softmax   | **36.10** ± 0.00 (3) |" in out and "data_content" not in out, out


def test_the_end_of_sweep_table_reads_its_records_as_lra_table_does(tmp_path):
    """The table a multirun prints and saves (lra.results.callback) goes through the same reader: a named pipe
    and a deep file among its jobs are notes, table.md holds the others."""
    sweep = good_runs(tmp_path / "sweep")
    (sweep / "fifo").mkdir()
    os.mkfifo(sweep / "fifo" / "metrics.json")
    write(sweep / "deep", "{\"a\": " * 100_000 + "1" + "}" * 100_000)
    script = ("import sys; from omegaconf import OmegaConf; from lra.results.callback import ComparisonTableCallback; "
              "ComparisonTableCallback().on_multirun_end(OmegaConf.create({'hydra': {'sweep': {'dir': sys.argv[1]}}}))")
    result = subprocess.run([sys.executable, "-c", script, str(sweep)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("note:")] == [
        f"note: skipped {sweep / 'deep' / 'metrics.json'}: not a readable run record (JSON nested deeper than 32 "
        "levels)",
        f"note: skipped {sweep / 'fifo' / 'metrics.json'}: not a readable run record (a named pipe, not a regular "
        "file)"]
    saved = (sweep / "table.md").read_text()
    assert "| Softmax   | **37.00** ± 1.41 (2) |" in saved and "runs: 3 completed" in saved


def test_the_reader_takes_a_file_of_exactly_its_limits(tmp_path):
    """16 MiB exactly and 32 levels exactly are a record; one byte or one level more is not."""
    nested = lambda levels: {"label": "x", "extra": json.loads("[" * (levels - 1) + "]" * (levels - 1))}  # noqa: E731
    assert read_json(write(tmp_path / "a", nested(MAX_DEPTH)))["label"] == "x"
    with pytest.raises(Unreadable, match=f"^JSON nested deeper than {MAX_DEPTH} levels$"):
        read_json(write(tmp_path / "b", nested(MAX_DEPTH + 1)))
    text = json.dumps(record())
    path = write(tmp_path / "c", text + " " * (MAX_BYTES - len(text)))
    assert path.stat().st_size == MAX_BYTES and read_json(path)["test_accuracy"] == 36.0
    with open(path, "a") as handle:
        handle.write(" ")
    with pytest.raises(Unreadable, match=r"^16,777,217 bytes, more than the 16 MiB a record or table may hold$"):
        read_json(path)


def test_a_folder_that_cannot_be_listed_or_a_record_that_cannot_be_read_is_a_note(tmp_path, data_dir):
    """A sweep folder whose listing fails (permission denied: pathlib's rglob skipped it without a word) and a
    record whose read fails (an I/O error) are each one note naming it; the other runs are tabled."""
    first, second = good_runs(tmp_path / "first"), good_runs(tmp_path / "second")
    listed = run_command(["lra-table", str(first), str(second)], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "table_list:5:EACCES"})  # the 5th folder listed: second
    assert listed.stderr.splitlines() == [f"note: skipped {second}: its files cannot be listed (permission denied); "
                                          "the runs in it are not in the table"]
    assert "| Softmax   | **37.00** ± 1.41 (2) |" in listed.stdout and "runs: 3 completed" in listed.stdout
    read = run_command(["lra-table", str(first)], tmp_path, data_dir, env_extra={"LRA_FAULT": "table_read:1:EIO"})
    assert read.stderr.splitlines() == [f"note: skipped {first / 'n0' / 'metrics.json'}: not a readable run record "
                                        "(input/output error)"]
    assert "| Softmax   | **37.00** ± 1.41 (2) |" in read.stdout and "runs: 2 completed" in read.stdout


def test_a_run_folder_nested_deeper_than_pythons_recursion_limit_is_found(tmp_path, capsys):
    """1,100 folders deep (pathlib's recursive rglob raised RecursionError past about 1,000)."""
    levels = [tmp_path / "sweep"]
    for _ in range(1_100):
        levels.append(levels[-1] / "d")
    try:
        for level in levels:  # one at a time: mkdir(parents=True) recurses too
            level.mkdir()
        write(levels[-1], record())
        code, out, err = table_of([tmp_path / "sweep"], capsys)
        assert code == 0 and "| Softmax   | **36.00** (1) |" in out and err == ""
    finally:
        (levels[-1] / "metrics.json").unlink(missing_ok=True)
        for level in reversed(levels):  # pytest's clean-up would recurse as deep
            if level.is_dir():
                level.rmdir()


@pytest.mark.parametrize("label, task", [("", "listops"), ("  ", "listops"), ("Softmax", ""), ("Softmax", "\n")])
def test_a_blank_label_or_task_is_no_row_or_column_but_a_note(tmp_path, capsys, label, task):
    good_runs(tmp_path)
    write(tmp_path / "blank", record(label=label, task=task))
    code, out, err = table_of([tmp_path], capsys)
    assert code == 0 and "runs: 3 completed" in out
    assert err.splitlines() == [f"note: skipped {tmp_path / 'blank' / 'metrics.json'}: a run record needs the fields "
                                "label, task, status, each a name"]


def test_a_record_whose_task_is_named_like_the_average_column_is_a_note(tmp_path, capsys):
    """Its cells were written over by the rows' averages (two columns "average", both the average)."""
    good_runs(tmp_path)
    write(tmp_path / "avg", record(task="average", accuracy=99.0))
    code, out, err = table_of([tmp_path], capsys)
    assert code == 0 and out.splitlines()[0].split() == ["|", "backend", "|", "listops", "|", "average", "|"]
    assert "99" not in out.replace(str(tmp_path), "") and err.splitlines() == [  # pytest-599 in a path is no cell
        f"note: skipped {tmp_path / 'avg' / 'metrics.json'}: its task is 'average', the name of the table's column of "
        "each row's average over the tasks (the record is damaged or was edited)"]


# ----------------------------------------------------------------------------- the reference table
@pytest.mark.parametrize("content, line, problem, fix", [
    ("method,listops,avg\nSoftmax,30,30\nSoftmax,31,31\n", 3, "the method 'Softmax' a second time (first on line 2)",
     "keep one row per method"),
    ("method,listops\nSoftmax,nan\n", 2, "its listops value for Softmax is 'nan', not a number",
     "write the paper's number there, or leave the cell empty where the paper has none"),
    ("method,listops\nSoftmax,30\nSoftmax,nan\nNone,nan\n", 3, "the method 'Softmax' a second time (first on line 2)",
     "keep one row per method"),  # both: the first problem, in one line
    ("# a comment\n\nmethod,listops\n# another, with \"a quote\nSoftmax,inf\n", 5,
     "its listops value for Softmax is 'inf', not a number",
     "write the paper's number there, or leave the cell empty where the paper has none"),
    ("method,listops\nSoftmax,3_7\n", 2, "its listops value for Softmax is '3_7', not a number",
     "write the paper's number there, or leave the cell empty where the paper has none"),
    ("method,listops\nSoftmax,37.1%\n", 2, "its listops value for Softmax is '37.1%', not a number",
     "write the paper's number there, or leave the cell empty where the paper has none"),
    ("method,listops\nSoftmax,37,38\n", 2, "3 values for the header's 2 columns (method, listops)",
     "give each row one value per column (an empty one where the paper has none)"),
    ("method,listops\n,37\n", 2, "no method name", "name the row's method in its 'method' column"),
    ("name,listops\nSoftmax,37\n", 1, "no 'method' column in its header (name, listops)",
     "its first line names the columns: method,<task>...,avg"),
    ("method,listops,avg,avg5\nSoftmax,37,37,37\n", 1,
     "the column 'avg5' twice in its header (every avg… column is the average)", "keep one of them"),
    ("method,listops,listops\nSoftmax,37,37\n", 1, "the column 'listops' twice in its header", "keep one of them"),
    ("method,listops\n", 1, "no rows",
     "its first line names the columns (method,<task>...,avg), then one row per method"),
    ("", 1, "no header", "its first line names the columns (method,<task>...,avg), then one row per method"),
    ("method,listops\nSoftmax,\"3\"7\n", 2, "not CSV (',' expected after '\"')",
     "write one row per line, fields separated by commas"),
])
def test_a_reference_table_it_cannot_use_is_one_line_naming_the_file_line_and_fix(tmp_path, capsys, content, line,
                                                                                  problem, fix):
    good_runs(tmp_path / "runs")
    reference = tmp_path / "paper.csv"
    reference.write_text(content)
    code, out, err = table_of([tmp_path / "runs", "--reference", reference], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"error: the reference table {str(reference)!r}, line {line}: {problem}; {fix}"]


def test_a_reference_table_with_comments_empty_cells_and_spaces_gives_deltas(tmp_path, capsys):
    good_runs(tmp_path / "runs")
    reference = tmp_path / "paper.csv"
    reference.write_text("# from the paper\nmethod, listops ,text,avg\n Softmax ,37.5,,\nNone,1e1,60,\n")
    code, out, _ = table_of([tmp_path / "runs", "--reference", reference, "--format", "json"], capsys)
    assert code == 0
    assert {r["backend"]: (r["paper"], r["delta"]) for r in json.loads(out)} == {"Softmax": (37.5, -0.5),
                                                                                "None": (10.0, 10.0)}


@pytest.mark.parametrize("content", ["\ufeffmethod,listops\nSoftmax,37.5\n", "method,listops\r\nSoftmax,37.5\r\n"])
def test_a_reference_saved_by_a_spreadsheet_is_read(tmp_path, capsys, content):
    """A byte-order mark (read as part of the first column's name, "no 'method' column") and Windows line ends."""
    good_runs(tmp_path / "runs")
    (tmp_path / "paper.csv").write_bytes(content.encode())
    code, out, _ = table_of([tmp_path / "runs", "--reference", tmp_path / "paper.csv", "--format", "json"], capsys)
    assert code == 0 and [r["paper"] for r in json.loads(out) if r["backend"] == "Softmax"] == [37.5]


@pytest.mark.parametrize("option", ["--reference", "--wandb", "--plot-task", "--metric"])
def test_an_empty_option_value_is_refused_not_taken_as_no_option(tmp_path, capsys, option):
    """`--reference "$PAPER"` with PAPER unset gave a table without deltas, and no word."""
    good_runs(tmp_path / "runs")
    code, out, err = table_of([tmp_path / "runs", option, "", "--plot", tmp_path / "chart.png"], capsys)
    assert (code, out) == (2, "") and err.splitlines() == [
        f"error: {option} is empty (an unset shell variable?); give it a value, or leave {option} out"]
    assert not (tmp_path / "chart.png").exists()


@pytest.mark.parametrize("make, why", [
    (lambda path: path.mkdir(), "a folder, not a regular file"),
    (lambda path: path.symlink_to("/dev/zero"), "a character device, not a regular file"),
    (lambda path: path.symlink_to(path), "a loop of symbolic links"),
    (lambda path: path.write_bytes(b"method,listops\nCaf\xe9,1\n"), "not UTF-8 text (byte 18 is b'\\xe9')"),
])
def test_a_reference_that_is_no_readable_csv_file_is_one_line(tmp_path, capsys, make, why):
    good_runs(tmp_path / "runs")
    make(tmp_path / "paper.csv")
    code, _, err = table_of([tmp_path / "runs", "--reference", tmp_path / "paper.csv"], capsys)
    assert code == 2 and err.splitlines() == [
        f"error: cannot read the reference table {str(tmp_path / 'paper.csv')!r} ({why}); use one of yoso, lra, lha "
        "or a CSV file with a 'method' column (method,<task>...,avg)"]


def test_a_reference_that_is_a_named_pipe_is_refused_without_waiting(tmp_path):
    good_runs(tmp_path / "runs")
    os.mkfifo(tmp_path / "paper.csv")
    result = bounded([tmp_path / "runs", "--reference", tmp_path / "paper.csv"], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [f"error: cannot read the reference table {str(tmp_path / 'paper.csv')!r} "
                                          "(a named pipe, not a regular file); use one of yoso, lra, lha or a CSV "
                                          "file with a 'method' column (method,<task>...,avg)"]


# ----------------------------------------------------------------------------- what a record holds, printed
# A Markdown column, a backslash, a newline, a terminal's escape, a text-direction override, LaTeX's specials; and as
# the table shows it, control characters as their escapes.
ODD, SHOWN = "a|b\\c\nd\x1b[31m\u202e&%_#$^~{}<>", "a|b\\c\\nd\\x1b[31m\\u202e&%_#$^~{}<>"


def markdown_cells(line: str) -> list:
    """The cells of a Markdown table row as GitHub reads them: split at each unescaped ``|``, escapes undone."""
    cells, current, i = [], "", 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            current, i = current + line[i + 1], i + 2
        elif line[i] == "|":
            cells, current, i = cells + [current.strip()], "", i + 1
        else:
            current, i = current + line[i], i + 1
    return cells[1:]


def odd_runs(folder: Path) -> Path:
    good_runs(folder)
    write(folder / "odd", record(label=ODD, task="list|ops\n", accuracy=30.0, device="cpu|\nx"))
    return folder


def test_odd_labels_tasks_and_fields_stay_in_their_cells_in_markdown(tmp_path, capsys):
    """A '|' shifted the Markdown columns and a newline ended a row; each now stays in its cell, control
    characters written as their escapes (no terminal escape reaches the screen)."""
    code, out, err = table_of([odd_runs(tmp_path), "--runs"], capsys)
    assert code == 0 and err == "" and "\x1b" not in out and "\u202e" not in out
    table = [markdown_cells(line) for line in out[:out.index("\n\n")].splitlines()]
    assert table[0] == ["backend", "listops", "list|ops\\n", "average"] and len(table[1]) == 4
    assert table[2:] == [["None", "20.00 (1)", "—", "—"], ["Softmax", "**37.00** ± 1.41 (2)", "—", "—"],
                         [SHOWN, "—", "**30.00** (1)", "—"]]
    listed = [markdown_cells(line) for line in out[out.index("every run (4):"):].splitlines()[2:]]
    assert {len(row) for row in listed} == {10}
    assert [SHOWN, "list|ops\\n", "0", "completed", "30.00", "—", "—", "—", "cpu|\\nx", "—"] in listed


def test_odd_labels_are_escaped_for_latex_and_kept_whole_in_csv_and_json(tmp_path, capsys):
    """LaTeX: each special character as LaTeX prints it (an '&' had opened a column, a '%' commented out the
    rest of the row); CSV and JSON: the label itself, quoted by their own rules."""
    odd_runs(tmp_path)
    code, latex, _ = table_of([tmp_path, "--format", "latex"], capsys)
    assert code == 0
    shown = ("a\\textbar{}b\\textbackslash{}c\\textbackslash{}nd\\textbackslash{}x1b[31m\\textbackslash{}u202e"
             "\\&\\%\\_\\#\\$"
             "\\textasciicircum{}\\textasciitilde{}\\{\\}\\textless{}\\textgreater{}")
    assert "Backend & listops & list\\textbar{}ops\\textbackslash{}n & average \\\\" in latex
    assert f"{shown} & -- & \\textbf{{30.00}} (1) & -- \\\\" in latex
    body = latex[latex.index("\\midrule"):latex.index("\\bottomrule")].splitlines()[1:]
    assert len(body) == 3 and all(len(re.findall(r"(?<!\\)&", row)) == 3 and row.endswith("\\\\") for row in body)
    unescaped = lambda mark: len(re.findall(rf"(?<!\\){re.escape(mark)}", latex))  # noqa: E731
    assert unescaped("{") == unescaped("}") and unescaped("%") == 0 and unescaped("#") == 0
    for form, read in (("csv", lambda text: list(pd.read_csv(io.StringIO(text), keep_default_na=False)["backend"])),
                       ("json", lambda text: [row["backend"] for row in json.loads(text)])):
        code, out, _ = table_of([tmp_path, "--format", form], capsys)
        assert code == 0 and sorted(read(out)) == sorted(["Softmax", "None", ODD]), form


def test_a_run_folder_named_with_a_newline_is_one_note_line_and_one_list_line(tmp_path, capsys):
    good_runs(tmp_path)
    write(tmp_path / "bad\nname", "{ not json")
    write(tmp_path / "failed\nrun", {**record(seed=2), "status": "failed", "error": "boom\n| forged | row |"})
    code, out, err = table_of([tmp_path], capsys)
    assert code == 0
    assert err.splitlines() == [f"note: skipped {tmp_path}/bad\\nname/metrics.json: not a readable run record (not "
                                "JSON: Expecting property name enclosed in double quotes: line 1 column 3 (char 2))"]
    assert f"failed runs (1):\n- {tmp_path}/failed\\nrun: boom\\n| forged | row |\n" in out + "\n"


def test_a_chart_of_labels_with_dollars_and_newlines_is_drawn(tmp_path, capsys):
    """A label with two '$' was read by matplotlib as mathematics: a parse error over five lines, no chart and no
    table."""
    for name, label, speed in (("s", "Softmax", 100.0), ("m", "a$x^$b", 150.0), ("n", "two\nlines", 120.0)):
        write(tmp_path / "runs" / name, record(label=label, train_tokens_per_second=speed, peak_memory_mb=10.0))
    code, out, err = table_of([tmp_path / "runs", "--plot", tmp_path / "chart.png"], capsys)
    assert code == 0 and err == "" and "| a$x^$b" in out
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- --output
OPEN_FILE = "is a file a process has open (standard output or another), which lra-table cannot replace whole"
SPECIAL = "not a regular file (lra-table writes a file whole and renames it over the name, which would replace it)"


@pytest.mark.parametrize("option, make, why", [
    ("--output", os.mkfifo, f"is a named pipe, {SPECIAL}"),
    ("--plot", os.mkfifo, f"is a named pipe, {SPECIAL}"),
    ("--output", lambda path: path.symlink_to("/dev/null"), f"is a character device, {SPECIAL}"),
    pytest.param("--output", lambda path: path.symlink_to("/proc/self/fd/1"), OPEN_FILE,
                 marks=pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="Linux's /proc")),
    ("--output", lambda path: path.symlink_to(path), "is a loop of symbolic links"),
])
def test_an_output_that_is_no_regular_file_is_refused_and_left_as_it_was(tmp_path, capsys, option, make, why):
    """--output /dev/stdout, /dev/null or a named pipe was replaced by a regular file (atomic writes rename over
    the name: for root, the device itself); now one line, nothing written, the file as it was."""
    good_runs(tmp_path / "runs")
    output = tmp_path / "out.png"
    make(output)
    before = os.lstat(output)
    code, out, err = table_of([tmp_path / "runs", option, output], capsys)
    fix = ("give --output a file name, or leave --output out to write to standard output" if option == "--output"
           else "give --plot a file name")
    if why.startswith("is a loop"):
        fix = f"give {option} another name"
    assert (code, out) == (1, "") and err.splitlines() == [f"error: {option}: {output} {why}; {fix}"]
    after = os.lstat(output)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)


def test_an_output_that_is_a_link_is_written_where_it_points_and_stays_a_link(tmp_path, capsys):
    good_runs(tmp_path / "runs")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("an older table\n")
    (tmp_path / "results.md").symlink_to(Path("docs") / "results.md")
    (tmp_path / "new.md").symlink_to(Path("docs") / "new.md")  # to a file not written yet
    for name in ("results.md", "new.md"):
        code, _, err = table_of([tmp_path / "runs", "--output", tmp_path / name], capsys)
        assert code == 0 and err == "" and (tmp_path / name).is_symlink()
        assert "| Softmax   | **37.00** ± 1.41 (2) |" in (tmp_path / "docs" / name).read_text()
