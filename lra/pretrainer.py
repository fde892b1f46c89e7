"""Self-pretraining's stage 1 (:mod:`lra.pretraining` holds its rules): the training loop of
:class:`lra.training.Trainer` on the token-prediction objective, and the hand-over to stage 2."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from lra import checkpoint, distributed
from lra.data.cache import sha256_file
from lra.errors import UserError
from lra.io import atomic_write_json
from lra.pretraining import (ENCODER, STAGE_DIR, draw_masked, finished_encoder, masking_draws, objective, source_run,
                             stage_config, token_loss)
from lra.records import HISTORY, read_record
from lra.run import RunDirectory
from lra.training import Trainer
from lra.validation import run_label


class Pretrainer(Trainer):
    """Stage 1: the training loop of :class:`Trainer` on the language-model objective, without evaluation
    (no validation or test input is read): a history entry of the training loss every
    ``pretrain.history_every`` steps, then the encoder's weights saved for stage 2."""

    stage_name = "pretraining "
    lr_setting = "pretrain.lr"

    def __init__(self, cfg, run: RunDirectory | Path, announce=print, ranks: distributed.Ranks = distributed.Ranks(),
                 record=None, attention=None):
        self.objective = objective(cfg)
        self.mask_probability = float(cfg.pretrain.mask_probability)
        super().__init__(stage_config(cfg), run, announce, ranks, record=record, attention=attention)
        self.label = f"{run_label(cfg)} pretraining"

    @property
    def stage_dir(self) -> Path:
        return self.run_dir / STAGE_DIR

    @property
    def encoder_path(self) -> Path:
        return self.stage_dir / ENCODER

    def build_components(self, cfg, announce, ranks):
        from lra.build import build

        return build(cfg, self.attention, announce, ranks, language_model=self.objective)

    def describe_stage(self) -> dict:
        return {"pretrain_status": "running", "pretrain_objective": self.objective,
                "pretrain_num_parameters": self.num_parameters,
                "pretrain_mask_probability": self.mask_probability if self.objective == "masked" else None,
                "pretrain_max_steps": self.cfg.trainer.max_steps, "pretrain_from": None}

    def training_loss(self, indices):
        ids, masks, _ = self.data.splits["train"].gather(indices, self.max_length)  # inputs only, never labels
        documents = len(ids)  # Retrieval: both documents of a pair, as two sequences
        ids, masks = torch.cat(self._to_device(ids)), torch.cat(self._to_device(masks))
        real = self.model.encoder.real_tokens(ids, masks)
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            if self.objective == "masked":
                draws = masking_draws(self.cfg.seed, self.state.step, indices, documents, ids.shape[1])
                (draws,) = self._to_device([draws.numpy()])  # pinned and asynchronous on CUDA, as the batch
                masked = draw_masked(real, self.mask_probability, draws)
                logits = self.train_model(ids, masks, masked)
                targets, counted = ids, masked
            else:  # causal: position t predicts token t + 1
                logits = self.train_model(ids, masks)[:, :-1]
                targets, counted = ids[:, 1:], real[:, :-1] & real[:, 1:]
        loss, correct, predictions = token_loss(logits, targets, counted)
        return loss, correct, masks.numel(), predictions

    def _validate(self, logger, train_metrics: dict) -> None:
        entry = {"step": self.state.step, "loss": train_metrics["train/loss"],
                 "token_accuracy": train_metrics["train/accuracy"], "lr": train_metrics["train/lr"]}
        self.state.history.append(entry)
        if self.ranks.main:
            atomic_write_json(self.stage_dir / HISTORY, self.state.history)
        self._record_progress("running")

    def _record_progress(self, status: str, **extra) -> None:
        s = self.state
        last = s.history[-1] if s.history else {}
        self.record.update(
            pretrain_status=status, pretrain_steps=s.step, pretrain_loss=last.get("loss"),
            pretrain_token_accuracy=last.get("token_accuracy"), pretrain_history=s.history,
            pretrain_wall_time_seconds=s.wall_seconds, pretrain_resumed_at_steps=s.resumed_at_steps,
            pretrain_train_tokens_per_second=s.train_tokens / s.train_seconds if s.train_seconds else None, **extra)

    def _test(self, logger) -> dict:
        """Stage 1's end: the encoder's weights, saved atomically (its presence marks the stage finished)."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.encoder.state_dict().items()}
        if self.ranks.main:
            checkpoint.save(self.encoder_path, {"encoder": weights, "steps": self.state.step})
        self._record_progress("completed", pretrain_encoder=str(self.encoder_path),
                              pretrain_encoder_sha256=sha256_file(self.encoder_path) if self.ranks.main else None)
        logger.summary({"pretrain/loss": self.record.data.get("pretrain_loss"), "pretrain/steps": self.state.step})
        return weights


def pretrained_encoder(cfg, run: RunDirectory, record, announce, ranks, attention, start_logger) -> dict:
    """The encoder weights stage 2 starts from: this run's own finished stage 1 (a resume), the finished
    stage 1 of ``pretrain.from`` (copied into this run, so that the run stays whole if the other one is
    moved or deleted; the record takes its ``pretrain_*`` fields and names where they came from), or
    stage 1 run (or resumed) here."""
    run_dir = run.path
    stage_dir = run_dir / STAGE_DIR
    run.remove_interrupted_writes(stage_dir)  # a kill while the encoder was written
    own = finished_encoder(run_dir)
    if own is not None:  # stage 1 finished (or was copied) before a kill or preemption: its fields are kept
        fields = {k: v for k, v in read_record(run_dir).items() if k.startswith("pretrain_")}
        recorded = fields.get("pretrain_encoder_sha256")
        if recorded is None:  # killed between the encoder's write and its record's: the encoder is this run's own
            data = own.read_bytes()
            fields["pretrain_encoder_sha256"] = hashlib.sha256(data).hexdigest()
        else:  # checked as pretrain.from's is: a replaced encoder is never fine-tuned from
            data = checkpoint.verified_encoder(own, recorded, f"resume={run_dir}", fix=(
                "put this run's encoder back, or start a new run (stage 2 would otherwise fine-tune another encoder "
                "than its record names)"))
        record.update(**fields)
        return _load_encoder(own, data)
    source = source_run(cfg)
    if source is not None:
        path = finished_encoder(source)
        fields = {k: v for k, v in read_record(source).items() if k.startswith("pretrain_")}
        data = checkpoint.verified_encoder(path, fields.get("pretrain_encoder_sha256"), f"pretrain.from={source}")
        weights = _load_encoder(path, data)
        own = stage_dir / ENCODER
        if ranks.main:  # the checked bytes, unchanged: the copy has the SHA-256 the record names
            checkpoint.save_bytes(own, data)
        record.update(**(fields | {"pretrain_from": str(source), "pretrain_encoder": str(own)}))
        announce(f"fine-tuning the encoder pretrained in {source}")
        return weights
    pretrainer = Pretrainer(cfg, run, announce, ranks, record=record, attention=attention)
    pretrainer.try_resume()
    logger = start_logger(pretrainer.stage_dir, pretrainer.label, "pretrain")
    try:
        weights = pretrainer.run(logger)
    except BaseException:
        logger.finish(1)
        raise
    logger.finish(0)
    return weights


def _load_encoder(path: Path, data: bytes | None = None) -> dict:
    """The encoder weights in ``path`` (or in ``data``, its bytes already read and checked)."""
    try:
        return (checkpoint.load(path) if data is None else checkpoint.load_bytes(data))["encoder"]
    except Exception as exc:
        raise UserError(f"cannot read the pretrained encoder {path} ({type(exc).__name__}); run the "
                        "pretraining stage again (a new run with the same pretrain=...)") from None
