"""``hydra/launcher=local_gpus``: Hydra's joblib launcher with ``jobs_per_gpu`` workers per GPU. Each
job claims a GPU slot through :mod:`lra.gpus` (trainer.device=auto), so k jobs share a GPU at most.
One LRA reference job (2 layers, dim 64) leaves a modern GPU mostly idle; k jobs fill it.

    lra-train -m hydra/launcher=local_gpus hydra.launcher.jobs_per_gpu=4 attention=softmax,yoso seed=0,1,2

A signal (SIGINT, SIGTERM, SIGHUP: lra/signals.py) to the sweep, or to any of its workers, stops the whole
sweep as it stops a sweep of the basic launcher: the signal is passed on to every worker, each running
job records ``interrupted``, the workers end (an interrupted worker takes no further job, lra/commands/
train.py), and only then does the sweep process end, with the signal's status.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Sequence

from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from hydra_plugins.lra_launcher import advise_continuing
from lra import signals
from lra.errors import ConfigError

SWEEP_PARENT = "LRA_SWEEP_PARENT"  # a worker's sweep process: told when a worker is interrupted
TRACKER_WARNINGS = "ignore::UserWarning:multiprocessing.resource_tracker"
WORKER_PATIENCE_S = 120.0  # how long the sweep waits for its workers' records before joblib kills them


@dataclass
class LocalGpusLauncherConf(JobLibLauncherConf):
    _target_: str = "hydra_plugins.lra_launcher.local_gpus.LocalGpusLauncher"
    n_jobs: int = -1  # -1: GPUs × jobs_per_gpu (one worker on a machine without a GPU)
    jobs_per_gpu: int = 1


class LocalGpusLauncher(JoblibLauncher):
    def __init__(self, jobs_per_gpu: int = 1, **kwargs: Any) -> None:
        if not isinstance(jobs_per_gpu, int) or jobs_per_gpu < 1:
            raise ConfigError(f"invalid value for hydra.launcher.jobs_per_gpu: {jobs_per_gpu!r}; it must be a whole "
                              "number >= 1: pass hydra.launcher.jobs_per_gpu=<such a value>")
        super().__init__(**kwargs)
        self.jobs_per_gpu = jobs_per_gpu

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        import torch

        if self.joblib.get("n_jobs", -1) == -1:
            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
            self.joblib["n_jobs"] = max(1, gpus) * self.jobs_per_gpu
        os.environ["LRA_JOBS_PER_GPU"] = str(self.jobs_per_gpu)  # inherited by the workers, read by lra.gpus
        os.environ[SWEEP_PARENT] = str(os.getpid())
        # A sweep stopped by a signal ends with its workers' queues unreleased; multiprocessing's resource
        # tracker (started below, with this process's warning options) removes them and would add a
        # warning after the sweep's one error line.
        if TRACKER_WARNINGS not in sys.warnoptions:
            sys.warnoptions.append(TRACKER_WARNINGS)
        try:
            with signals.on_interruption(stop_workers):
                return super().launch(job_overrides, initial_job_idx)
        except signals.Interrupted as stopped:
            advise_continuing(stopped, self.config.hydra.sweep.dir, "each job it was running")
            raise


def _workers() -> List[int]:
    """This process's loky worker processes (not its resource trackers), from /proc."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and b"LokyProcess" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _exited(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


def stop_workers(number: int) -> None:
    """The sweep process's first signal: pass it on to every worker and wait until each has recorded its
    job and ended (joblib would kill them at once, leaving their records ``running``)."""
    workers = _workers()
    for pid in workers:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + WORKER_PATIENCE_S
    while not all(_exited(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
