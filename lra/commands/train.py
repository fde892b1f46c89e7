"""``lra-train``: compose the config, then call :func:`lra.pipeline.train`. Nothing else."""

from __future__ import annotations

import logging
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from lra import signals, validation
from lra.commands import command_line, config_errors, hydra_settings
from lra.config import CONF_DIR, register_configs, register_resolvers, saved_run_config, typed
from lra.errors import ConfigError, InvalidValue, UserError
from lra.loggers import sweep_group
from lra.records import git_commit
from lra.results.callback import clear_refused_resume, note_refused_resume
from lra.run import (HYDRA_FILES, OVERRIDES, RESOLVED, FolderHoldsRun, FolderTaken, RunDirectory, not_a_run,
                     resume_command)
from lra.validation import check_group_names, check_preset_choices, check_unused_pretrain_keys, keys_given, validate

log = logging.getLogger("lra.train")

register_configs()
register_resolvers()


def _announce(message: str) -> None:
    log.info(message)


def _rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0  # torchrun's rank (the process group starts later)


def _take_refused_job_folder(folder: RunDirectory, cfg: DictConfig, hydra_cfg) -> None:
    """A sweep job whose config is refused still takes its folder, with its config files, for the record of why
    (:func:`_record_failed_start`; a sweep continued with the same command refuses it again and writes it anew)."""
    folder.claim(fresh=not folder.holds_failed_start(_overrides(hydra_cfg)))
    folder.save_hydra_files(hydra_cfg, cfg)


def _overrides(hydra_cfg) -> list:  # a sweep job's own: what tells its folder's failed start from another job's
    return [str(o) for o in hydra_cfg.overrides.task]


def _resumes_by_override(hydra_cfg) -> bool:  # -m resume=A,B (not a sweep's job continuing its own run)
    return "resume" in keys_given(o for o in _overrides(hydra_cfg) if "=" in o)


def _record_failed_start(folder: RunDirectory, cfg: DictConfig, hydra_cfg, line: str) -> None:
    """A sweep job that failed in its own folder before its run started (its config refused, its config
    files unwritable on a full disk, ...) leaves a record there, ``failed`` with the error line, its task,
    attention, label and seed from the composed config and its overrides, so that the sweep's table and
    exit status count it; the same job started again replaces it. Where even this write fails, the sweep's
    end counts the folder without a record (lra.results.callback). A resume's folder is the user's: never."""
    overrides = _overrides(hydra_cfg)
    if cfg.resume or not folder.main or not folder.owned or (folder.holds_run()
                                                             and not folder.holds_failed_start(overrides)):
        return  # not this job's own folder, or a run started there: its own record says how it ended
    name = OmegaConf.select(cfg, "attention.name", default=None)
    try:
        label = validation.run_label(cfg)
    except Exception:  # a config broken before its attention (e.g. a deleted group): the name is all there is
        label = name
    try:
        record = folder.new_record(task=OmegaConf.select(cfg, "task.name", default=None), attention=name,
                                   label=label, seed=OmegaConf.select(cfg, "seed", default=None),
                                   git_commit=git_commit(), overrides=overrides)
        record.fail(line)
    except Exception as exc:  # the disk that failed the job: the console's line and the sweep's count remain
        known = config_errors.failure(exc)
        log.error("error: the failure could not be recorded in %s: %s", folder.path,
                  known[0] if known else config_errors.bug_line(exc))


def refuse_one_job_of_a_sweep(sweep_params, experiment: Optional[str], overrides: list) -> None:
    """A run without ``-m`` whose config is a sweep (a preset's ``hydra.sweeper.params``, which only
    ``-m`` applies) trains one job only if the command line gives each swept key its one value; otherwise
    it would train the defaults (``setup=null``, Softmax) and say nothing: one :class:`ConfigError` line
    naming both ways on."""
    given = set(keys_given(overrides))
    unset = {str(key): value for key, value in (sweep_params or {}).items() if str(key) not in given}
    if not unset:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    counts, examples = [], []
    for key, value in unset.items():
        try:
            override = parser.parse_override(f"{key}={value}")
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [str(value)]
        except Exception:  # a glob over a group's options needs Hydra's config loader: no count to show
            values = []
        counts.append(f"{key}: {len(values)} value{'s' * (len(values) != 1)}" if values else f"{key}: {value}")
        examples.append(f"{key}={values[0] if values else '<one value>'}")
    what = f"experiment={experiment}" if experiment else "this config (its hydra.sweeper.params)"
    raise ConfigError(f"{what} is a sweep ({', '.join(counts)}), which only -m trains: train it with "
                      f"`{shlex.join(['lra-train', '-m', *overrides])}`, or one of its jobs by giving "
                      f"{'each of ' * (len(unset) > 1)}{', '.join(unset)} one value, e.g. `{shlex.join(['lra-train', *overrides, *examples])}`")


def _command_overrides() -> list:
    """The overrides on this command line, as Hydra parsed them (flags such as ``--cfg job`` left out)."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser

    with contextlib.redirect_stderr(io.StringIO()):
        return list(get_args_parser().parse_args(sys.argv[1:]).overrides)


def _start_fresh(folder: RunDirectory, cfg: DictConfig, hydra_cfg, multirun: bool) -> DictConfig:
    """Validate, then own the folder (refusing one that holds a run), then write its config files; None
    for a sweep's job that already completed with this config (a sweep continued: kept, not trained)."""
    composed = cfg.copy()
    if not multirun:
        refuse_one_job_of_a_sweep(hydra_cfg.sweeper.get("params"), hydra_cfg.runtime.choices.get("experiment"),
                                  _command_overrides())
    try:
        check_preset_choices(hydra_cfg.runtime.choices)
        check_group_names(cfg, hydra_cfg.runtime.choices, hydra_cfg.overrides.task)
        check_unused_pretrain_keys(cfg, hydra_cfg.overrides.task)
        validate(cfg)
    except ConfigError:
        if multirun:
            _take_refused_job_folder(folder, composed, hydra_cfg)
        raise
    with open_dict(cfg):  # paths as they are here, so that a resume from another folder finds them
        cfg.data_dir = str(Path(cfg.data_dir).expanduser().resolve())
        if cfg.pretrain["from"] is not None:
            cfg.pretrain["from"] = str(Path(cfg.pretrain["from"]).expanduser().resolve())
    resolved = OmegaConf.to_yaml(cfg, resolve=True)
    if multirun and folder.holds_run() and folder.completed() and folder.records_config(resolved):
        return None  # a sweep continued with its own command: this job finished, and is kept as it is
    if folder.holds_run() and folder.continued_by(resolved):
        folder.claim(fresh=False)  # a requeued job (or the same command again): it resumes its own run
        folder.attach_log()
        log.info("continuing the unfinished run in %s: the same config (a requeued or restarted job)", folder.path)
        with open_dict(cfg):
            cfg.resume = str(folder.path)
        return cfg
    folder.claim(fresh=not (multirun and folder.holds_failed_start(_overrides(hydra_cfg))))
    folder.attach_log()
    folder.save_hydra_files(hydra_cfg, composed)
    folder.save_resolved(cfg)
    return cfg


def _start_resume(folder: RunDirectory, hydra_cfg) -> Optional[DictConfig]:
    """Own the folder, then reload the config it recorded; None for a completed run (reported, never
    changed or extended). A folder without a run is refused before anything is written into it."""
    problem = not_a_run(folder.path)
    if problem:
        raise ConfigError(problem)
    folder.claim(fresh=False)
    cfg = folder.load_resolved(saved_run_config)
    refuse_changes_on_resume(folder, list(hydra_cfg.overrides.task), cfg)
    if folder.completed():
        return None
    with open_dict(cfg):
        cfg.resume = str(folder.path)
    validate_saved(folder, cfg)
    folder.attach_log()
    return cfg


def validate_saved(folder: RunDirectory, cfg: DictConfig) -> None:
    """The process count the run began with, then :func:`validate` of the config it saved: a resume takes no overrides,
    so a value refused there is named with the fixes a resume has (what the machine lacks keeps its own line)."""
    from lra.checkpoint import check_run_processes

    check_run_processes(folder.path, folder.read_record())
    try:
        validate(cfg)
    except InvalidValue as exc:
        reason = str(exc).split("; ")[0]
        raise ConfigError(f"cannot resume {folder.path}: the config it saved is refused ({reason}), and a resume "
                          f"takes no overrides: restore {folder.path / RESOLVED} as the run wrote it, or start a new "
                          "run with a valid value") from None


def refuse_changes_on_resume(folder: RunDirectory, overrides: list, saved_config: DictConfig) -> None:
    """A resume continues the run as it was configured: overrides that would change it (a completed run: extend
    it) are one ConfigError line naming the new run's command. An override that changes nothing is no change:
    the run's own again, or a key given the value ``saved_config`` holds (compared as Hydra parses them: seed=01
    is seed=1, trainer.lr=1e-3 is 0.001)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()

    def meaning(override: str) -> tuple:
        try:
            parsed = parser.parse_override(override)
        except Exception as exc:  # only a saved one can fail: Hydra parsed the command line's
            raise ValueError(f"{override!r} is no override: {' '.join(str(exc).split())}") from None
        value = parsed.value()  # Hydra keeps 01 a string; the config's int field reads it as 1
        return parsed.key_or_group, int(value) if isinstance(value, str) and value.strip().isdigit() else value

    def holds(key: str, value) -> bool:
        if key in (p.name for p in CONF_DIR.iterdir() if p.is_dir()):
            return False  # a group's choice is no value of the saved config
        saved_value = OmegaConf.select(saved_config, key, default=KeyError)
        saved_value = getattr(saved_value, "value", saved_value)  # an enum's text
        if saved_value is KeyError:
            return False
        if isinstance(saved_value, bool) or isinstance(value, bool):
            return saved_value is value  # true is no 1
        return saved_value == value

    given = {o: meaning(o) for o in overrides if meaning(o)[0] != "resume"}
    try:
        saved = {o: meaning(o) for o in folder.saved_overrides(strict=True)}
    except Exception as exc:  # the file damaged or edited: which overrides change the run cannot be told
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise UserError(f"cannot resume {folder.path}: its {OVERRIDES} is unreadable ({reason}); restore it (a YAML "
                        f"list of the run's overrides, [] for none: its {HYDRA_FILES}/hydra.yaml lists them under "
                        "hydra.overrides.task), or start a new run with the same overrides instead") from None
    changes = [o for o, said in given.items() if said not in saved.values() and not holds(*said)]
    if not changes:
        return
    replaced = {key for key, _ in given.values()}
    new_run = shlex.join(["lra-train", *[o for o, (key, _) in saved.items() if key not in replaced], *given])
    if folder.completed():
        # Extending is refused: trainer.max_steps shapes the learning-rate schedule from step 0, so a longer run
        # is a new run, not this one continued.
        raise ConfigError(f"{folder.path} completed at step {folder.read_record().get('steps')}; a completed run is "
                          f"never changed or extended (trainer.max_steps sets the learning-rate schedule from step "
                          f"0): train a new run instead: {new_run}")
    raise ConfigError(f"{folder.path} resumes with the config it saved, which {shlex.join(changes)} would change "
                      f"midway; resume it as it is with: {resume_command(folder.path)}, or train a "
                      f"new run: {new_run}")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def run(cfg: DictConfig):
    """One job: its signals (:mod:`lra.signals`; owned here only in a launcher's worker process, where
    no command edge runs), its folder, its record, and one line for every failure (a bug's traceback in train.log)."""
    owner = not signals.installed()
    with signals.interruptible():
        return _run_job(cfg, worker=owner)


def _run_job(cfg: DictConfig, worker: bool):
    from lra.pipeline import train

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    group = sweep_group(Path(hydra_cfg.sweep.dir)) if multirun else None
    folder = RunDirectory(cfg.resume or hydra_cfg.runtime.output_dir, main=_rank_zero())
    if multirun and cfg.resume and Path(hydra_cfg.runtime.output_dir).resolve() != folder.path.resolve():
        RunDirectory(hydra_cfg.runtime.output_dir).remove_if_empty()  # the job's folder Hydra made: the run is elsewhere
    record_before = None  # -m resume=A,B: the run's record as this job found it (a refusal leaves it so)
    if multirun and _resumes_by_override(hydra_cfg):
        clear_refused_resume(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num)  # an earlier attempt's, if it was refused
        record_before = folder.read_record()
    try:
        started = _start_resume(folder, hydra_cfg) if cfg.resume else _start_fresh(folder, cfg, hydra_cfg, multirun)
        if started is None:
            previous = folder.read_record()
            print(f"{folder.path} already completed at step {previous.get('steps')}: nothing to resume "
                  "(to train longer, start a new run with more trainer.max_steps)")
            return _objective(previous, OmegaConf.select(cfg, "optimized_metric", default="best_val_accuracy"))
        resolved = OmegaConf.to_container(started, resolve=True, enum_to_str=True)
        result = train(typed(started), folder, resolved, group=group, announce=_announce)
        line = (f"{result['label']} on {result['task']}: test accuracy {result['test_accuracy']:.2f} (best validation "
                f"{result['best_val_accuracy']:.2f} at step {result['best_step']}); run: {folder.path}")
        config_errors.log_to_file(line, "INFO")  # while train.log is still the run's
    except UserError as exc:
        # A folder a live process is starting a run in (no config saved there yet): the same sweep started twice
        # (its multirun.yaml let this command in); left to that process, counted unfinished at the sweep's end.
        starting = type(exc) is FolderTaken and folder.holder() is not None and not folder.holds_run() and \
            not _shared_subdir(folder, hydra_cfg)
        if multirun and isinstance(exc, FolderTaken) and not starting:  # no record to say so: the sweep ends here
            if isinstance(exc, FolderHoldsRun) and hydra_cfg.job.num == 0 and not worker:
                _withdraw_sweep_file(Path(hydra_cfg.sweep.dir))  # this command trained nothing there
            config_errors.exit_on_user_error(_taken_in_sweep(exc, folder, hydra_cfg))
        if multirun:  # the sweep goes on; the job's record (and log) says why it stopped
            log.error("error: %s", exc)
            return _failed_in_sweep(folder, cfg, hydra_cfg, str(exc), worker, record_before)
        config_errors.exit_on_user_error(exc, folder)
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: the run's record says interrupted
        _stop(exc, folder, hydra_cfg, multirun, worker)
    except (Exception, SystemExit) as exc:  # a diverged run, a full disk, ..., or a bug (an exit: your backend's)
        if isinstance(exc, SystemExit) and config_errors.backend_of_yours(exc, chained=False) is None:
            raise
        if multirun:  # one failed job must not end the sweep; its metrics.json says failed
            known = config_errors.failure(exc)  # a bug's traceback goes to the job's train.log, while it is open
            line = known[0] if known else config_errors.bug_line(exc)
            log.error("error: %s", line)
            return _failed_in_sweep(folder, cfg, hydra_cfg, line, worker, record_before)
        if folder.main and not folder.owned:  # failed before the run took its folder: Hydra's empty one goes
            folder.remove_if_empty()
        config_errors.exit_on_failure(exc)  # one line; a bug's traceback in the run's train.log, while it is open
    finally:
        folder.release()
    print(line)
    return _objective(result, started.optimized_metric)


def _failed_in_sweep(folder: RunDirectory, cfg: DictConfig, hydra_cfg, line: str, worker: bool,
                     record_before: Optional[dict] = None) -> float:
    """A sweep's failed job: recorded where it failed before its run did (a signal meanwhile stops the sweep
    as anywhere else), then NaN for the sweeper; the sweep goes on."""
    try:
        if record_before is not None and folder.read_record() == record_before:  # refused: the sweep's end names it
            try:
                note_refused_resume(Path(hydra_cfg.sweep.dir), hydra_cfg.job.num, str(cfg.resume), line)
            except OSError as exc:  # a full disk: the console's line remains
                log.error("error: the refusal could not be noted in %s: %s", hydra_cfg.sweep.dir, exc)
        _record_failed_start(folder, cfg, hydra_cfg, line)
    except KeyboardInterrupt as exc:  # raised once the record is whole (signals.deferred)
        _stop(exc, folder, hydra_cfg, True, worker)
    return math.nan


def _stop(exc: KeyboardInterrupt, folder: RunDirectory, hydra_cfg, multirun: bool, worker: bool) -> None:
    """SIGINT, SIGTERM, SIGHUP: raised again as the run's or the sweep's interruption, with what to do next
    (the run's record says interrupted; a local_gpus worker passes the signal on to its sweep)."""
    stopped = _interrupted(signals.as_interrupted(exc), folder, hydra_cfg, multirun)
    if folder.main and not folder.owned:  # stopped before the run took its folder: Hydra's empty one goes
        folder.remove_if_empty()
    if multirun and worker and os.environ.get("LRA_SWEEP_PARENT"):  # a worker of hydra/launcher=local_gpus
        _end_worker(stopped)
    config_errors.log_to_file(f"error: {stopped}")  # the edge prints it on the console
    raise stopped from None


def _interrupted(exc: signals.Interrupted, folder: RunDirectory, hydra_cfg, multirun: bool) -> signals.Interrupted:
    """``exc`` with what to do next: resume the run, or continue the sweep (a signal stops a whole sweep:
    the jobs before this one keep their records, this one's says interrupted, no further job starts)."""
    unfinished = folder.owned and folder.holds_run() and not folder.completed()
    if multirun:
        sweep = Path(hydra_cfg.sweep.dir).resolve()
        exc.advice = (f"the sweep stopped at job {hydra_cfg.job.num} ({folder.path}); continue it with the same "
                      f"command and hydra.sweep.dir={shlex.quote(str(sweep))}: finished jobs are kept, unfinished "
                      "ones resume")
    elif unfinished:
        exc.advice = f"resume it with: {resume_command(folder.path)}"
    return exc


def _withdraw_sweep_file(sweep_dir: Path) -> None:
    """A sweep stopped at its first job by another sweep's folder: the multirun.yaml Hydra wrote for it goes."""
    from lra.run import sweep_overrides

    if command_line.SWEEP_FILE_BEFORE != [False]:  # it was there before (the sweep's own), or cannot be told
        return
    try:
        if sweep_overrides(sweep_dir) == command_line.task_overrides(sys.argv[1:]):
            (sweep_dir / "multirun.yaml").unlink()
    except (OSError, ValueError):  # unreadable, or gone: nothing of this command to take back
        pass


def _taken_in_sweep(exc: FolderTaken, folder: RunDirectory, hydra_cfg) -> UserError:
    """A sweep job whose folder belongs to another run (the sweep folder holds another sweep, or the same
    command composes other configs now) cannot record why it did not train, and the jobs after it would
    write into that other sweep: the sweep ends at this job with this line and the error's status, with no
    table printed as if the other sweep's runs were this one's."""
    sweep = shlex.quote(str(Path(hydra_cfg.sweep.dir).resolve()))
    shared = _shared_subdir(folder, hydra_cfg)
    if shared:
        return type(exc)(f"the sweep stopped at job {hydra_cfg.job.num}: hydra.sweep.subdir={shared}: give each job a "
                         "folder of its own (leave hydra.sweep.subdir out for its default ${hydra.job.num}), in a new "
                         "hydra.sweep.dir")
    holder = folder.holder()
    taken = f"is in use by {holder}" if holder else f"already holds {folder.describe()}"
    return type(exc)(f"the sweep stopped at job {hydra_cfg.job.num}: {folder.path} {taken}, which this command does "
                     f"not continue; hydra.sweep.dir={sweep} holds another sweep (or one made with other settings): "
                     "continue it with its own command and settings, or choose another hydra.sweep.dir")


def _shared_subdir(folder: RunDirectory, hydra_cfg) -> Optional[str]:
    """``hydra.sweep.subdir`` as written, with what it did wrong, where it gave this job the sweep folder itself or
    the folder another job of the sweep saved its config in (a subdir the same for every job); None otherwise."""
    subdir = OmegaConf.to_container(hydra_cfg.sweep, resolve=False).get("subdir")
    if folder.path == Path(hydra_cfg.sweep.dir).resolve():
        return f"{subdir} gives job {hydra_cfg.job.num} the sweep's own folder, where no run is written"
    if any(key in str(subdir) for key in ("hydra.job.num", "hydra.job.id")):
        return None  # a folder of its own by construction: what holds it is another sweep's
    try:  # the job that wrote the folder's config files, as Hydra numbered it
        other = OmegaConf.select(OmegaConf.load(folder.path / HYDRA_FILES / "hydra.yaml"), "hydra.job.num")
    except Exception:
        return None
    if not isinstance(other, int) or other == hydra_cfg.job.num:
        return None
    return f"{subdir} gives job {hydra_cfg.job.num} the folder of job {other} ({folder.path})"


def _end_worker(stopped: signals.Interrupted) -> None:
    """A worker process of hydra/launcher=local_gpus whose job was interrupted takes no further job: it
    passes the signal on to its sweep (which stops its other workers the same way, hydra_plugins/
    lra_launcher/local_gpus.py), says why and ends with the signal's status (its record is written)."""
    parent = int(os.environ["LRA_SWEEP_PARENT"])
    if parent == os.getppid():
        os.kill(parent, stopped.signal_number)
    log.error("error: %s", stopped)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(stopped.exit_code)


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
    choices = [a.split(",")[0] for a in sys.argv[1:]  # a group's choice (hydra/launcher=…), a sweep's first
               if "=" in a and a.split("=")[0].lstrip("+").split("/")[0] in groups]
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = compose(config_name="config", overrides=choices, return_hydra_config=path.startswith("hydra"))
        node = OmegaConf.select(node, path) if path else node
        return sorted(node.keys()) if isinstance(node, DictConfig) else []
    except Exception:
        return []


def _validate_dry_run(overrides: list) -> None:
    """``--cfg job|hydra|all``: the composed config is refused as the real run would refuse it (the same
    line, exit 2); a resume's dry run checks the config that run saved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    hydra_cfg = cfg.hydra
    with open_dict(cfg):
        del cfg["hydra"]
    hydra_settings.check(hydra_cfg)
    if not cfg.resume:
        refuse_one_job_of_a_sweep(hydra_cfg.sweeper.get("params"), hydra_cfg.runtime.choices.get("experiment"), overrides)
        check_preset_choices(hydra_cfg.runtime.choices)
        check_group_names(cfg, hydra_cfg.runtime.choices, hydra_cfg.overrides.task)
        check_unused_pretrain_keys(cfg, hydra_cfg.overrides.task)
    if cfg.resume:
        from lra.config import _if_resume  # hydra.run.dir's resolver: the real run's refusal, word for word

        try:
            _if_resume(cfg.resume, None)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        folder = RunDirectory(cfg.resume)
        cfg = folder.load_resolved(saved_run_config)
        refuse_changes_on_resume(folder, overrides, cfg)
        return validate_saved(folder, cfg)
    validate(cfg)


def main() -> None:
    """Console entry: Hydra errors become one line (set HYDRA_FULL_ERROR=1 for a traceback)."""
    sys.argv[1:] = command_line.env_set_added(sys.argv[1:])
    config_errors.at_the_edge(command_line.check)(sys.argv[1:])  # before Hydra makes hydra.run.dir
    config_errors.run_app(run, _valid_keys, check_shown=_validate_dry_run)
    from lra.results.callback import ENDED_SWEEPS

    if ENDED_SWEEPS and (ENDED_SWEEPS[-1][0] or ENDED_SWEEPS[-1][1]):  # every job ran: a script or scheduler
        print(f"error: {_shortfall(*ENDED_SWEEPS[-1])}", file=sys.stderr)  # must still see what did not finish
        sys.exit(1)


def _shortfall(failed: int, unfinished: int, runs: int, table: Path) -> str:
    """The line that ends a sweep whose runs did not all complete: those that failed, and those it could not
    finish (another process holds the folder, or a resume failed), with where each is listed."""
    if not unfinished:
        return (f"{failed} of the sweep's {runs} runs failed; the table above and {table} list each with its error "
                "(its record and train.log say more)")
    what = f"{failed} of the sweep's {runs} runs failed and {unfinished} did not finish" if failed else \
        f"{unfinished} of the sweep's {runs} runs did not finish"
    return (f"{what} (another process holds its folder, or its resume failed); the table above and {table} list "
            f"each: once that process has ended, continue the sweep with the same command and "
            f"hydra.sweep.dir={shlex.quote(str(Path(table).parent))} (finished jobs are kept, unfinished ones resume)")


if __name__ == "__main__":
    main()
