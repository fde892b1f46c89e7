"""``hydra/launcher=local_gpus``: Hydra's joblib launcher with ``jobs_per_gpu`` workers per GPU. Each
job claims a GPU slot through :mod:`lra.gpus` (trainer.device=auto), so k jobs share a GPU at most.
One LRA reference job (2 layers, dim 64) leaves a modern GPU mostly idle; k jobs fill it.

    lra-train -m hydra/launcher=local_gpus hydra.launcher.jobs_per_gpu=4 attention=softmax,yoso seed=0,1,2
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

from hydra_plugins.hydra_joblib_launcher.config import JobLibLauncherConf
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher

from lra.errors import ConfigError


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
        return super().launch(job_overrides, initial_job_idx)
