"""The run record: ``metrics.json`` (the contract's fields, rewritten atomically at each
evaluation and at the end) and facts about where a run ran."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch

from lra import signals
from lra.io import Unreadable, atomic_write_json, read_bytes

METRICS = "metrics.json"
# A record's status: "running" (being trained, or killed without a word: SIGKILL, a power cut),
# "completed", "failed" (the error says why) or "interrupted" (SIGINT, SIGTERM, SIGHUP: resumable).
INTERRUPTED = "interrupted"
HISTORY = "history.json"
REPO_ROOT = Path(__file__).resolve().parent.parent


def source_fields(source: Optional[dict]) -> dict:
    """The record's fields naming the code of a backend of the user's (``attention_zoo.user_modules.source_of``:
    the file that defines it and its SHA-256), which the run's git commit does not name; none for a built-in."""
    return {} if not source else {"attention_file": source["file"], "attention_file_sha256": source["sha256"]}


def changed_backend_code(record: dict) -> Optional[str]:
    """How the code of a run's backend of the user's (its record's :func:`source_fields`) differs from what this
    process has registered under its name: a phrase, or None where it is the same (or a built-in's run, or no
    backend of that name is registered: that has its own line)."""
    import attention_zoo
    from attention_zoo import user_modules

    recorded = record.get("attention_file_sha256")
    if not isinstance(recorded, str) or not isinstance(record.get("attention"), str):
        return None
    try:
        source = user_modules.source_of(attention_zoo.get(record["attention"]).cls) or {}
    except KeyError:
        return None
    if source.get("sha256") == recorded:
        return None
    now = f"{source['file']}, of SHA-256 {source['sha256'][:12]}…" if source else "a built-in backend of that name"
    return (f"it was trained by a backend of yours defined in a file of SHA-256 {recorded[:12]}… "
            f"({record.get('attention_file')}) and this process has {now}")


@functools.lru_cache(maxsize=None)  # HEAD does not move during a run: ask git once
def git_commit() -> str:
    """HEAD of the checkout this package runs from, with ``-dirty`` if tracked files changed. An
    installed package (a wheel, the Docker image) is no checkout, even inside one (a venv in a
    project): it reports ``$LRA_GIT_COMMIT`` (the image sets it from its build argument) or unknown."""
    if (REPO_ROOT / "pyproject.toml").is_file():
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                  text=True, check=True).stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                                   capture_output=True, text=True, check=True).stdout.strip()
            return head + ("-dirty" if dirty else "")
        except (OSError, subprocess.CalledProcessError):
            pass
    return os.environ.get("LRA_GIT_COMMIT") or "unknown"


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def read_record(run_dir: Path) -> Dict[str, Any]:
    """A run directory's ``metrics.json`` as a dict ({} when missing or unreadable: not a regular file of
    at most 16 MiB, as :func:`lra.io.read_bytes` reads, so a named pipe never blocks a resume, or no JSON
    object)."""
    import json

    try:
        data = json.loads(read_bytes(Path(run_dir) / METRICS))
        return data if isinstance(data, dict) else {}
    except (Unreadable, ValueError, RecursionError):
        return {}


class RunRecord:
    """Writes ``metrics.json`` in a run directory; unknown values stay ``null``.

    ``write`` is False on the ranks other than 0 of a multi-process run: they never write. A
    ``provisional`` record (a resume before its checkpoint has loaded) keeps its updates in memory
    until :meth:`confirm`, so a resume that fails leaves the previous record as it was."""

    FIELDS = ("task", "attention", "label", "seed", "status", "error", "steps", "best_step",
              "best_val_accuracy", "test_accuracy", "train_tokens_per_second", "wall_time_seconds",
              "peak_memory_mb", "num_parameters", "git_commit", "device")

    def __init__(self, run_dir: Path, write: bool = True, provisional: bool = False,
                 guard: Optional[Callable[[], None]] = None, **fields: Any):
        self.path = Path(run_dir) / METRICS
        self.write = write
        self.provisional = provisional
        self.guard = guard  # raises when the record must not be written (its run's folder is gone)
        self.data: Dict[str, Any] = {name: None for name in self.FIELDS}
        self.data.update(fields)

    def update(self, **fields: Any) -> None:
        self.data.update(fields)
        if self.write and not self.provisional:
            if self.guard is not None:
                self.guard()
            with signals.deferred():  # a signal meanwhile is raised once the record is whole
                atomic_write_json(self.path, self.data)

    def confirm(self) -> None:
        """The run is this folder's from now on (a resume's checkpoint has loaded): write from here."""
        self.provisional = False
        self.update()

    def fail(self, error: BaseException | str, **fields: Any) -> None:
        message = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self.update(status="failed", error=message, **fields)

    def stop(self, exc: BaseException) -> None:
        """The run ended before completing: ``interrupted`` with the signal's name (``signal``: SIGINT,
        SIGTERM or SIGHUP; ``error``: "interrupted (SIGTERM)") for a signal, else ``failed`` with the
        error. A stage still running (self-pretraining's ``pretrain_status``) ends the same way."""
        if isinstance(exc, KeyboardInterrupt):
            interrupted = signals.as_interrupted(exc)
            fields = {"status": INTERRUPTED, "error": interrupted.reason, "signal": interrupted.signal_name}
        else:  # the same words as the console's error line where the edge has one (the fix included)
            from lra.commands.config_errors import failure

            known = failure(exc)
            fields = {"status": "failed", "error": f"{type(exc).__name__}: {known[0] if known else exc}"}
        if self.data.get("pretrain_status") == "running":
            fields["pretrain_status"] = fields["status"]
        from lra.errors import UserError

        try:
            self.update(**fields)
        except UserError:  # the guard: the run's folder is gone, so there is no record to write
            pass
