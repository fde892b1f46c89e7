"""End-to-end runs of ``lra-train``: the run record, and exact resume after SIGKILL anywhere."""

import signal

import pytest
import torch

from conftest import SMALL_LISTOPS, one_run, read_json, run_command, run_dirs
from lra.data.sampler import EpochSampler
from lra.records import RunRecord
from lra.schedules import SCHEDULES, linear_warmup_decay

RESUMABLE = ["trainer=smoke", "trainer.max_steps=16", "trainer.eval_every=5", "trainer.checkpoint_every=3",
             "trainer.train_subset=null", "trainer.eval_subset=null", "attention=softmax", "seed=7", *SMALL_LISTOPS]


def test_smoke_run_on_a_machine_with_no_data_writes_every_contract_field(tmp_path):
    result = run_command(["lra-train", "task=listops", "attention=softmax", "trainer=smoke"], tmp_path, tmp_path / "empty")
    assert "ListOps data not found: generating" in result.stderr + result.stdout
    (run,) = run_dirs(tmp_path)
    metrics = read_json(run / "metrics.json")
    assert set(RunRecord.FIELDS) <= set(metrics)
    assert metrics["status"] == "completed" and metrics["error"] is None
    assert (metrics["task"], metrics["attention"], metrics["label"], metrics["seed"]) == ("listops", "softmax", "Softmax", 0)
    assert metrics["steps"] == 20 and metrics["best_step"] in (10, 20)
    assert 0 <= metrics["test_accuracy"] <= 100 and 0 <= metrics["best_val_accuracy"] <= 100
    assert metrics["train_tokens_per_second"] > 0 and metrics["wall_time_seconds"] > 0
    assert metrics["peak_memory_mb"] > 0 and metrics["num_parameters"] > 100_000
    assert metrics["git_commit"] and metrics["device"].startswith("cpu") and metrics["data_fingerprint"]
    assert metrics["deterministic"] is True and metrics["nondeterministic_ops"] == []
    assert 10 <= metrics["chance_accuracy"] <= 100 and isinstance(metrics["stuck_at_chance"], bool)
    history = read_json(run / "history.json")
    assert [h["step"] for h in history] == [10, 20]
    assert max(h["val_accuracy"] for h in history) == metrics["best_val_accuracy"]
    assert (run / ".hydra" / "resolved.yaml").is_file() and (run / "checkpoints" / "last.pt").is_file()
    # Not on a terminal: a progress line every trainer.log_every (5) steps, on the console and in
    # train.log, and the result line in train.log too.
    progress = [line for line in result.stdout.splitlines() if " - step " in line]
    assert [line.split(" - step ")[1].split("/")[0] for line in progress] == ["5", "10", "15", "20"], result.stdout
    assert all("/20 (" in line and " eta " in line and " tok/s " in line for line in progress)
    log = (run / "train.log").read_text()
    assert log.count(" - step ") == 4 and "Softmax on listops: test accuracy" in log


def test_the_record_names_ops_that_alerted_under_deterministic_algorithms(recwarn):
    """With warn_only=True PyTorch's alert is a warning; it is still shown, and its op is kept so
    that the run's record says the run was not bitwise repeatable (a CUDA scatter-add, say)."""
    import warnings

    from lra.determinism import NondeterminismLog

    alert = ("index_add_cuda_ does not have a deterministic implementation, but you set "
             "'torch.use_deterministic_algorithms(True, warn_only=True)'. You can file an issue ...")
    with NondeterminismLog() as log:
        warnings.warn("an unrelated warning")
        for _ in range(2):
            warnings.warn(alert)
    assert log.ops == ["index_add_cuda_"] and not log.repeatable(True)
    assert any("index_add_cuda_" in str(w.message) for w in recwarn)
    assert NondeterminismLog().repeatable(True) and not NondeterminismLog().repeatable(False)


@pytest.mark.parametrize("before", [(False, False), (True, False), (True, True)])
def test_deterministic_algorithms_switch_within_the_block_and_are_restored_after_it(before):
    """lra.determinism.deterministic_algorithms (the benchmarks' and the CUDA tests' switch): on or off,
    warn-only, inside the block; the earlier setting back after it, an exception too."""
    from lra.determinism import deterministic_algorithms

    def setting():
        return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()

    outside = setting()
    try:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        for on in (True, False):
            with pytest.raises(RuntimeError, match="inside"), deterministic_algorithms(on):
                assert setting() == (on, True)
                raise RuntimeError("inside")
            assert setting() == before
    finally:
        torch.use_deterministic_algorithms(outside[0], warn_only=outside[1])


def test_stuck_at_chance_is_within_three_standard_errors_of_the_best_constant_guess():
    import math

    import numpy as np

    from lra.chance import ChanceLevel

    level = ChanceLevel.of(np.array([0] * 600 + [1] * 300 + [2] * 100))  # 60 % for always guessing class 0
    assert level.accuracy == 60.0
    assert math.isclose(level.threshold, 60.0 + 300 * math.sqrt(0.6 * 0.4 / 1000))
    assert level.stuck(61.0) is True and level.stuck(65.0) is False and level.stuck(None) is None
    balanced = ChanceLevel.of(np.array([0, 1] * 10_000))  # Pathfinder's validation set: 50 %, stuck up to 51.06
    assert balanced.stuck(51.0) and not balanced.stuck(51.1)


def final_state(run):
    metrics = read_json(run / "metrics.json")
    history = [(h["step"], h["val_accuracy"], h["val_loss"]) for h in read_json(run / "history.json")]
    weights = torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]
    return metrics, history, weights


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    return final_state(one_run(tmp_path_factory.mktemp("uninterrupted"), data_dir, RESUMABLE))


@pytest.mark.parametrize("fault", [
    "step:8",              # between steps, 2 steps after a checkpoint
    "checkpoint_write:3",  # inside a checkpoint write: the temporary file is written, not renamed
    "after_checkpoint:2",  # right after a checkpoint
    "eval_batch:9",        # in the middle of the second validation
])
def test_sigkill_anywhere_then_resume_gives_identical_results(tmp_path, data_dir, uninterrupted, fault):
    killed = run_command(["lra-train", *RESUMABLE], tmp_path, data_dir, env_extra={"LRA_FAULT": fault}, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (run,) = run_dirs(tmp_path)
    assert read_json(run / "metrics.json")["status"] == "running"
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
    assert run_dirs(tmp_path) == [run], "resume must continue in the same run directory"
    metrics, history, weights = final_state(run)
    expected_metrics, expected_history, expected_weights = uninterrupted
    assert metrics["status"] == "completed"
    for key in ("steps", "best_step", "best_val_accuracy", "test_accuracy"):
        assert metrics[key] == expected_metrics[key], key
    assert history == expected_history
    for name, tensor in expected_weights.items():
        assert torch.equal(weights[name], tensor), name
    assert not list(run.rglob("*.tmp")), "no temporary checkpoint file may survive"


def test_a_resume_on_another_cpu_thread_count_is_refused_naming_the_count_and_on_it_is_identical(tmp_path, data_dir):
    """A CPU run's last digits depend on its thread count (how its reductions are split): a resume on another
    count is refused in one line naming the OMP_NUM_THREADS to set, and with it the run ends bit for bit as the
    run uninterrupted on that count."""
    threads, other = 2, 1
    expected_metrics, expected_history, expected_weights = final_state(
        one_run(tmp_path / "uninterrupted", data_dir, RESUMABLE, {"OMP_NUM_THREADS": str(threads)}))
    assert expected_metrics["device"].endswith(f", {threads} threads)")
    tmp_path = tmp_path / "killed"
    killed = run_command(["lra-train", *RESUMABLE], tmp_path, data_dir, check=False,
                         env_extra={"LRA_FAULT": "step:8", "OMP_NUM_THREADS": str(threads)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (run,) = run_dirs(tmp_path)
    before = (run / "metrics.json").read_bytes()
    refused = run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, check=False,
                          env_extra={"OMP_NUM_THREADS": str(other)})
    line = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 1 and line == (
        f"error: cannot resume from {run / 'checkpoints' / 'last.pt'}: it was computed on {threads} CPU threads and "
        f"this process runs on {other}, and a CPU run's last digits depend on its thread count: resume it with "
        f"OMP_NUM_THREADS={threads} exported before lra-train, as it went on exactly only as it was computed; the "
        "run's metrics.json is "
        "left as it was"), refused.stderr
    assert (run / "metrics.json").read_bytes() == before
    run_command(["lra-train", f"resume={run}"], tmp_path, data_dir, env_extra={"OMP_NUM_THREADS": str(threads)})
    metrics, history, weights = final_state(run)
    assert metrics["device"] == expected_metrics["device"] and history == expected_history
    assert metrics["test_accuracy"] == expected_metrics["test_accuracy"]
    for name, tensor in expected_weights.items():
        assert torch.equal(weights[name], tensor), name


def test_learning_rate_schedule_is_linear_warmup_then_linear_decay():
    factors = [linear_warmup_decay(s, warmup=4, total=12, start=0.04, end=0.0) for s in range(13)]
    assert factors[0] == pytest.approx(0.04) and factors[4] == pytest.approx(1.0) and factors[12] == 0.0
    assert factors[2] == pytest.approx(0.04 + 0.96 / 2)
    assert factors[8] == pytest.approx(0.5)


def test_every_schedule_has_its_function_and_lras_closed_forms_hold():
    """lra/schedules.py: one function per trainer.lr_schedule value; rsqrt is min(1, t/w)/√max(t, w)
    and cosine min(1, t/w)·½(1 + cos(π (t − w)/T)), LRA's forms."""
    import math
    from types import SimpleNamespace

    from lra.config import LRSchedule
    from lra.schedules import lr_factor

    assert set(SCHEDULES) == set(LRSchedule)
    trainer = SimpleNamespace(warmup_steps=100, max_steps=1000, lr_start_factor=0.04, lr_end_factor=0.0,
                              lr_schedule=LRSchedule.rsqrt)
    assert lr_factor(50, trainer) == pytest.approx(0.5 / 10) and lr_factor(400, trainer) == pytest.approx(1 / 20)
    trainer.lr_schedule = "cosine"  # a saved config's plain string works too
    assert lr_factor(50, trainer) == pytest.approx(0.5)
    assert lr_factor(600, trainer) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    trainer.lr_schedule = LRSchedule.linear
    assert lr_factor(550, trainer) == pytest.approx(0.5)


def test_sampler_position_round_trips_and_epochs_are_permutations():
    sampler = EpochSampler(10, 3, seed=1)
    seen = [sampler.next_batch() for _ in range(3)]
    assert sorted(int(i) for batch in seen for i in batch) == sorted(set(int(i) for b in seen for i in b))
    state = sampler.state_dict()
    expected = [sampler.next_batch().tolist() for _ in range(5)]
    resumed = EpochSampler(10, 3, seed=1)
    resumed.load_state_dict(state)
    assert [resumed.next_batch().tolist() for _ in range(5)] == expected


def test_gradient_accumulation_matches_one_big_batch(tmp_path, data_dir):
    from hydra import compose, initialize_config_dir

    from lra.config import CONF_DIR, register_configs, register_resolvers
    from lra.training import Trainer

    register_configs()
    register_resolvers()

    def weights_after_steps(accumulation):
        overrides = ["trainer=smoke", "trainer.batch_size=8", f"trainer.grad_accumulation={accumulation}",
                     "model.dropout=0.0", f"data_dir={data_dir}", *SMALL_LISTOPS]
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
        trainer = Trainer(cfg, tmp_path / f"acc{accumulation}", announce=lambda m: None)
        losses = [float(trainer.train_step()["loss"]) for _ in range(3)]
        return losses, trainer.model.state_dict()

    losses_one, weights_one = weights_after_steps(1)
    losses_two, weights_two = weights_after_steps(2)
    assert losses_one == pytest.approx(losses_two, rel=1e-5)
    for name in weights_one:
        torch.testing.assert_close(weights_one[name], weights_two[name], rtol=1e-4, atol=1e-6)


HOST_READS = {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero"}  # what .item(), float(), bool() dispatch to


@pytest.mark.parametrize("attention", ["softmax", "yoso"])
def test_training_steps_between_reads_never_read_a_value_back(tmp_path, data_dir, attention):
    """The profiler over three steps between log points finds no scalar read (on a GPU each would make
    the host wait for the device); the window's read at a log point is the one, and it sees the steps."""
    from hydra import compose, initialize_config_dir

    from lra.config import CONF_DIR, register_configs, register_resolvers
    from lra.distributed import Ranks
    from lra.training import Trainer, TrainWindow

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["trainer=smoke", f"attention={attention}", "trainer.grad_clip=1.0",
                                                        f"data_dir={data_dir}", *SMALL_LISTOPS])
    trainer = Trainer(cfg, tmp_path / "run", announce=lambda m: None)
    window = TrainWindow()
    trainer.train_step()  # the first step builds lazily created state
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(3):
            window.add(trainer.train_step())
    events = profile.events()
    optimizer_steps = [e.time_range for e in events if e.name.startswith("Optimizer.step#")]
    # AdamW reads its step counter, a CPU tensor also when the weights are on a GPU: not a device read.
    reads = [e for e in events if e.name in HOST_READS
             and not any(r.start <= e.time_range.start and e.time_range.end <= r.end for r in optimizer_steps)]
    assert len(optimizer_steps) == 3 and any(e.name == "aten::addmm" for e in events)
    assert not reads, [e.name for e in reads]
    metrics = window.read(Ranks(), step=4)
    assert window.steps == 3 and 0 < metrics["train/loss"] < 10 and 0 <= metrics["train/accuracy"] <= 100
    with torch.no_grad():
        trainer.model.head[0].weight[0, 0] = float("nan")
    window = TrainWindow()
    window.add(trainer.train_step())
    with pytest.raises(FloatingPointError, match="not finite at a step between 5 and 5 .* start a new run with a lower"):
        window.read(Ranks(), step=5)
