"""A run folder belongs to one run: a fresh run never adopts a folder that holds one, a refused
command writes nothing into a folder it does not own, and a resume only takes the run's own
training checkpoint."""

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs

SHORT = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2", *SMALL_LISTOPS]


def snapshot(folder):
    """Every file under ``folder`` (the lock file aside) with its bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def completed(tmp_path_factory, data_dir):
    """A completed seed-1 run whose folder later commands point at."""
    root = tmp_path_factory.mktemp("completed")
    run_command(["lra-train", *SHORT, "seed=1", "hydra.run.dir=runs/done"], root, data_dir)
    return root, root / "runs" / "done"


@pytest.mark.parametrize("extra", [["seed=2"], ["attention=none"], []], ids=["another seed", "another backend", "the same"])
def test_a_fresh_run_never_adopts_a_completed_run_folder(completed, data_dir, extra):
    root, run = completed
    before = snapshot(run)
    result = run_command(["lra-train", *SHORT, *extra, f"hydra.run.dir={run}"], root, data_dir, check=False)
    line = last_line(result)
    assert result.returncode == 2 and line.startswith(f"error: {run} already holds a completed run (Softmax on listops, seed 1)")
    assert f"lra-train resume={run}" in line and "new folder" in line, line
    assert "Traceback" not in result.stderr
    assert snapshot(run) == before, "the completed run's record, config, log and checkpoints are untouched"


def test_a_fresh_run_refuses_a_folder_holding_only_a_failed_run_or_a_checkpoint(tmp_path, data_dir):
    run = tmp_path / "runs" / "partial"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"weights")
    result = run_command(["lra-train", *SHORT, f"hydra.run.dir={run}"], tmp_path, data_dir, check=False)
    assert result.returncode == 2 and "already holds a run" in last_line(result)
    assert sorted(p.name for p in run.rglob("*")) == ["checkpoints", "last.pt"]


@pytest.mark.parametrize("inside, what", [({"multirun.yaml": "{}"}, "a sweep (multirun.yaml)"),
                                          ({"ok1/metrics.json": "{}", "ok2/metrics.json": "{}"}, "runs (ok1, ok2)")],
                         ids=["a sweep", "run folders"])
def test_a_fresh_run_refuses_a_folder_holding_a_sweep_or_other_runs(tmp_path, data_dir, inside, what):
    """A run written at a sweep's root (or among run folders) lay among other runs, and a table read it as one
    of them."""
    folder = tmp_path / "results"
    for name, text in inside.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = snapshot(folder)
    result = run_command(["lra-train", *SHORT, f"hydra.run.dir={folder}"], tmp_path, data_dir, check=False)
    assert result.returncode == 2 and last_line(result) == (
        f"error: {folder} holds {what}; a new run never writes among other runs: train into a new folder (leave "
        "hydra.run.dir unset, or choose another)"), result.stderr
    assert snapshot(folder) == before


def test_a_sweep_into_a_run_folder_is_refused(completed, data_dir):
    root, run = completed
    before = snapshot(run)
    result = run_command(["lra-train", "-m", *SHORT, "seed=2,3", f"hydra.sweep.dir={run}"], root, data_dir, check=False)
    assert result.returncode == 1 and last_line(result) == (
        f"error: hydra.sweep.dir: {run} is a run's folder (its metrics.json or .hydra); a sweep's jobs never write "
        "into a run: give hydra.sweep.dir a new folder"), result.stderr
    assert snapshot(run) == before


def test_a_fresh_run_may_use_an_empty_folder(tmp_path, data_dir):
    (tmp_path / "mine").mkdir()
    run_command(["lra-train", *SHORT, f"hydra.run.dir={tmp_path / 'mine'}"], tmp_path, data_dir)
    assert read_json(tmp_path / "mine" / "metrics.json")["status"] == "completed"


def test_a_refused_second_command_writes_nothing_into_a_live_run(tmp_path, data_dir):
    """A run stopped mid-training (SIGSTOP at its first checkpoint) keeps its folder: a fresh run and
    a resume pointed at it are refused naming its process, and its config, Hydra files, log and
    record stay byte for byte as they were; the stopped run then completes as configured."""
    env = {**os.environ, "LRA_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled",
           "LRA_FAULT": "after_checkpoint:1:SIGSTOP"}
    exe = os.path.join(os.path.dirname(sys.executable), "lra-train")
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([exe, *SHORT, "seed=1", "hydra.run.dir=runs/live"], cwd=tmp_path, env=env,
                                 stdout=log, stderr=log)
    run = tmp_path / "runs" / "live"
    try:
        _, status = os.waitpid(first.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), (tmp_path / "first.log").read_text()
        before = snapshot(run)
        for args, code in ((["lra-train", *SHORT, "attention=none", "seed=7", f"hydra.run.dir={run}"], 1),
                           (["lra-train", f"resume={run}"], 1)):
            result = run_command(args, tmp_path, data_dir, check=False)
            assert result.returncode == code and f"{run} is in use by process {first.pid}" in last_line(result), result.stderr
            assert snapshot(run) == before, args
        first.send_signal(signal.SIGCONT)
        assert first.wait() == 0, (tmp_path / "first.log").read_text()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    record = read_json(run / "metrics.json")
    assert (record["status"], record["label"], record["seed"]) == ("completed", "Softmax", 1)
    assert "seed: 1" in (run / ".hydra" / "resolved.yaml").read_text()


@pytest.mark.parametrize("replacement", ["best", "other_backend", "not_a_checkpoint"])
def test_a_resume_takes_only_this_runs_training_checkpoint(tmp_path, data_dir, replacement):
    killed = run_command(["lra-train", *SHORT, "trainer.max_steps=6"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert killed.returncode != 0
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.pt"
    if replacement == "best":
        last.write_bytes((run / "checkpoints" / "best.pt").read_bytes())
    elif replacement == "other_backend":
        run_command(["lra-train", *SHORT, "attention=linformer", "hydra.run.dir=other"], tmp_path, data_dir)
        last.write_bytes((tmp_path / "other" / "checkpoints" / "last.pt").read_bytes())
    else:
        import torch

        torch.save([1, 2, 3], last)
    before = (run / "metrics.json").read_bytes()
    result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    line = last_line(result)
    expected = {"best": "it is not a training checkpoint (no optimizer", "other_backend": "it is not this run's checkpoint",
                "not_a_checkpoint": "it is not a training checkpoint"}[replacement]
    assert result.returncode == 1 and f"cannot resume from {last}" in line and expected in line, result.stderr
    assert "Traceback" not in result.stderr
    assert (run / "metrics.json").read_bytes() == before, "a failed resume leaves the record as it was"


def test_a_run_resumed_under_another_commit_records_the_commits_it_ran(tmp_path, data_dir):
    """git_commit is the last process's; the earlier ones, where they differ, stay in earlier_git_commits."""
    from lra.records import git_commit

    run_command(["lra-train", *SHORT, "trainer.max_steps=6"], tmp_path, data_dir,
                env_extra={"LRA_FAULT": "step:3:SIGTERM"}, check=False)
    (run,) = run_dirs(tmp_path)
    record = read_json(run / "metrics.json")
    (run / "metrics.json").write_text(json.dumps({**record, "git_commit": "a" * 40}))  # as an older checkout wrote it
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    resumed = read_json(run / "metrics.json")
    assert resumed["status"] == "completed" and resumed["git_commit"] == git_commit()
    assert resumed["earlier_git_commits"] == ["a" * 40]
    killed_again = run_command(["lra-train", *SHORT, "trainer.max_steps=6"], tmp_path / "same", data_dir,
                               env_extra={"LRA_FAULT": "step:3:SIGTERM"}, check=False)
    assert killed_again.returncode == 143
    (same,) = run_dirs(tmp_path / "same")
    run_command(["lra-train", f"resume={same}"], tmp_path / "same", data_dir)
    assert "earlier_git_commits" not in read_json(same / "metrics.json"), "one commit throughout: nothing to add"


@pytest.mark.parametrize("record", ["whole", "cut"])
def test_a_resume_whose_checkpoint_went_missing_is_refused_not_started_again(tmp_path, data_dir, record):
    """The record shows a step past the first checkpoint, or (the record cut) the history does, but last.pt is
    gone (deleted, never copied with the folder): training again from step 0 would overwrite the run's best
    checkpoint and history."""
    killed = run_command(["lra-train", *SHORT, "trainer.max_steps=6"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "step:5:SIGTERM"}, check=False)
    (run,) = run_dirs(tmp_path)
    assert killed.returncode == 143 and read_json(run / "metrics.json")["steps"] >= 4
    (run / "checkpoints" / "last.pt").unlink()
    reached = read_json(run / "metrics.json")["steps"]
    if record == "cut":
        (run / "metrics.json").write_text((run / "metrics.json").read_text()[:100])
        reached = max(entry["step"] for entry in read_json(run / "history.json"))  # the last evaluation's
    before = snapshot(run)
    result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    line = last_line(result)
    assert result.returncode == 1 and line.startswith(f"error: cannot resume {run}: it reached step {reached}, "), line
    assert f"{run / 'checkpoints' / 'last.pt'} is missing" in line and "start a new run" in line, line
    after = snapshot(run)
    assert after.pop("train.log").startswith(before.pop("train.log")) and after == before  # the log told, the rest kept


def test_ctrl_c_records_the_run_as_interrupted_and_a_resume_completes_it(tmp_path, data_dir):
    interrupted = run_command(["lra-train", *SHORT], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3:SIGINT"},
                              check=False)
    (run,) = run_dirs(tmp_path)
    assert interrupted.returncode == 130 and last_line(interrupted) == (
        f"error: interrupted (ctrl-C); resume it with: lra-train resume={run}")
    assert "Traceback" not in interrupted.stderr
    record = read_json(run / "metrics.json")
    assert (record["status"], record["signal"], record["error"]) == ("interrupted", "SIGINT", "interrupted (ctrl-C)")
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_a_resume_whose_record_is_a_named_pipe_neither_waits_nor_loses_the_run(tmp_path, data_dir):
    """A metrics.json that is a FIFO (no writer ever comes) is read as no record: the resume goes on from
    the checkpoint and writes a regular record in its place."""
    run_command(["lra-train", *SHORT], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3:SIGINT"}, check=False)
    (run,) = run_dirs(tmp_path)
    (run / "metrics.json").unlink()
    os.mkfifo(run / "metrics.json")
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)  # pytest-timeout bounds a hang
    assert (run / "metrics.json").is_file() and read_json(run / "metrics.json")["status"] == "completed"


def test_a_lock_file_that_is_a_link_or_a_pipe_is_never_written_through(tmp_path, data_dir):
    """The resume wrote "process … on …" into whatever a link named .lock pointed at (as root, any file of the
    system's), and made a dangling link's target; a named pipe there would be opened. Each is one line, the
    run and the link's target left as they were; with the link removed, the resume completes."""
    run_command(["lra-train", *SHORT], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3:SIGINT"}, check=False)
    (run,) = run_dirs(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    record = (run / "metrics.json").read_bytes()
    for make in (lambda lock: lock.symlink_to(victim), lambda lock: lock.symlink_to(tmp_path / "made"),
                 lambda lock: os.mkfifo(lock)):
        (run / ".lock").unlink()
        make(run / ".lock")
        result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
        assert result.returncode == 1 and last_line(result).startswith(f"error: {run / '.lock'} is not the run's lock "
                                                                      "file but "), result.stderr
        assert "remove it (rm " in last_line(result)
        assert victim.read_text() == "precious\n" and not (tmp_path / "made").exists()
        assert (run / "metrics.json").read_bytes() == record
    (run / ".lock").unlink()
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_the_printed_resume_command_resumes_a_folder_named_like_hydras_override_dirname(tmp_path, data_dir):
    """hydra.sweep.subdir=${hydra.job.override_dirname} names folders like attention=softmax,seed=0: the resume
    command printed for one was `lra-train resume=…/attention=softmax,seed=0`, which Hydra cannot parse."""
    import shlex

    folder = tmp_path / "runs" / "attention=softmax,seed=0 [it's]"
    run = [*SHORT, f"hydra.run.dir='{folder}'".replace("'s]", "\\'s]")]
    interrupted = run_command(["lra-train", *run], tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3:SIGINT"},
                              check=False)
    assert interrupted.returncode == 130 and (folder / "metrics.json").is_file(), interrupted.stderr
    command = last_line(interrupted).split("resume it with: ", 1)[1]
    resumed = run_command(shlex.split(command), tmp_path, data_dir)
    assert read_json(folder / "metrics.json")["status"] == "completed", resumed.stderr


def test_a_resume_removes_the_temporary_files_a_kill_left_mid_write(tmp_path, data_dir):
    """A kill mid-write (lra.io.atomic_write) leaves .metrics.json.*.tmp, .history.json's or a config's beside
    the file it was to replace: only the checkpoints' folder was cleared; now the whole run folder is, once
    the resume owns it."""
    run = tmp_path / "run"
    run_command(["lra-train", *SHORT, f"hydra.run.dir={run}"], tmp_path, data_dir,
                env_extra={"LRA_FAULT": "step:3:SIGINT"}, check=False)
    left = [run / ".metrics.json.k1.tmp", run / ".history.json.k2.tmp", run / ".hydra" / ".resolved.yaml.k3.tmp"]
    for path in left:
        path.write_text("{")
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert read_json(run / "metrics.json")["status"] == "completed" and not list(run.rglob(".*.tmp"))


def test_every_resume_is_listed_even_one_killed_before_its_next_checkpoint_and_its_time_counts(tmp_path, data_dir):
    """resumed_at_steps lived in the checkpoint alone, so a resume killed before the next checkpoint was
    forgotten: three starts from step 2 recorded [2]. So did the clock: the time of the steps after the
    checkpoint, trained again by the resume, was left out of wall_time_seconds (the record had it)."""
    run = tmp_path / "run"
    for fault in ("step:3", "step:1", None):  # killed at step 3 (checkpoint at 2), again, then to the end
        env = {"LRA_FAULT": f"{fault}:SIGKILL"} if fault else None
        args = [*SHORT, f"hydra.run.dir={run}"] if fault == "step:3" else [f"resume={run}"]
        result = run_command(["lra-train", *args], tmp_path, data_dir, env_extra=env, check=False)
        assert result.returncode == (0 if fault is None else -9), result.stderr
        if fault == "step:3":  # its step 3 took an hour, by its record
            killed = read_json(run / "metrics.json")
            (run / "metrics.json").write_text(json.dumps({**killed, "wall_time_seconds": 3600.0}))
    record = read_json(run / "metrics.json")
    assert (record["status"], record["resumed_at_steps"]) == ("completed", [2, 2]), record
    assert 3600.0 < record["wall_time_seconds"] < 3600.0 + 600, record["wall_time_seconds"]


def test_a_checkpoint_with_a_byte_changed_on_disk_is_refused_not_trained_on(tmp_path, data_dir):
    """torch.load checks no checksum: a bit flipped in last.pt loaded as a slightly other weight and the
    resume went on. Each part's CRC-32 (written by torch.save) is checked first."""
    run = tmp_path / "run"
    run_command(["lra-train", *SHORT, f"hydra.run.dir={run}"], tmp_path, data_dir,
                env_extra={"LRA_FAULT": "step:3:SIGINT"}, check=False)
    last = run / "checkpoints" / "last.pt"
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x01
    last.write_bytes(bytes(data))
    record = (run / "metrics.json").read_bytes()
    result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    assert result.returncode == 1 and last_line(result).startswith(f"error: cannot resume from {last}: the checkpoint "
                                                                  "is damaged (its part "), result.stderr
    assert (run / "metrics.json").read_bytes() == record


@pytest.mark.parametrize("world", ["2", "two"])
def test_a_leftover_world_size_is_one_line_and_leaves_no_folder(tmp_path, data_dir, world):
    result = run_command(["lra-train", *SHORT], tmp_path, data_dir, env_extra={"WORLD_SIZE": world}, check=False)
    assert result.returncode == 2 and "WORLD_SIZE" in last_line(result) and "torchrun" in last_line(result)
    assert not (tmp_path / "runs").exists()


def test_a_resume_of_a_folder_that_holds_no_run_is_one_line(tmp_path, data_dir):
    (tmp_path / "empty").mkdir()
    result = run_command(["lra-train", f"resume={tmp_path / 'empty'}"], tmp_path, data_dir, check=False)
    assert result.returncode == 2 and "is not an lra-train run directory" in last_line(result)
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_training_split_smaller_than_one_batch_is_one_line(tmp_path, data_dir):
    small = [o for o in SHORT if not o.startswith("task.generator.num_train")] + ["task.generator.num_train=3"]
    result = run_command(["lra-train", *small, "hydra.run.dir=run"], tmp_path, data_dir, check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "the training split has 3 examples, fewer than one batch of 4: pass trainer.batch_size=3" in last_line(result)
    assert read_json(tmp_path / "run" / "metrics.json")["status"] == "failed"


def test_the_same_command_started_again_continues_its_unfinished_run_and_another_is_refused(tmp_path, data_dir):
    """As a requeued submitit/SLURM job does: the identical command in the folder of its killed run
    resumes it; a command with another config (seed=2) is refused and changes nothing."""
    args = ["lra-train", *SHORT, "trainer.max_steps=6", "hydra.run.dir=run"]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert killed.returncode != 0
    run = tmp_path / "run"
    before = snapshot(run)
    other = run_command([*args, "seed=2"], tmp_path, data_dir, check=False)
    assert other.returncode == 2 and "already holds a running run (Softmax on listops, seed 0)" in last_line(other)
    assert snapshot(run) == before
    again = run_command(args, tmp_path, data_dir)
    assert "continuing the unfinished run" in again.stdout + again.stderr and "resumed from" in again.stdout + again.stderr
    record = read_json(run / "metrics.json")
    assert record["status"] == "completed" and record["resumed_at_steps"] == [2]


def test_a_run_saved_before_newer_fields_existed_resumes_with_their_defaults(tmp_path, data_dir):
    """A resolved.yaml written by an older version lacks newer fields (the pretrain group,
    task.heldout_size, task.heldout_seed, model.padding_mask, model.position_embedding, an attention
    option) or holds a value's old name (task.validation=reference): resume merges the saved
    config onto the schemas, so they take their defaults, and the run completes as a fresh one would."""
    import torch
    import yaml

    args = ["lra-train", *SHORT, "trainer.max_steps=6", "hydra.run.dir=run"]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert killed.returncode != 0
    resolved = tmp_path / "run" / ".hydra" / "resolved.yaml"
    saved = yaml.safe_load(resolved.read_text())
    for section, key in (("task", "heldout_size"), ("task", "heldout_seed"), ("model", "padding_mask"),
                         ("model", "position_embedding"), ("attention", "dropout")):
        del saved[section][key]
    saved["task"]["validation"] = "reference"  # the name task.validation=test had until 2026-11-24
    del saved["pretrain"]  # self-pretraining's group (2026-11-24)
    resolved.write_text(yaml.safe_dump(saved))
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    payload = torch.load(last, weights_only=False)
    del payload["config_sha256"]  # nor did that version's checkpoints carry their config's digest (2026-11-25)
    torch.save(payload, last)
    run_command(["lra-train", f"resume={tmp_path / 'run'}"], tmp_path, data_dir)
    record = read_json(tmp_path / "run" / "metrics.json")
    assert record["status"] == "completed" and record["resumed_at_steps"] == [2]
    assert record["validation"] == "the validation split"
    assert record["label"] == "Softmax" and record["pretrain_objective"] == "none"


# ------------------------------------------------ one process per run folder, and resumes that fail
RESUMABLE = ["trainer=smoke", "trainer.max_steps=12", "trainer.eval_every=4", "trainer.checkpoint_every=4",
             "attention=softmax", *SMALL_LISTOPS]


def test_a_run_directory_belongs_to_one_process(tmp_path, data_dir):
    """A trainer stopped mid-run (SIGSTOP at its second checkpoint) still owns its folder: a resume
    of it stops with a line naming the holder and changes nothing; once the holder is gone, the
    resume goes ahead and completes."""
    env = {**os.environ, "LRA_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "LRA_FAULT": "after_checkpoint:2:SIGSTOP"}
    exe = os.path.join(os.path.dirname(sys.executable), "lra-train")
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([exe, *RESUMABLE], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        _, status = os.waitpid(first.pid, os.WUNTRACED)  # returns when the trainer stops itself
        assert os.WIFSTOPPED(status), (tmp_path / "first.log").read_text()
        (run,) = run_dirs(tmp_path)
        before = (run / "metrics.json").read_bytes()
        second = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
        last = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 1 and f"the run directory {run} is in use by process {first.pid}" in last, second.stderr
        assert (run / "metrics.json").read_bytes() == before
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    resumed = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert "resumed from" in resumed.stderr + resumed.stdout
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_a_failed_resume_leaves_the_record_and_a_completed_run_is_not_resumed(tmp_path, data_dir):
    killed = run_command(["lra-train", *RESUMABLE], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert killed.returncode != 0
    (run,) = run_dirs(tmp_path)
    last = run / "checkpoints" / "last.pt"
    good = last.read_bytes()
    last.write_bytes(good[: len(good) // 3])  # a damaged checkpoint
    before = (run / "metrics.json").read_bytes()
    failed = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 1 and "cannot resume from" in lines[-1] and "left as it was" in lines[-1]
    assert (run / "metrics.json").read_bytes() == before, "a failed resume must not rewrite the record"
    last.write_bytes(good)
    changed = run_command(["lra-train", f"resume={run}", "trainer.max_steps=24"], tmp_path, data_dir, check=False)
    line = changed.stderr.strip().splitlines()[-1]
    assert changed.returncode == 2 and line == (
        f"error: {run} resumes with the config it saved, which trainer.max_steps=24 would change midway; resume it as "
        f"it is with: lra-train resume={run}, or train a new run: lra-train "
        f"{' '.join(o for o in RESUMABLE if 'max_steps' not in o)} trainer.max_steps=24"), changed.stderr
    assert (run / "metrics.json").read_bytes() == before, "a refused resume must not rewrite the record"
    dry = run_command(["lra-train", f"resume={run}", "trainer.max_steps=24", "--cfg", "job"], tmp_path, data_dir,
                      check=False)
    assert (dry.returncode, dry.stderr.strip().splitlines()[-1]) == (2, line), "the dry run refuses as the run does"
    # its own override, and a value the config holds written otherwise (smoke's log_every, the default lr): no change
    run_command(["lra-train", f"resume={run}", "trainer=smoke", "trainer.log_every=05", "trainer.lr=1e-4"], tmp_path,
                data_dir)
    completed = (run / "metrics.json").read_bytes()
    assert read_json(run / "metrics.json")["status"] == "completed"
    again = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert "already completed" in again.stderr + again.stdout
    longer = run_command(["lra-train", f"resume={run}", "trainer.max_steps=24"], tmp_path, data_dir, check=False)
    last = longer.stderr.strip().splitlines()[-1]
    assert longer.returncode == 2 and last.startswith(f"error: {run} completed at step ") and last.endswith(
        f"train a new run instead: lra-train {' '.join(o for o in RESUMABLE if 'max_steps' not in o)} "
        "trainer.max_steps=24"), longer.stderr
    assert (run / "metrics.json").read_bytes() == completed, "a completed result never changes"


@pytest.mark.parametrize("content", ["", "{{{not yaml", "- a list\n"])
def test_resume_with_a_damaged_saved_config_is_one_line(tmp_path, data_dir, content):
    run = tmp_path / "runs" / "x"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "resolved.yaml").write_text(content)
    result = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "cannot resume" in last and "resolved.yaml is unreadable" in last, result.stderr
    assert not (run / "metrics.json").exists()


def test_resume_with_a_damaged_overrides_file_is_one_line_and_restoring_it_resumes(tmp_path, data_dir):
    """A resume compares its overrides with those the run saved: a damaged .hydra/overrides.yaml was "unexpected
    HydraException … a bug in the harness", for the resume and its dry run alike."""
    killed = run_command(["lra-train", *RESUMABLE, "hydra.run.dir=run"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "after_checkpoint:2"}, check=False)
    assert killed.returncode != 0
    run = tmp_path / "run"
    saved = run / ".hydra" / "overrides.yaml"
    good = saved.read_text()
    for damage, reason in (("- trainer=smoke\n- trainer.max_steps\n", "'trainer.max_steps' is no override: missing EQUAL"),
                           ("garbage\n", "it is no YAML list of overrides"), ("- [1, 2]\n", "it is no YAML list"),
                           ("", "it is no YAML list")):
        saved.write_text(damage)
        before = snapshot(run)
        for flags in ([], ["--cfg", "job"]):
            result = run_command(["lra-train", f"resume={run}", *flags], tmp_path, data_dir, check=False)
            (line,) = result.stderr.strip().splitlines()
            assert result.returncode == 1 and line.startswith(
                f"error: cannot resume {run}: its .hydra/overrides.yaml is unreadable ({reason}"), (damage, line)
            assert line.endswith("restore it (a YAML list of the run's overrides, [] for none: its .hydra/hydra.yaml "
                                 "lists them under hydra.overrides.task), or start a new run with the same overrides "
                                 "instead") and result.stdout == "", line
            assert snapshot(run) == before, "a refused resume changes nothing"
    saved.write_text(good)
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert read_json(run / "metrics.json")["status"] == "completed"


def test_resume_beside_hydra_run_dir_is_one_line_and_writes_nothing_there_or_where_it_points(tmp_path, data_dir):
    """``resume=`` with ``hydra.run.dir=``: Hydra made that folder and left it empty (a resume continues in its own);
    now one line, exit 2, before either is touched, whether ``resume=`` names a run or not (a missing folder,
    ``true``, a folder of other files: without hydra.run.dir, the config's resolver refuses those: test_config)."""
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("x")
    for target in (tmp_path / "no" / "run", "true", other):
        result = run_command(["lra-train", "trainer=smoke", f"resume={target}", f"hydra.run.dir={tmp_path / 'out'}"],
                             tmp_path, data_dir, check=False)
        line = last_line(result)
        assert result.returncode == 2 and line == (
            f"error: resume= continues the run in its own folder, which hydra.run.dir= does not choose (Hydra would make "
            f"hydra.run.dir={tmp_path / 'out'} and leave it empty): leave hydra.run.dir out"), result.stderr
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "no").exists() and not (tmp_path / "True").exists() and not (tmp_path / "true").exists()
    assert sorted(p.name for p in other.iterdir()) == ["todo.txt"]
