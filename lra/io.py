"""Atomic file writes: write a temporary file in the same folder, fsync, rename over the target."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from lra.faults import fault_point


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "w") -> None:
    """Call ``write(handle)`` on a temporary file, then rename it to ``path`` in one step."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp's 0600 would make results unreadable to others
    try:
        with os.fdopen(fd, mode) as handle:
            write(handle)
            fault_point("write", path)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda handle: handle.write(text))


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale(folder: Path, name_pattern: str) -> list:
    """Remove the temporaries in ``folder`` whose names match the regular expression
    ``name_pattern`` and whose writer is dead: the pattern's group ``pid`` is the writer's process
    id. Files and folders of live writers (a concurrent job on this machine) are kept. Returns what
    was removed."""
    import re
    import shutil

    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for path in folder.iterdir():
        match = re.fullmatch(name_pattern, path.name)
        if match and not pid_alive(int(match.group("pid"))):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def readable_by_group(path: Path) -> None:
    """Give a folder made by ``mkdtemp`` (0700) the permissions a plain ``mkdir`` would."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)


def save_figure(figure, path: Path, rect=(0, 0, 1, 1)) -> None:
    """Lay out a matplotlib figure (its axes within ``rect``, figure fractions), write it as PNG
    atomically, and close it."""
    import matplotlib.pyplot as plt

    figure.tight_layout(rect=rect)
    atomic_write(path, lambda handle: figure.savefig(handle, dpi=110, format="png"), mode="wb")
    plt.close(figure)
