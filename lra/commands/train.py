"""``lra-train``: compose the config, then call :func:`lra.training.train`. Nothing else."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from lra.commands import config_errors
from lra.config import CONF_DIR, TrainRunConfig, register_configs, register_resolvers
from lra.errors import ConfigError, UserError
from lra.io import atomic_write_text
from lra.loggers import sweep_group
from lra.records import read_record
from lra.validation import validate

log = logging.getLogger("lra.train")
RESOLVED = Path(".hydra") / "resolved.yaml"

register_configs()
register_resolvers()


def _announce(message: str) -> None:
    log.info(message)


def _load_saved(run_dir: Path) -> DictConfig:
    """The resolved config a run recorded, checked like a fresh one."""
    path = run_dir / RESOLVED
    try:
        saved = OmegaConf.load(path)
        if not isinstance(saved, DictConfig) or not saved:
            raise ValueError("it is empty")
        return OmegaConf.merge(OmegaConf.structured(TrainRunConfig), saved)
    except Exception as exc:
        raise UserError(f"cannot resume {run_dir}: its {RESOLVED} is unreadable ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else 'empty'}); start a new run with the same "
                        "overrides instead") from None


def _prepare_config(cfg: DictConfig, run_dir: Path) -> tuple[DictConfig, Path]:
    """A fresh run records its resolved config; a resumed run reloads the one it recorded. Either
    is validated before anything is written."""
    if cfg.resume:
        run_dir = Path(cfg.resume).resolve()
        cfg = _load_saved(run_dir)
        others = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
        previous = read_record(run_dir)
        if others and previous.get("status") == "completed":
            # Extending is refused: trainer.max_steps shapes the learning-rate schedule from step 0, so
            # a longer run is a new run, not this one continued.
            saved = run_dir / ".hydra" / "overrides.yaml"
            replaced = {o.split("=")[0] for o in others}
            kept = [o for o in map(str, OmegaConf.load(saved) if saved.is_file() else []) if o.split("=")[0] not in replaced]
            command = " ".join(["lra-train", *kept, *others])
            raise ConfigError(f"{run_dir} completed at step {previous.get('steps')}; a completed run is "
                              f"never changed or extended (trainer.max_steps sets the learning-rate schedule from "
                              f"step 0): train a new run instead: {command}")
        if others:
            log.warning("resuming with the run's saved config; ignoring overrides: %s", " ".join(others))
        with open_dict(cfg):
            cfg.resume = str(run_dir)
        validate(cfg)
        return cfg, run_dir
    validate(cfg)
    with open_dict(cfg):
        cfg.data_dir = str(Path(cfg.data_dir).expanduser().resolve())
    atomic_write_text(run_dir / RESOLVED, OmegaConf.to_yaml(cfg, resolve=True))
    return cfg, run_dir


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def run(cfg: DictConfig):
    from lra.training import train

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    group = sweep_group(Path(hydra_cfg.sweep.dir)) if multirun else None
    try:
        cfg, run_dir = _prepare_config(cfg, Path(hydra_cfg.runtime.output_dir))
        resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        result = train(cfg, run_dir, resolved, group=group, announce=_announce)
    except UserError as exc:
        if multirun:  # the sweep goes on; the job's log says why it stopped
            log.error("error: %s", exc)
            return math.nan
        config_errors.exit_on_user_error(exc, fresh_folder=not cfg.resume)  # a resumed run's folder stays
    except Exception:
        if multirun:  # one failed job must not end the sweep; its metrics.json says failed
            log.exception("job failed")
            return math.nan
        raise
    line = (f"{result['label']} on {result['task']}: test accuracy {result['test_accuracy']:.2f} "
            f"(best validation {result['best_val_accuracy']:.2f} at step {result['best_step']}); run: {run_dir}")
    config_errors.log_to_file(line, "INFO")
    print(line)
    return _objective(result, cfg.optimized_metric)


def _objective(result: dict, metric: str) -> float:
    """What a Hydra sweeper optimizes (Optuna needs a float): the run's ``optimized_metric``, NaN
    when the run has none. The record itself stays in the run's metrics.json."""
    value = result.get(metric)
    return math.nan if value is None else float(value)


def _valid_keys(path: str) -> list:
    """Keys of the default config at a dotted path, for suggestions in error messages."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir()}  # group choices change the valid keys; nothing else
    choices = [a for a in sys.argv[1:] if a.split("=")[0] in groups and "=" in a]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = compose(config_name="config", overrides=choices)
        node = OmegaConf.select(node, path) if path else node
        return sorted(node.keys()) if isinstance(node, DictConfig) else []
    except Exception:
        return []


def main() -> None:
    """Console entry: Hydra errors become one line (set HYDRA_FULL_ERROR=1 for a traceback)."""
    config_errors.run_app(run, _valid_keys)


if __name__ == "__main__":
    main()
