"""Self-pretraining (SPT; Amos, Berant & Gupta, "Never Train from Scratch", ICLR 2024): stage 1 trains
the encoder with a token-prediction head on the task's own training inputs, stage 2 fine-tunes it with
a fresh classification head (:class:`lra.training.Trainer`).

Stage 1 reads the training split's inputs only (never a label, never a validation or test input; the
two documents of a Retrieval pair are two sequences). ``masked``: a share ``mask_probability`` of each
sequence's real tokens is replaced by a learned vector and predicted, the loss over those positions only;
``causal``: every real token predicts the next one through causal attention. Stage 1 lives in
``<run>/pretrain/`` (checkpoints, history.json, and once it ended encoder.pt and finished.json) and resumes
exactly; its record is metrics.json's ``pretrain_*`` keys, which :func:`finished_stage` decides from the disk
once the stage has ended.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from lra import checkpoint, signals
from lra.config import TrainRunConfig, saved_run_config, typed
from lra.data.cache import sha256_file
from lra.errors import ConfigError, UserError
from lra.faults import fault_point
from lra.io import atomic_write_json
from lra.records import read_record
from lra.run import PRETRAIN as STAGE_DIR, RESOLVED, resume_command

ENCODER = "encoder.pt"  # stage 1's final encoder weights: what stage 2 starts from
FINISHED = "finished.json"  # stage 1's own record of its end, written after ENCODER: its SHA-256 and record fields
DERIVED = ("pretrain_status", "pretrain_encoder", "pretrain_encoder_sha256")  # what finished_stage fills in itself
SPT_SUFFIX = " +SPT"
# What a run's pretraining must share with the run that fine-tunes from it (the encoder's shape and data).
MATCHING = ("task", "model", "attention", "trainer.max_length")


def objective(cfg) -> str:
    return cfg.pretrain.objective.value


def source_run(cfg) -> Optional[Path]:
    source = getattr(cfg.pretrain, "from")  # a Python keyword: no attribute syntax
    return None if source is None else Path(source).expanduser().resolve()


def pretrains(cfg) -> bool:
    """Whether this run fine-tunes a self-pretrained encoder (trained here, or taken from ``pretrain.from``)."""
    return objective(cfg) != "none" or source_run(cfg) is not None


def spt_label(attention_label: str, cfg) -> str:
    """The row label: the attention's, with " +SPT" for a self-pretrained run (e.g. "YOSO-32 +SPT")."""
    return attention_label + (SPT_SUFFIX if pretrains(cfg) else "")


def stage_config(cfg) -> TrainRunConfig:
    """``cfg`` with stage 1's schedule as its trainer: ``pretrain.*`` replaces the fine-tuning values."""
    cfg = typed(cfg)
    pretrain = cfg.pretrain
    trainer = dataclasses.replace(
        cfg.trainer, max_steps=pretrain.max_steps, warmup_steps=pretrain.warmup_steps, lr=pretrain.lr,
        lr_schedule=pretrain.lr_schedule, batch_size=pretrain.batch_size, checkpoint_every=pretrain.checkpoint_every,
        eval_every=pretrain.history_every)
    return dataclasses.replace(cfg, trainer=trainer)


def masking_draws(seed: int, step: int, indices, documents: int, length: int) -> torch.Tensor:
    """[documents · len(indices), length] uniform draws, rows ordered document by document as the batch
    is: each (example, document) seeded by (seed, step, example index, document) alone, so the masks do
    not depend on how a step's batch is split over processes or micro-batches, and a resume redraws them."""
    rows = []
    for document in range(documents):
        for index in indices:
            state = np.random.SeedSequence([seed, step, int(index), document]).generate_state(1)[0]
            rows.append(torch.rand(length, generator=torch.Generator().manual_seed(int(state))))
    return torch.stack(rows)


def draw_masked(real: torch.Tensor, probability: float, draws: torch.Tensor) -> torch.Tensor:
    """[batch, n] bool: each real token masked with ``probability`` (``draws`` uniform, on ``real``'s
    device), padding never."""
    return (draws < probability) & real


def token_loss(logits: torch.Tensor, targets: torch.Tensor, counted: torch.Tensor):
    """(the mean over sequences of each sequence's mean cross-entropy over its ``counted`` positions, the
    correct predictions among them, their number), all device tensors: nothing is read back. A mean per
    sequence, then over sequences, is the same however the batch is split over processes or micro-batches."""
    losses = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
    weights = counted.to(losses.dtype)
    per_sequence = (losses * weights).sum(-1) / weights.sum(-1).clamp(min=1.0)
    correct = ((logits.argmax(-1) == targets) & counted).sum()
    return per_sequence.mean(), correct, weights.sum()


@dataclasses.dataclass(frozen=True)
class FinishedStage:
    """A run's finished stage 1 as its folder holds it: the encoder, the SHA-256 that names it, and the
    record's ``pretrain_*`` fields of the finished stage."""

    encoder: Path
    sha256: str
    fields: dict

    def verified_bytes(self, setting: str, fix: Optional[str] = None) -> bytes:
        """The encoder's bytes, checked against :attr:`sha256` (one line naming ``setting`` if they differ)."""
        return checkpoint.verified_encoder(self.encoder, self.sha256, setting, fix)


def finished_stage(run_dir: Path) -> Optional[FinishedStage]:
    """The one answer to "did this run's stage 1 finish?", read from the run's folder, never from the
    status its metrics.json says (a kill between two writes can leave that behind): the stage finished
    when ``pretrain/encoder.pt`` (written atomically) and the stage's own record of its end,
    ``pretrain/finished.json`` (written after it, naming its SHA-256), are both there; for a run from
    before that file existed, when its metrics.json names the encoder's SHA-256. An encoder without either
    is a stage stopped while it ended: not finished (its resume ends it again from its last checkpoint).
    An unreadable finished.json is one :class:`UserError` line."""
    run_dir = Path(run_dir)
    encoder, marker = run_dir / STAGE_DIR / ENCODER, run_dir / STAGE_DIR / FINISHED
    if not encoder.is_file():
        return None
    recorded = read_record(run_dir).get("pretrain_encoder_sha256")  # None until the run's record says it ended
    if marker.exists():
        sha256, fields = _read_marker(marker, run_dir)
        if recorded is not None and recorded != sha256:
            raise UserError(f"{run_dir}: its metrics.json names another encoder (SHA-256 {str(recorded)[:12]}…) than "
                            f"its {STAGE_DIR}/{FINISHED} ({sha256[:12]}…), which a run never writes: one of them was "
                            "replaced or edited; put the run's own files back, or pretrain again")
    else:
        fields = {k: v for k, v in read_record(run_dir).items() if k.startswith("pretrain_")}
        sha256 = recorded
        if not sha256:
            return None
    fields = {k: v for k, v in fields.items() if k not in DERIVED}
    return FinishedStage(encoder, sha256, fields | {"pretrain_status": "completed", "pretrain_encoder": str(encoder),
                                                   "pretrain_encoder_sha256": sha256})


def _read_marker(marker: Path, run_dir: Path) -> tuple:
    import json

    try:
        if not marker.is_file():
            raise ValueError("not a regular file")
        data = json.loads(marker.read_text())
        sha256, fields = data["encoder_sha256"], data["fields"]
        if not (isinstance(sha256, str) and len(sha256) == 64 and isinstance(fields, dict)):
            raise ValueError("not a SHA-256 and the stage's fields")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UserError(f"{marker} is unreadable ({type(exc).__name__}); it records the end of that run's pretraining "
                        f"stage: delete it and resume the run ({resume_command(run_dir)}), which records the stage's end "
                        "again") from None
    return sha256, fields


def finish_stage(run_dir: Path, save_encoder: Callable[[Path], None], fields: dict, record, main: bool) -> None:
    """Stage 1's end, written in the order :func:`finished_stage` reads: the encoder (``save_encoder(path)``,
    atomic), the stage's own record of its end (naming the encoder's SHA-256 and ``fields``, the stage's
    ``pretrain_*`` record fields), then the run's ``record`` with what :func:`finished_stage` reads back. A
    signal while the encoder is written leaves none; one after it is raised once both records say the stage
    finished. Ranks other than 0 (``main`` False) write nothing."""
    if not main:
        record.update(**(fields | {"pretrain_status": "completed"}))
        return
    stage_dir = Path(run_dir) / STAGE_DIR
    save_encoder(stage_dir / ENCODER)
    fault_point("encoder_written")  # tests: a kill between the encoder and any record of the stage's end
    with signals.deferred():
        kept = {k: v for k, v in fields.items() if k not in DERIVED}
        atomic_write_json(stage_dir / FINISHED, {"encoder_sha256": sha256_file(stage_dir / ENCODER), "fields": kept})
        fault_point("stage_recorded")  # tests: a kill between the stage's own record of its end and the run's
        record.update(**finished_stage(run_dir).fields)


def source_stage(cfg) -> FinishedStage:
    """``pretrain.from``'s finished stage 1 (:func:`finished_stage`), or one :class:`ConfigError` line."""
    source = source_run(cfg)
    given = f"pretrain.from={getattr(cfg.pretrain, 'from')}"
    stage = finished_stage(source) if source.is_dir() else None
    if stage is not None:
        return stage
    if cfg.resume:  # the run's saved config names the source: only that folder, put back, can serve
        raise ConfigError(f"resume={cfg.resume} fine-tunes the encoder of {given}, and this run's copy of it was not "
                          f"finished when it stopped, so it needs that run again: it "
                          + ("is no longer there" if not source.is_dir() else "holds no finished pretraining stage")
                          + f"; put that run back at {source}, or start a new run")
    if not source.is_dir():
        why = "is not a folder; pass"
    elif (source / STAGE_DIR / ENCODER).is_file():
        why = (f"stopped while its pretraining stage ended: it wrote {STAGE_DIR}/{ENCODER} but no record of the "
               f"stage's end ({STAGE_DIR}/{FINISHED}); finish that stage with `{resume_command(source)}`, or pass")
    else:
        why = f"holds no finished pretraining stage (no {STAGE_DIR}/{ENCODER}); pass"
    raise ConfigError(f"{given} {why} a run directory of lra-train ... pretrain=masked|causal that finished its "
                      "pretraining stage")


def check_source(cfg) -> None:
    """``pretrain.from``: a run whose stage 1 finished, for the same task data, model and attention, and
    (when this run names an objective) the same objective — else one :class:`ConfigError` line."""
    source = source_run(cfg)
    if source is None or (cfg.resume and finished_stage(Path(cfg.resume)) is not None):
        return  # a resume that already holds its copy of the encoder needs the other run no longer
    given = f"pretrain.from={getattr(cfg.pretrain, 'from')}"
    stage = source_stage(cfg)
    try:
        saved = saved_run_config(OmegaConf.load(source / RESOLVED))
    except Exception as exc:
        raise ConfigError(f"{given}: its saved config {source / RESOLVED} is unreadable ({type(exc).__name__}); "
                          "pass a run directory of lra-train") from None
    for key in MATCHING:
        ours, theirs = OmegaConf.select(cfg, key), OmegaConf.select(saved, key)
        ours = OmegaConf.to_container(ours, resolve=True) if isinstance(ours, DictConfig) else ours
        theirs = OmegaConf.to_container(theirs, resolve=True) if isinstance(theirs, DictConfig) else theirs
        if ours != theirs:
            raise ConfigError(f"{given} pretrained with another {key} ({_difference(ours, theirs)}); its encoder "
                              f"fits only the same {', '.join(MATCHING)}: fine-tune with that run's settings")
    own = objective(cfg)
    # what its encoder's stage 1 ran: its record's (a run that fine-tuned another's encoder holds that one's)
    theirs = stage.fields.get("pretrain_objective") or objective(saved)
    if own != "none" and own != theirs:
        raise ConfigError(f"{given} pretrained with pretrain={theirs}, not pretrain={own}; "
                          f"pass pretrain={theirs} (or leave pretrain=none) with it")
    stage.verified_bytes(given)


def _difference(ours, theirs) -> str:
    shown = lambda value: repr(getattr(value, "value", value))  # noqa: E731  an Enum as its config value
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.get("name") != theirs.get("name"):
            return f"{shown(theirs.get('name'))} there, {shown(ours.get('name'))} here"
        keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        return ", ".join(f"{k}: {shown(theirs.get(k))} there, {shown(ours.get(k))} here" for k in keys[:3])
    return f"{shown(theirs)} there, {shown(ours)} here"


def check_objective(cfg) -> None:
    """The causal objective needs a backend with a causal mode."""
    import attention_zoo

    if objective(cfg) != "causal":
        return
    backend = attention_zoo.get(cfg.attention.name).cls
    if not backend.supports_causal:
        raise ConfigError(f"pretrain=causal needs causal attention and attention={cfg.attention.name} has no causal "
                          f"mode; use pretrain=masked, or one of attention={','.join(attention_zoo.causal_names())}")
    from lra.validation import attention_spec

    leak = backend.causal_leak(attention_spec(cfg).options)
    if leak is not None:
        raise ConfigError(f"pretrain=causal cannot use attention={cfg.attention.name} as set: {leak} "
                          "(or pretrain=masked)")
