"""Every command checks where it will write before it writes (lra.io.check_output_folder /
check_output_file): a file where a folder is expected, a read-only folder, a file in the way of a
missing folder, and a path the same command reads are one ``error:`` line and a non-zero exit, with
nothing written and nothing finished changed; a missing folder is made."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import SMALL_LISTOPS, run_command
from helpers import main_in_process
from lra.commands.table import main as table_main
from lra.errors import UserError
from lra.io import check_output_file, check_output_folder

RECORD = {"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "test_accuracy": 36.0}


def one_error_line(result, code=1):
    errors = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert result.returncode == code and len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Error executing job" not in result.stderr, result.stderr
    return errors[0]


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(folder.rglob("*"))}


def write_run(folder, record=RECORD):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(record))
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "resolved.yaml").write_text("seed: 0\n")
    return folder


@pytest.fixture
def read_only(tmp_path):
    """A folder this process cannot write: permissions for a user; for root (whom permissions do not
    stop), a read-only tmpfs where mounting is allowed; skipped otherwise."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                                                        capture_output=True).returncode:
        pytest.skip("running as root without permission to mount a read-only file system")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


# ----------------------------------------------------------------------------- the check itself
def test_the_output_check_refuses_files_unwritable_folders_and_what_the_command_reads(tmp_path, read_only):
    (tmp_path / "file").write_text("x")
    record = write_run(tmp_path / "run") / "metrics.json"
    (tmp_path / "link.md").symlink_to(record)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    refused = {
        "a file": lambda: check_output_folder(tmp_path / "file", "out"),
        "under a file": lambda: check_output_folder(tmp_path / "file" / "sub", "out"),
        "a broken link": lambda: check_output_folder(tmp_path / "dangling", "out"),
        "read-only": lambda: check_output_folder(read_only, "out"),
        "under read-only": lambda: check_output_folder(read_only / "new" / "deeper", "out"),
        "a folder it reads": lambda: check_output_folder(tmp_path / "run" / ".." / "run", "out", reads=[tmp_path / "run"]),
        "a file given a folder": lambda: check_output_file(tmp_path / "run", "--output"),
        "a file it reads": lambda: check_output_file(record, "--output", reads=[record]),
        "a link to a file it reads": lambda: check_output_file(tmp_path / "link.md", "--output", reads=[record]),
        "a file in a read-only folder": lambda: check_output_file(read_only / "t.md", "--output"),
    }
    for case, check in refused.items():
        with pytest.raises(UserError) as error:
            check()
        assert str(error.value).split(":")[0] in ("out", "--output"), (case, error.value)
    before = snapshot(tmp_path / "run")
    assert check_output_folder(tmp_path / "new" / "deeper", "out") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists(), "the check makes nothing; the command makes the folder when it writes"
    assert check_output_file(tmp_path / "run" / "table.md", "--output", reads=[record]) == tmp_path / "run" / "table.md"
    assert snapshot(tmp_path / "run") == before


def test_an_injected_read_only_file_system_is_refused_by_the_check(tmp_path, monkeypatch):
    """The same refusal on any machine (root in a container cannot always mount a read-only disk)."""
    monkeypatch.setenv("LRA_FAULT", "output_check:1:EROFS")
    with pytest.raises(UserError, match=r"out: cannot write into .* \(read-only file system\); give out another"):
        check_output_folder(tmp_path, "out")


# ----------------------------------------------------------------------------- lra-table
def test_lra_table_never_writes_its_table_over_the_record_it_reads(tmp_path, data_dir):
    """The record stays byte for byte, one line, exit 1; a later table still has the run."""
    run = write_run(tmp_path / "run")
    before = snapshot(run)
    result = run_command(["lra-table", str(run), "--output", str(run / "metrics.json")], tmp_path, data_dir, check=False)
    assert "is a file this command reads" in one_error_line(result)
    assert snapshot(run) == before
    assert "36.00** (1)" in run_command(["lra-table", str(run)], tmp_path, data_dir).stdout


def lra_table(*args, capsys):
    status, _, errors = main_in_process(table_main, [str(a) for a in args], capsys)
    return status, errors


def test_lra_table_output_paths(tmp_path, capsys):
    runs = tmp_path / "runs"
    run = write_run(runs / "a")
    other = write_run(tmp_path / "elsewhere" / "b")
    (tmp_path / "link.md").symlink_to(run / "metrics.json")
    (tmp_path / "file").write_text("x")
    before = snapshot(tmp_path)
    refused = {  # --output (or --plot) → the words of its one line
        ("--output", tmp_path / "link.md"): "is a file this command reads",
        ("--output", other / "metrics.json"): "is named like a run record",  # a record the command does not read
        ("--output", runs / "new" / "metrics.json"): "is named like a run record",
        ("--output", run / ".hydra" / "resolved.yaml"): "one of the files of the run",
        ("--output", run / "checkpoints" / "table.md"): "one of the files of the run",
        ("--output", run): "is a folder; give --output a file name",
        ("--output", tmp_path / "file" / "table.md"): "is a file, not a folder",
        ("--plot", run / "metrics.json"): "is a file this command reads",
    }
    for (option, path), words in refused.items():
        code, err = lra_table(runs, option, path, capsys=capsys)
        assert code == 1 and f"error: {option}: " in err and words in err, (option, path, err)
    assert snapshot(tmp_path) == before, "nothing was written by a refused command"
    code, err = lra_table(runs, "--output", tmp_path / "new" / "folders" / "table.md", capsys=capsys)
    assert code == 0 and "36.00** (1)" in (tmp_path / "new" / "folders" / "table.md").read_text(), err
    code, err = lra_table(runs, "--output", run / "table.md", capsys=capsys)  # a table beside a run's own files
    assert code == 0 and (run / "table.md").is_file()
    code, err = lra_table(runs, "--output", tmp_path / "t.md", "--plot", tmp_path / "t.md", capsys=capsys)
    assert code == 1 and "are the same file" in err


# ----------------------------------------------------------------------------- the other commands
def test_tool_output_folders_that_are_files_or_read_what_the_tool_reads_are_one_line(tmp_path, data_dir):
    (tmp_path / "file").write_text("x")
    run = write_run(tmp_path / "run")
    before = snapshot(run)
    cases = [
        (["lra-profile", "preset=smoke", "output_dir=file"], "output_dir: ", "is a file, not a folder"),
        (["lra-fidelity", "preset=smoke", "output_dir=file/sub"], "output_dir: ", "is a file, so no folder"),
        (["lra-fidelity", "preset=smoke", "checkpoint=run", "output_dir=run"], "output_dir: ", "a folder this command"),
        (["lra-fidelity", "preset=smoke", "checkpoint=run", "hydra.run.dir=run"], "hydra.run.dir: ", "a folder this command"),
        (["lra-profile", "preset=smoke", "hydra.run.dir=file"], "hydra.run.dir: ", "is a file, not a folder"),
        (["lra-gpu-check", "--device", "cpu", "--quick", "--out", "file"], "--out: ", "is a file, not a folder"),
        (["lra-train", "trainer=smoke", "hydra.run.dir=file"], "hydra.run.dir: ", "is a file, not a folder"),
        (["lra-prepare", "listops", "--data-dir", "file"], "the data directory (data_dir): ", "is a file, so no folder"),
    ]
    for args, setting, words in cases:
        line = one_error_line(run_command(args, tmp_path, data_dir, check=False))
        assert line.startswith(f"error: {setting}") and words in line, (args, line)
    assert snapshot(run) == before, "the run read by lra-fidelity is unchanged"
    assert not (tmp_path / "runs").exists(), "a refused tool leaves no folder of Hydra's behind (runs/profile/ neither)"


@pytest.mark.parametrize("command", [["lra-train", "trainer=smoke"], ["lra-train", "-m", "seed=0"],
                                     ["lra-profile", "preset=smoke"]], ids=["lra-train", "a sweep", "lra-profile"])
def test_an_empty_hydra_output_folder_is_refused_rather_than_the_working_folder_used(tmp_path, data_dir, command):
    """hydra.run.dir= (or hydra.sweep.dir=) empty made the working folder itself the run folder: a run's
    files among the user's own."""
    key = "hydra.sweep.dir" if "-m" in command else "hydra.run.dir"
    for value in ("", "''"):
        line = one_error_line(run_command([*command, f"{key}={value}"], tmp_path, data_dir, check=False))
        assert line.startswith(f"error: {key} is empty, which would make the current folder") and "leave it out" in line
    assert list(tmp_path.iterdir()) == [], "nothing was written into the working folder"


@pytest.mark.parametrize("key", ["resume", "data_dir"])
def test_an_empty_resume_or_data_dir_is_refused_rather_than_a_fresh_run_or_the_working_folder(tmp_path, data_dir,
                                                                                                   key):
    """resume= empty (an unset shell variable) trained a new run; data_dir= empty made the working folder the
    data root, generating ListOps into it."""
    for value in ("", "''"):
        line = one_error_line(run_command(["lra-train", "trainer=smoke", f"{key}={value}"], tmp_path, data_dir,
                                          check=False), code=2)
        assert line == f"error: {key} is empty (an unset shell variable?); give {key} a folder, or leave it out"
    assert list(tmp_path.iterdir()) == [], "nothing was written into the working folder"


def test_a_sweep_folder_holding_another_sweep_stops_the_sweep_and_its_own_command_keeps_what_finished(tmp_path, data_dir):
    """A different command with hydra.sweep.dir of an earlier sweep ended with exit 0 and that sweep's table,
    its jobs refused without a record; the same command again keeps the finished jobs as they are."""
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", "seed=0", "trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2",
            *SMALL_LISTOPS, f"hydra.sweep.dir={sweep}"]
    run_command(args, tmp_path, data_dir)
    before = snapshot(sweep / "0")
    other = run_command([*args[:2], "attention=none", *args[2:]], tmp_path, data_dir, check=False)
    line = one_error_line(other, code=2)
    assert line.startswith(f"error: hydra.sweep.dir={sweep} holds a sweep made by another command (lra-train -m seed=0")
    assert line.endswith("continue it with that command, or choose another hydra.sweep.dir (the sweep is left as it was)")
    assert "Test accuracy" not in other.stdout, "no table of the other sweep's runs"
    (sweep / "multirun.yaml").rename(tmp_path / "multirun.yaml")  # a sweep without it: its first job refuses
    other = run_command([*args[:2], "attention=none", *args[2:]], tmp_path, data_dir, check=False)
    line = one_error_line(other, code=2)
    assert line.startswith(f"error: the sweep stopped at job 0: {sweep / '0'} already holds a completed run (Softmax")
    assert line.endswith("continue it with its own command and settings, or choose another hydra.sweep.dir")
    assert "Test accuracy" not in other.stdout, "no table of the other sweep's runs"
    (tmp_path / "multirun.yaml").replace(sweep / "multirun.yaml")
    again = run_command(args, tmp_path, data_dir)
    assert f"{sweep / '0'} already completed at step 2" in again.stdout and "Test accuracy" in again.stdout
    assert snapshot(sweep / "0") == before, "the finished job is kept as it is, not trained again"


def test_a_task_folder_that_is_a_file_in_the_data_directory_is_one_line(tmp_path, data_dir):
    """LRA_DATA_DIR/<task> a file (NotADirectoryError before): lra-train and lra-prepare say which file."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "listops").write_text("not a folder")
    for args in (["lra-train", "trainer=smoke", "trainer.max_steps=2", *SMALL_LISTOPS, "hydra.run.dir=run"],
                 ["lra-prepare", "listops", *[o for o in SMALL_LISTOPS if "max_length=256" not in o]]):
        line = one_error_line(run_command(args, tmp_path, data, check=False))
        assert f"(data_dir): {data / 'listops'} is a file, so no folder" in line and "LRA_DATA_DIR" in line, line


@pytest.mark.parametrize("command", ["lra-profile", "lra-fidelity", "lra-gpu-check", "lra-train", "lra-prepare",
                                     "lra-table"])
def test_a_read_only_output_folder_is_one_line_for_every_command(tmp_path, data_dir, read_only, command):
    run = write_run(tmp_path / "run")
    args = {"lra-profile": ["preset=smoke", f"output_dir={read_only / 'out'}"],
            "lra-fidelity": ["preset=smoke", f"output_dir={read_only}"],
            "lra-gpu-check": ["--device", "cpu", "--quick", "--out", str(read_only / "out")],
            "lra-train": ["trainer=smoke", f"hydra.run.dir={read_only / 'run'}"],
            "lra-prepare": ["listops", "--data-dir", str(read_only)],
            "lra-table": [str(run), "--output", str(read_only / "table.md")]}[command]
    line = one_error_line(run_command([command, *args], tmp_path, data_dir, check=False))
    assert "cannot write into" in line and ("read-only file system" in line or "permission denied" in line), line


def test_a_data_folder_that_is_a_loop_of_links_or_an_empty_lra_data_dir_is_handled(tmp_path):
    """A loop of symbolic links as the data folder was pathlib's 'Symlink loop' traceback; LRA_DATA_DIR set
    but empty made the working folder the data folder (its caches among the user's files), not ./data; set to
    whitespace alone it made a folder named so."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    generate = ["lra-prepare", "listops", *[o for o in SMALL_LISTOPS if "max_length=256" not in o]]
    for args, data in ((generate, tmp_path / "a"), (["lra-train", "trainer=smoke", *SMALL_LISTOPS, "data_dir=a",
                                                      "hydra.run.dir=run"], tmp_path / "unused")):
        line = one_error_line(run_command(args, tmp_path, data, check=False))
        assert line in (f"error: {tmp_path / link} is a loop of symbolic links (each points on to the next, never to "
                        "a folder): point it at a real folder, or choose another path" for link in "ab"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"], "nothing written"
    (tmp_path / "work").mkdir()
    run_command(generate, tmp_path / "work", "")  # LRA_DATA_DIR=""
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["data"] and (tmp_path / "work" / "data" / "listops").is_dir()
    for args in (generate, ["lra-train", "trainer=smoke", "hydra.run.dir=run"]):  # LRA_DATA_DIR=" ": no folder " "
        line = one_error_line(run_command(args, tmp_path / "work", " ", check=False), code=2)
        assert line.endswith("LRA_DATA_DIR is ' ', whitespace alone; set it to the data folder, or unset it (./data "
                             "is the default)"), line
    assert [p.name for p in (tmp_path / "work").iterdir()] == ["data"]


def test_a_run_folder_in_the_data_it_reads_is_refused(tmp_path, data_dir):
    """hydra.run.dir inside a task's cache (or the data folder itself) trained there, its record, checkpoints
    and log among the cache's arrays; a run folder elsewhere under data_dir (runs/ beside the tasks) is fine."""
    cache = data_dir / "listops" / "cache" / "0123abcd"
    for run, words in ((cache / "run", f"is inside the listops data folder {data_dir / 'listops'}, which this command "
                                       "reads"),
                       (data_dir, f"is a folder this command reads ({data_dir})")):
        line = one_error_line(run_command(["lra-train", "trainer=smoke", f"hydra.run.dir={run}"], tmp_path, data_dir,
                                          check=False))
        assert line.startswith(f"error: hydra.run.dir: {run} ") and words in line, line
    assert not cache.exists() and not (data_dir / "metrics.json").exists()


@pytest.mark.parametrize("path", ["runs/a", "/tmp/s w,p/sweep", "it's", "a=b,c", "[x]~y", "café", "back\\slash\\"])
def test_a_path_given_to_hydra_parses_back_to_itself_in_every_command_that_writes_one(path):
    """The reference slice passed --sweep-dir to lra-train unquoted: a path with a space or a comma was read as a
    sweep of hydra.sweep.dir (refused as 'Sweeping over Hydra's configuration is not supported')."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from lra.commands.reference_slice import Slice
    from lra.run import hydra_value, parsed_value

    assert parsed_value(hydra_value(path)) == path
    (override,) = [o for o in Slice(["softmax"], ["0"], [], "cpu").command(Path(path)) if o.startswith("hydra.sweep")]
    parsed = OverridesParser.create().parse_override(override)
    assert not parsed.is_sweep_override() and parsed.value() == path
