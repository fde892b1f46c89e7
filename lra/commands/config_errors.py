"""Turn Hydra / OmegaConf composition errors into one line that names the fix."""

from __future__ import annotations

import difflib
import errno
import os
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
            override = getattr(cause, "override", None)
            text = f" {override!r}" if override else ""
            return (f"cannot parse the override{text}: {str(cause).splitlines()[0]}; a value with spaces or any of "
                    "( ) [ ] { } , : = ' \" must be quoted for Hydra as well as for the shell, e.g. "
                    "\"task.path='/data/my files (copy)'\"")
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


DISK_ERRORS = {  # errno → the fix, for errors of the file system a command writes to
    errno.ENOSPC: "free space on that disk, or write elsewhere",
    errno.EDQUOT: "free space within your quota, or write elsewhere",
    errno.ENAMETOOLONG: "use a shorter name (at most 255 bytes per path component)",
    errno.EROFS: "write to a writable file system",
    errno.EACCES: "write to a folder you may write to (or fix its permissions)",
    errno.EPERM: "write to a folder you may write to (or fix its permissions)",
}


def os_error_line(exc: BaseException) -> Optional[str]:
    """One line for a full disk, a read-only or forbidden folder or a name too long (anywhere in
    ``exc``'s causes), or None for any other error."""
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno in DISK_ERRORS:
            name = str(cause.filename) if cause.filename else ""
            where = f" ({name if len(name) <= 160 else name[:70] + ' … ' + name[-70:]})" if name else ""
            return f"{os.strerror(cause.errno)}{where}: {DISK_ERRORS[cause.errno]}; nothing finished was changed"
    return None


def exit_on_disk_error(exc: BaseException) -> None:
    """End the process with one line (exit 1) if ``exc`` is a disk error (:func:`os_error_line`);
    return otherwise, for the caller to re-raise."""
    import sys

    line = os_error_line(exc)
    if line is not None:
        print(f"error: {line}", file=sys.stderr)
        sys.exit(1)


def exit_on_user_error(exc, folder=None) -> None:
    """End a Hydra job that met bad input: one line on stderr and the error's exit status (raising
    would add Hydra's own "Error executing job" line); a refused config leaves no folder when Hydra
    made it for this job (an empty folder the run never claimed)."""
    import sys

    from lra.errors import ConfigError

    message = f"error: {exc}"
    log_to_file(message)
    if isinstance(exc, ConfigError) and folder is not None and not folder.owned:
        folder.remove_if_empty()
    print(message, file=sys.stderr)
    sys.exit(exc.exit_code)


INTERRUPTED = 130  # the shell's status for a process ended by SIGINT


def at_the_edge(main):
    """Decorate a console command's ``main``: its bad input (``UserError``), a full disk, a read-only
    or forbidden folder, a name too long and ctrl-C end it with one ``error:`` line and a non-zero
    exit status instead of a traceback; anything else keeps its traceback (a bug to report)."""
    import functools
    import sys

    from lra.errors import UserError

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            print("error: interrupted (ctrl-C); what was finished is kept, what was being written is not",
                  file=sys.stderr)
            sys.exit(INTERRUPTED)
        except Exception as exc:
            exit_on_disk_error(exc)
            raise

    return wrapped


def remove_hydra_leftovers(run_dir, job_name: str) -> None:
    """A tool's refused config leaves no folder behind: remove the one Hydra made for it (its
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


def one_line_user_errors(task):
    """Decorate a tool's Hydra task function (lra-profile, lra-fidelity: Hydra saves their .hydra/)
    so that its bad-input errors end the process with one line, a refused config leaving no folder."""
    import functools
    import sys

    from hydra.core.hydra_config import HydraConfig

    from lra.errors import ConfigError, UserError

    @functools.wraps(task)
    def wrapped(cfg):
        try:
            return task(cfg)
        except UserError as exc:
            message = f"error: {exc}"
            log_to_file(message)
            if isinstance(exc, ConfigError):
                hydra_cfg = HydraConfig.get()
                remove_hydra_leftovers(hydra_cfg.runtime.output_dir, hydra_cfg.job.name)
            print(message, file=sys.stderr)
            sys.exit(exc.exit_code)
        except Exception as exc:  # inside Hydra's job, or it would add its "Error executing job" line
            exit_on_disk_error(exc)
            raise

    return wrapped


def run_app(run, valid_keys) -> None:
    """Run a Hydra app's ``run`` so that a config mistake ends with one line (exit 2) naming the fix,
    and bad input, a disk error or ctrl-C with one line as :func:`at_the_edge` says; other errors keep
    their traceback. Set HYDRA_FULL_ERROR=1 to see Hydra's own traceback."""
    import os
    import sys

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        run()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    from lra.errors import UserError

    @at_the_edge
    def guarded():
        try:
            run()
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, UserError):  # e.g. a launcher's option, raised while Hydra instantiates it
                raise cause from None
            message = explain(exc, valid_keys)
            if message is None:
                raise
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)

    guarded()
