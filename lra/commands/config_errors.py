"""Turn Hydra / OmegaConf composition errors into one line that names the fix."""

from __future__ import annotations

import difflib
from typing import Iterable, List, Optional

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, InterpolationResolutionError, ValidationError


def _closest(word: str, choices: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def _causes(exc: BaseException) -> List[BaseException]:
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def explain(exc: BaseException, valid_keys) -> Optional[str]:
    """A one-line explanation, or None if ``exc`` is not a configuration error.

    ``valid_keys(path)`` lists the keys of the config node at a dotted path (for suggestions).
    """
    for cause in _causes(exc):
        if isinstance(cause, MissingConfigException) and cause.options is not None:
            group, _, choice = (cause.missing_cfg_file or "").rpartition("/")
            if group:
                options = sorted(o for o in cause.options if not o.startswith("_"))
                return (f"unknown choice '{choice}' for {group}{_closest(choice, options)}; "
                        f"valid: {', '.join(options)} (e.g. {group}={options[0]})")
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
            parent, _, key = str(cause.full_key).rpartition(".")
            keys = valid_keys(parent)
            where = f"under {parent}" if parent else "at the top level"
            return (f"unknown key '{cause.full_key}'{_closest(key, keys)}; valid keys {where}: "
                    f"{', '.join(keys)}")
        if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
            first_line = str(cause).splitlines()[0]
            return f"invalid value for {cause.full_key}: {first_line}"
        if isinstance(cause, OverrideParseException):
            return f"cannot parse the override: {str(cause).splitlines()[0]}"
        if isinstance(cause, InterpolationResolutionError):
            # "ValueError raised while resolving interpolation: <the resolver's message>"
            return str(cause).splitlines()[0].split("resolving interpolation: ", 1)[-1]
    if isinstance(exc, ConfigCompositionException):
        return str(exc).splitlines()[0]
    return None


def schema_keys(schema):
    """``valid_keys`` for an app whose config is the dataclass ``schema``: the keys at a dotted path."""
    from omegaconf import DictConfig, OmegaConf

    def valid_keys(path: str) -> list:
        node = OmegaConf.structured(schema)
        node = OmegaConf.select(node, path) if path else node
        return sorted(node.keys()) if isinstance(node, DictConfig) else []

    return valid_keys


def log_to_file(message: str, level: str = "ERROR") -> None:
    """Log to the run's log file only, for a line the console already gets another way (an error's
    one line on stderr, a run's result on stdout)."""
    import logging

    record = logging.makeLogRecord({"name": "lra", "levelno": getattr(logging, level), "levelname": level, "msg": message})
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


def remove_hydra_leftovers(run_dir, job_name: str) -> None:
    """A refused fresh config leaves no folder behind: remove the one Hydra made for it (its
    ``.hydra/`` and log file, nothing else) and the folder above it if that is now empty."""
    import contextlib
    import shutil
    from pathlib import Path

    run_dir = Path(run_dir)
    hydra_files = {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", f"{job_name}.log"}
    if not run_dir.is_dir() or not {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if not p.is_dir()} <= hydra_files:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    if run_dir.parent.resolve() != Path.cwd().resolve():
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()


def exit_on_user_error(exc, fresh_folder: bool = True) -> None:
    """End a Hydra job that met bad input: one line on stderr and the error's exit status (raising
    would add Hydra's own "Error executing job" line); a refused config leaves no folder when Hydra
    made it for this job (``fresh_folder``)."""
    import sys

    from hydra.core.hydra_config import HydraConfig

    from lra.errors import ConfigError

    message = f"error: {exc}"
    log_to_file(message)
    if isinstance(exc, ConfigError) and fresh_folder:
        hydra_cfg = HydraConfig.get()
        remove_hydra_leftovers(hydra_cfg.runtime.output_dir, hydra_cfg.job.name)
    print(message, file=sys.stderr)
    sys.exit(exc.exit_code)


def one_line_user_errors(task):
    """Decorate a Hydra task function (under ``hydra.main``) so that its bad-input errors end the
    process with one line (see :func:`exit_on_user_error`)."""
    import functools

    from lra.errors import UserError

    @functools.wraps(task)
    def wrapped(cfg):
        try:
            return task(cfg)
        except UserError as exc:
            exit_on_user_error(exc)

    return wrapped


def run_app(run, valid_keys) -> None:
    """Run a Hydra app's ``run`` so that a config mistake ends with one line (exit 2) naming the fix;
    other errors keep their traceback. Set HYDRA_FULL_ERROR=1 to see Hydra's own traceback."""
    import os
    import sys

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        run()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    from lra.errors import UserError

    try:
        run()
    except UserError as exc:  # bad input the app recognised: its message names the fix
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Exception as exc:
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, UserError):  # e.g. a launcher's option, raised while Hydra instantiates it
            print(f"error: {cause}", file=sys.stderr)
            sys.exit(cause.exit_code)
        message = explain(exc, valid_keys)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
