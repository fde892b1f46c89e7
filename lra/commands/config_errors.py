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
        message = explain(exc, valid_keys)
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
