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
    if cfg.resume:
        train_on_recorded_data(cfg, run, announce)
    record = run.new_record(provisional=bool(cfg.resume), task=cfg.task.name, attention=attention.name,
                            label=run_label(cfg), seed=cfg.seed, status="running",
                            git_commit=git_commit(), pretrain_objective=objective(cfg))
    logger = None

    def start_logger(folder: Path, name: str, job_type: str):
        return build_logger(cfg.logger, folder, resolved_config, name=name, group=group,
                            job_type=job_type, announce=announce) if ranks.main else NullLogger()

    try:
        encoder, began_earlier = pretrained_encoder(cfg, run, record, announce, ranks, attention, start_logger) \
            if pretrains(cfg) else (None, True)  # whether this stage began before this process, if it resumes
        trainer = Trainer(cfg, run, announce, ranks, record=record, attention=attention)
        if encoder is not None:
            trainer.start_from_encoder(encoder)
            if record.data.get("pretrain_from") is None:  # this run's own stage 1 (not another run's, pretrain.from)
                trainer.follow_engine(record.data.get("pretrain_attention_engine"), "its stage 1")
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


def train_on_recorded_data(cfg, run: RunDirectory, announce) -> None:
    """``task.source=auto`` chooses its data at each start (the one prepared cache of the task's settings,
    else the generator): a resume takes the source (and raw folder) its record says the run trained on, so
    that data prepared since (a release beside generated data) neither changes a run midway nor blocks its
    resume. In ``cfg`` (a typed run config) only: the saved config, which the checkpoints' digest covers, stays as it was."""
    import dataclasses

    from lra.data.sources import AUTO, SOURCES

    if cfg.task.source != AUTO:
        return
    record = run.read_record()
    source, folder = record.get("data_source"), record.get("data_raw_folder")
    if source not in SOURCES.get(cfg.task.name, ()):
        return  # no record (or an older one): auto chooses, and the checkpoint's data digest judges
    pinned = folder if cfg.task.path is None and isinstance(folder, str) and folder else cfg.task.path
    cfg.task = dataclasses.replace(cfg.task, source=source, path=pinned)  # the task's rules run again
    announce(f"task.source=auto: the {source} data the run trained on" + (f" (from {folder})" if folder else ""))
