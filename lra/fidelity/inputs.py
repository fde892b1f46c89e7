"""The Q, K, V that ``lra-fidelity`` measures on: drawn at random, or captured by forward hooks from
a trained ``lra-train`` run on its own task's inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import numpy as np
import torch

from lra import checkpoint
from lra.errors import UserError


@dataclass
class AttentionInputs:
    """One attention call's inputs: q, k, v [B, H, n, d] float32, mask [B, n] bool."""

    source: str  # "random" or "<task> layer <i>"
    seed: Optional[int]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: torch.Tensor
    trained_backend: Optional[torch.nn.Module] = None  # the checkpoint's own layer, if any

    @property
    def n(self) -> int:
        return self.q.shape[2]


def random_inputs(batch: int, heads: int, n: int, head_dim: int, score_std: float, seed: int,
                  device: torch.device) -> AttentionInputs:
    """Entries of q and k from N(0, score_std) and v from N(0, 1), so that q·k/√d has standard
    deviation ``score_std``; no padding. Drawn from a generator seeded by ``seed`` (and n)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + n)
    shape = (batch, heads, n, head_dim)
    q, k = (math.sqrt(score_std) * torch.randn(shape, generator=generator) for _ in range(2))
    v = torch.randn(shape, generator=generator)
    mask = torch.ones(batch, n, dtype=torch.bool)
    return AttentionInputs("random", seed, q.to(device), k.to(device), v.to(device), mask.to(device))


def load_run_config(run_dir: Path):
    """The resolved config an ``lra-train`` run recorded, validated against the schema: what
    ``lra-fidelity`` builds the run's model and reads its data from."""
    from lra.config import saved_run_config
    from lra.run import RESOLVED, read_saved_config

    path = Path(run_dir) / RESOLVED
    if not path.is_file():
        raise UserError(f"checkpoint={run_dir} is not an lra-train run directory (no {RESOLVED}); "
                        "pass a run folder such as runs/<date>/<time>")
    try:
        cfg = read_saved_config(path, saved_run_config)
    except ValueError as exc:
        raise UserError(f"cannot capture from checkpoint={run_dir}: its {RESOLVED}, which says how to rebuild the "
                        f"run's model, is unreadable ({exc}); put the run's own {RESOLVED} back, or pass another run "
                        "as checkpoint=") from None
    check_backend_code(Path(run_dir), cfg)
    return cfg


def check_backend_code(run_dir: Path, cfg) -> None:
    """The run's attention is registered here, and a backend of the user's by the file it trained with (its
    record's ``attention_file_sha256``): its weights mean nothing to other code. One line otherwise."""
    from lra.records import changed_backend_code
    from lra.run import RunDirectory
    from lra.validation import check_attention

    check_attention(cfg)
    changed = changed_backend_code(RunDirectory(run_dir).read_record() or {})
    if changed:
        raise UserError(f"cannot capture from checkpoint={run_dir}: {changed}; restore that file "
                        "(LRA_ATTENTION_MODULES), or pass another run as checkpoint=")


NO_BEST = f"{checkpoint.LAST}: the run has no {checkpoint.BEST} yet"  # what a capture from the last weights says


def checkpoint_weights(run_dir: Path) -> Path:
    """The weights ``lra-fidelity`` captures from: the run's best checkpoint, else its last one (a run
    that has not validated yet; every captured input then says so, :data:`NO_BEST`), else one line."""
    from lra.run import resume_command

    paths = [Path(run_dir) / "checkpoints" / name for name in (checkpoint.BEST, checkpoint.LAST)]
    found = next((p for p in paths if p.is_file()), None)
    if found is None:
        raise UserError(f"no checkpoint in {run_dir}/checkpoints (looked for {checkpoint.BEST}, {checkpoint.LAST}); "
                        f"train it first, or resume it with: {resume_command(run_dir)}")
    return found


def captured_inputs(run_dir: Path, examples: int, split: str, device: torch.device) -> List[AttentionInputs]:
    """Every layer's attention inputs when the run's best (else last, said in each input's name)
    weights read the first ``examples`` sequences of ``split`` (the first document of a dual-encoder pair)."""
    from lra.data.prepare import load_task_data
    from lra.model import Classifier, input_length
    from lra.run import RunDirectory
    from lra.validation import attention_spec

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir)
    found = checkpoint_weights(run_dir)
    weights = f" ({NO_BEST})" if found.name == checkpoint.LAST else ""
    max_length = input_length(cfg.task.max_length, cfg.trainer.max_length)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), max_length)
    try:
        payload = checkpoint.load(found)
        checkpoint.check_config(found, payload, RunDirectory(run_dir).config_sha256, reading="measure the weights in",
                                fix="put the run's own files back, or pass another run as checkpoint=")
        model.load_state_dict(payload["model"])
    except UserError:
        raise
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot capture from checkpoint={run_dir}: the weights in {found} are unreadable "
                        f"({type(exc).__name__}: {reason}), damaged or not this run's; put an intact copy back, pass "
                        "another run as checkpoint=, or train the run again") from None
    model.to(device).eval()

    data = load_task_data(cfg.task, Path(cfg.data_dir), announce=lambda message: None)
    if split not in data.splits:
        raise UserError(f"split={split} is not one of {', '.join(data.splits)}")
    chosen = np.arange(min(examples, len(data.splits[split])))
    ids, masks, _ = data.splits[split].gather(chosen, max_length)

    captured = []
    hooks = [block.attention.backend.register_forward_hook(
        lambda module, inputs, output: captured.append((module, inputs))) for block in model.encoder.blocks]
    try:
        with torch.no_grad():
            model([torch.from_numpy(i).to(device) for i in ids], [torch.from_numpy(m).to(device) for m in masks])
    finally:
        for hook in hooks:
            hook.remove()
    layers = len(model.encoder.blocks)
    result = []
    for layer, (module, (q, k, v, mask)) in enumerate(captured[:layers]):
        result.append(AttentionInputs(f"{cfg.task.name} layer {layer}{weights}", None, q.float(), k.float(), v.float(),
                                      mask.bool(), trained_backend=module))
    return result
