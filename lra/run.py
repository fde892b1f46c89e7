"""A run directory and its one owner.

``lra-train`` makes one :class:`RunDirectory` per run and nothing else decides about the folder: it
takes the folder's OS lock before anything is written there, refuses a fresh run in a folder that
already holds one (a completed result is never adopted), answers "is this run completed?", saves
the config files Hydra would have saved (Hydra itself writes nothing into a run folder:
``hydra.output_subdir`` is null and its job log is console-only), keeps the run's log file
(``train.log``), and makes the run's single record (``metrics.json``, written by rank 0 only). The
lock is the OS's (``flock``): released when the process ends however it ends, so a killed run never
blocks the next.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shlex
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Callable, List, Optional

from omegaconf import DictConfig, OmegaConf

from lra import packing
from lra.errors import ConfigError, UserError
from lra.io import atomic_write_text, kind
from lra.records import HISTORY, METRICS, RunRecord, read_record

HYDRA_FILES = ".hydra"  # the run's config files, as Hydra's output_subdir would hold them
RESOLVED = Path(HYDRA_FILES) / "resolved.yaml"
OVERRIDES = Path(HYDRA_FILES) / "overrides.yaml"
# A record packed by lra-gpu-check --reference (and committed under docs/gpu/*/records/): each of a run's
# files → its name beside the others, in a folder of its own.
PACKED = {Path(METRICS): METRICS, RESOLVED: "resolved.yaml", OVERRIDES: "overrides.yaml"}


def hydra_value(path) -> str:
    """``path`` as a value Hydra's override grammar parses back to it: as it is where it holds no character the
    grammar reads as syntax (``,`` ``=`` ``[`` ``~`` a space, a quote, a letter beyond ASCII:
    ``attention=softmax,seed=0`` from ``hydra.job.override_dirname``), else in Hydra's single quotes."""
    import re

    path = str(path)
    if re.fullmatch(r"[A-Za-z0-9_/.+@%:-]+", path):
        return path
    quoted = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", path)  # a quote, and backslashes before it
    quoted = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, quoted)  # backslashes before the closing quote
    return f"'{quoted}'"


def parsed_value(text: str) -> str:
    """A value as typed on a command line (``'/data/a b'``), as Hydra's grammar reads it back (the inverse of
    :func:`hydra_value`); the text without its outer quotes where the grammar takes none of it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        value = OverridesParser.create().parse_override(f"key={text}").value()
    except Exception:  # Hydra refuses it with its own line once it parses the command line
        return text.strip("'\"")
    return value if isinstance(value, str) else text.strip("'\"")


def process_count(value) -> Optional[int]:
    """A run's recorded torchrun process count as a whole number ≥ 1 (from a record, a checkpoint's build as
    text, a table's column as a float), or None where it holds none."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 1:
        return None
    return int(value)


def resume_command(folder, processes: Optional[int] = None) -> str:
    """``lra-train resume=<folder>`` as a shell takes it and Hydra parses it back to ``folder`` (:func:`hydra_value`,
    then the whole argument quoted for the shell), under torchrun with the run's process count where it had
    more than one (``processes``, else its record's): a run resumes only on the count it began with."""
    import re

    processes = process_count(read_record(Path(folder)).get("processes") if processes is None else processes) or 1
    command = f"torchrun --standalone --nproc_per_node={processes} $(which lra-train)" if processes > 1 else "lra-train"
    argument = f"resume={hydra_value(folder)}"
    if not argument.endswith("'"):
        return f"{command} {shlex.quote(argument)}"
    return f'{command} "{argument}"' if not re.search(r'[$`"\\!]', argument) else f"{command} {shlex.quote(argument)}"


def not_a_run(folder) -> Optional[str]:
    """The line refusing ``resume=<folder>`` where the folder holds no run's saved config; None where it does."""
    folder = Path(folder)
    if (folder / RESOLVED).is_file():
        return None
    if (folder / HYDRA_FILES).is_dir() and not (folder / METRICS).exists() and not (folder / CHECKPOINTS).exists():
        # lra-train made it and was stopped (a kill) while it wrote its config files: nothing was trained there.
        saved = RunDirectory(folder).saved_overrides()
        again = shlex.join(["lra-train", *saved, f"hydra.run.dir={hydra_value(folder)}"]) if saved else \
            "the command that started it"
        return (f"resume={folder} holds a run stopped while it saved its config (no {RESOLVED.as_posix()}): nothing "
                f"was trained there, so there is nothing to resume; start it again with {again}")
    return (f"resume={folder} is not an lra-train run directory (no {RESOLVED.as_posix()}); "
            "pass a run folder such as runs/<date>/<time>")


def run_file_candidates(run_dir: Path, name: Path) -> tuple:
    """Where a run folder, or a packed record's folder, holds the run's file ``name`` (a key of :data:`PACKED`)."""
    return run_dir / name, run_dir / PACKED[name]
LOCK = ".lock"
LOG = "train.log"
CHECKPOINTS = "checkpoints"
PRETRAIN = "pretrain"  # self-pretraining's stage 1 (lra/pretraining.py)
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job-log format


class RunFolderGone(UserError):
    """The run's folder was deleted or moved while the run wrote to it."""


class FolderTaken(UserError):
    """The folder a fresh run was to use belongs to another run (in use by a process: exit 1)."""


class FolderHoldsRun(FolderTaken, ConfigError):
    """The folder a fresh run was to use already holds another run (exit 2)."""


class RunDirectory:
    def __init__(self, path: Path | str, main: bool = True):
        self.path = Path(path).resolve()
        self.main = main  # rank 0 of a torchrun job (or the only process): the one that writes
        self._lock_handle = None
        self._log_handler: Optional[logging.Handler] = None
        self._identity: Optional[tuple] = None  # (device, inode) of the folder claimed
        self._config_sha256: Optional[str] = None

    # ------------------------------------------------------------------ facts (no writes)
    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    def holds_run(self) -> bool:
        """Whether a run has been started here (its record, saved config, checkpoints or history)."""
        return (self.path / METRICS).exists() or self._trained_here()

    def others_inside(self) -> Optional[str]:
        """What other runs this folder holds (a sweep's multirun.yaml, or run folders in it), or None: a new run
        written here would lie among them, and a table read them as one."""
        if (self.path / "multirun.yaml").is_file():
            return "a sweep (multirun.yaml)"
        try:
            inside = sorted(child.name for child in self.path.iterdir() if (child / METRICS).is_file())
        except OSError:  # not there yet, or not a folder: claim's own checks say so
            return None
        return f"runs ({', '.join(inside[:3])}{', …' if len(inside) > 3 else ''})" if inside else None

    def _trained_here(self) -> bool:
        """Whether a run went past its start here (its saved config, checkpoints or history): a record alone
        is a refused sweep job's."""
        return any((self.path / name).exists() for name in (RESOLVED, CHECKPOINTS, HISTORY, PRETRAIN))

    def recorded(self) -> bool:
        """Whether the run here has its record (metrics.json)."""
        return (self.path / METRICS).is_file()

    def read_record(self) -> dict:
        return read_record(self.path)

    def completed(self) -> bool:
        """The one answer to "is this run completed?": its record says so."""
        return self.read_record().get("status") == "completed"

    def continued_by(self, resolved_yaml: str) -> bool:
        """Whether a fresh command with this resolved config continues the run here rather than
        starting another one: the run is unfinished and recorded exactly this config (a job that
        submitit or SLURM requeued, or the same command started again)."""
        return not self.completed() and self.records_config(resolved_yaml)

    def records_config(self, resolved_yaml: str) -> bool:
        """Whether the run here recorded exactly this resolved config."""
        try:
            return (self.path / RESOLVED).read_text() == resolved_yaml
        except OSError:
            return False

    def holds_failed_start(self, overrides: list) -> bool:
        """Whether this folder holds only the record of the sweep job with these overrides that failed before
        its run started (its config refused, or its config files unwritable): no saved config, no checkpoint.
        That job started again replaces it; any other job is refused the folder."""
        record = self.read_record()
        recorded = record.get("overrides", self.saved_overrides())  # in the record: its config files may be missing
        return record.get("status") == "failed" and not (self.path / RESOLVED).exists() \
            and not self.checkpoints.exists() and list(recorded) == list(overrides)

    def describe(self) -> str:
        record = self.read_record()
        if not record:
            return "a run"
        what = f"{record.get('label') or record.get('attention')} on {record.get('task')}, seed {record.get('seed')}"
        status = record.get("status") or "started"
        return f"{'an' if status[:1] in 'aeiou' else 'a'} {status} run ({what})"

    # ------------------------------------------------------------------ ownership
    def claim(self, fresh: bool) -> None:
        """Own the folder for this process's lifetime, before anything is written into it. A fresh
        run refuses a folder that already holds a run; any run refuses a folder another process
        holds. Ranks other than 0 share rank 0's claim and take none."""
        if not self.main:
            return
        if fresh and self.holds_run():  # refused before even the lock file is made
            raise self._occupied()
        others = self.others_inside() if fresh else None
        if others is not None:
            raise FolderHoldsRun(f"{self.path} holds {others}; a new run never writes among other runs: train into a "
                                 f"new folder (leave hydra.run.dir unset, or choose another)")
        self.path.mkdir(parents=True, exist_ok=True)
        handle = self._open_lock(create=True)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            fix = ("wait for that run to end (or stop it) before resuming it" if not fresh else
                   "train into a new folder (leave hydra.run.dir unset, or choose another)")
            taken = FolderTaken if fresh else UserError
            raise taken(f"the run directory {self.path} is in use by {holder}; {fix}") from None
        if fresh and self.holds_run():  # started by another process meanwhile
            handle.close()
            raise self._occupied()
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} on {socket.gethostname()} (since {time.strftime('%Y-%m-%d %H:%M:%S')})")
        handle.flush()
        self._lock_handle = handle
        for folder in (self.path, self.path / HYDRA_FILES, self.path / PRETRAIN):  # a kill's leftovers, now it is ours
            if folder.is_dir():
                self.remove_interrupted_writes(folder)
        folder = os.stat(self.path)
        self._identity = (folder.st_dev, folder.st_ino)

    def _open_lock(self, create: bool):
        """The folder's lock file, opened for reading and writing. Anything there but a regular file is never
        opened (a symbolic link would have the lock written over its target, say a file of the system's; a
        named pipe would wait; a device may act): a :class:`UserError` line to claim it, an OSError to look."""
        path = self.path / LOCK
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            mode = None
        if mode is None or stat.S_ISREG(mode):
            try:  # O_NOFOLLOW: a link put there since the lstat is refused too
                descriptor = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                                     | (os.O_CREAT if create else 0), 0o644)
                if stat.S_ISREG(os.fstat(descriptor).st_mode):
                    return os.fdopen(descriptor, "r+")
                os.close(descriptor)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
            mode = os.lstat(path).st_mode
        if not create:
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        raise UserError(f"{path} is not the run's lock file but {kind(mode)}, which lra-train never writes "
                        f"through; remove it (rm {shlex.quote(str(path))}) and run the command again")

    def check_present(self) -> None:
        """Before this run writes into its folder: the folder it claimed is still there, at its path. A
        folder deleted (or moved away) mid-run would otherwise be made again by the next write, holding a
        record and checkpoints without the run's config or log: one :class:`RunFolderGone` line instead."""
        if self._identity is None:
            return
        try:
            now = os.stat(self.path)
            same = (now.st_dev, now.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            raise RunFolderGone(f"the run folder {self.path} was deleted or moved while this run was writing to it; "
                                "nothing more is written there: resume it where it was moved to (lra-train "
                                "resume=<that folder>), or start it again")

    def holder(self) -> Optional[str]:
        """Who holds this folder's lock right now (None when nobody does), found without writing."""
        try:
            with self._open_lock(create=False) as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return handle.read().strip() or "another process"
                return None  # closing the file releases the lock taken just now
        except OSError:
            return None

    def last_holder_alive(self) -> Optional[bool]:
        """Whether the process that last held this folder (its lock file's "process PID on HOST") still holds
        it: the lock as the kernel's table shows it (:func:`lra.io.flock_held`; where there is none, whether that
        process is alive), read without taking the lock; None where that cannot be told from here (no lock file,
        another host). A record still ``running`` whose holder is gone was killed (SIGKILL, the out-of-memory
        killer, a power cut) and resumes exactly."""
        import re

        from lra.io import flock_held, pid_alive

        try:
            with self._open_lock(create=False) as handle:
                text = handle.read(4096)
        except OSError:
            return None
        found = re.match(r"process (\d+) on (\S+) ", text)
        if found is None or found.group(2) != socket.gethostname():
            return None
        held = flock_held(self.path / LOCK)  # the lock itself: its last holder may live on idle (a sweep, a worker)
        return pid_alive(int(found.group(1))) if held is None else held

    def _occupied(self) -> UserError:
        holder = self.holder()
        if holder is not None:
            return FolderTaken(f"the run directory {self.path} is in use by {holder}; train into a new folder (leave "
                               "hydra.run.dir unset, or choose another)")
        if not self._trained_here() and self.read_record().get("status") == "failed":  # a refused sweep job's: nothing to resume
            return FolderHoldsRun(f"{self.path} already holds {self.describe()} that failed before it started (no saved "
                                  "config, no checkpoint: nothing to resume); a new run never adopts an existing folder: "
                                  "train into a new folder (leave hydra.run.dir unset, or choose another), or delete "
                                  "that one first")
        return FolderHoldsRun(f"{self.path} already holds {self.describe()}; a new run never adopts an existing folder: "
                           f"resume that run with `{resume_command(self.path)}`, or train into a new folder (leave "
                           "hydra.run.dir unset, or choose another)")

    @property
    def config_sha256(self) -> Optional[str]:
        """SHA-256 of the run's saved config (:data:`RESOLVED`) as this process trains it (read once:
        its checkpoints carry it, and a resume checks it against theirs), None without one."""
        if self._config_sha256 is None:
            try:
                self._config_sha256 = hashlib.sha256((self.path / RESOLVED).read_bytes()).hexdigest()
            except OSError:
                return None
        return self._config_sha256

    @property
    def owned(self) -> bool:
        return self._lock_handle is not None

    def release(self) -> None:
        self.detach_log()
        if self._lock_handle is not None:
            self._lock_handle.close()  # closing the descriptor releases the flock
            self._lock_handle = None

    # ------------------------------------------------------------------ files (only once owned)
    def _check_owned(self) -> None:
        if self.main and not self.owned:
            raise RuntimeError(f"{self.path} is written before it is claimed")

    def attach_log(self) -> None:
        """Send the root logger's records to ``train.log`` too (appending, as a resumed run does)."""
        self._check_owned()
        if self.main and self._log_handler is None:
            handler = logging.FileHandler(self.path / LOG)
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            if packing.in_pack():  # the pack's other runs log from their own threads to their own files
                thread = threading.get_ident()
                handler.addFilter(lambda entry: entry.thread == thread)
            logging.getLogger().addHandler(handler)
            self._log_handler = handler

    def detach_log(self) -> None:
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None

    def save_hydra_files(self, hydra_cfg: DictConfig, task_cfg: DictConfig) -> None:
        """``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml``, as Hydra's output_subdir would."""
        self._check_owned()
        if not self.main:
            return
        folder = self.path / HYDRA_FILES
        atomic_write_text(folder / "config.yaml", OmegaConf.to_yaml(task_cfg))
        atomic_write_text(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})))
        atomic_write_text(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task))

    def save_resolved(self, cfg: DictConfig) -> None:
        self._check_owned()
        if self.main:
            atomic_write_text(self.path / RESOLVED, OmegaConf.to_yaml(cfg, resolve=True))
            self._config_sha256 = None

    def saved_overrides(self, strict: bool = False) -> list:
        """The overrides the run saved (:data:`OVERRIDES`), [] without that file; where it is no YAML list of
        texts, [] too, or with ``strict`` a ValueError saying why (a resume compares them with its own)."""
        path = self.path / OVERRIDES
        try:
            saved = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else []
            if not isinstance(saved, list) or not all(isinstance(o, str) for o in saved):
                raise ValueError("it is no YAML list of overrides such as trainer=smoke")
            return saved
        except Exception as exc:
            if strict:
                raise ValueError(" ".join(str(exc).split())[:200] or type(exc).__name__) from None
            return []

    def load_resolved(self, complete: Callable[[DictConfig], DictConfig]) -> DictConfig:
        """The resolved config this run recorded, made whole by ``complete`` (fields added since get
        their defaults: :func:`lra.config.saved_run_config`), or a one-line error."""
        try:
            return read_saved_config(self.path / RESOLVED, complete)
        except ValueError as exc:
            from lra.records import changed_backend_code

            changed = changed_backend_code(self.read_record())  # an option of yours renamed: the cause, not the file
            if changed:
                raise UserError(f"cannot resume {self.path}: {changed}, whose options no longer read its {RESOLVED} "
                                f"({exc}); restore that file (LRA_ATTENTION_MODULES), or start a new run") from None
            raise UserError(f"cannot resume {self.path}: its {RESOLVED} is unreadable ({exc}); start a new run with "
                            "the same overrides instead") from None

    @staticmethod
    def remove_interrupted_writes(folder: Path) -> None:
        """Delete the temporary files (``lra.io.atomic_write``'s ``.<name>.*.tmp``) that a kill left in
        ``folder`` mid-write: the file they were to replace is still whole, or absent."""
        for stale in Path(folder).glob(".*.tmp"):
            stale.unlink()

    def training_checkpoint(self, folder: Path) -> Optional[tuple]:
        """(path, payload) of the training checkpoint in ``folder`` (this run's ``checkpoints/``, or a
        stage's), or None when there is none yet; temporary files a kill left mid-write are removed
        first; an unreadable or foreign file is one :class:`UserError` line."""
        from lra import checkpoint  # torch: imported when a checkpoint is read, not when a command starts

        self.remove_interrupted_writes(folder)
        path = Path(folder) / checkpoint.LAST
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return None
        except OSError as exc:  # a loop of links, a folder this user may not enter: never taken for "no checkpoint"
            raise UserError(f"cannot resume from {path}: it cannot be read ({exc.strerror.lower()}); make it readable, "
                            f"or start a new run with the same overrides (its metrics.json is left as it was)") from None
        if not stat.S_ISREG(mode):  # taken for "no checkpoint", the run trained again from step 0 over its files
            raise UserError(f"cannot resume from {path}: it is {kind(mode)}, not a checkpoint file; move it away and "
                            f"put the run's {checkpoint.LAST} there, or start a new run with the same overrides (its "
                            f"metrics.json is left as it was)")
        return path, checkpoint.load_training(path)

    def new_record(self, provisional: bool = False, **fields: Any) -> RunRecord:
        """The run's one record, written by rank 0 alone; ``provisional`` (a resume) writes nothing
        until :meth:`RunRecord.confirm` (its checkpoint has loaded)."""
        self._check_owned()
        return RunRecord(self.path, write=self.main, provisional=provisional, guard=self.check_present, **fields)

    def remove_if_empty(self) -> None:
        """A refused fresh config leaves no folder: remove this one if nothing is in it (Hydra made it),
        and the empty folders above it up to the working folder (outside it, only this one)."""
        cwd = Path.cwd().resolve()
        folder = self.path
        while folder != cwd:
            try:
                folder.rmdir()
            except OSError:
                return
            if cwd not in folder.parents:
                return
            folder = folder.parent


def sweep_overrides(sweep_dir: Path, part: str = "task") -> Optional[List[str]]:
    """The overrides Hydra saved in a sweep folder's multirun.yaml (``part``: task, or hydra), None where the
    folder has none; ValueError where it cannot be read."""
    from omegaconf import OmegaConf

    saved = Path(sweep_dir) / "multirun.yaml"
    if not saved.is_file():
        return None
    try:
        overrides = OmegaConf.select(OmegaConf.load(saved), f"hydra.overrides.{part}")
    except Exception as exc:
        raise ValueError(f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}") from None
    if not OmegaConf.is_list(overrides):
        raise ValueError(f"hydra.overrides.{part} is no list")
    return [str(override) for override in overrides]


def read_saved_config(path: Path, complete: Callable[[DictConfig], DictConfig]) -> DictConfig:
    """A run's saved config at ``path``, made whole by ``complete``; ValueError saying why it cannot be read."""
    try:
        saved = OmegaConf.load(path)
        if not isinstance(saved, DictConfig) or not saved:
            raise ValueError("it is empty")
        return complete(saved)
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "empty"
        raise ValueError(f"{type(exc).__name__}: {reason}") from None
