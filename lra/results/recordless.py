"""Runs a table counts without a usable record: a job that ended before it wrote ``metrics.json`` (a full
disk; killed as it started) and a run whose record is damaged (cut, edited, not JSON). Each is counted in its
cell as failed, placed by the config its folder holds (``.hydra/resolved.yaml``, or the composed
``.hydra/config.yaml`` Hydra writes before the job starts), so that no seed vanishes from a table; one whose
folder holds no readable config either is :class:`Unplaced`, named under the table."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

# What a job writes into its folder before its record: its log, its lock, Hydra's config files.
JOB_MARKS = ("train.log", ".lock", ".hydra")


@dataclass(frozen=True)
class Unplaced:
    """A run folder without a usable record or config: no cell can be told."""

    folder: Path
    why: str
    running: bool = False  # a live process holds the folder: a job starting there now (unfinished, not failed)


def is_job_folder(entries: List[str]) -> bool:
    """Whether a folder whose entries are named ``entries`` is a run's, holding no record: a job wrote its
    log, lock or config files there."""
    from lra.records import METRICS

    return METRICS not in entries and any(mark in entries for mark in JOB_MARKS)


NO_RECORD = ("no run record: the job ended before writing one (a full disk, or killed as it started); its train.log, "
             "where it has one, or the sweep's console says why; run this seed again")
STARTING = "no run record yet: a live process holds the folder, a job starting there now (unfinished)"


def damaged_reason(reason: str) -> str:
    return f"its run record is damaged ({reason}): the run's result is lost; run this seed again"


def stand_in(folder: Path, why: str, warn: Callable[[str], None]) -> Optional[dict]:
    """A record for the run in ``folder`` that has none it can use: failed with ``why`` (running while the
    process that holds the folder is alive: a job starting now), its label, task, attention and seed from the
    config the folder holds; None without a readable config."""
    from omegaconf import OmegaConf

    from lra.config import register_resolvers, saved_run_config
    from lra.results.setups import saved_config
    from lra.run import RunDirectory
    from lra.validation import run_label

    raw = saved_config(folder, warn)
    if raw is None:
        return None
    register_resolvers()
    try:
        cfg = saved_run_config(OmegaConf.create(raw))
        fields = {"task": str(cfg.task.name), "attention": str(cfg.attention.name), "label": run_label(cfg),
                  "seed": int(cfg.seed)}
    except Exception:  # a config today's schemas cannot read: no cell can be told
        return None
    alive = RunDirectory(folder).last_holder_alive()
    return {**fields, "status": "running" if alive else "failed", "error": None if alive else why, "steps": None,
            "run_dir": str(folder), "stand_in": True}


def unplaced_note(unplaced: List[Unplaced]) -> str:
    """The line under a table naming the runs it could not count in a cell; empty when there is none."""
    if not unplaced:
        return ""
    from lra.results.formats import visible

    lines = "\n".join(visible(f"- {item.folder}: {item.why}") for item in unplaced)
    starting = sum(item.running for item in unplaced)
    counted = f"{starting} unfinished, {len(unplaced) - starting} failed" if starting else "counted failed"
    return f"runs in no cell ({len(unplaced)}; {counted}: no usable record, nor a config that tells the cell):\n{lines}"
