"""What :mod:`lra.results.cost` needs to know of presets and runs: a preset's cells (each row × task it
sweeps, composed as ``lra-train -m experiment=<preset>`` composes its jobs) with their training tokens,
the preset a run came from, and the training tokens of a run whose record does not hold them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

from lra.errors import ConfigError
from lra.results import validity
from lra.results.reading import Unreadable, read_text
from lra.run import OVERRIDES, RESOLVED, run_file_candidates


@dataclass(frozen=True)
class Cell:
    """One row × task of a preset: its label and task as a record names them, a run's training tokens
    (steps × batch × length × documents), whether it self-pretrains first, and its setup as a run's is
    taken (:mod:`lra.results.setups`: ``setup`` the fingerprint, ``setup_config`` the flat config; None
    where the composed job cannot be made one)."""

    label: str
    task: str
    tokens: int
    pretrains: bool = False
    setup: Optional[str] = None
    setup_config: Optional[Dict[str, object]] = field(default=None, compare=False, hash=False)


def training_tokens(cfg, steps) -> int:
    """The padded tokens ``steps`` optimizer steps train on under ``cfg`` (a composed or saved config):
    batch × the length the model reads × documents per example (two for Retrieval's dual encoder), as
    :class:`lra.training.Trainer` counts them."""
    from lra.model import input_length

    task, trainer = cfg["task"], cfg["trainer"]
    documents = 2 if task.get("dual_encoder") else 1
    return int(steps) * int(trainer["batch_size"]) * input_length(int(task["max_length"]), trainer.get("max_length")) \
        * documents


def presets() -> List[str]:
    """The experiments that sweep a table (a ``hydra.sweeper.params``)."""
    from omegaconf import OmegaConf

    from lra.config import CONF_DIR

    found = []
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        params = OmegaConf.select(OmegaConf.load(path), "hydra.sweeper.params")
        if params:
            found.append(path.stem)
    return found


@functools.lru_cache(maxsize=None)
def preset_cells(preset: str) -> List[Cell]:
    """Every job of ``experiment=<preset>`` but the seed (the sweep expanded as Hydra's basic sweeper expands
    it), composed; one cell per (label, task), in the sweep's order. :class:`ConfigError` for a name that is no
    such preset."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from lra.config import CONF_DIR, register_configs, register_resolvers
    from lra.pretraining import objective
    from lra.results.setups import Setups, fingerprint
    from lra.validation import run_label

    known = presets()
    if preset not in known:
        raise ConfigError(f"--cost-preset {preset}: no such preset; choose one of {', '.join(known)}")
    params = OmegaConf.load(CONF_DIR / "experiment" / f"{preset}.yaml").hydra.sweeper.params
    sweep = [f"{key}={value}" for key, value in params.items() if key != "seed"]
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(sweep), max_batch_size=None)[0]
    register_configs()
    register_resolvers()
    cells, made = {}, Setups()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for job in jobs:
                cfg = compose(config_name="config", overrides=[f"experiment={preset}", *job])
                key = (run_label(cfg), str(cfg.task.name))
                if key in cells:
                    continue
                setup = _setup(cfg, made)
                cells[key] = Cell(*key, training_tokens(cfg, cfg.trainer.max_steps), objective(cfg) != "none",
                                  fingerprint(setup) if setup else None, setup)
    finally:
        GlobalHydra.instance().clear()
    return list(cells.values())


def _setup(cfg, made) -> Optional[Dict[str, object]]:
    """The flat setup of a preset's composed job, as :func:`lra.results.setups.describe` takes a run's from its
    resolved config; None when it cannot be resolved here (its cell's runs are then matched by their training
    tokens alone)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except OmegaConfBaseException:
        return None
    return made.setup_of(container)[0]


def _side_yaml(run_dir: Path, name: Path, warn: Callable[[str], None]):
    """The YAML of a run's ``name`` (in its folder, or under its packed name beside the record); None when
    there is none, or with a ``warn`` naming the file read when it cannot be read or parsed."""
    for path in run_file_candidates(run_dir, name):
        if not path.exists() and not path.is_symlink():
            continue
        try:
            return _yaml(read_text(path), path, warn)
        except Unreadable as exc:
            warn(f"skipped {path}: not readable ({exc}); the run's cost is shown without it")
            return None
    return None


def _yaml(text: str, path: Path, warn: Callable[[str], None]):
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        warn(f"skipped {path}: not YAML ({str(exc).splitlines()[0]}); the run's cost is shown without it")
        return None


def preset_of(run_dir: Path, warn: Callable[[str], None]) -> Optional[str]:
    """The preset a run came from: the ``experiment=`` of its overrides (None without one)."""
    overrides = _side_yaml(run_dir, OVERRIDES, warn)
    if not isinstance(overrides, list):
        return None
    for override in overrides:
        key, _, value = str(override).partition("=")
        if key.lstrip("+~") == "experiment" and value:
            return value
    return None


def run_tokens(run_dir: Path, steps, warn: Callable[[str], None]) -> Optional[int]:
    """A run's training tokens from its saved config and its record's ``steps`` (a record from before
    ``train_tokens``); None when either is missing."""
    if not validity.is_number(steps) or steps < 0:
        return None
    cfg = _side_yaml(run_dir, RESOLVED, warn)
    try:
        return training_tokens(cfg, steps)
    except (TypeError, KeyError, ValueError, AttributeError):  # no config, or not a run's
        return None
