"""``hydra/launcher=packed``: a sweep's jobs K at a time in this one process, their training steps
interleaved (:mod:`lra.packing`), so that one GPU runs K jobs' kernels at once instead of time-slicing
K processes. ``hydra.launcher.runs_per_process``: K, or ``auto`` (what the GPU holds: 8 on an H100 80GB,
1 on a CPU).

    lra-train -m hydra/launcher=packed experiment=yoso_table3 task=listops seed=0,1,2

Each job keeps everything a job of the basic launcher has (its folder, record, checkpoints, resume with
the same command, a failure that is its own); a signal stops every job of the running pack, each
recording ``interrupted``, and the sweep, as the basic launcher's sweep stops.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf, open_dict

from hydra_plugins.lra_launcher import advise_continuing
from lra import packing, signals
from lra.errors import ConfigError, UserError

log = logging.getLogger(__name__)


@dataclass
class PackedLauncherConf:
    _target_: str = "hydra_plugins.lra_launcher.packed.PackedLauncher"
    runs_per_process: Any = "auto"  # a whole number >= 1, or auto


class PackedLauncher(Launcher):
    def __init__(self, runs_per_process: Any = "auto") -> None:
        whole = isinstance(runs_per_process, int) and not isinstance(runs_per_process, bool)
        if runs_per_process != "auto" and not (whole and runs_per_process >= 1):
            raise ConfigError(f"invalid value for hydra.launcher.runs_per_process: {runs_per_process!r}; it must be "
                              "a whole number >= 1 or auto: pass hydra.launcher.runs_per_process=<such a value>")
        self.runs_per_process = runs_per_process
        self.config = self.hydra_context = self.task_function = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        if self.config.hydra.job.chdir:
            raise ConfigError("hydra.job.chdir=true gives each job the working directory of its own, which jobs "
                              "packed in one process cannot have: leave hydra.job.chdir at false with "
                              "hydra/launcher=packed (or use another launcher)")
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        configs = []  # every job's config, composed once
        for index, overrides in enumerate(job_overrides, start=initial_job_idx):
            config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(config):
                config.hydra.job.id = config.hydra.job.num = index
            configs.append(config)
        device = _claimed_gpu(configs[0])
        size = packing.pack_size(self.runs_per_process, len(job_overrides), device)
        log.info(f"Launching {len(job_overrides)} jobs in one process, {size} at a time")
        returns = []
        for first in range(0, len(configs), size):
            pack = configs[first:first + size]
            for config, overrides in zip(pack, job_overrides[first:first + size]):
                log.info(f"\t#{config.hydra.job.num} : {' '.join(filter_overrides(overrides))}")
            # Logging is configured once for the pack: a job's own configure_log would drop the train.log
            # handlers the pack's other runs have opened.
            configure_log(pack[0].hydra.job_logging, pack[0].hydra.verbose)
            jobs = [functools.partial(run_job, hydra_context=self.hydra_context, task_function=self.task_function,
                                      config=config, job_dir_key="hydra.sweep.dir",
                                      job_subdir_key="hydra.sweep.subdir", configure_logging=False)
                    for config in pack]
            try:
                outcomes = packing.run_packed(jobs, device)
            except signals.Interrupted as stopped:
                advise_continuing(stopped, self.config.hydra.sweep.dir, "each job of its running pack")
                raise
            for outcome in outcomes:  # run_job keeps a job's Exception in its return; anything else ends the sweep
                if outcome.error is not None:
                    raise outcome.error
            returns.extend(outcome.value for outcome in outcomes if outcome.started)
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns


def _claimed_gpu(config):
    """The GPU this process's jobs train on, decided as the first job (``config``) decides it (trainer.device:
    auto claims a free one on a machine with several), or None where it trains on the CPU."""
    from lra.build import resolve_device

    try:
        device = resolve_device(OmegaConf.select(config, "trainer.device", default="auto"))
    except (UserError, RuntimeError):  # e.g. cuda on a machine without one: the job refuses it with its own line
        return None
    return packing.gpu_index(device)
