"""Every job of a sweep leaves a record, and the sweep's table shows every failed or refused job."""

import fcntl
import os
import socket

import pytest

from conftest import SMALL_LISTOPS, read_json, run_command

SHORT = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", *SMALL_LISTOPS]


def test_a_job_refused_by_validation_is_recorded_failed_and_the_table_shows_it(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", "trainer.lr=1e-3,-1", *SHORT, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir,
                         check=False)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 1 and "error: 1 of the sweep's 2 runs failed" in result.stderr  # after every job ran
    refused = read_json(sweep / "1" / "metrics.json")
    assert refused["status"] == "failed" and refused["error"].startswith("invalid value for trainer.lr: -1.0")
    assert (refused["label"], refused["task"], refused["seed"]) == ("Softmax", "listops", 0)
    assert (sweep / "1" / ".hydra" / "overrides.yaml").is_file(), "the refused job's overrides are kept"
    assert read_json(sweep / "0" / "metrics.json")["status"] == "completed"
    for text in (result.stdout, (sweep / "table.md").read_text(),
                 run_command(["lra-table", str(sweep)], tmp_path, data_dir).stdout):
        assert "failed runs (1):" in text and f"{sweep / '1'}: invalid value for trainer.lr" in text, text


def test_a_job_refused_for_its_backend_shape_is_recorded_under_its_label(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    assert run_command(["lra-train", "-m", "attention=nystrom", "attention.num_landmarks=32,5000", *SHORT,
                        f"hydra.sweep.dir={sweep}"], tmp_path, data_dir, check=False).returncode == 1
    refused = read_json(sweep / "1" / "metrics.json")
    assert refused["label"] == "Nystromformer" and refused["status"] == "failed"
    assert "attention.num_landmarks: 5000; it must be at most the input length 256" in refused["error"]
    table = run_command(["lra-table", str(sweep)], tmp_path, data_dir).stdout
    assert "Nystromformer" in table and f"failed runs (1):\n- {sweep / '1'}: invalid value for attention.num_landmarks" in table


def test_a_sweep_run_again_into_its_own_folder_keeps_every_finished_job_and_its_result(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"]
    run_command(args, tmp_path, data_dir)
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and p.name not in (".lock", "table.md", "multirun.yaml")}
    again = run_command(args, tmp_path, data_dir)
    assert again.stdout.count("already completed at step 2") == 2 and "error:" not in again.stderr + again.stdout
    assert {p: p.read_bytes() for p in before} == before, "no record, config, log or checkpoint of the first sweep changed"
    assert "Softmax" in (sweep / "table.md").read_text() and "2 completed" in (sweep / "table.md").read_text()


def test_a_sweep_folder_given_to_another_command_is_refused_before_its_multirun_yaml_is_replaced(tmp_path, data_dir):
    """Another command (other values, or the same in another order) into a sweep's folder was refused by its
    first job, after Hydra had written the new command's multirun.yaml over the sweep's: the record of the
    command that continues it was gone. Now nothing is written, and the line names that command."""
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"]
    run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "step:1:SIGTERM"}, check=False)
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and p.name != ".lock"}
    for other in (["seed=1,0", *SHORT], ["seed=0,1", *SHORT, "trainer.lr=3e-4"]):
        result = run_command(["lra-train", "-m", *other, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir, check=False)
        line = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2 and f"hydra.sweep.dir={sweep} holds a sweep made by another command (lra-train " \
            f"-m seed=0,1 {' '.join(SHORT)} hydra.sweep.dir={sweep}); continue it with that command" in line, line
        assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file() and p.name != ".lock"} == before
    run_command(args, tmp_path, data_dir)  # its own command continues it
    assert [read_json(sweep / job / "metrics.json")["status"] for job in ("0", "1")] == ["completed"] * 2


@pytest.mark.parametrize("launcher, fault, recorded", [
    ("basic", "write:1:ENOSPC", True),  # its config files unwritable; the record then written
    ("packed", "write:1:ENOSPC,write:1:EROFS", False),  # and its record too: the disk refuses every write
], ids=["config-files", "config-files-and-record"])
def test_a_job_that_fails_before_its_run_starts_is_counted_and_a_continued_sweep_trains_it(tmp_path, data_dir, launcher,
                                                                                          fault, recorded):
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", "seed=0,1,2", *SHORT, f"hydra.sweep.dir={sweep}", f"hydra/launcher={launcher}"]
    result = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": fault}, check=False)
    assert "Traceback" not in result.stderr + result.stdout
    assert result.returncode == 1 and "error: 1 of the sweep's 3 runs failed" in result.stderr, result.stderr
    table = (sweep / "table.md").read_text()
    if recorded:
        failed = read_json(sweep / "0" / "metrics.json")
        assert failed["status"] == "failed" and failed["error"].startswith("No space left on device (")
        assert (failed["label"], failed["task"], failed["seed"]) == ("Softmax", "listops", 0)
        assert f"failed runs (1):\n- {sweep / '0'}: No space left on device" in table, table
    else:
        assert not (sweep / "0" / "metrics.json").exists()
        assert f"runs in no cell (1; counted failed: no usable record, nor a config that tells the cell):\n- " \
            f"{sweep / '0'}: no run record: the job ended before writing one" in table, table
    kept = {seed: (sweep / seed / "metrics.json").read_bytes() for seed in ("1", "2")}
    run_command(args, tmp_path, data_dir)  # the disk has room again: the same command trains the failed job alone
    assert read_json(sweep / "0" / "metrics.json")["status"] == "completed"
    assert kept == {seed: (sweep / seed / "metrics.json").read_bytes() for seed in ("1", "2")}
    assert "failed" not in (sweep / "table.md").read_text().split("how to read")[0]


def test_a_failed_start_s_folder_is_taken_only_by_its_own_job(tmp_path, data_dir):
    """Two jobs of one sweep in one folder (a subdir without the job's number): the refused first job's record
    is not taken over by the second, which stops the sweep as a folder holding another run does."""
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", "trainer.lr=-1,1e-3", *SHORT, f"hydra.sweep.dir={sweep}",
                          "hydra.sweep.subdir=x"], tmp_path, data_dir, check=False)
    assert result.returncode == 2 and "the sweep stopped at job 1" in result.stderr, result.stderr
    assert read_json(sweep / "x" / "metrics.json")["error"].startswith("invalid value for trainer.lr: -1.0")
    # Nor is a single run into that folder told to resume what never started
    single = run_command(["lra-train", "trainer.lr=1e-3", *SHORT, f"hydra.run.dir={sweep / 'x'}"], tmp_path, data_dir,
                         check=False)
    line = single.stderr.strip().splitlines()[-1]
    assert single.returncode == 2 and "resume=" not in line, line
    assert "that failed before it started (no saved config, no checkpoint: nothing to resume)" in line, line


def test_a_job_whose_folder_another_process_holds_is_left_to_it_and_the_sweep_exits_1(tmp_path, data_dir):
    """Two identical sweeps into one folder: the second met a job the first was training, logged that its folder was
    in use, printed "1 running" and exited 0. The job is still left to that process, untouched, and the sweep now
    ends with one line counting it; once the folder is free, the same command finishes the sweep."""
    sweep = tmp_path / "sweep"
    args = ["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "step:3"}, check=False)  # job 1's first
    assert killed.returncode == -9 or killed.returncode == 137, killed.stderr
    assert read_json(sweep / "1" / "metrics.json")["status"] == "running"
    lock = open(sweep / "1" / ".lock", "r+")  # another process (this one) holds job 1's folder, as a live run does
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"process {os.getpid()} on {socket.gethostname()} (since now)")
        lock.flush()
        held = {p: p.read_bytes() for p in (sweep / "1").rglob("*") if p.is_file() and p.name != ".lock"}
        first = (sweep / "0" / "metrics.json").read_bytes()
        result = run_command(args, tmp_path, data_dir, check=False)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"the run directory {sweep / '1'} is in use by process {os.getpid()}" in result.stdout + result.stderr
        assert result.stderr.strip().splitlines()[-1] == (
            f"error: 1 of the sweep's 2 runs did not finish (another process holds its folder, or its resume failed); "
            f"the table above and {sweep / 'table.md'} list each: once that process has ended, continue the sweep with "
            f"the same command and hydra.sweep.dir={sweep} (finished jobs are kept, unfinished ones resume)")
        assert f"unfinished runs (1):\n- {sweep / '1'}: running (its process is alive)" in (sweep / "table.md").read_text()
        assert {p: p.read_bytes() for p in held} == held and (sweep / "0" / "metrics.json").read_bytes() == first
    finally:
        lock.close()
    run_command(args, tmp_path, data_dir)  # the folder free again: the same command resumes job 1, exit 0
    assert [read_json(sweep / job / "metrics.json")["status"] for job in ("0", "1")] == ["completed"] * 2


@pytest.mark.parametrize("subdir, said", [("same", "gives job 1 the folder of job 0 ({sweep}/same)"),
                                          (".", "gives job 0 the sweep's own folder, where no run is written")])
def test_a_sweep_subdir_that_is_the_same_for_every_job_is_named_as_the_cause(tmp_path, data_dir, subdir, said):
    """hydra.sweep.subdir without the job's number gives every job one folder: the sweep stopped at the second job
    blaming hydra.sweep.dir ("holds another sweep"); now the line names the subdir and its fix."""
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}",
                          f"hydra.sweep.subdir={subdir}"], tmp_path, data_dir, check=False)
    job = 1 if subdir == "same" else 0
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        f"error: the sweep stopped at job {job}: hydra.sweep.subdir={subdir} {said.format(sweep=sweep)}: give each job "
        "a folder of its own (leave hydra.sweep.subdir out for its default ${hydra.job.num}), in a new "
        "hydra.sweep.dir"), result.stderr
    if subdir == "same":
        assert read_json(sweep / "same" / "metrics.json")["seed"] == 0, "job 0's run is left as it ended"


def test_a_sweep_that_resumes_a_run_writes_no_failure_into_it_and_counts_none(tmp_path, data_dir):
    run = tmp_path / "run"
    run_command(["lra-train", *SHORT, f"hydra.run.dir={run}"], tmp_path, data_dir)
    before = (run / "metrics.json").read_bytes()
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", f"resume={run}", f"hydra.sweep.dir={sweep}"], tmp_path, data_dir)
    table = (sweep / "table.md").read_text()
    assert "already completed" in result.stdout and "failed" not in table.split("how to")[0]
    assert (run / "metrics.json").read_bytes() == before
    assert "| Softmax   | **" in table and "runs: 1 completed" in table, "the resumed run is the sweep's: tabled"
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml", "table.md"], "no empty job folder left"


def test_a_resume_sweep_counts_each_refused_job_failed_names_it_and_tables_only_the_runs_it_went_on_with(
        tmp_path, data_dir):
    """-m resume=A,B,C with a typo or a sweep's folder among them: each job is refused as a lone resume would be,
    and the sweep exited 0, tabling a sweep's untouched runs as its own. The same command, once the typo's run is
    there, goes on with it and names only what is still refused."""
    import shutil

    run_command(["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={tmp_path / 'done'}"], tmp_path, data_dir)
    before = (tmp_path / "done" / "0" / "metrics.json").read_bytes()
    sweep = tmp_path / "sweep"
    values = [tmp_path / "done" / "0", tmp_path / "typo", tmp_path / "done"]
    command = ["lra-train", "-m", f"resume={','.join(map(str, values))}", f"hydra.sweep.dir={sweep}"]
    for refused_jobs in ([1, 2], [2]):
        result = run_command(command, tmp_path, data_dir, check=False)
        assert result.returncode == 1 and result.stderr.strip().splitlines()[-1] == (
            f"error: {len(refused_jobs)} of the sweep's 3 runs failed; the table above and {sweep / 'table.md'} list "
            "each with its error (its record and train.log say more)"), result.stderr
        table = (sweep / "table.md").read_text()
        refused = table.split("jobs refused before they resumed (their runs are left as they were):\n")[1]
        assert [line.split(":")[0] for line in refused.splitlines()] == [
            f"- job {n}, resume={values[n]}" for n in refused_jobs]
        assert "not an lra-train run directory" in refused
        assert f"runs: {3 - len(refused_jobs)} completed" in table, "the sweep's folder given is no run of this sweep"
        shutil.copytree(tmp_path / "done" / "1", tmp_path / "typo", dirs_exist_ok=True)
    assert (tmp_path / "done" / "0" / "metrics.json").read_bytes() == before


def test_a_signal_while_a_failed_start_is_recorded_stops_the_sweep_with_its_advice(tmp_path, data_dir):
    sweep = tmp_path / "sweep"
    result = run_command(["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "write:1:ENOSPC,write:1:SIGTERM"}, check=False)
    assert result.returncode == 143 and "the sweep stopped at job 0" in result.stderr, result.stderr
    assert read_json(sweep / "0" / "metrics.json")["status"] == "failed" and not (sweep / "1").exists()


def test_only_job_folders_without_a_record_are_counted_links_not_followed(tmp_path):
    """A folder where a job wrote its log, lock or config files but no record, at any depth; never one inside a
    run folder (a recorded run's own subfolders), nor a folder of other files, nor one reached by a link."""
    from lra.results.reading import record_files

    sweep, outside = tmp_path / "sweep", tmp_path / "outside"
    for folder in ("0", "1/.hydra", "1/pretrain", "notes", "plots", "1/wandb/run-1/tmp/code", "2/.hydra",
                   "deep/a/b/c/0"):
        (sweep / folder).mkdir(parents=True)
    (sweep / "0" / "train.log").write_text("error: No space left on device\n")  # a job that failed unrecorded
    (sweep / "1" / "metrics.json").write_text("{}")  # a run, whatever it holds
    (sweep / "1" / "pretrain" / "train.log").write_text("")
    (sweep / "plots" / ".DS_Store").write_text("")
    (sweep / "deep/a/b/c/0" / ".lock").write_text("")
    (outside / "x").mkdir(parents=True)
    (outside / "x" / "train.log").write_text("")
    (sweep / "link").symlink_to(outside)
    jobs = []
    assert record_files([sweep], without_record=jobs) == [sweep / "1" / "metrics.json"]
    assert jobs == [sweep / "0", sweep / "2", sweep / "deep/a/b/c/0"]

def test_a_run_this_process_let_go_is_not_called_alive_though_its_lock_names_this_process(tmp_path):
    """A sweep's job whose resume failed leaves the folder's lock naming the sweep's own process, which is alive:
    the end-of-sweep table said the run was running, where it was killed earlier and waits for its resume."""
    from lra.run import RunDirectory

    folder = RunDirectory(tmp_path / "run")
    folder.claim(fresh=True)
    assert RunDirectory(tmp_path / "run").last_holder_alive() is True
    folder.release()
    assert f"process {os.getpid()} on " in (tmp_path / "run" / ".lock").read_text()
    assert RunDirectory(tmp_path / "run").last_holder_alive() is False


def test_a_job_whose_folder_another_process_is_starting_a_run_in_is_left_to_it(tmp_path, data_dir):
    """The same sweep started twice: the other process holds job 1's folder and has not saved its config yet. The
    sweep stopped there, saying the folder held another sweep; the job is left to that process and counted
    unfinished, as one whose run that process is training."""
    sweep = tmp_path / "sweep"
    (sweep / "1").mkdir(parents=True)
    lock = open(sweep / "1" / ".lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(f"process {os.getpid()} on {socket.gethostname()} (since now)")
        lock.flush()
        result = run_command(["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir,
                             check=False)
    finally:
        lock.close()
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith(
        "error: 1 of the sweep's 2 runs did not finish (another process holds its folder"), result.stderr
    assert read_json(sweep / "0" / "metrics.json")["status"] == "completed"
    assert f"- {sweep / '1'}: no run record yet: a live process holds the folder" in (sweep / "table.md").read_text()
    assert sorted(p.name for p in (sweep / "1").iterdir()) == [".lock"], "left untouched"


def test_a_command_stopped_at_its_first_job_by_another_sweep_leaves_no_multirun_yaml_of_its_own(tmp_path, data_dir):
    """The sweep's multirun.yaml lost, a command with the seeds in another order got in, wrote its own and stopped
    at job 0: that file then refused the sweep's own command as well. It is taken back; the sweep goes on."""
    sweep = tmp_path / "sweep"
    run_command(["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir)
    (sweep / "multirun.yaml").unlink()
    other = run_command(["lra-train", "-m", "seed=1,0", *SHORT, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir,
                        check=False)
    assert other.returncode == 2 and "the sweep stopped at job 0" in other.stderr, other.stderr
    assert not (sweep / "multirun.yaml").exists()
    again = run_command(["lra-train", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={sweep}"], tmp_path, data_dir)
    assert "runs: 2 completed" in again.stdout
