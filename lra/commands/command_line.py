"""lra-train's command line, checked before Hydra composes it: what Hydra would act on first (make a run or
sweep folder, write a sweep's multirun.yaml, start a launcher) or fail to compose with a line that names
neither cause nor fix. Each check is one :class:`~lra.errors.ConfigError` line; :func:`check` runs them all."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from lra.config import CONF_DIR
from lra.errors import ConfigError
from lra.run import hydra_value, parsed_value, sweep_overrides


def check(argv: list) -> None:
    """Every check of a command line ``argv`` (``sys.argv[1:]``), in the order Hydra would act."""
    from lra.io import check_data_dir_variable, check_folders_given, check_hydra_output_overrides
    from lra.validation import check_user_backends

    check_user_backends()
    check_folders_given(argv, ("resume", "data_dir"))
    check_data_dir_variable(argv)
    refuse_run_dir_beside_resume(argv)
    refuse_slurm_without_slurm(argv)
    refuse_sweep_under_torchrun(argv)
    check_hydra_output_overrides(argv, reads=[data_dir(argv)], within=task_data_folders(argv), runs=True)
    refuse_another_commands_sweep(argv)
    check_presets_against_choices(argv)
    refuse_settings_of_a_deleted_group(argv)
    refuse_sweeper_params(argv)


def refuse_sweeper_params(argv: list) -> None:
    """``hydra.sweeper.params…`` set on the command line of the basic sweeper: Hydra fails merging it into the
    schema's null (an AssertionError, an AttributeError), naming neither the key nor the way to sweep."""
    if any(a.split("=", 1)[0].lstrip("+") == "hydra/sweeper" for a in argv if "=" in a):
        return  # another sweeper (optuna): its params are its own
    for argument in argv:
        key = argument.split("=", 1)[0].lstrip("+~")
        if "=" in argument and (key == "hydra.sweeper.params" or key.startswith("hydra.sweeper.params.")):
            raise ConfigError(f"{argument}: hydra.sweeper.params is where a preset (an experiment config) lists its "
                              "sweep; on the command line sweep the key itself, e.g. lra-train -m seed=0,1")


def refuse_settings_of_a_deleted_group(argv: list) -> None:
    """``~<group>`` (``~trainer``) beside an override that chooses or sets that group (``trainer=smoke``,
    ``trainer.max_steps=2``): Hydra fails on the second with "Error merging override", naming neither."""
    groups = {p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name != "hydra"}
    deleted = [a.split("=", 1)[0][1:] for a in argv if a.startswith("~") and a.split("=", 1)[0][1:] in groups]
    for group in deleted:
        for argument in argv:
            key = argument.split("=", 1)[0]
            if "=" in argument and not key.startswith("~") and key.lstrip("+").split(".")[0] == group:
                choices = "|".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))
                raise ConfigError(f"{argument} {'chooses' if '.' not in key else 'sets a key of'} {group}, which "
                                  f"~{group} deletes from the config: every run needs a {group}, so leave ~{group} out "
                                  f"(pass {group}=<{choices}> to choose another)")


ENV_SET = "hydra.job.env_set."  # Hydra's free-form dict of the environment variables it sets for the job


def env_set_added(argv: list) -> list:
    """``argv`` with each ``hydra.job.env_set.<NAME>=<value>`` as ``++hydra.job.env_set.<NAME>=<value>``: Hydra
    sets each variable of that dict for the job, yet its schema takes a new name there only with ``+`` (or
    ``++``, set or add), and refused ``hydra.job.env_set.OMP_NUM_THREADS=1`` as an unknown key."""
    return [f"++{a}" if "=" in a and a.startswith(ENV_SET) else a for a in argv]


def given(argv: list, key: str) -> Optional[str]:
    """The value the last ``key=`` (or ``+key=``) on a command line gives ``key``, as typed; None without one."""
    values = [a.split("=", 1)[1] for a in argv if "=" in a and a.split("=", 1)[0].lstrip("+") == key]
    return values[-1] if values else None


def multirun(argv: list) -> bool:  # -m, or Hydra's own hydra.mode=MULTIRUN
    return bool({"-m", "--multirun"} & set(argv)) or given(argv, "hydra.mode") in ("MULTIRUN", "multirun")


def task_data_folders(argv: list) -> list:
    """(folder, what it is) for each task's folder in the data folder ``argv`` names (its caches): no run's
    output may lie in one."""
    data = Path(data_dir(argv))
    return [(data / path.stem, f"the {path.stem} data folder") for path in sorted((CONF_DIR / "task").glob("*.yaml"))]


def data_dir(argv: list) -> str:
    """The data folder a command line names (``data_dir=``), else the config's default: LRA_DATA_DIR or ./data."""
    value = given(argv, "data_dir")
    return value.strip("'\"") if value is not None and "${" not in value else os.environ.get("LRA_DATA_DIR") or "data"


def task_overrides(argv: list) -> list:
    """The overrides of ``argv`` that a sweep's multirun.yaml lists as its task's (not Hydra's own, no flags)."""
    valued = {"-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir", "-p", "--package", "--info"}
    return [a for i, a in enumerate(argv) if not a.startswith("-") and not (i and argv[i - 1] in valued)
            and not a.split("=", 1)[0].lstrip("+~").startswith("hydra")]


SWEEP_FILE_BEFORE: list = []  # [whether hydra.sweep.dir held a multirun.yaml before this command], once checked


def refuse_another_commands_sweep(argv: list) -> None:
    """A sweep folder (``hydra.sweep.dir=`` on the command line) is continued by the command that made it: one
    whose overrides differ (other values, or the same in another order, which numbers the jobs otherwise)
    is refused with that command before Hydra writes its multirun.yaml over the sweep's (Hydra's callbacks
    cannot stop a sweep: the jobs refused it only after). A multirun.yaml that cannot be read is left to
    Hydra, and so is a sweep folder a config sets."""
    value = given(argv, "hydra.sweep.dir")
    if not multirun(argv) or value is None or "${" in value:
        return
    sweep_dir = Path(parsed_value(value))
    SWEEP_FILE_BEFORE[:] = [(sweep_dir / "multirun.yaml").exists()]  # Hydra writes it next: whose it was
    try:
        made_by, hydra = sweep_overrides(sweep_dir), sweep_overrides(sweep_dir, "hydra")
    except ValueError:  # unreadable
        return
    if made_by is None or hydra is None:  # a new sweep
        return
    hydra = [o for o in hydra if not o.startswith(("hydra.mode=", "hydra.sweep.dir="))]
    if made_by == task_overrides(argv):
        return
    raise ConfigError(f"hydra.sweep.dir={shlex.quote(str(sweep_dir))} holds a sweep made by another command "
                      f"({shlex.join(['lra-train', '-m', *made_by, *hydra, f'hydra.sweep.dir={hydra_value(sweep_dir)}'])}); continue "
                      "it with that command, or "
                      "choose another hydra.sweep.dir (the sweep is left as it was)")


def refuse_run_dir_beside_resume(argv: list) -> None:
    """``hydra.run.dir=`` with ``resume=``: a resume continues in the run's own folder, and Hydra would make the
    other one, left empty, before any code of ours runs."""
    run_dir = given(argv, "hydra.run.dir")
    if (given(argv, "resume") or "").strip("'\" ") and run_dir is not None:
        raise ConfigError(f"resume= continues the run in its own folder, which hydra.run.dir= does not choose (Hydra "
                          f"would make hydra.run.dir={run_dir} and leave it empty): leave hydra.run.dir out")


def refuse_sweep_under_torchrun(argv: list) -> None:
    """``-m`` in the processes of one torchrun: each job would join and leave the process group again in the same
    processes (the ranks hung between two jobs), and each rank would make its own sweep folder."""
    from lra import distributed

    if multirun(argv) and distributed.world_size() > 1:
        raise ConfigError("lra-train -m runs a sweep's jobs one after another, and under torchrun its processes "
                          "would not share them: start one torchrun per run (a shell loop over the values), or sweep "
                          "without torchrun (hydra/launcher=local_gpus runs the jobs side by side, a GPU each)")


def refuse_slurm_without_slurm(argv: list) -> None:
    """``hydra/launcher=slurm`` (or submitit_slurm) where there is no ``srun``: submitit's RuntimeError came after
    Hydra had made the sweep's folder, and read as a bug. And hydra-joblib-launcher's own ``joblib``, installed
    for ``local_gpus``, which passes no signal on to its workers."""
    import shutil

    launcher = given(argv, "hydra/launcher")
    if multirun(argv) and launcher is not None and "slurm" in launcher and shutil.which("srun") is None:
        raise ConfigError(f"hydra/launcher={launcher} submits the sweep's jobs to SLURM, and this machine has no "
                          "srun (it is no SLURM node): run the command on the cluster, or pass "
                          "hydra/launcher=local_gpus (this machine's GPUs) or hydra/launcher=submitit_local")
    if launcher == "joblib":
        raise ConfigError("hydra/launcher=joblib runs the jobs in workers that a signal leaves recorded running and "
                          "a kill leaves unnamed: pass hydra/launcher=local_gpus, the same joblib launcher with this "
                          "harness's signal policy (each job records interrupted) and GPU slots (hydra.launcher.n_jobs "
                          "sets the workers there too)")


PRESET_GROUPS = ("experiment", "setup", "row")  # presets that choose a task or a backend themselves
FIXED_GROUPS = ("task", "attention")  # choices whose settings a preset sets: another one cannot take them


def preset_choice(group: str, preset: str, fixed: str):
    """The choice of ``fixed`` that a preset's file makes (``override /<fixed>: <choice>``), or None."""
    path = CONF_DIR / group / f"{preset}.yaml"
    if not path.is_file():
        return None
    for entry in OmegaConf.load(path).get("defaults") or []:
        if isinstance(entry, DictConfig) and f"override /{fixed}" in entry:
            return entry[f"override /{fixed}"]
    return None


def check_presets_against_choices(argv) -> None:
    """``task=`` or ``attention=`` on a command line beside a preset that chooses another (a row its backend, a
    setup or the quickstart its task): the preset's settings either fail to compose on it (Hydra's line blames
    one of them as an unknown key) or train on what the preset is not. Read from the command line, before
    Hydra composes."""
    def values(key):  # a sweep's values too
        value = given(argv, key)
        return [v.strip("'\" ") for v in value.split(",")] if value is not None and "${" not in value else []

    for group in PRESET_GROUPS:
        for preset in values(group):
            for fixed in FIXED_GROUPS:
                chosen = preset_choice(group, preset, fixed)
                others = [value for value in values(fixed) if chosen is not None and value != chosen]
                if others:
                    sibling = f"{preset.rpartition('/')[0]}/{others[0]}"  # the same paper's preset for that choice
                    fits = f"pass {group}={sibling} for {fixed}={others[0]}, " if (
                        "/" in preset and preset_choice(group, sibling, fixed) == others[0]) else ""
                    raise ConfigError(f"{group}={preset} trains {fixed}={chosen} with its own settings, and "
                                      f"{fixed}={others[0]} contradicts it: {fits}leave {fixed}= out (the preset "
                                      f"chooses it), or leave {group}= out to train {fixed}={others[0]} without it")
