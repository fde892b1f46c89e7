"""One ``lra-train`` run from start to end: self-pretraining's stage 1 when the config asks for it
(:mod:`lra.pretrainer`), then training (or fine-tuning) and the test (:class:`lra.training.Trainer`),
with one record."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from lra import distributed
from lra.faults import fault_point
from lra.loggers import NullLogger, build_logger
from lra.pretrainer import pretrained_encoder
from lra.pretraining import objective, pretrains
from lra.records import git_commit
from lra.run import RunDirectory
from lra.training import Trainer
from lra.validation import attention_spec, run_label


def train(cfg, run: RunDirectory, resolved_config: dict, group: Optional[str], announce=print) -> dict:
    """Build everything from ``cfg`` (validated), resume from the run directory if it holds a
    checkpoint, (pretrain,) train, test. ``run`` is owned by this process (:meth:`RunDirectory.claim`).

    Any failure rewrites ``metrics.json`` with status ``failed`` and the error, a signal with status
    ``interrupted`` and the signal's name (:meth:`lra.records.RunRecord.stop`), then re-raises; except
    that a resume writes nothing until its checkpoint is loaded, so a resume that fails leaves the
    previous record as it was.
    """
    ranks = distributed.setup()
    try:
        return _train(cfg, run, resolved_config, group, announce, ranks)
    finally:
        distributed.teardown()


def _train(cfg, run: RunDirectory, resolved_config: dict, group: Optional[str], announce, ranks) -> dict:
    attention = attention_spec(cfg)  # validated options
    record = run.new_record(provisional=bool(cfg.resume), task=cfg.task.name, attention=attention.name,
                            label=run_label(cfg), seed=cfg.seed, status="running",
                            git_commit=git_commit(), pretrain_objective=objective(cfg))
    logger = None

    def start_logger(folder: Path, name: str, job_type: str):
        return build_logger(cfg.logger, folder, resolved_config, name=name, group=group,
                            job_type=job_type) if ranks.main else NullLogger()

    try:
        encoder, began_earlier = pretrained_encoder(cfg, run, record, announce, ranks, attention, start_logger) \
            if pretrains(cfg) else (None, True)  # whether this stage began before this process, if it resumes
        trainer = Trainer(cfg, run, announce, ranks, record=record, attention=attention)
        if encoder is not None:
            trainer.start_from_encoder(encoder)
        trainer.try_resume(continuing=bool(cfg.resume) and began_earlier)
        logger = start_logger(run.path, trainer.label, cfg.task.name)
        result = trainer.run(logger)
        logger.finish(0)
        return result
    except BaseException as exc:
        try:
            fault_point("stopping")  # tests: a second signal while the run stops
            record.stop(exc)
        except OSError:  # e.g. the disk is full: the last record written stays as it was
            pass
        if logger is not None:
            logger.finish(1)
        raise
