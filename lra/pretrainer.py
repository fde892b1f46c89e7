"""Self-pretraining's stage 1 (:mod:`lra.pretraining` holds its rules): the training loop of
:class:`lra.training.Trainer` on the token-prediction objective, and the hand-over to stage 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lra import checkpoint, distributed
from lra.errors import UserError
from lra.io import atomic_write_json
from lra.pretraining import (STAGE_DIR, draw_masked, finish_stage, finished_stage, masking_draws, objective,
                             source_run, source_stage, stage_config, token_loss)
from lra.records import HISTORY
from lra.run import RunDirectory
from lra.training import Trainer
from lra.validation import run_label


class Pretrainer(Trainer):
    """Stage 1: the training loop of :class:`Trainer` on the language-model objective, without evaluation
    (no validation or test input is read): a history entry of the training loss every
    ``pretrain.history_every`` steps, then the encoder's weights saved for stage 2."""

    stage_name = "pretraining "
    lr_setting = "pretrain.lr"
    resumes_field = "pretrain_resumed_at_steps"
    clock_fields = {"wall_seconds": "pretrain_wall_time_seconds"}
    steps_field = "pretrain_steps"
    engine_field = "pretrain_attention_engine"

    def __init__(self, cfg, run: RunDirectory | Path, announce=print, ranks: distributed.Ranks = distributed.Ranks(),
                 record=None, attention=None):
        self.objective = objective(cfg)
        self.mask_probability = float(cfg.pretrain.mask_probability)
        super().__init__(stage_config(cfg), run, announce, ranks, record=record, attention=attention)
        self.label = f"{run_label(cfg)} pretraining"

    @property
    def stage_dir(self) -> Path:
        return self.run_dir / STAGE_DIR

    def build_components(self, cfg, announce, ranks):
        from lra.build import build

        return build(cfg, self.attention, announce, ranks, language_model=self.objective)

    def describe_stage(self) -> dict:
        return {"pretrain_status": "running", "pretrain_objective": self.objective,
                "pretrain_num_parameters": self.num_parameters,
                "pretrain_mask_probability": self.mask_probability if self.objective == "masked" else None,
                "pretrain_max_steps": self.cfg.trainer.max_steps, "pretrain_from": None}

    def training_batch(self, indices):
        ids, masks, _ = self.data.splits["train"].gather(indices, self.max_length)  # inputs only, never labels
        documents = len(ids)  # Retrieval: both documents of a pair, as two sequences
        arrays = [np.concatenate(ids), np.concatenate(masks)]
        if self.objective == "masked":
            arrays.append(masking_draws(self.cfg.seed, self.state.step, indices, documents, ids[0].shape[1]).numpy())
        return arrays, arrays[1].size

    def training_loss_on(self, arrays):
        ids, masks = arrays[0], arrays[1]
        real = self.model.encoder.real_tokens(ids, masks)
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            if self.objective == "masked":
                masked = draw_masked(real, self.mask_probability, arrays[2])
                logits = self.train_model(ids, masks, masked)
                targets, counted = ids, masked
            else:  # causal: position t predicts token t + 1
                logits = self.train_model(ids, masks)[:, :-1]
                targets, counted = ids[:, 1:], real[:, :-1] & real[:, 1:]
        return token_loss(logits, targets, counted)

    def _validate(self, logger, train_metrics: dict) -> None:
        entry = {"step": self.state.step, "loss": train_metrics["train/loss"],
                 "token_accuracy": train_metrics["train/accuracy"], "lr": train_metrics["train/lr"]}
        self.state.history.append(entry)
        if self.ranks.main:
            atomic_write_json(self.stage_dir / HISTORY, self.state.history)
        self._record_progress("running")

    def _record_progress(self, status: str, **extra) -> None:
        self.record.update(**self._progress_fields(status), **extra)

    def _progress_fields(self, status: str) -> dict:
        s = self.state
        last = s.history[-1] if s.history else {}
        return dict(
            pretrain_status=status, pretrain_steps=s.step, pretrain_loss=last.get("loss"),
            pretrain_token_accuracy=last.get("token_accuracy"), pretrain_history=s.history,
            pretrain_wall_time_seconds=s.wall_seconds, pretrain_resumed_at_steps=s.resumed_at_steps,
            pretrain_train_tokens_per_second=s.train_tokens / s.train_seconds if s.train_seconds else None)

    def _test(self, logger) -> dict:
        """Stage 1's end: the encoder's weights, then the records of the stage's end (:func:`finish_stage`)."""
        weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.encoder.state_dict().items()}
        fields = {k: v for k, v in (self.record.data | self._progress_fields("completed")).items()
                  if k.startswith("pretrain_")}
        finish_stage(self.run_dir, lambda path: checkpoint.save(path, {"encoder": weights, "steps": self.state.step}),
                     fields, self.record, self.ranks.main)
        logger.summary({"pretrain/loss": self.record.data.get("pretrain_loss"), "pretrain/steps": self.state.step})
        return weights


def pretrained_encoder(cfg, run: RunDirectory, record, announce, ranks, attention, start_logger) -> tuple:
    """(the encoder weights stage 2 starts from, whether stage 1 had finished before this process: a resume
    that continues in stage 2). The weights: this run's own finished stage 1 (a resume; the record's
    ``pretrain_*`` fields are read back from it, whatever the record said when the run stopped), the finished
    stage 1 of ``pretrain.from`` (copied into this run, so that the run stays whole if the other one is moved
    or deleted; the record takes its ``pretrain_*`` fields and names where they came from), or stage 1 run
    (or resumed) here."""
    run_dir = run.path
    run.remove_interrupted_writes(run_dir / STAGE_DIR)  # a kill while the encoder or its record was written
    own = finished_stage(run_dir)
    if own is not None:  # checked as pretrain.from's is: a replaced encoder is never fine-tuned from
        data = own.verified_bytes(f"resume={run_dir}", fix=(
            "put this run's encoder back, or start a new run (stage 2 would otherwise fine-tune another encoder "
            "than its record names)"))
        record.update(**own.fields)
        return _load_encoder(own.encoder, data), True
    source = source_run(cfg)
    if source is not None:
        theirs = source_stage(cfg)
        data = theirs.verified_bytes(f"pretrain.from={source}")
        weights = _load_encoder(theirs.encoder, data)
        # the checked bytes, unchanged: the copy has the SHA-256 the record names
        finish_stage(run_dir, lambda path: checkpoint.save_bytes(path, data), theirs.fields | {"pretrain_from": str(source)},
                     record, ranks.main)
        announce(f"fine-tuning the encoder pretrained in {source}")
        return weights, False
    pretrainer = Pretrainer(cfg, run, announce, ranks, record=record, attention=attention)
    pretrainer.try_resume(continuing=bool(cfg.resume))
    logger = start_logger(pretrainer.stage_dir, pretrainer.label, "pretrain")
    try:
        weights = pretrainer.run(logger)
    except BaseException:
        logger.finish(1)
        raise
    logger.finish(0)
    return weights, False


def _load_encoder(path: Path, data: bytes | None = None) -> dict:
    """The encoder weights in ``path`` (or in ``data``, its bytes already read and checked)."""
    try:
        return (checkpoint.load(path) if data is None else checkpoint.load_bytes(data))["encoder"]
    except Exception as exc:
        raise UserError(f"cannot read the pretrained encoder {path} ({type(exc).__name__}); run the "
                        "pretraining stage again (a new run with the same pretrain=...)") from None
