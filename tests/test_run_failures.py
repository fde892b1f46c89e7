"""One error edge around the whole job (lra/commands/config_errors.failure): what fails inside a run that
passed validation — a diverged loss, compiled kernels that cannot be built, a file where a data folder
must be, memory exhausted — ends with one ``error:`` line naming the fix and exit 1, never a traceback,
and the run's record says ``failed`` with the same words; in a sweep the job is recorded and the sweep
goes on. An error no rule knows (a bug: LRA_FAULT's BUG action) is one line too, in every command, naming
the file that holds its traceback (the run's train.log, a tool's log, else a file of its own) and exit 1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from helpers import needs_kernels

QUICK = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2", *SMALL_LISTOPS]
DIVERGED = "the training loss was not finite at a step between"


def one_error_line(result):
    """The single ``error:`` line of a command that failed with exit 1 and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and len(lines) == 1, (result.returncode, result.stderr)
    assert result.stderr.strip().splitlines()[-1] == lines[0] and "Traceback" not in result.stderr + result.stdout
    return lines[0].removeprefix("error: ")


def failed_record(root):
    (run,) = run_dirs(root)
    record = read_json(run / "metrics.json")
    assert record["status"] == "failed", record
    return record


def test_a_diverged_run_is_one_line_naming_the_learning_rate_and_grad_clip(tmp_path, data_dir):
    """trainer.lr=10 on the smoke preset diverges within its first 10 steps."""
    result = run_command(["lra-train", "trainer=smoke", "trainer.lr=10", *SMALL_LISTOPS], tmp_path, data_dir,
                         check=False)
    line = one_error_line(result)
    assert line.startswith(DIVERGED)
    assert line.endswith("start a new run with a lower trainer.lr or with trainer.grad_clip set")
    assert failed_record(tmp_path)["error"] == f"TrainingDiverged: {line}"
    (run,) = run_dirs(tmp_path)
    assert not (run / "checkpoints" / "last.pt").exists(), "no checkpoint was written after the loss diverged"


def test_a_diverged_pretraining_stage_names_its_own_learning_rate(tmp_path, data_dir):
    result = run_command(["lra-train", *QUICK, "pretrain=masked", "pretrain.lr=1000"], tmp_path, data_dir, check=False)
    line = one_error_line(result)
    assert line.startswith(DIVERGED) and "a lower pretrain.lr or with trainer.grad_clip set" in line
    record = failed_record(tmp_path)
    assert record["pretrain_status"] == "failed", "stage 1 is the stage that failed"


@needs_kernels
def test_a_kernel_cache_that_is_a_file_is_one_line_naming_lra_kernel_cache(tmp_path, data_dir):
    cache = tmp_path / "kernels"
    cache.write_text("not a folder")
    result = run_command(["lra-train", *QUICK, "attention=yoso", "attention.impl=cpu"], tmp_path, data_dir,
                         env_extra={"LRA_KERNEL_CACHE": str(cache)}, check=False)
    line = one_error_line(result)
    assert line.startswith(f"cannot build the YOSO CPU kernels in {cache}/") and f"{cache} is a file" in line
    assert line.endswith("set LRA_KERNEL_CACHE to a folder you can write, or attention.impl=torch")
    assert failed_record(tmp_path)["error"] == f"KernelUnavailable: {line}"
    assert cache.read_text() == "not a folder"


def test_a_task_data_folder_that_is_a_file_is_one_line(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "listops").write_text("not a folder")
    result = run_command(["lra-train", *QUICK], tmp_path, data, check=False)
    line = one_error_line(result)
    assert f"{data / 'listops'}" in line and "is a file" in line, line
    assert (data / "listops").read_text() == "not a folder"


def test_memory_exhausted_mid_run_is_one_line_naming_the_settings_that_use_less(tmp_path, data_dir):
    result = run_command(["lra-train", *QUICK], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3:OOM"}, check=False)
    line = one_error_line(result)
    assert line.startswith("out of memory (CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "trainer.grad_accumulation" in line and "trainer.batch_size" in line
    record = failed_record(tmp_path)
    assert record["error"] == f"OutOfMemoryError: {line}" and record["steps"] == 2, "the record says the fix too"


def test_memory_exhausted_during_validation_is_the_same_line(tmp_path, data_dir):
    result = run_command(["lra-train", *QUICK], tmp_path, data_dir, env_extra={"LRA_FAULT": "eval_batch:2:OOM"},
                         check=False)
    assert one_error_line(result).startswith("out of memory (")
    assert failed_record(tmp_path)["error"].startswith("OutOfMemoryError:")


def test_a_diverged_job_of_a_sweep_is_recorded_and_the_sweep_goes_on(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", "trainer=smoke", "trainer.lr=10,1e-3", *SMALL_LISTOPS,
                          f"hydra.sweep.dir={sweep}"], tmp_path, data_dir, check=False)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
        f"error: 1 of the sweep's 2 runs failed; the table above and {sweep / 'table.md'} list each with its error "
        "(its record and train.log say more)")
    diverged = read_json(sweep / "0" / "metrics.json")
    assert diverged["status"] == "failed" and DIVERGED in diverged["error"]
    assert read_json(sweep / "1" / "metrics.json")["status"] == "completed"
    table = (sweep / "table.md").read_text()
    assert "failed runs (1):" in table and f"{sweep / '0'}: TrainingDiverged: {DIVERGED}" in table


def traceback_file(line: str, error: str) -> Path:
    """The file a bug's one line names, checked to hold the full traceback of ``error``."""
    match = re.fullmatch(rf"unexpected {re.escape(error)} \(its traceback is in (.+)\); this is a bug in the harness, "
                         "not in your input: please report it with that file", line)
    assert match, line
    path = Path(match.group(1))
    text = path.read_text()
    assert "Traceback (most recent call last):" in text and f"\n{error}\n" in text, text
    return path


def test_a_bug_inside_a_run_is_one_line_naming_its_traceback_in_the_run_log_and_the_record_says_failed(tmp_path,
                                                                                                         data_dir):
    """An error no rule knows (LRA_FAULT's BUG: a RuntimeError) was a traceback: one line now, exit 1."""
    result = run_command(["lra-train", *QUICK], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3:BUG"}, check=False)
    error = "RuntimeError: a fault injected at step (LRA_FAULT=step:3:BUG)"
    (run,) = run_dirs(tmp_path)
    assert traceback_file(one_error_line(result), error) == run / "train.log"
    assert failed_record(tmp_path)["error"] == error


def test_a_bug_in_a_sweep_job_is_one_line_its_traceback_in_the_job_log(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", "seed=0", *QUICK, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "step:3:BUG"}, check=False)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    error = "RuntimeError: a fault injected at step (LRA_FAULT=step:3:BUG)"
    (line,) = [line.split("] - error: ", 1)[1] for line in result.stdout.splitlines() if "] - error: " in line]
    assert traceback_file(line, error) == sweep / "0" / "train.log"
    assert read_json(sweep / "0" / "metrics.json")["error"] == error


A_RECORD = '{"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "steps": 4, "test_accuracy": 12.5}'
TOOL_BUGS = {  # command line, the fault, where the traceback goes: the tool's Hydra log, else a file of its own
    "lra-prepare": (["lra-prepare", "listops", "--data-dir", "data",
                     *[o for o in SMALL_LISTOPS if "task.max" not in o]], "cache_example:3:BUG", None),
    "lra-table": (["lra-table", ".", "--output", "table.md"], "write:1:BUG", None),
    "lra-profile": (["lra-profile", "preset=smoke", "backends=[softmax]", "hydra.run.dir=out"], "output_check:2:BUG",
                    "out/profile.log"),
    "lra-fidelity": (["lra-fidelity", "preset=smoke", "hydra.run.dir=out"], "output_check:2:BUG", "out/fidelity.log"),
}


@pytest.mark.parametrize("tool", TOOL_BUGS)
def test_a_bug_in_any_command_is_one_line_naming_the_file_with_its_traceback(tmp_path, data_dir, tool):
    args, fault, log = TOOL_BUGS[tool]
    (tmp_path / "metrics.json").write_text(A_RECORD)  # for lra-table
    result = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": fault}, check=False)
    path = traceback_file(one_error_line(result), f"RuntimeError: a fault injected at {fault.split(':')[0]} "
                                                  f"(LRA_FAULT={fault})")
    if log is not None:
        assert path == tmp_path / log
    else:  # no run folder, no log: a file of its own, named after the command and holding its command line
        assert path.name.startswith(f"{tool}-traceback-") and path.read_text().startswith(f"{tool} {args[1]} ")
        path.unlink()


def test_a_reader_that_closes_the_pipe_early_is_no_error_and_no_bug_report(tmp_path, monkeypatch, capsys):
    """`lra-table runs | head -1` (or `lra-train --help | head`): the write to the closed pipe is a
    BrokenPipeError, not a bug to report; the command ends silently with SIGPIPE's status, 141."""
    import os
    import sys

    from lra.commands.table import main as table_main

    (tmp_path / "metrics.json").write_text(A_RECORD)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    monkeypatch.setattr(sys, "stdout", os.fdopen(write, "w", buffering=1))  # a line is written as printed
    with pytest.raises(SystemExit) as stopped:
        table_main([str(tmp_path)])
    assert stopped.value.code == 141 and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", [["lra-prepare", "listops"], ["lra-train", *QUICK]],
                         ids=["lra-prepare", "lra-train"])
def test_memory_exhausted_while_the_data_is_converted_is_one_line_in_both_commands(tmp_path, command):
    """The same edge for a command with no run record (lra-prepare) as for a run (lra-train)."""
    data = tmp_path / "data"
    args = [*command, "--data-dir", str(data), *[o for o in SMALL_LISTOPS if "max_length=256" not in o]] \
        if command[0] == "lra-prepare" else command
    result = run_command(args, tmp_path, data, env_extra={"LRA_FAULT": "cache_example:5:OOM"}, check=False)
    assert one_error_line(result).startswith("out of memory (")
    assert not [p for p in data.rglob("*") if p.name.startswith(".")], "no staging folder left behind"


def test_a_run_folder_deleted_mid_run_is_one_line_and_is_not_made_again(tmp_path, data_dir, monkeypatch):
    """The next write made the folder again and the run ended 'completed' (exit 0) in a folder holding a record
    and checkpoints but no config or log. Deleted at a fixed step, in this process (lra.faults' point)."""
    import shutil

    from lra import training
    from lra.run import RunFolderGone
    from helpers import train_in_process

    run = tmp_path / "run"
    steps = []

    def delete_the_folder_at_step_three(name, path=None):
        if name == "step":
            steps.append(name)
            if len(steps) == 3:
                shutil.rmtree(run)

    monkeypatch.setattr(training.checkpoint, "fault_point", delete_the_folder_at_step_three)
    with pytest.raises(RunFolderGone) as gone:
        train_in_process(run, *QUICK, f"data_dir={data_dir}")
    assert str(gone.value) == (f"the run folder {run} was deleted or moved while this run was writing to it; nothing "
                               "more is written there: resume it where it was moved to (lra-train resume=<that "
                               "folder>), or start it again")
    assert not run.exists(), "nothing made the folder again"


def test_the_progress_line_of_a_run_longer_than_a_clock_holds_is_written(tmp_path):
    """trainer.max_steps=10**23 (a valid count) ended its first progress line with an OverflowError traceback."""
    from lra.training import progress_line

    line = progress_line(40, 10**23, 2.25, 18.75, 25676.0, 31.0, 0.5)
    assert line == "step 40/100000000000000000000000 (0%) loss 2.250 acc 18.8 tok/s 25,676 elapsed 0:00:31 eta 1.58e+15 years"
    assert progress_line(1, 10, 1.0, 2.0, 3.0, float("inf"), 1.0).endswith("elapsed ? eta 0:00:09")


GLOO_PEER_GONE = ("[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:29500: Connection "
                  "reset by peer")


@pytest.mark.parametrize("error", [RuntimeError(GLOO_PEER_GONE), "DistBackendError"])
def test_under_torchrun_a_collective_whose_other_process_is_gone_is_no_bug_and_names_the_resume(monkeypatch, error):
    """A rank killed made the other say "unexpected RuntimeError … this is a bug in the harness". An NCCL or
    gloo error of the process's own stays one (the words of a peer gone decide)."""
    import torch

    from lra.commands.config_errors import failure

    if error == "DistBackendError":
        error = torch.distributed.DistBackendError("NCCL communicator was aborted on rank 0")
        own = torch.distributed.DistBackendError("NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)")
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert failure(own) is None
        monkeypatch.delenv("WORLD_SIZE")
    assert failure(error) is None or "another process" not in failure(error)[0]  # one process: no peer to lose
    monkeypatch.setenv("WORLD_SIZE", "2")
    line, status = failure(error)
    said = " ".join(str(error).split())
    assert status == 1 and line == (
        f"another process of this torchrun run stopped, and this one with it ({type(error).__name__}: "
        f"{said[:160]}{' …' if len(said) > 160 else ''}); the other process's output says why; then resume the run "
        "with torchrun --standalone --nproc_per_node=2 $(which lra-train) resume=<its folder> (each process goes "
        "on from the last checkpoint)")
