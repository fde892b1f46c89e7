"""Metric loggers behind one small interface: ``log(metrics, step)``, ``summary(metrics)``,
``finish()``. ``logger=none`` records only to the run directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict

from lra import packing


class NullLogger:
    def log(self, metrics: Dict[str, Any], step: int) -> None:
        pass

    def summary(self, metrics: Dict[str, Any]) -> None:
        pass

    def finish(self, exit_code: int = 0) -> None:
        pass


class WandbLogger(NullLogger):
    """Weights & Biases; a failure of W&B is one warning line in the run's log and training goes on."""

    def __init__(self, cfg, run_dir: Path, resolved_config: dict, name: str, group: str, job_type: str,
                 announce: Callable[[str], None] = print):
        self.run, self.announce, self.failed = None, announce, False
        try:
            import wandb

            mode = os.environ.get("WANDB_MODE") or ("online" if _logged_in(wandb) else "offline")
            self.run = wandb.init(
                project=cfg.project, entity=cfg.entity, group=cfg.group or group, job_type=job_type,
                name=name, tags=list(cfg.tags), config=resolved_config, dir=str(run_dir), mode=mode,
                resume="allow", id=_run_id(run_dir),
                **({"reinit": "create_new"} if packing.in_pack() else {}),  # a pack's runs log side by side
            )
            self.run.summary["run_dir"] = str(run_dir)
        except Exception as exc:  # W&B must never fail training
            self.run = None
            announce(f"warning: W&B logging is off for this run: wandb.init failed ({_first_line(exc)}); the run "
                     "trains and records to its folder as without W&B")

    def _safely(self, action) -> None:
        if self.run is None:
            return
        try:
            action()
        except Exception as exc:
            if not self.failed:  # once: a W&B outage would repeat it at every step
                self.failed = True
                self.announce(f"warning: W&B logging failed ({_first_line(exc)}); training goes on, and its record "
                              "is in the run's folder whatever W&B received")

    def log(self, metrics, step):
        self._safely(lambda: self.run.log(metrics, step=step))

    def summary(self, metrics):
        self._safely(lambda: self.run.summary.update(metrics))

    def finish(self, exit_code: int = 0):
        self._safely(lambda: self.run.finish(exit_code=exit_code))


def _logged_in(wandb) -> bool:
    """Credentials from WANDB_API_KEY or ``wandb login`` (netrc), checked without prompting."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return bool(wandb.login(prompt=False))
    except Exception:
        return False


def _run_id(run_dir: Path) -> str:
    """A W&B run id stable across resumes of the same run directory."""
    import hashlib

    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def sweep_group(sweep_dir: Path) -> str:
    """A sweep's W&B group: its command-line overrides (from the multirun.yaml Hydra writes before any
    job starts) and its folder, e.g. ``attention=softmax,yoso seed=0,1 · 2026-11-23/10-31-07``;
    at most 128 characters, W&B's limit."""
    sweep_dir = Path(sweep_dir)
    when = f"{sweep_dir.parent.name}/{sweep_dir.name}"
    try:
        from omegaconf import OmegaConf

        overrides = [str(o) for o in OmegaConf.load(sweep_dir / "multirun.yaml").hydra.overrides.task]
    except Exception:  # no multirun.yaml (a custom launcher): the folder alone
        overrides = []
    described = " ".join(overrides)
    suffix = f" · {when}"
    if len(described) + len(suffix) > 128:
        described = described[: 128 - len(suffix) - 1] + "…"
    return f"{described}{suffix}" if described else when


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"


def build_logger(cfg, run_dir: Path, resolved_config: dict, name: str, group: str, job_type: str,
                 announce: Callable[[str], None] = print):
    if cfg.name == "none":
        return NullLogger()
    if cfg.name == "wandb":
        return WandbLogger(cfg, run_dir, resolved_config, name, group, job_type, announce)
    raise ValueError(f"unknown logger {cfg.name!r}")
