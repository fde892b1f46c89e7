"""``lra-prepare TASK [--source S] [--path P]``: turn raw data into the training cache.

Further ``key=value`` arguments are config overrides (e.g. ``task.generator.seed=1``), so the
cache is exactly the one ``lra-train`` with the same overrides would use.
"""

from __future__ import annotations

import argparse

from lra.commands.config_errors import at_the_edge
from lra.errors import ConfigError
from lra.io import check_data_dir_variable

TASKS = ["listops", "text", "retrieval", "image", "pathfinder"]


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="lra-prepare", description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("task", nargs="?", choices=TASKS)
    parser.add_argument("--source", help="where the data comes from: listops generate|lra_release; "
                        "text tfds|aclimdb; retrieval lra_release; image tfds|cifar_python; pathfinder generate|lra_release "
                        "(default: the task's first; task.source=S is the same setting)")
    parser.add_argument("--path", help="the raw data folder: an extracted LRA release (either nesting level), "
                        "aclImdb/, cifar-10-batches-py/, or a tensorflow-datasets data_dir")
    parser.add_argument("--data-dir", help="the cache root (default: LRA_DATA_DIR or ./data)")
    parser.add_argument("--force", action="store_true", help="rebuild the cache even if it exists")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. task.generator.seed=1")
    args = parser.parse_intermixed_args(argv)  # overrides may come before or after the options
    if args.task is None:  # argparse would also call the optional overrides required
        parser.error(f"the task is required: lra-prepare {{{','.join(TASKS)}}} [options] [task.key=value ...]")
    for option in ("path", "data_dir"):
        if getattr(args, option) is not None and not getattr(args, option).strip():
            parser.error(f"--{option.replace('_', '-')} is empty (an unset shell variable?); give it a folder, or "
                         "leave it out")
    if args.data_dir is None:
        check_data_dir_variable(args.overrides)
    for override in args.overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key == "task" and override.split("=", 1)[-1] != args.task:
            parser.error(f"{override} contradicts the task {args.task}; give one of them")
        if key != "task" and not key.startswith("task.") and key != "data_dir":
            parser.error(f"{override}: lra-prepare takes the task's settings (task.*) and data_dir, which make the "
                         f"cache; {key} changes no cache: leave it out")

    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from lra.commands import composition_errors
    from lra.config import CONF_DIR, register_configs, register_resolvers
    from lra.data.prepare import describe, load_task_data
    from lra.validation import check_group, unknown_keys

    register_configs()
    register_resolvers()
    overrides = [f"task={args.task}", *args.overrides]
    # --source S and task.source=S are two spellings of one setting: either works, both must agree.
    for option, key in (("source", "task.source"), ("path", "task.path"), ("data_dir", "data_dir")):
        given = getattr(args, option)
        spelled = [o.split("=", 1)[1] for o in args.overrides if o.split("=", 1)[0].lstrip("+") == key]
        if given is not None and any(value != given for value in spelled):
            parser.error(f"--{option.replace('_', '-')} {given} contradicts {key}={spelled[-1]}; give one of them")
    if args.source is not None:
        overrides.append(f"task.source={args.source}")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides)
    except Exception as exc:
        message = composition_errors.explain(exc, lambda path: _valid_keys(args.task, path))
        if message is None:
            raise
        raise ConfigError(message) from None
    for option, key in (("path", "task.path"), ("data_dir", "data_dir")):
        given = getattr(args, option)
        if given is not None:  # set on the composed config, not parsed as an override: a path may hold ( ) , ' $ …
            OmegaConf.update(cfg, key, given.replace("${", "\\${"), merge=False)
    unknown_keys(cfg.task, "task.")
    check_group(cfg.task, "task")  # the task's rules, as lra-train checks them, before anything is written
    data = load_task_data(cfg.task, cfg.data_dir, prepare=True, rebuild=args.force)
    print(describe(data))


def _valid_keys(task: str, path: str) -> list:
    """Keys of the task's default config at a dotted path, for suggestions in error messages."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import DictConfig, OmegaConf

    from lra.config import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = compose(config_name="config", overrides=[f"task={task}"])
        node = OmegaConf.select(node, path) if path else node
        return sorted(node.keys()) if isinstance(node, DictConfig) else []
    except Exception:
        return []


if __name__ == "__main__":
    main()
