"""Turn Hydra / OmegaConf composition errors into one line that names the fix."""

from __future__ import annotations

import difflib
from typing import Iterable, List, Optional

from hydra.errors import (ConfigCompositionException, MissingConfigException, OverrideParseException,
                          SearchPathException)
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, InterpolationResolutionError, ValidationError

from attention_zoo.user_modules import VARIABLE


def _closest(word: str, choices: Iterable[str]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean '{match[0]}'?)" if match else ""


def causes(exc: BaseException) -> List[BaseException]:
    chain = []
    while exc is not None and exc not in chain:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def explain(exc: BaseException, valid_keys) -> Optional[str]:
    """A one-line explanation, or None if ``exc`` is not a configuration error.

    ``valid_keys(path)`` lists the keys of the config node at a dotted path (for suggestions).
    """
    for cause in causes(exc):
        if isinstance(cause, MissingConfigException) and cause.options is not None:
            group, _, choice = (cause.missing_cfg_file or "").rpartition("/")
            if group:
                options = sorted(o for o in cause.options if not o.startswith(("_", "schema_")))  # not the schemas
                yours = f"; a backend of your own: name its module in {VARIABLE}" if group == "attention" else ""
                return (f"unknown choice '{choice}' for {group}{_closest(choice, options)}; "
                        f"valid: {', '.join(options)} (e.g. {group}={options[0]}){yours}")
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and getattr(cause, "full_key", None):
            parent, _, key = str(cause.full_key).rpartition(".")
            keys = valid_keys(parent)
            if key in keys:  # a key of the schema that is not there: deleted with ~
                from lra.validation import deleted_key

                return deleted_key(str(cause.full_key))
            where = f"under {parent}" if parent else "at the top level"
            return (f"unknown key '{cause.full_key}'{_closest(key, keys)}; valid keys {where}: "
                    f"{', '.join(keys)}")
        if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
            first_line = str(cause).splitlines()[0]
            return f"invalid value for {cause.full_key}: {first_line}; pass {cause.full_key}=<{_wanted(first_line)}>"
        if isinstance(cause, OverrideParseException):
            override = getattr(cause, "override", None)
            text = f" {override!r}" if override else ""
            return (f"cannot parse the override{text}: {str(cause).splitlines()[0]}; a value with spaces, letters "
                    "beyond ASCII or any of ( ) [ ] { } , : = ' \" must be quoted for Hydra as well as for the shell, "
                    "e.g. \"task.path='/data/my files (copy)'\"")
        if isinstance(cause, InterpolationResolutionError):
            # "ValueError raised while resolving interpolation: <the resolver's message>"
            return str(cause).splitlines()[0].split("resolving interpolation: ", 1)[-1]
        if isinstance(cause, SearchPathException):
            return f"{str(cause).splitlines()[0]}; pass an existing folder to --config-dir, or leave it out"
        deletion = _deletion_line(cause, valid_keys)
        if deletion is not None:
            return deletion
        mode = _run_mode_line(cause)
        if mode is not None:
            return mode
    group = _group_choice_line(exc)
    if group is not None:
        return group
    if isinstance(exc, ConfigCompositionException):
        import re

        foreign = re.match(r"Could not override '([^'.]+)'\. No match in the defaults list", str(exc))
        if foreign:  # a group of another command's config (lra-profile attention=…): a key this config lacks
            key, keys = foreign.group(1), valid_keys("")
            return f"unknown key '{key}'{_closest(key, keys)}; valid keys at the top level: {', '.join(keys)}"
        return " ".join(line.strip() for line in str(exc).splitlines()[:2])
    return None


def _wanted(message: str) -> str:
    """What OmegaConf's type check asked for, in words, from the clause that ends its message (the value the user
    typed comes before it)."""
    import re

    for pattern, wanted in ((r"converted to Integer$", "a whole number"), (r"converted to Float$", "a number"),
                            (r"is not a valid bool \(type \w+\)$", "true or false"),
                            (r"is not Optional$", "a value: it takes no null or empty one"),
                            (r"expected one of \[[^]]*\]$", "one of those")):
        if re.search(pattern, message):
            return wanted
    return "a value of its type"


def _deletion_line(cause: BaseException, valid_keys) -> Optional[str]:
    """``~key`` on a key of a structured config (which does not support deletion) or on one that holds no
    value: Hydra's line names neither the cause nor the fix."""
    import re

    from omegaconf.errors import ConfigTypeError

    from lra.validation import deleted_key

    if isinstance(cause, ConfigTypeError) and "does not support deletion" in str(cause) and getattr(cause, "full_key", None):
        return deleted_key(str(cause.full_key))
    absent = re.match(r"Could not delete from config\. '([^']+)' does not exist", str(cause))
    if isinstance(cause, ConfigCompositionException) and absent:
        parent, _, key = absent.group(1).rpartition(".")
        keys = valid_keys(parent)
        if key in keys:
            return deleted_key(absent.group(1))
        where = f"under {parent}" if parent else "at the top level"
        return f"unknown key '{absent.group(1)}'{_closest(key, keys)}; valid keys {where}: {', '.join(keys)}"
    return None


def _run_mode_line(cause: BaseException) -> Optional[str]:
    """Several values for a key without ``-m`` (which only a sweep trains), ``-m`` with ``--cfg``, or ``+`` on a
    group the config has: Hydra's message is a numbered list (cut to its first item on one line), a ValueError
    read as a bug, or the defaults list's syntax."""
    import re

    text = str(cause)
    if isinstance(cause, ValueError) and text.startswith("Only one of --run, --multirun, --cfg"):
        return ("-m (--multirun), --cfg, --info, --run and --shell-completion each choose what the command does: give "
                "one of them; --cfg prints the config of one job, so leave out -m and give each swept key one value")
    several = re.match(r"(?:Ambiguous value for argument|Sweep parameters) '([^'=]+)=(.*)'", text)
    if isinstance(cause, ConfigCompositionException) and several:
        key, value = several.groups()
        alternatives = "" if text.startswith("Sweep") else (f"; for one value that is a list write {key}=[{value}], "
                                                            f"for a string quote it: {key}='{value}'")
        return f"{key}={value} gives several values, which only a sweep trains: add -m to train each{alternatives}"
    added = re.match(r"Multiple values for (\S+)\. To override a value use 'override \S+: (.*)'", text)
    if isinstance(cause, ConfigCompositionException) and added:  # Hydra names the defaults list's syntax
        group, choice = added.groups()
        return (f"+{group}={choice} adds a config group the config has already: choose it with {group}={choice} "
                "(without +)")
    return None


def _group_choice_line(exc: BaseException) -> Optional[str]:
    """A config group given no choice or several on the command line (``task=null``, ``task=[listops,text]``):
    Hydra fails deep in composing the defaults, naming neither the override nor the fix."""
    import sys

    text = "\n".join(str(cause) for cause in causes(exc))
    overrides = [(a.split("=", 1)[0].lstrip("+~"), a.split("=", 1)[1].strip()) for a in sys.argv[1:]
                 if "=" in a and not a.startswith("-")]
    groups = [(key, value) for key, value in overrides if "." not in key]  # a group's choice: key=option
    if "Config group override must be a string or a list" in text:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
        for key, value in groups:
            try:
                parsed = parser.parse_overrides([f"{key}={value}"])[0].value() if value else None
            except Exception:  # not this one: Hydra's own line names it
                continue
            if parsed is None or isinstance(parsed, (bool, int, float)):
                what = "null" if parsed is None else f"the value {value} (the command line reads it so)"
                return (f"{key}={value}: a config group takes one of its choices, not {what}; pass {key}=<choice> "
                        "(--help lists them), or leave it at its default")
    if "Merge error" in text and "is not a subclass of" in text:
        for key, value in groups:
            if value.startswith("[") and value.endswith("]"):
                return (f"{key}={value}: a config group takes one choice, not a list; to train each of them, sweep "
                        f"them: -m {key}={value[1:-1]}")
    return None


def schema_keys(schema):
    """``valid_keys`` for an app whose config is the dataclass ``schema``: the keys at a dotted path."""
    from omegaconf import DictConfig, OmegaConf

    def valid_keys(path: str) -> list:
        node = OmegaConf.structured(schema)
        node = OmegaConf.select(node, path) if path else node
        return sorted(node.keys()) if isinstance(node, DictConfig) else []

    return valid_keys


def refuse_deleted_fields(argv, schema) -> None:
    """``~<key>`` on a command line for a key of a tool's ``schema`` (a dataclass): one line before Hydra
    composes (``~output_dir`` fails inside Hydra's composition, its default naming the run folder)."""
    import dataclasses

    from lra.errors import ConfigError
    from lra.validation import deleted_key

    fields = {f.name for f in dataclasses.fields(schema)}
    for argument in argv:
        key = argument.partition("=")[0]
        if key.startswith("~") and key[1:] in fields:
            raise ConfigError(deleted_key(key[1:]))


def composed_for_dry_run(conf_dir, config_name: str, overrides: list):
    """The config a tool's ``--cfg job|hydra|all`` prints, without its hydra node, for the tool's checks (with
    Hydra's run config set: ``output_dir`` interpolates the run folder, which a dry run never makes)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = cfg.hydra.run.dir
        HydraConfig.instance().set_config(cfg)
        del cfg["hydra"]
    return cfg
