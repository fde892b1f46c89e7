"""Self-pretraining (SPT; Amos, Berant & Gupta, "Never Train from Scratch", ICLR 2024): stage 1 trains
the encoder with a token-prediction head on the task's own training inputs, stage 2 fine-tunes it with
a fresh classification head (:class:`lra.training.Trainer`).

Stage 1 reads the training split's inputs only (never a label, never a validation or test input; the
two documents of a Retrieval pair are two sequences). ``masked``: a share ``mask_probability`` of each
sequence's real tokens is replaced by a learned vector and predicted, the loss over those positions only;
``causal``: every real token predicts the next one through causal attention. Stage 1 lives in
``<run>/pretrain/`` (checkpoints, history.json, encoder.pt when finished) and resumes exactly; its record
is metrics.json's ``pretrain_*`` keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf

from lra import checkpoint
from lra.config import TrainRunConfig, saved_run_config, typed
from lra.errors import ConfigError
from lra.records import read_record
from lra.run import PRETRAIN as STAGE_DIR, RESOLVED

ENCODER = "encoder.pt"  # stage 1's final encoder weights: what stage 2 starts from
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


def finished_encoder(run_dir: Path) -> Optional[Path]:
    """``<run>/pretrain/encoder.pt`` if that run's stage 1 finished, else None."""
    path = Path(run_dir) / STAGE_DIR / ENCODER
    return path if path.is_file() else None


def check_source(cfg) -> None:
    """``pretrain.from``: a run whose stage 1 finished, for the same task data, model and attention, and
    (when this run names an objective) the same objective — else one :class:`ConfigError` line."""
    source = source_run(cfg)
    if source is None or (cfg.resume and finished_encoder(Path(cfg.resume)) is not None):
        return  # a resume that already holds its copy of the encoder needs the other run no longer
    given = f"pretrain.from={getattr(cfg.pretrain, 'from')}"
    if finished_encoder(source) is None:
        why = "is not a folder" if not source.is_dir() else f"holds no finished pretraining stage (no {STAGE_DIR}/{ENCODER})"
        raise ConfigError(f"{given} {why}; pass a run directory of lra-train ... pretrain=masked|causal that "
                          "finished its pretraining stage")
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
    if own != "none" and own != objective(saved):
        raise ConfigError(f"{given} pretrained with pretrain={objective(saved)}, not pretrain={own}; "
                          f"pass pretrain={objective(saved)} (or leave pretrain=none) with it")
    checkpoint.verified_encoder(finished_encoder(source), read_record(source).get("pretrain_encoder_sha256"), given)


def _difference(ours, theirs) -> str:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if ours.get("name") != theirs.get("name"):
            return f"{theirs.get('name')!r} there, {ours.get('name')!r} here"
        keys = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        return ", ".join(f"{k}: {theirs.get(k)!r} there, {ours.get(k)!r} here" for k in keys[:3])
    return f"{theirs!r} there, {ours!r} here"


def check_objective(cfg) -> None:
    """The causal objective needs a backend with a causal mode."""
    import attention_zoo

    if objective(cfg) == "causal" and not attention_zoo.get(cfg.attention.name).cls.supports_causal:
        raise ConfigError(f"pretrain=causal needs causal attention and attention={cfg.attention.name} has no causal "
                          f"mode; use pretrain=masked, or one of attention={','.join(attention_zoo.causal_names())}")
