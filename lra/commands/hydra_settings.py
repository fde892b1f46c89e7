"""Hydra settings that ``lra-train`` refuses, checked on the composed config before Hydra makes a run or sweep
folder (:class:`RefuseFolderWrites`, a callback of ``conf/config.yaml``) and by a dry run (``--cfg``): each would
write into a run folder before the run owns it (:mod:`lra.run`), or change the folder that relative paths are
read against. Each is one :class:`~lra.errors.ConfigError` line naming the fix."""

from __future__ import annotations

from typing import List, Optional, Tuple

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from lra.errors import ConfigError


def check(hydra_cfg: DictConfig) -> None:
    """Refuse ``hydra.job.chdir=true``, a ``hydra.output_subdir`` and a job log configuration with file handlers."""
    if hydra_cfg.job.chdir:
        raise ConfigError("hydra.job.chdir=true gives each job the working directory of its own (its run folder), and "
                          "lra-train reads relative paths (data_dir and LRA_DATA_DIR, resume=, pretrain.from, "
                          "task.path) against the folder it starts in: leave hydra.job.chdir out (false), and give "
                          "each path relative to where you start lra-train, or absolute")
    if hydra_cfg.output_subdir is not None:
        raise ConfigError(f"hydra.output_subdir={hydra_cfg.output_subdir} has Hydra write its config files into the "
                          "run folder before lra-train owns it (over those of a run already there); lra-train saves "
                          "each run's .hydra/ itself: leave hydra.output_subdir out (null)")
    writers = file_handlers(hydra_cfg.get("job_logging"))
    if writers:
        name, filename = writers[0]
        choice = (OmegaConf.select(hydra_cfg, "runtime.choices", default=None) or {}).get("hydra/job_logging")
        chosen = f" (hydra/job_logging={choice})" if choice and choice != "console" else ""
        raise ConfigError(f"hydra.job_logging.handlers.{name}{chosen} writes a log file ({filename}), which Hydra "
                          "opens as each job starts, before lra-train owns the run's folder (a refused command, or a "
                          "second one, would write into a run's log); lra-train logs each run to its own train.log: "
                          "leave hydra/job_logging out (console), and give the job's logging no file handler")


def file_handlers(logging_cfg) -> List[Tuple[str, Optional[str]]]:
    """(name, filename as written) of each handler of a logging configuration (``logging.config.dictConfig``'s,
    as Hydra's ``hydra.job_logging``) that writes a file: one given a ``filename``, or whose class is a
    :class:`logging.FileHandler`. ``logging.config`` opens every handler it is given, used or not."""
    handlers = OmegaConf.select(logging_cfg, "handlers", default=None) if logging_cfg is not None else None
    if not isinstance(handlers, DictConfig):
        return []
    found = []
    for name in handlers:
        handler = OmegaConf.to_container(handlers._get_node(name), resolve=False)
        if isinstance(handler, dict) and ("filename" in handler or _writes_files(handler.get("class"))):
            found.append((str(name), handler.get("filename")))
    return found


def _writes_files(class_path) -> bool:
    """Whether ``class_path`` (``logging.handlers.RotatingFileHandler``) names a FileHandler class."""
    import importlib
    import logging

    if not isinstance(class_path, str) or "." not in class_path:
        return False
    module, _, name = class_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except Exception:  # logging.config refuses it itself, before any file is opened
        return False
    return isinstance(found, type) and issubclass(found, logging.FileHandler)


class RefuseFolderWrites(Callback):
    """Runs :func:`check` once Hydra has composed the config, before it makes any folder: one line and exit 2
    (a SystemExit: Hydra turns a callback's Exception into a warning and goes on)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _refuse(config.hydra)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _refuse(config.hydra)


def _refuse(hydra_cfg: DictConfig) -> None:
    from lra.commands import config_errors

    try:
        check(hydra_cfg)
    except ConfigError as exc:
        config_errors.exit_on_user_error(exc)
