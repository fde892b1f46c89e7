"""Where a reference run's time goes: one training step and one evaluation pass under torch.profiler,
split into the attention backend, the rest of the model, the optimizer, data, evaluation and, on
CUDA, the host's gaps (``python -m lra.benchmarks.throughput --profile``).

The run is built as ``lra-train`` builds it (its config composed and validated with lra-train's rules,
then :class:`lra.training.Trainer`, that is :func:`lra.build.build`); the profile calls the trainer's
own ``train_step`` and ``evaluate``. Nothing in the trainer changes: the parts are named by
``record_function`` scopes this module puts around the trainer instance's methods and, through
module hooks, around each attention backend's forward. Each profiler event belongs to the innermost
scope around it; a backward node belongs to the attention backend when its forward was recorded in a
backend scope (autograd numbers each node, and the profiler gives the forward op and its backward the
same sequence number), else to the rest of the model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from lra.model import MultiHeadAttention
from lra.profiling.measure import synchronize, timed

ATTENTION_FORWARD = "attention backend, forward"
ATTENTION_BACKWARD = "attention backend, backward"
MODEL_FORWARD = "rest of the model, forward"
MODEL_BACKWARD = "rest of the model, backward"
OPTIMIZER = "optimizer"
DATA = "data"
OTHER = "other"
HOST_GAPS = "host gaps"
PARTS = (ATTENTION_FORWARD, ATTENTION_BACKWARD, MODEL_FORWARD, MODEL_BACKWARD, OPTIMIZER, DATA)

SCOPE = "lra.profile/"  # the scopes this module records
STEP_SCOPE, EVALUATION_SCOPE = SCOPE + "train_step", SCOPE + "evaluate"
BACKEND_SCOPE, FORWARD_SCOPE = SCOPE + "attention_backend", SCOPE + "forward"
DATA_SCOPE, OPTIMIZER_SCOPE = SCOPE + "data", SCOPE + "optimizer"
BACKWARD_NODE = "autograd::engine::evaluate_function: "  # the autograd engine's scope of one backward node
SCOPE_PARTS = {BACKEND_SCOPE: ATTENTION_FORWARD, FORWARD_SCOPE: MODEL_FORWARD, DATA_SCOPE: DATA,
               OPTIMIZER_SCOPE: OPTIMIZER, STEP_SCOPE: OTHER, EVALUATION_SCOPE: OTHER}
OPTIMIZER_EVENTS = ("Optimizer.step#", "Optimizer.zero_grad#")  # torch.optim's own scopes


def scoped(owner, attribute: str, scope: str) -> None:
    """``owner.attribute`` (a bound method) called inside ``record_function(scope)`` from now on; the
    instance's attribute shadows its class's method, so the class and its other instances are unchanged."""
    method = getattr(owner, attribute)

    @functools.wraps(method)
    def wrapped(*args, **kwargs):
        with record_function(scope):
            return method(*args, **kwargs)

    setattr(owner, attribute, wrapped)


def scope_backends(model: torch.nn.Module) -> int:
    """Record each attention backend's forward in :data:`BACKEND_SCOPE` (a pre-hook opens it, a hook
    that runs even when the forward raises closes it); the number of backends."""
    backends = [module.backend for module in model.modules() if isinstance(module, MultiHeadAttention)]
    for backend in backends:
        open_scopes: List[record_function] = []

        def opened(module, args, scopes=open_scopes):
            scopes.append(record_function(BACKEND_SCOPE))
            scopes[-1].__enter__()

        def closed(module, args, output, scopes=open_scopes):
            scopes.pop().__exit__(None, None, None)

        backend.register_forward_pre_hook(opened)
        backend.register_forward_hook(closed, always_call=True)
    return len(backends)


def check_profilable(cfg) -> None:
    """Refuse, before anything is built, a run whose time this profile cannot split (:class:`UserError`)."""
    from lra.errors import UserError
    from lra.pretraining import pretrains

    if cfg.trainer.compile:
        raise UserError("the profile names the attention backend's time through module hooks, which a compiled "
                        "model does not run: profile with trainer.compile=false")
    if cfg.trainer.capture:
        raise UserError("the profile names the parts of a step through hooks and scopes, which a replayed CUDA graph "
                        "does not run: profile with trainer.capture=false")
    if pretrains(cfg):
        raise UserError("the profile covers the training stage only, and this config self-pretrains first: leave "
                        "pretrain at none (and pretrain.from unset)")


def instrument(trainer) -> None:
    """Scopes around what a training step and an evaluation call: the forward of a batch (gather, copy,
    model, loss), the data parts within it and the sampler, the optimizer's parts, the backends."""
    if not scope_backends(trainer.model):
        raise AssertionError("the model has no attention backend to profile")
    scoped(trainer, "_forward", FORWARD_SCOPE)
    scoped(trainer, "training_loss_on", FORWARD_SCOPE)
    scoped(trainer, "_to_device", DATA_SCOPE)
    scoped(trainer.sampler, "next_batch", DATA_SCOPE)
    for split in trainer.data.splits.values():
        scoped(split, "gather", DATA_SCOPE)
    for attribute in ("step", "update", "unscale_"):  # the AdamW step runs inside GradScaler.step
        scoped(trainer.scaler, attribute, OPTIMIZER_SCOPE)
    scoped(trainer.scheduler, "step", OPTIMIZER_SCOPE)


@dataclass
class Attribution:
    """Profiler events summed by part. ``host``: seconds of CPU time (each event's self time, so nested
    parts are not counted twice); ``device``: seconds of GPU time of the kernels and copies each part
    launched (CUDA); ``busy``: seconds the GPU ran anything (the union of their intervals); ``operators``:
    the operators each part called (outermost dispatcher calls such as ``aten::mm``, not those inside
    another: the host's units of work, each one launch or a few on a GPU, none for a view)."""

    host: Dict[str, float] = field(default_factory=dict)
    device: Dict[str, float] = field(default_factory=dict)
    busy: float = 0.0
    operators: Dict[str, int] = field(default_factory=dict)


@dataclass
class Window:
    """One profiled stretch (``count`` training steps, or one evaluation pass of ``count`` batches): its
    wall time in seconds and its :class:`Attribution`; ``cuda`` whether the device's time is the split."""

    count: int
    wall: float
    measured: Attribution
    cuda: bool = False

    def parts(self) -> Dict[str, float]:
        """Seconds per part that add up to ``wall``: on CPU the host's time, on CUDA the device's, the
        host gaps (wall minus busy), and ``other``, the remainder."""
        measured = self.measured.device if self.cuda else self.measured.host
        rows = {part: measured.get(part, 0.0) for part in PARTS}
        if self.cuda:
            rows[HOST_GAPS] = self.wall - self.measured.busy
        rows[OTHER] = self.wall - sum(rows.values())
        return rows

    def measured_other(self) -> float:
        """``other`` as the profiler saw it: time inside the step (evaluation) scope outside every part
        (CPU), or kernels launched outside every part (CUDA)."""
        return (self.measured.device if self.cuda else self.measured.host).get(OTHER, 0.0)


def attribute(events: Iterable) -> Attribution:
    """Profiler events (``torch.autograd.profiler_util.FunctionEvent``) summed by part. Host events outside
    every scope are left out; kernels launched outside every part count as ``other``."""
    events = list(events)
    host_events = [e for e in events if _on_host(e) and not e.is_async]
    backend_forward = _backend_sequence_ranges(host_events)
    part_of: Dict[int, Optional[str]] = {}
    inside_operator: Dict[int, bool] = {}
    result = Attribution()
    for event in sorted(host_events, key=_depth):  # parents first
        parent = event.cpu_parent
        own = _own_part(event, backend_forward)
        name = part_of[id(event)] = own if own is not None or parent is None else part_of[id(parent)]
        inside_operator[id(event)] = parent is not None and (_operator(parent) or inside_operator[id(parent)])
        if name is not None:
            result.host[name] = result.host.get(name, 0.0) + event.self_cpu_time_total / 1e6
            if _operator(event) and not inside_operator[id(event)]:
                result.operators[name] = result.operators.get(name, 0) + 1
        launched = sum(kernel.duration for kernel in event.kernels)
        if launched:
            result.device[name or OTHER] = result.device.get(name or OTHER, 0.0) + launched / 1e6
    intervals = sorted((e.time_range.start, e.time_range.end) for e in events
                       if not _on_host(e) and not getattr(e, "is_user_annotation", False))
    result.busy = _union(intervals) / 1e6
    return result


def _operator(event) -> bool:
    """A dispatcher operator (``aten::add``, ``attention_zoo::yoso_sample``), not a scope of the autograd
    engine or of this module."""
    return "::" in event.name and not event.name.startswith(("autograd::", SCOPE))


def _on_host(event) -> bool:
    return event.device_type == torch.autograd.DeviceType.CPU


def _depth(event) -> int:
    depth, parent = 0, event.cpu_parent
    while parent is not None:
        depth, parent = depth + 1, parent.cpu_parent
    return depth


def _descendants(event):
    stack = list(event.cpu_children)
    while stack:
        child = stack.pop()
        yield child
        stack.extend(child.cpu_children)


def _backend_sequence_ranges(events) -> List[Tuple[int, int]]:
    """The autograd sequence numbers each backend forward recorded, as (first, last): a forward runs
    on one thread, whose counter numbers the nodes it makes one after another, so every node the
    backend made lies in its range."""
    ranges = []
    for event in events:
        if event.name == BACKEND_SCOPE:
            numbers = [child.sequence_nr for child in _descendants(event) if child.sequence_nr >= 0]
            if numbers:
                ranges.append((min(numbers), max(numbers)))
    return ranges


def _own_part(event, backend_forward: List[Tuple[int, int]]) -> Optional[str]:
    name = event.name
    if name.startswith(BACKWARD_NODE):
        in_backend = any(first <= event.sequence_nr <= last for first, last in backend_forward)
        return ATTENTION_BACKWARD if in_backend else MODEL_BACKWARD
    if name.startswith(OPTIMIZER_EVENTS):
        return OPTIMIZER
    return SCOPE_PARTS.get(name)


def _union(intervals: List[Tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in intervals:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def profiled(work, count: int, scope: str, device: torch.device) -> Window:
    """``work`` (``count`` steps, or one pass of ``count`` batches) inside ``scope`` under the profiler, timed
    from a device synchronization to the next."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as warm:  # the profiler's own first start-up stays outside the window
        synchronize(device)
    del warm

    def scoped_work():
        with record_function(scope):
            return work()

    with profile(activities=activities) as prof:
        wall = timed(scoped_work, device)[1]
    return Window(count, wall, attribute(prof.events()), cuda=device.type == "cuda")


@dataclass
class StepProfile:
    """What :func:`profile_run` measured, seconds: ``step`` over ``steps`` training steps, ``evaluation``
    one pass over the validation split, ``checkpoint`` one save, ``unprofiled_step`` a step's wall time
    without the profiler."""

    label: str
    device: torch.device
    step: Window
    evaluation: Window
    checkpoint: float
    unprofiled_step: float
    eval_every: int
    checkpoint_every: int
    max_steps: int
    tokens_per_step: int
    test_passes: float  # the final test's length in validation passes (test examples ÷ validation examples)
    settings: Dict[str, object] = field(default_factory=dict)

    def run_step(self) -> float:
        """A run's time per training step: the step, a validation pass every ``eval_every`` steps, a
        checkpoint every ``checkpoint_every``."""
        return (self.step.wall / self.step.count + self.evaluation.wall / self.eval_every
                + self.checkpoint / self.checkpoint_every)

    def run_seconds(self) -> float:
        """A whole run at this rate: ``max_steps`` run steps and the final test pass."""
        return self.max_steps * self.run_step() + self.test_passes * self.evaluation.wall


def profile_run(trainer, steps: int, warmup: int) -> StepProfile:
    """Profile ``trainer`` (built as lra-train builds it): ``warmup`` steps, one checkpoint save timed,
    ``steps`` steps timed without the profiler, ``steps`` steps and one validation pass under it."""
    device = trainer.device
    tokens = [0]

    def train(count: int):
        for _ in range(count):
            tokens[0] += trainer.train_step()["tokens"]

    train(warmup)
    checkpoint = timed(trainer.save_checkpoint, device)[1]  # before the scopes: the schedule's state holds its step
    instrument(trainer)
    unprofiled = timed(lambda: train(steps), device)[1] / steps
    tokens[0] = 0
    step = profiled(lambda: train(steps), steps, STEP_SCOPE, device)
    validation = trainer.data.splits["val"]
    batch = trainer.cfg.trainer.evaluation_batch_size
    evaluation = profiled(lambda: trainer.evaluate("val"), -(-len(validation) // batch), EVALUATION_SCOPE, device)
    cfg = trainer.cfg.trainer
    return StepProfile(trainer.label, device, step, evaluation, checkpoint, unprofiled, cfg.eval_every,
                       cfg.checkpoint_every, cfg.max_steps, tokens[0] // steps,
                       len(trainer.data.splits["test"]) / len(validation),
                       {"batch": cfg.batch_size, "length": trainer.max_length, "validation": len(validation),
                        "eval_batch": batch})


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f}"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "–"


def report(result: StepProfile, header: str) -> str:
    """The profile as Markdown: ``header``, the split of a training step and of an evaluation pass, a
    run's time per step, and how each row is measured."""
    cuda = result.device.type == "cuda"
    step, evaluation = result.step, result.evaluation
    step_wall = step.wall / step.count
    windows = ((step, step.count, step_wall), (evaluation, 1, evaluation.wall))
    columns = ["part", "training step, ms", "share", "operators", "evaluation pass, ms", "share", "operators"]
    if cuda:
        columns += ["step, host ms", "evaluation, host ms"]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|:--|" + "--:|" * (len(columns) - 1)]
    for name in step.parts():
        cells = [name]
        for window, per, wall in windows:
            seconds = window.parts()[name] / per
            operators = window.measured.operators.get(name) if name in (*PARTS, OTHER) else None
            cells += [_ms(seconds), _share(seconds, wall), "" if operators is None else f"{operators / per:,.0f}"]
        if cuda:
            cells += ["" if name == HOST_GAPS else _ms(window.measured.host.get(name, 0.0) / per)
                      for window, per, _ in windows]
        lines.append("| " + " | ".join(cells) + " |")
    wall = ["**wall**"]
    for window, per, seconds in windows:
        wall += [f"**{_ms(seconds)}**", "100 %", f"{sum(window.measured.operators.values()) / per:,.0f}"]
    if cuda:
        wall += [_ms(sum(window.measured.host.values()) / per) for window, per, _ in windows]
    lines.append("| " + " | ".join(wall) + " |")

    run_step = result.run_step()
    amortised = [("training step", step_wall),
                 (f"validation: one pass ÷ eval_every {result.eval_every}", evaluation.wall / result.eval_every),
                 (f"checkpoint: one save ÷ checkpoint_every {result.checkpoint_every}",
                  result.checkpoint / result.checkpoint_every)]
    lines += ["", "| a run, per training step | ms | share |", "|:--|--:|--:|"]
    lines += [f"| {name} | {_ms(seconds)} | {_share(seconds, run_step)} |" for name, seconds in amortised]
    lines.append(f"| **a run's step** | **{_ms(run_step)}** | 100 % |")
    run = result.run_seconds()
    lines += ["", f"A whole run ({result.max_steps:,} steps, {result.max_steps // result.eval_every} validations, the final "
                  f"test pass) at this rate: {run:,.0f} s ({run / 3600:.2f} h). Training tokens/s: "
                  f"{result.tokens_per_step / step_wall:,.0f} profiled, {result.tokens_per_step / result.unprofiled_step:,.0f} "
                  f"without the profiler ({_ms(result.unprofiled_step)} ms a step: the profiled step takes "
                  f"{step_wall / result.unprofiled_step:.2f}× as long)."]
    measured = ("the rest of train_step's (evaluate's) own time: its Python, metric sums, the autograd engine "
                "between nodes, gradient clipping when set" if not cuda
                else "kernels launched outside every part (metric sums, gradient clipping when set, …)")
    lines += ["", "How each row is measured "
              + ("(device time: the GPU time of the kernels and copies each part launched, by the profiler's "
                 "correlation of each kernel with the operator that launched it; host ms: CPU time of the same "
                 "parts, not additive with the device's):" if cuda else "(CPU self time of the profiler's events in "
                 "each part, nested parts counted once):"),
              "- attention backend, forward: the backend modules' forward, inside scopes that module hooks open "
              "and close; backward: the autograd nodes whose forward the backend recorded (matched by sequence number).",
              "- rest of the model: the batch's forward (embeddings, projections, feed-forward, norms, pooling, loss) "
              "without the backend and data inside it; backward: every other autograd node (gradient accumulation "
              "into the parameters included).",
              "- optimizer: zero_grad, the AdamW step (inside GradScaler.step), GradScaler.update, the LR schedule.",
              "- data: the sampler's batch, the gather into padded arrays, the copy to the device.",
              "- operators: the outermost dispatcher calls of each part (aten::mm, attention_zoo::yoso_sample, ...; "
              "a view counts, an operator inside another does not): the host's units of work, each one kernel "
              "launch or a few on a GPU.",
              *(["- host gaps: the wall time minus the time the GPU ran anything (the union of its kernels' and "
                 "copies' intervals): the GPU waiting for the host."] if cuda else []),
              f"- other: the wall time minus the rows above; the profiler measured {_ms(step.measured_other() / step.count)} "
              f"ms of it a step and {_ms(evaluation.measured_other())} ms a pass as {measured}."]
    return "\n".join(lines)
