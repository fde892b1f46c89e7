"""trainer.capture=true (lra/capture.py): the whole training step as one CUDA graph. Where it cannot run
it is one line naming the fix (tested here on any machine); on a GPU, a captured run trains as the eager
run does (within float tolerance: the capturable optimizer computes its bias correction on the device), a
captured run killed and resumed equals the uninterrupted captured run bit for bit, and captured runs
pack (the CUDA tests, which lra-gpu-check's campaign runs)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
import torch

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from helpers import compose_config
from lra.capture import EAGER_STEPS, CapturedStep, refusal
from lra.config import Precision

SETUP = ["attention=yoso", "trainer=smoke", "trainer.max_steps=12", "trainer.eval_every=4", "trainer.checkpoint_every=4",
         "trainer.log_every=2", "trainer.grad_clip=1.0", *SMALL_LISTOPS]


def settings(**changes):
    fields = {"precision": Precision.bf16, "compile": False, "compile_mode": "default", **changes}
    return SimpleNamespace(**fields)


def test_capture_is_refused_where_the_step_cannot_be_captured():
    assert refusal(settings(), on_cuda=True) is None
    assert refusal(settings(), on_cuda=False).endswith("this run is on the CPU: pass trainer.capture=false")
    assert "pass trainer.precision=bf16 (or fp32)" in refusal(settings(precision=Precision.fp16), on_cuda=True)
    assert "under torchrun" in refusal(settings(), on_cuda=True, processes=2)
    for mode in ("reduce-overhead", "max-autotune"):
        assert f"trainer.compile_mode={mode} makes CUDA graphs of its own" in refusal(
            settings(compile=True, compile_mode=mode), on_cuda=True)
    assert refusal(settings(compile=True, compile_mode="max-autotune-no-cudagraphs"), on_cuda=True) is None


class RerunGraph:
    """A CUDA graph's contract on the CPU: capturing runs nothing; each replay runs the captured step on
    the same static inputs, its gradients made afresh (as the captured backward writes them), and writes
    its metrics into the same output tensors."""

    def __init__(self, step, optimizer):
        self.step, self.optimizer, self.outputs, self.replays = step, optimizer, None, 0

    def replay(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        result = self.step()
        if self.outputs is None:
            self.outputs = result
        else:
            for key, value in result.items():
                self.outputs[key].copy_(value)
        self.replays += 1


def test_a_captured_step_takes_each_batch_and_trains_as_the_eager_step(tmp_path, data_dir):
    """CapturedStep's own part, on the CPU with a stand-in graph: its eager steps, the capture on the
    fourth step's batch, each later batch copied into the static inputs (two micro-batches), the metrics
    taken before the next replay: ten steps equal the eager trainer's bit for bit (YOSO's hashes and
    dropout drawn every step; gradient clipping); then two validations (a graph of their own from the
    fourth batch on) around a step equal the eager trainer's too."""
    from lra.training import Trainer

    cfg = compose_config("trainer=smoke", "attention=yoso", "trainer.grad_accumulation=2", "trainer.grad_clip=0.5",
                         "seed=4", f"data_dir={data_dir}", *SMALL_LISTOPS)
    metrics = {}
    for name in ("eager", "captured"):  # one after the other: each trainer's build seeds the generators
        trainer = Trainer(cfg, tmp_path / name, announce=lambda message: None)
        graphs = []
        if name == "captured":
            trainer.captured = CapturedStep(trainer, graph=lambda step: graphs.append(
                RerunGraph(step, trainer.optimizer)) or graphs[-1])
        metrics[name] = [trainer.train_step() for _ in range(10)]
        metrics[name] = [(m["loss"].item(), m["correct"].item(), m["tokens"]) for m in metrics[name]]
        metrics[name + " weights"] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        metrics[name + " evaluations"] = [trainer.evaluate("val"), trainer.train_step()["loss"].item(),
                                          trainer.evaluate("val")]
    batches = -(-24 // 4)  # the validation split's batches
    assert [graph.replays for graph in graphs] == [10 + 1 - EAGER_STEPS, 2 * batches - EAGER_STEPS]
    assert metrics["captured evaluations"] == metrics["eager evaluations"]
    assert metrics["captured"] == metrics["eager"]
    assert len({loss for loss, _, _ in metrics["eager"]}) == 10, "each step trained on its own batch"
    for key, value in metrics["eager weights"].items():
        assert torch.equal(metrics["captured weights"][key], value), key


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's refusal")
def test_lra_train_refuses_capture_on_the_cpu_in_one_line(tmp_path, data_dir):
    result = run_command(["lra-train", "trainer=smoke", "trainer.capture=true", *SMALL_LISTOPS], tmp_path, data_dir,
                         check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: invalid value for trainer.capture: true; it captures CUDA graphs and this run is on the CPU: pass "
        "trainer.capture=false"]
    assert not (tmp_path / "runs").exists() or not run_dirs(tmp_path)


def train(root, data_dir, *overrides, env=None, check=True):
    return run_command(["lra-train", *SETUP, "trainer.device=cuda", "trainer.precision=bf16", *overrides,
                        "hydra.run.dir=run"], root, data_dir, env_extra=env, check=check)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_captured_run_trains_as_the_eager_run(tmp_path, data_dir):
    train(tmp_path / "eager", data_dir)
    train(tmp_path / "captured", data_dir, "trainer.capture=true")
    eager, captured = (read_json(tmp_path / name / "run" / "history.json") for name in ("eager", "captured"))
    assert [e["step"] for e in eager] == [c["step"] for c in captured]
    for ours, theirs in zip(captured, eager):
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=2e-3)
        assert ours["lr"] == pytest.approx(theirs["lr"], rel=1e-6)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_a_captured_run_killed_and_resumed_equals_the_uninterrupted_captured_run(tmp_path, data_dir):
    train(tmp_path / "once", data_dir, "trainer.capture=true")
    killed = train(tmp_path / "twice", data_dir, "trainer.capture=true", env={"LRA_FAULT": "step:10"}, check=False)
    assert killed.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)
    run_command(["lra-train", f"resume={tmp_path / 'twice' / 'run'}"], tmp_path / "twice", data_dir)
    once, twice = (read_json(tmp_path / name / "run" / "metrics.json") for name in ("once", "twice"))
    assert twice["resumed_at_steps"] == [8]
    for field in ("best_step", "best_val_accuracy", "test_accuracy", "test_loss"):
        assert twice[field] == once[field], field
    assert read_json(tmp_path / "twice" / "run" / "history.json") == read_json(tmp_path / "once" / "run" / "history.json")
    ours = torch.load(tmp_path / "twice" / "run" / "checkpoints" / "last.pt", weights_only=False)["model"]
    theirs = torch.load(tmp_path / "once" / "run" / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert all(torch.equal(ours[key], theirs[key]) for key in theirs)
