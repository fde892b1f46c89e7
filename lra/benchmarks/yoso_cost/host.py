"""The host's side of a YOSO call: what an eager call and a CUDA-graph replay cost on the CPU, and the wall
time of the two working together.

- **Host time of an op**: its PyTorch ops' worth (:mod:`.ops`: an ATen op from Python is 1, a custom op's
  Python, autograd's wrappers and nodes more, as the calibration trace's profiler columns weigh them) ×
  ``HOST_OP_S``, fitted on the calibration trace's queued step (:mod:`.fit`), plus ``LAUNCH_HOST_S`` per
  kernel a YOSO operator launches from C++ (the CUDA runtime's launch call; an estimate, not fitted).
- **The pipeline**: the host issues the ops in order; a kernel starts when the host has issued it and
  the GPU has finished the one before (:func:`wall`). A call whose host work outlasts its kernels is
  host-bound (its wall time is the host's), else device-bound (the GPU's, plus the host's head start).
- **CUDA graphs** (``torch.cuda.make_graphed_callables``, the ``YOSO-32 (CUDA graphs)`` cell): the module's
  forward is one replay and its backward another (each an autograd.Function's apply or backward and one
  graph launch), every kernel of it queued at once; the loss and the gradients' accumulation stay eager.
- **A step queued** (the trace's "ms a step queued", steps back to back): the larger of the host's and the
  GPU's time a step.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

from lra.benchmarks.yoso_cost import ops as torch_ops
from lra.benchmarks.yoso_cost.call import Call
from lra.benchmarks.yoso_cost.gpu import H100, Machine, seconds
from lra.benchmarks.yoso_cost.ops import FUNCTION, Op

HOST_OP_S = 27.9e-6  # one PyTorch op from Python on the measured sessions' hosts (fitted, :mod:`.fit`)
LAUNCH_HOST_S = 3e-6  # a kernel launched from C++ inside an operator
GRAPH_REPLAY = FUNCTION  # a replay's autograd.Function (PyTorch ops' worth), besides its one launch


def host_seconds(op: Op, host_op_s: float = HOST_OP_S) -> float:
    return op.host * host_op_s + sum(k.launches for k in op.raw) * LAUNCH_HOST_S


def timeline(ops: Sequence[Op], machine: Machine = H100, host_op_s: float = HOST_OP_S) -> Tuple[float, float]:
    """(host seconds, wall seconds) of ``ops`` issued in order from an idle host and GPU: each op's kernels
    are queued when its host work ends, and run one after another."""
    host = device = 0.0
    for op in ops:
        host += host_seconds(op, host_op_s)
        for kernel in (*op.kernels, *op.raw):
            device = max(device, host) + seconds(kernel, machine)
    return host, max(host, device)


def wall(ops: Sequence[Op], machine: Machine = H100, host_op_s: float = HOST_OP_S) -> float:
    return timeline(ops, machine, host_op_s)[1]


def device_seconds(ops: Sequence[Op], machine: Machine = H100) -> float:
    return sum(seconds(k, machine) for op in ops for k in (*op.kernels, *op.raw))


def graphed(ops: Sequence[Op]) -> List[Op]:
    """``ops`` with the module's forward, and its backward, each one replay of a CUDA graph."""
    def replay(name: str, phase: str, extra: float) -> List[Op]:
        part = [op for op in ops if op.phase == phase and not op.name.startswith(("loss gradient", "gradients "))]
        kernels = tuple(k for op in part for k in (*op.kernels, *op.raw))
        half = (GRAPH_REPLAY + extra) / 2  # the Function's Python before the graph's launch, and after it
        return [Op(name, half, kernels, phase=phase), Op(f"{name}: returned", half, phase=phase)]

    out = replay("forward graph replayed", "forward", 0.0)
    if any(op.phase == "backward" for op in ops):
        out += [op for op in ops if op.phase == "loss"]
        out += [op for op in ops if op.name.startswith("loss gradient")]
        out += replay("backward graph replayed", "backward", torch_ops.BACKWARD_NODE)
        out += [op for op in ops if op.name.startswith("gradients ")]
    return out


def call_seconds(c: Call, atomic: bool, training: bool, graphs: bool = False, machine: Machine = H100,
                 host_op_s: float = HOST_OP_S) -> float:
    """The wall time of one call as yoso_speed measures it (synchronized): a forward without autograd
    (``training=False``) or a training step, eager or as CUDA graphs."""
    ops = torch_ops.step(c, atomic, machine, training).ops
    return wall(graphed(ops) if graphs else ops, machine, host_op_s)


def queued_step(c: Call, atomic: bool, machine: Machine = H100, host_op_s: float = HOST_OP_S) -> float:
    """Seconds a training step takes when steps are queued back to back (no synchronization between)."""
    ops = torch_ops.step(c, atomic, machine).ops
    return max(sum(host_seconds(op, host_op_s) for op in ops), device_seconds(ops, machine))
