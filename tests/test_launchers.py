"""Sweeps through hydra-submitit-launcher: a two-seed sweep as submitit jobs, one of them preempted
(SIGUSR2, as SLURM signals preemption), requeued by submitit and resumed from its checkpoint."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import torch

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from lra.results.table import collect, comparison


def test_submitit_local_sweep_requeues_a_preempted_job_which_resumes_from_its_checkpoint(tmp_path, data_dir):
    common = ["trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=2", "trainer.checkpoint_every=2", *SMALL_LISTOPS]
    run_command(["lra-train", *common, "trainer.max_steps=1", "trainer.warmup_steps=0", "hydra.run.dir=warm-up"], tmp_path, data_dir)  # data once
    marker = tmp_path / "preempted-once"
    result = run_command(
        ["lra-train", "-m", "hydra/launcher=submitit_local", "attention=none", "seed=0,1", "logger=wandb", *common],
        tmp_path / "sweep", data_dir,
        env_extra={"LRA_FAULT": "step:3:SIGUSR2", "LRA_FAULT_ONCE": str(marker), "WANDB_MODE": "offline"})
    assert marker.exists(), "the preemption fired"
    runs = run_dirs(tmp_path / "sweep")
    records = [read_json(r / "metrics.json") for r in runs]
    assert len(records) == 2 and all(r["status"] == "completed" and r["steps"] == 6 for r in records)
    assert sorted(r["resumed_at_steps"] for r in records) == [[], [2]], \
        "exactly the preempted job was requeued and continued from its checkpoint at step 2"
    (preempted,) = [run for run, record in zip(runs, records) if record["resumed_at_steps"]]
    attempts = sorted(preempted.glob("wandb/offline-run-*"))
    assert len(attempts) == 2 and len({a.name.rsplit("-", 1)[1] for a in attempts}) == 1, \
        "both attempts log to one W&B run id"
    (sweep,) = {r.parent for r in runs}
    assert list(sweep.glob(".submitit/*/*_submitted.pkl")), "the jobs went through submitit"
    table = comparison(collect([sweep]))
    accuracies = [r["test_accuracy"] for r in records]
    stuck = sum(r["stuck_at_chance"] is True for r in records)  # 6 steps: None usually never leaves chance
    note = f"; {stuck} of 2 at chance" if stuck else ""
    assert table.loc["None", "listops"] == \
        f"{statistics.mean(accuracies):.2f} ± {statistics.stdev(accuracies):.2f} (2{note})"
    assert "mean ± std" in result.stdout


def test_gpu_claims_are_exclusive_and_released_with_their_holder(tmp_path):
    from lra import gpus

    first, second = gpus.try_claim(2, tmp_path), gpus.try_claim(2, tmp_path)
    assert (first[0], second[0]) == (0, 1)
    assert gpus.try_claim(2, tmp_path) is None, "both GPUs are held: a third job must wait"
    first[1].close()  # the job on GPU 0 ends
    third = gpus.try_claim(2, tmp_path)
    assert third[0] == 0
    second[1].close(), third[1].close()


def test_with_two_jobs_per_gpu_the_slots_fill_every_gpu_once_before_any_twice(tmp_path):
    from lra import gpus

    claims = [gpus.try_claim(2, tmp_path, slots=2) for _ in range(4)]
    assert [c[0] for c in claims] == [0, 1, 0, 1] and gpus.try_claim(2, tmp_path, slots=2) is None
    claims[2][1].close()  # a job on GPU 0's second slot ends
    again = gpus.try_claim(2, tmp_path, slots=2)
    assert again[0] == 0
    for claim in (claims[0], claims[1], claims[3], again):
        claim[1].close()


def test_local_gpus_jobs_per_gpu_must_be_at_least_one(tmp_path, data_dir):
    result = run_command(["lra-train", "-m", "hydra/launcher=local_gpus", "hydra.launcher.jobs_per_gpu=0",
                          "attention=none", "trainer=smoke"], tmp_path, data_dir, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1] == (
        "error: invalid value for hydra.launcher.jobs_per_gpu: 0; it must be a whole number >= 1: "
        "pass hydra.launcher.jobs_per_gpu=<such a value>"), result.stderr


# The local_gpus sweep itself (2 jobs per GPU, in worker processes) runs in lra-gpu-check's quick test
# (tests/test_commands.py).


@pytest.mark.parametrize("args,expected", [
    # submitit's RuntimeError ("Could not detect srun") read as a bug, after Hydra made the sweep's folder
    (["hydra/launcher=slurm"], "error: hydra/launcher=slurm submits the sweep's jobs to SLURM, and this machine has no "
                               "srun (it is no SLURM node): run the command on the cluster, or pass "
                               "hydra/launcher=local_gpus"),
    # the valid keys listed were the basic launcher's (_target_), the schemas were listed as launchers
    (["hydra/launcher=packed", "hydra.launcher.runs_per_gpu=0"], "error: unknown key 'hydra.launcher.runs_per_gpu' (did "
                                                                "you mean 'runs_per_process'?); valid keys under "
                                                                "hydra.launcher: _target_, runs_per_process"),
    (["hydra/launcher=nosuch"], "error: unknown choice 'nosuch' for hydra/launcher; valid: basic, joblib, local_gpus, "
                                "packed, slurm, submitit_local, submitit_slurm (e.g."),
])
def test_a_launcher_that_cannot_run_here_or_a_wrong_key_of_one_is_one_line_and_no_folder(tmp_path, data_dir, args,
                                                                                        expected):
    import shutil

    if "hydra/launcher=slurm" in args and shutil.which("srun"):
        pytest.skip("this machine has SLURM")
    result = run_command(["lra-train", "-m", "attention=softmax,none", "trainer=smoke", *args], tmp_path, data_dir,
                         check=False)
    (line,) = result.stderr.strip().splitlines()
    assert result.returncode == 2 and line.startswith(expected[:60]) and expected in line, result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("sweep", ["-m", "hydra.mode=MULTIRUN"])
def test_a_sweep_inside_torchrun_is_refused_before_any_folder(tmp_path, data_dir, sweep):
    """Its second job hung: both ranks set the process group up again, one of them in another sweep folder."""
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}
    result = run_command(["lra-train", sweep, "seed=0,1", "trainer=smoke"], tmp_path, data_dir, env_extra=torchrun,
                         check=False)
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: lra-train -m runs a sweep's jobs one after another, and under torchrun its processes would not share "
        "them: start one torchrun per run (a shell loop over the values), or sweep without torchrun "
        "(hydra/launcher=local_gpus runs the jobs side by side, a GPU each)"), result.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "multirun").exists()


@pytest.mark.parametrize("pretrain, attention", [("masked", "none"), ("causal", "softmax")])
def test_two_process_gloo_run_matches_one_process_with_the_same_global_batch(tmp_path, data_dir, pretrain, attention):
    """The two processes also accumulate gradients over 2 micro-batches each, all-reduced on the last
    one only (DDP's no_sync on the first): the same global batch, the same training, in both stages of
    self-pretraining: stage 1 (each example's masks are its own, the loss a mean over sequences) and stage 2,
    the classifier's training from the pretrained encoder (the code path of a run without pretraining).
    attention=none leaves the q and k projections out of the loss, which DDP refused at the second step."""
    import math

    args = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "model.dropout=0.0", f"pretrain={pretrain}",
            f"attention={attention}", *SMALL_LISTOPS]
    run_command(["lra-train", *args], tmp_path / "one", data_dir)
    run_command(["torchrun", "--standalone", "--nproc_per_node=2", str(Path(sys.executable).parent / "lra-train"),
                 *args, "trainer.grad_accumulation=2"], tmp_path / "two", data_dir, env_extra={"OMP_NUM_THREADS": "1"})
    (one,), (two,) = run_dirs(tmp_path / "one"), run_dirs(tmp_path / "two")  # both ranks share one run directory
    single, double = read_json(one / "metrics.json"), read_json(two / "metrics.json")
    assert double["status"] == "completed" and double["processes"] == 2 and single["processes"] == 1
    for key in ("steps", "best_step", "best_val_accuracy", "test_accuracy"):
        assert single[key] == double[key], key
    for a, b in zip(read_json(one / "history.json"), read_json(two / "history.json"), strict=True):
        for key in ("val_loss", "train_loss", "val_accuracy"):
            assert math.isclose(a[key], b[key], rel_tol=1e-4, abs_tol=1e-6), (key, a, b)
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert single["pretrain_history"]
    for a, b in zip(single["pretrain_history"], double["pretrain_history"], strict=True):
        assert math.isclose(a["loss"], b["loss"], rel_tol=1e-4), (a, b)


def test_an_optuna_sweep_maximizes_the_runs_objective_and_still_tables_its_runs(tmp_path, data_dir):
    """hydra/sweeper=optuna gets a float from every run (its optimized_metric, the best validation
    accuracy by default); the best value it reports is the best of the three trials' records."""
    import yaml

    result = run_command(["lra-train", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3",
                          "hydra.sweeper.direction=maximize", "hydra.sweeper.sampler.seed=0",
                          "trainer.lr=interval(0.0001,0.01)", "trainer=smoke", "trainer.max_steps=4",
                          "trainer.eval_every=2", *SMALL_LISTOPS], tmp_path, data_dir)
    runs = run_dirs(tmp_path)
    records = [read_json(run / "metrics.json") for run in runs]
    assert len(records) == 3 and all(r["status"] == "completed" for r in records)
    (results,) = (tmp_path / "runs").rglob("optimization_results.yaml")
    best = yaml.safe_load(results.read_text())
    assert best["best_value"] == max(r["best_val_accuracy"] for r in records)
    assert set(best["best_params"]) == {"trainer.lr"}
    # each trial's learning rate is a setup of its own: a row each, named by it
    assert "Test accuracy (%)" in result.stdout and result.stdout.count("| Softmax (trainer.lr=") == 3, result.stdout


def _same_engine_check(rank, world, init_file, out):
    """One rank of test_ranks_that_differ_in_yosos_engine_each_stop_with_one_line."""
    import torch.distributed as dist

    from lra import distributed
    from lra.errors import UserError

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ranks = distributed.Ranks(rank=rank, world=world)
    distributed.same_across("kernel", ranks, "the engine", "fix it")  # the same everywhere: nothing to say
    try:
        distributed.same_across("kernel" if rank == 0 else "torch", ranks, "the engine", "fix it")
        said = "nothing"
    except UserError as error:
        said = str(error)
    (out / f"{rank}.txt").write_text(said)
    dist.destroy_process_group()


def test_ranks_that_differ_in_yosos_engine_each_stop_with_one_line(tmp_path):
    """lra.build checks YOSO's engine across the ranks (a node without a compiler takes the PyTorch path under
    impl=auto): each rank raises the same line, rather than one rank alone, which would leave the others waiting
    in the next collective."""
    torch.multiprocessing.spawn(_same_engine_check, args=(2, tmp_path / "init", tmp_path), nprocs=2)
    for rank in (0, 1):
        assert (tmp_path / f"{rank}.txt").read_text() == (
            "the run's processes differ in the engine (rank 0: kernel, rank 1: torch); fix it")


@pytest.mark.parametrize("message, said", [
    ("A worker process managed by the executor was unexpectedly terminated.\n\nThe exit codes of the workers are "
     "{SIGKILL(-9)}\nDetailed tracebacks …", "TerminatedWorkerError: The exit codes of the workers are {SIGKILL(-9)}: "
                                             "SIGKILL is the out-of-memory killer's signal, or a kill -9"),
    ("… unexpectedly terminated.\n\nThe exit codes of the workers are {SIGSEGV(-11)}\nDetailed …",
     "TerminatedWorkerError: The exit codes of the workers are {SIGSEGV(-11)}: the process crashed"),
    ("Job 7 (task: 0) with path /s/.submitit/7_result.pkl has not produced any output (state: FINISHED)\nNo error "
     "stream produced.", "UncompletedJobError: Job 7 (task: 0), which left no output: killed (SIGKILL"),
    ("Job 7 (task: 0) with path /s/.submitit/7_result.pkl has not produced any output (state: FINISHED)\nError "
     "stream produced:\n----\nerror: the sweep stopped at job 0: it holds another sweep\n",
     "UncompletedJobError: Job 7 (task: 0), whose last line was: error: the sweep stopped at job 0: it holds another "
     "sweep"),
])
def test_a_job_process_lost_under_a_process_launcher_is_one_line_with_the_continuing_command(tmp_path, monkeypatch,
                                                                                             message, said):
    """local_gpus (joblib) and submitit_local lose a job's process (SIGKILL: the out-of-memory killer; a crash; a
    job that ended on its own error): each launcher stops the sweep with its own error, which ended the sweep as a
    bug of the harness. The line names the cause only as far as that error tells it."""
    from joblib.externals.loky.process_executor import TerminatedWorkerError
    from submitit.core.utils import UncompletedJobError

    from lra.commands import config_errors
    from lra.results import callback

    monkeypatch.setattr(callback, "STARTED_SWEEPS", [tmp_path / "s w"])
    error = (TerminatedWorkerError if said.startswith("Terminated") else UncompletedJobError)(message)
    try:
        try:
            raise error
        except Exception as inner:  # as Hydra's launch passes it on
            raise RuntimeError("launch failed") from inner
    except RuntimeError as outer:
        line, status = config_errors.failure(outer)
    assert status == 1 and line.startswith(f"a job of the sweep ended without its result ({said}"), line
    assert line.endswith(f"continue it with the same command and hydra.sweep.dir='{tmp_path / 's w'}': finished "
                         "jobs are kept, unfinished ones resume from their last checkpoints (lra-table lists them)")


def test_a_thread_count_refusal_in_a_local_gpus_worker_says_where_the_count_comes_from(tmp_path, monkeypatch):
    """The refusal advised OMP_NUM_THREADS=2 to a worker that had it set: joblib's cores ÷ workers wins there."""
    from lra import checkpoint
    from lra.errors import UserError

    monkeypatch.setenv("LRA_SWEEP_PARENT", "1")
    with pytest.raises(UserError, match=r"resume it with OMP_NUM_THREADS=2 exported before lra-train \(a "
                                        r"hydra/launcher=local_gpus worker runs on cores ÷ hydra.launcher.n_jobs threads "
                                        r"where it is not set"):
        checkpoint.check_threads(tmp_path / "last.pt", {"build": {"cpu_threads": "2"}}, {"cpu_threads": "1"})
