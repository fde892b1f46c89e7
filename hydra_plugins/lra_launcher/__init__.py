"""lra-train's own Hydra launchers: local_gpus (processes, k per GPU) and packed (runs in one process)."""

from pathlib import Path


def advise_continuing(stopped, sweep_dir, running: str) -> None:
    """A sweep stopped by a signal: ``stopped`` (its :class:`lra.signals.Interrupted`) tells how to continue it;
    ``running``: which jobs recorded the interruption."""
    sweep = Path(str(sweep_dir)).resolve()
    stopped.advice = (f"the sweep stopped, {running} recorded as interrupted; continue it with the same command and "
                      f"hydra.sweep.dir={sweep}: finished jobs are kept, unfinished ones resume")
