"""hydra/launcher=packed (lra/packing.py): a sweep's runs packed in one process equal the same runs alone,
bit for bit on CPU in deterministic mode (records, histories, checkpoints, test accuracy), with YOSO
drawing its hashes and dropout its masks from the global generators every step; a packed process that is
signalled, then killed outright, resumes every run exactly; a run that diverges or runs out of memory
fails alone while the pack's other runs complete."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from conftest import SMALL_LISTOPS, read_json, run_command

SETUP = ["attention=yoso", "trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=2", "trainer.checkpoint_every=2",
         "trainer.log_every=1", *SMALL_LISTOPS]
SEEDS = "seed=0,1,2"
PACKED = ["hydra/launcher=packed", "hydra.launcher.runs_per_process=3"]
TIMING = {"train_tokens_per_second", "wall_time_seconds", "peak_memory_mb", "run_dir", "resumed_at_steps"}


def sweep(cwd: Path, data_dir: Path, folder: str, *overrides, env=None, check=True):
    return run_command(["lra-train", "-m", *SETUP, *overrides, f"hydra.sweep.dir={folder}"], cwd, data_dir,
                       env_extra=env, check=check)


@pytest.fixture(scope="module")
def alone(tmp_path_factory, data_dir) -> Path:
    """The three seeds, one run after the other (the basic launcher): what a packed sweep must equal."""
    root = tmp_path_factory.mktemp("alone")
    sweep(root, data_dir, "sweep", SEEDS)
    return root / "sweep"


def assert_equal_runs(packed: Path, alone: Path, jobs=(0, 1, 2)) -> None:
    for job in jobs:
        ours, theirs = read_json(packed / str(job) / "metrics.json"), read_json(alone / str(job) / "metrics.json")
        assert ours["status"] == "completed", ours.get("error")
        assert {k: v for k, v in ours.items() if k not in TIMING} == {k: v for k, v in theirs.items() if k not in TIMING}
        assert read_json(packed / str(job) / "history.json") == read_json(alone / str(job) / "history.json")
        for name in ("last.pt", "best.pt"):
            a = torch.load(packed / str(job) / "checkpoints" / name, weights_only=False)
            b = torch.load(alone / str(job) / "checkpoints" / name, weights_only=False)
            for key in ("model",) + (("optimizer", "rng", "sampler") if name == "last.pt" else ()):
                assert_same(a[key], b[key], f"job {job} {name} {key}")


def assert_same(a, b, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for x, y in zip(a, b):
            assert_same(x, y, where)
    elif hasattr(a, "shape"):  # numpy's generator state
        assert (a == b).all(), where
    else:
        assert a == b, where


def test_a_packed_sweep_of_three_seeds_equals_the_three_runs_alone(tmp_path, data_dir, alone):
    result = sweep(tmp_path, data_dir, "packed", SEEDS, *PACKED)
    assert "in one process, 3 at a time" in result.stdout + result.stderr
    assert_equal_runs(tmp_path / "packed", alone)
    logs = [(tmp_path / "packed" / str(job) / "train.log").read_text() for job in range(3)]
    for job, log in enumerate(logs):  # each run's log holds its own lines only
        assert log.count("step 6/6") == 1 and str(tmp_path / "packed" / str(job)) in log


def test_a_packed_sweep_signalled_then_killed_resumes_every_run_exactly(tmp_path, data_dir, alone):
    """SIGTERM at the pack's 9th step: every run stops at its next turn and records interrupted; continued,
    and killed outright (SIGKILL) at the new process's 4th step; continued again: every run equals its
    run alone. (Where each run stops depends on when the main thread takes the signal: not asserted.)"""
    stopped = sweep(tmp_path, data_dir, "packed", SEEDS, *PACKED, env={"LRA_FAULT": "step:9:SIGTERM"}, check=False)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert "continue it with the same command" in stopped.stderr
    records = [read_json(tmp_path / "packed" / str(job) / "metrics.json") for job in range(3)]
    assert [(r["status"], r["error"]) for r in records] == [("interrupted", "interrupted (SIGTERM)")] * 3
    assert all(3 <= r["steps"] < 6 for r in records), [r["steps"] for r in records]
    killed = sweep(tmp_path, data_dir, "packed", SEEDS, *PACKED, env={"LRA_FAULT": "step:4"}, check=False)
    assert killed.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
    assert [read_json(tmp_path / "packed" / str(job) / "metrics.json")["status"] for job in range(3)] == ["running"] * 3
    sweep(tmp_path, data_dir, "packed", SEEDS, *PACKED)
    assert_equal_runs(tmp_path / "packed", alone)
    for job in range(3):  # two resumes each (the killed one listed too), from its own last checkpoint
        resumed = read_json(tmp_path / "packed" / str(job) / "metrics.json")["resumed_at_steps"]
        assert len(resumed) == 2 and set(resumed) <= {2, 4} and resumed == sorted(resumed), resumed


def test_a_diverging_or_out_of_memory_run_of_a_pack_fails_alone(tmp_path, data_dir, alone):
    """Job 0 diverges (trainer.lr=1e30), job 1 trains seed 1 as alone (the default lr) beside it, job 2 (seed 2) meets an out-of-memory
    error at the pack's 3rd step: the other two record their failures and job 1 completes, equal to its run
    alone; the sweep ends with status 1, its table listing both failures."""
    result = sweep(tmp_path, data_dir, "packed", "seed=1", "trainer.lr=1e30,1e-4,2e-4", *PACKED,
                   env={"LRA_FAULT": "step:3:OOM"}, check=False)
    assert result.returncode == 1, result.stderr
    assert "2 of the sweep's 3 runs failed" in result.stderr
    records = [read_json(tmp_path / "packed" / str(job) / "metrics.json") for job in range(3)]
    assert [r["status"] for r in records] == ["failed", "completed", "failed"]
    assert "trainer.lr" in records[0]["error"] and "out of memory" in records[2]["error"]
    assert_equal_runs(tmp_path / "packed", alone, jobs=(1,))


def test_a_bug_in_one_packed_run_is_told_in_its_own_log_only(tmp_path, data_dir):
    """An unexpected error (LRA_FAULT BUG at the pack's 2nd evaluation batch) fails its run: its line names
    that run's train.log, which holds the traceback; the other run's log holds none and it completes."""
    result = sweep(tmp_path, data_dir, "packed", "seed=0,1", "hydra/launcher=packed", "hydra.launcher.runs_per_process=2",
                   env={"LRA_FAULT": "eval_batch:2:BUG"}, check=False)
    assert result.returncode == 1, result.stderr
    records = {job: read_json(tmp_path / "packed" / str(job) / "metrics.json") for job in (0, 1)}
    (failed,) = [job for job, record in records.items() if record["status"] == "failed"]
    (other,) = {0, 1} - {failed}
    assert records[other]["status"] == "completed"
    own, others = (tmp_path / "packed" / str(job) / "train.log" for job in (failed, other))
    assert f"its traceback is in {own}" in result.stdout + result.stderr
    assert "Traceback" in own.read_text() and "Traceback" not in others.read_text()


def test_a_packed_sweep_into_another_sweep_s_folder_ends_at_its_first_job_and_writes_nothing(tmp_path, data_dir,
                                                                                            alone):
    """As under the basic launcher: the first job's folder holds another run (another config), which ends
    the sweep with one line; the pack's other jobs never start, so the other sweep is left as it was."""
    import shutil

    other = tmp_path / "other"
    shutil.copytree(alone, other)
    (other / "multirun.yaml").unlink()  # with it, the command line is refused before any job (test_sweep_records)
    before = {job: (other / str(job) / "metrics.json").read_text() for job in range(3)}
    result = sweep(tmp_path, data_dir, str(other), SEEDS, *PACKED, "model.dropout=0.2", check=False)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: the sweep stopped at job 0: "), result.stderr
    assert {job: (other / str(job) / "metrics.json").read_text() for job in range(3)} == before


def test_packed_launcher_refuses_a_bad_runs_per_process(tmp_path, data_dir):
    result = sweep(tmp_path, data_dir, "packed", "hydra/launcher=packed", "hydra.launcher.runs_per_process=0",
                   check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: invalid value for hydra.launcher.runs_per_process: 0; it must be a whole number >= 1 or auto")
    result = sweep(tmp_path, data_dir, "chdir", "hydra/launcher=packed", "hydra.job.chdir=true", check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].startswith(
        "error: hydra.job.chdir=true gives each job the working directory of its own")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("capture", ["false", "true"])
def test_a_packed_sweep_on_cuda_equals_the_runs_alone(tmp_path, data_dir, capture):
    """On a GPU each packed run queues on a CUDA stream of its own, its steps captured or not; deterministic
    mode (YOSO's sorted cumulation, cuBLAS's fixed workspace) still gives each run its values alone, bit for bit."""
    on_cuda = ["trainer.device=cuda", "trainer.precision=bf16", f"trainer.capture={capture}", "seed=0,1"]
    sweep(tmp_path, data_dir, "alone", *on_cuda)
    sweep(tmp_path, data_dir, "packed", *on_cuda, "hydra/launcher=packed", "hydra.launcher.runs_per_process=2")
    assert_equal_runs(tmp_path / "packed", tmp_path / "alone", jobs=(0, 1))


def test_a_signal_while_the_pack_waits_is_raised_only_after_every_job_has_written_its_record():
    """The signal reaches the main thread while it waits for the jobs; a job goes on to record it after that.
    The pack raises only once the job has ended (Python 3.11's Thread.join, interrupted by the signal's
    exception, reported the running job's thread as stopped, so the pack raised while the job was still
    writing, and its record stayed `running`). In a fresh interpreter whose main thread keeps the GIL as long as
    it does not block (the job would otherwise win the race by chance)."""
    import subprocess
    import sys

    code = """
import os, signal, sys, threading
from lra import packing, signals
stopped, recorded = threading.Event(), []
stop = packing.Pack.stop
def stop_then_tell(self, number):
    stop(self, number)
    stopped.set()
packing.Pack.stop = stop_then_tell
def job():
    os.kill(os.getpid(), signal.SIGTERM)  # to the main thread, waiting in Pack.run
    stopped.wait()
    recorded.append("interrupted")  # the job's own record of the signal
sys.setswitchinterval(1.0)
try:
    with signals.interruptible():
        packing.Pack([job]).run()
except signals.Interrupted as raised:
    written = list(recorded)  # before anything here blocks (a print lets the job run)
    print(raised.signal_name, written)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "SIGTERM ['interrupted']", result.stdout + result.stderr
