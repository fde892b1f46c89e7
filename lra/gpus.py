"""One job per GPU on a local machine: a job claims a free GPU through an exclusive lock file, held
until the process exits, so parallel sweep jobs (``hydra/launcher=local_gpus``) never share a GPU and
a waiting job starts the moment one is released."""

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


def try_claim(count: int, folder: Optional[Path] = None) -> Optional[Tuple[int, IO]]:
    """The first of ``count`` GPUs whose lock is free, with its open lock file; None if all are taken."""
    folder = Path(folder or lock_dir())
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        handle = open(folder / f"gpu{index}.lock", "a")
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
    waited = False
    while True:
        claimed = try_claim(count)
        if claimed is not None:
            index, handle = claimed
            _HELD.append((index, handle))
            if waited:
                announce(f"GPU {index} became free")
            return index
        if not waited:
            announce(f"all {count} GPUs are busy with other jobs; waiting for one to be released")
            waited = True
        time.sleep(poll_seconds)
