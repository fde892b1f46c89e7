"""k jobs per GPU on a local machine (k = 1 by default): a job claims a free slot of a GPU through an
exclusive lock file, held until the process exits, so parallel sweep jobs (``hydra/launcher=local_gpus``,
``hydra.launcher.jobs_per_gpu=k``) never put more than k jobs on a GPU, fill every GPU's first slot
before any second one, and a waiting job starts the moment a slot is released."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Callable, Optional, Tuple

_HELD: list = []  # lock files held for the life of the process


def lock_dir() -> Path:
    return Path(os.environ.get("LRA_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / f"lra-gpu-locks-{os.getuid()}"))


def slots_per_gpu() -> int:
    """Jobs that may share one GPU: ``LRA_JOBS_PER_GPU``, set by the local_gpus launcher."""
    value = os.environ.get("LRA_JOBS_PER_GPU", "1")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"LRA_JOBS_PER_GPU={value!r}: it must be a whole number >= 1 (hydra.launcher.jobs_per_gpu)")
    return int(value)


def try_claim(count: int, folder: Optional[Path] = None, slots: int = 1) -> Optional[Tuple[int, IO]]:
    """The GPU of the first free slot, with its open lock file; None if all ``count`` × ``slots`` are
    taken. Slot 0 of every GPU comes before slot 1 of any, so the jobs spread over the GPUs."""
    folder = Path(folder or lock_dir())
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(slots):
        for index in range(count):
            handle = open(folder / (f"gpu{index}.lock" if slot == 0 else f"gpu{index}.slot{slot}.lock"), "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return index, handle
    return None


def claim(count: int, announce: Callable[[str], None] = print, poll_seconds: float = 5.0) -> int:
    """Block until one of ``count`` GPUs is free; keep its lock until this process exits. A process
    that already holds one (a launcher's worker running its next job) keeps using it."""
    if _HELD:
        return _HELD[0][0]
    waited, slots = False, slots_per_gpu()
    while True:
        claimed = try_claim(count, slots=slots)
        if claimed is not None:
            index, handle = claimed
            _HELD.append((index, handle))
            if waited:
                announce(f"GPU {index} became free")
            return index
        if not waited:
            announce(f"all {count} GPUs are busy with other jobs ({slots} per GPU); waiting for one to be released")
            waited = True
        time.sleep(poll_seconds)
