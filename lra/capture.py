"""The training step as one CUDA graph (``trainer.capture=true``): forward and backward of every
micro-batch, gradient clipping and the optimizer's step, launched by one replay instead of hundreds of
kernel launches from the host, which at the LRA reference sizes takes longer to queue a step than the GPU
takes to run it.

The first :data:`EAGER_STEPS` steps of a process run eagerly through the same
:meth:`lra.training.Trainer.device_step` (they create cuBLAS's handles and workspaces, the optimizer's state
and the allocator's pools, none of which a capture may do); the next step is captured, with its inputs
in static device tensors, and every step from then on copies its batch into those tensors and replays the
graph. A captured step computes what the same step eagerly computes, kernel for kernel: a resumed run,
which runs its first steps eagerly again, equals the uninterrupted one. Evaluation is captured the same
way, a full evaluation batch's forward (no autograd) as a graph of its own (a last, smaller batch runs
eagerly). What capture needs is decided by
:func:`refusal` (one line each), checked when the config is validated: a CUDA device, no fp16
(GradScaler's skipped steps read the device from the host), one process (no DDP), no
``trainer.compile_mode`` with its own CUDA graphs. The optimizer is made capturable by
:func:`lra.build.build` (AdamW with ``capturable=True`` and its learning rate a device tensor, which the
schedule fills each step).
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import torch

from attention_zoo._common import take_held_by_capture
from lra.errors import UserError

EAGER_STEPS = 3


def refusal(trainer_cfg, on_cuda: bool, processes: int = 1) -> Optional[str]:
    """Why ``trainer.capture=true`` cannot run with these settings (None: it can), with the fix."""
    if not on_cuda:
        return "it captures CUDA graphs and this run is on the CPU: pass trainer.capture=false"
    if trainer_cfg.precision.value == "fp16":  # (auto on a GPU without bf16: lra.build.build refuses it)
        return ("fp16's gradient scaler decides on the host whether to skip a step: pass trainer.precision=bf16 "
                "(or fp32), or trainer.capture=false")
    if processes > 1:
        return "a DDP run's gradient all-reduce is not captured here: pass trainer.capture=false under torchrun"
    if trainer_cfg.compile and trainer_cfg.compile_mode in ("reduce-overhead", "max-autotune"):
        return (f"trainer.compile_mode={trainer_cfg.compile_mode} makes CUDA graphs of its own: pass "
                "trainer.compile_mode=default (or max-autotune-no-cudagraphs) with trainer.capture=true")
    return None


class StepGraph:
    """``step()`` (device work on static tensors, returning its metrics: a training step, or an evaluation
    batch's forward) captured as one CUDA graph: :meth:`replay` runs it again, writing :attr:`outputs`
    (capturing runs nothing)."""

    def __init__(self, step):
        self.graph = torch.cuda.CUDAGraph()
        take_held_by_capture()  # nothing earlier is this graph's
        try:
            with torch.cuda.graph(self.graph):
                self.outputs = step()
        except RuntimeError as exc:  # e.g. a backend that reads a value back to the host inside the step
            cause = exc
            while cause.__context__ is not None:  # the op that broke the capture, not capture_end's own error
                cause = cause.__context__
            reason = " ".join(str(cause).split())[:200]
            raise UserError(f"trainer.capture=true: this run's step cannot be captured as one CUDA graph ({reason}); "
                            "train it with trainer.capture=false") from exc
        self.held = take_held_by_capture()  # cached tensors the graph reads: alive as long as it is

    def replay(self) -> None:
        self.graph.replay()


class Replayed:
    """A device computation of host batches (``compute(device batches) -> dict of tensors``): run eagerly for
    the first :data:`EAGER_STEPS` calls, captured on the next call's batches (its static inputs) and from
    then on replayed after each call's batches are copied into them. ``prepare()`` runs before every eager
    call and before the capture (the training step's gradients set to None)."""

    def __init__(self, make_graph, to_device, prepare=lambda: None):
        self.make_graph, self.to_device, self.prepare = make_graph, to_device, prepare
        self.eager_calls = 0
        self.graph = None
        self.inputs: List[List[torch.Tensor]] = []  # the static device tensors each replay reads

    def __call__(self, batches: List[List[np.ndarray]], compute) -> dict:
        if self.graph is None and self.eager_calls < EAGER_STEPS:
            self.eager_calls += 1
            self.prepare()
            return compute([self.to_device(arrays) for arrays in batches])
        if self.graph is None:
            self.inputs = [self.to_device(arrays) for arrays in batches]
            self.prepare()
            self.graph = self.make_graph(lambda: compute(self.inputs))
        else:
            for statics, arrays in zip(self.inputs, batches, strict=True):
                copy_into_statics(statics, arrays)
        self.graph.replay()
        return {key: value.clone() for key, value in self.graph.outputs.items()}


class CapturedStep:
    """:meth:`step` and :meth:`evaluation` for :class:`lra.training.Trainer` under ``trainer.capture``
    (module docstring): a :class:`Replayed` each.
    ``graph``: what captures a step (:class:`StepGraph`; the CPU tests give a stand-in that reruns it)."""

    def __init__(self, trainer, graph=StepGraph):
        self.trainer = trainer
        # the graph's backward makes the gradients it then reuses: set to None before each eager step and the capture
        self.training = Replayed(graph, trainer._to_device, lambda: trainer.optimizer.zero_grad(set_to_none=True))
        self.evaluating = Replayed(graph, trainer._to_device)
        self.weights: Optional[List[float]] = None  # the micro-batches' shares, fixed in the graph

    def step(self, batches: List[List[np.ndarray]], weights: List[float]) -> dict:
        """One optimizer step on ``batches`` (host arrays per micro-batch); its metrics, which later steps
        leave as they are."""
        if self.training.graph is not None and list(weights) != self.weights:
            raise AssertionError(f"a captured step's micro-batch weights changed: {weights} != {self.weights}")
        self.weights = list(weights)
        return self.training(batches, lambda device_batches: self.trainer.device_step(device_batches, weights))

    def evaluation(self, arrays: List[np.ndarray]) -> tuple:
        """(mean loss, number correct) of a full evaluation batch (host arrays) through the evaluation model,
        with no autograd."""
        trainer = self.trainer
        result = self.evaluating([arrays], lambda device_batches: dict(zip(("loss", "correct"), trainer.loss_on(
            device_batches[0], trainer.eval_model))))
        return result["loss"], result["correct"]


def copy_into_statics(statics: List[torch.Tensor], arrays: List[np.ndarray]) -> None:
    """Copy a batch's host arrays into the static tensors a graph reads (from pinned memory on CUDA)."""
    for static, array in zip(statics, arrays, strict=True):
        if tuple(static.shape) != array.shape:  # copy_ would broadcast a smaller batch without a word
            raise AssertionError(f"a batch of shape {array.shape} for a graph captured at {tuple(static.shape)}")
        static.copy_(torch.from_numpy(array).pin_memory() if static.is_cuda else torch.from_numpy(array),
                     non_blocking=True)
