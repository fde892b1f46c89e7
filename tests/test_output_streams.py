"""Standard output that cannot be written (lra/commands/streams.py): a full disk (`> /dev/full`) or a closed
descriptor (`>&-`) is one `error:` line on stderr and exit status 1, never a logging traceback per line, and
the work itself goes on (a run completes and its record says so); standard error unwritable keeps the
command's own status; a reader gone (`| head`) stays silent, 141."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SMALL_LISTOPS, read_json, run_command

TRAIN = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "model.num_layers=1", *SMALL_LISTOPS]
RECORD = ('{"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "steps": 4, '
          '"test_accuracy": 12.5}')


def full_disk_line(command: str) -> str:
    return (f"error: cannot write to standard output (No space left on device): free space on that disk, or write "
            f"elsewhere; {command} carries on without printing (the files it writes are kept as usual) and ends "
            "with status 1")


def assert_one_line(result, line):
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert result.stderr.splitlines() == [line], result.stderr


def test_lra_train_on_a_full_disk_completes_its_run_and_says_so_in_one_line(tmp_path, data_dir):
    """It completed, then ended with exit 1 after a "--- Logging error ---" traceback for every progress line."""
    run = tmp_path / "runs" / "full"
    result = run_command(["lra-train", *TRAIN, f"hydra.run.dir={run}"], tmp_path, data_dir, check=False,
                         streams={"stdout": "/dev/full"})
    assert_one_line(result, full_disk_line("lra-train"))
    record = read_json(run / "metrics.json")
    assert (record["status"], record["steps"]) == ("completed", 4)
    assert "Softmax on listops: test accuracy" in (run / "train.log").read_text(), "the log keeps what was not printed"


@pytest.mark.parametrize("command", [
    ["lra-table", "runs"],
    ["lra-table", "--help"],
    ["lra-prepare", "--help"],
    ["lra-profile", "--cfg", "job", "preset=smoke"],
    ["lra-fidelity", "--help"],
    ["lra-gpu-check", "--plan"],
    ["lra-sync", "runs", "--dry-run"],
    ["lra-train", "--cfg", "job"],
], ids=lambda command: " ".join(command))
def test_every_command_with_a_full_disk_for_standard_output_is_one_line(tmp_path, data_dir, command):
    (tmp_path / "runs" / "0" / "wandb" / "offline-run-20261127_101500-x").mkdir(parents=True)  # lra-sync's
    (tmp_path / "runs" / "0" / "metrics.json").write_text(RECORD)  # lra-table's
    result = run_command(command, tmp_path, data_dir, check=False, streams={"stdout": "/dev/full"})
    if command[0] == "lra-sync":  # the dry run's verdict stands (that folder holds no log): its status, 1, and line
        assert result.returncode == 1 and result.stderr.splitlines()[0] == full_disk_line("lra-sync")
        assert result.stderr.splitlines()[1].startswith("error: 1 of 1 runs would not be synced")
        return
    assert_one_line(result, full_disk_line(command[0]))


def test_lra_prepare_on_a_full_disk_builds_the_cache_all_the_same(tmp_path, data_dir):
    data = tmp_path / "data"
    generate = [o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]
    result = run_command(["lra-prepare", "listops", "--data-dir", str(data), *generate], tmp_path, data_dir,
                         check=False, streams={"stdout": "/dev/full"})
    assert_one_line(result, full_disk_line("lra-prepare"))
    assert list(data.rglob("manifest.json")), "the cache is built"


def test_an_unwritable_standard_error_keeps_the_commands_own_status(tmp_path, data_dir):
    """A config mistake whose one line cannot be shown: still exit 2, no crash of its own (no 120, no 1)."""
    result = run_command(["lra-train", "trainer.max_step=3"], tmp_path, data_dir, check=False,
                         streams={"stderr": "/dev/full"})
    assert result.returncode == 2
    (tmp_path / "runs" / "0").mkdir(parents=True)
    (tmp_path / "runs" / "0" / "metrics.json").write_text(RECORD)
    result = run_command(["lra-table", "runs"], tmp_path, data_dir, check=False,
                         streams={"stderr": "/dev/full", "stdout": "/dev/full"})
    assert result.returncode == 1, "nothing to say it with, but the lost table is still a failure"


def test_a_closed_standard_output_is_one_line_and_never_a_file_the_command_opens(tmp_path):
    """`lra-sync --help >&-`: Python starts with no sys.stdout and printed nothing, silently, exit 0."""
    exe = Path(sys.executable).parent / "lra-sync"
    result = subprocess.run([str(exe), "--help"], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: os.close(1), timeout=120)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "error: cannot write to standard output (Bad file descriptor): it was closed (>&-): send it to a file, or to "
        "/dev/null to discard it; lra-sync carries on without printing (the files it writes are kept as usual) and "
        "ends with status 1"]
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'lra-table'; import lra.commands, os; "
                            "print(os.readlink('/proc/self/fd/1'), file=sys.stderr)"],
                           stderr=subprocess.PIPE, text=True, preexec_fn=lambda: os.close(1), timeout=60)
    assert probe.stderr.strip() == "/dev/null", "descriptor 1 is taken before any file could get it"
