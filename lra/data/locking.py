"""Locks that make concurrent jobs share one data preparation instead of racing through it.

Two kinds, each an OS lock (``flock``) on a small file beside the folder it guards, released when its
process ends however it ends (a killed job never leaves a lock held):

- :func:`preparing` (exclusive): held while a cache is built or generated data is written. A second job
  that needs the same folder meanwhile says whom it waits for, waits, and then judges the folder again:
  it uses what the first one prepared instead of preparing it a second time (and a sweep of N jobs on a
  bare data folder generates its data once, not N times over each other).
- :func:`reading` (shared) and :func:`replacing` (exclusive): a job loading a cache (its manifest, the
  checksums of its files, the memory maps) reads one cache, never half of the old one and half of the
  rebuild that ``lra-prepare --force`` swaps in meanwhile; the swap waits the moment the load takes.

Lock files are named ``.<folder>.<kind>.lock`` and removed by their last holder, so that nothing stays
behind in the data folder; one is writable by whoever may write its folder (the jobs of a group's data
folder share its locks). A data folder that cannot take a lock file (a read-only copy, which no job can
rebuild either) is read without one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

from lra.faults import fault_point

_NO_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}  # a file system that has no flock

def lock_path(folder: Path, kind: str) -> Path:
    folder = Path(folder)
    return folder.parent / f".{folder.name}.{kind}.lock"


def _open(path: Path, required: bool) -> Optional[int]:
    """A descriptor of the lock file at ``path``, made when missing; None when none can be made and none is
    required (a read-only data folder)."""
    flags = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        if required:
            path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o666)
    except OSError as exc:
        if required and exc.errno not in (errno.EACCES, errno.EPERM):
            raise
        try:  # one made by whoever may write there (another user's, in a group's data folder: flock needs no write)
            return os.open(path, os.O_RDONLY | flags)
        except OSError:
            if required:
                raise exc from None
            return None
    _writable_as_its_folder(descriptor, path.parent)
    return descriptor


def _writable_as_its_folder(descriptor: int, folder: Path) -> None:
    """A lock file writable by whoever may write its folder (a group's shared data folder): another user's job
    takes the lock and names itself there, as the job that made it does (the umask would leave it the maker's)."""
    with contextlib.suppress(OSError):  # (not the maker: the maker's job has done it)
        wanted, mode = os.stat(folder).st_mode & 0o022, os.fstat(descriptor).st_mode & 0o7777
        if mode & wanted != wanted:
            os.fchmod(descriptor, mode | wanted)


def _holder(descriptor: int) -> str:
    try:
        said = " ".join(os.pread(descriptor, 400, 0).decode(errors="replace").split())  # one line, whatever it holds
        return said[:200] or "another process"
    except OSError:
        return "another process"


def _lock_at_once(descriptor: int, operation: int) -> Optional[bool]:
    """Take the lock if no one holds it: True when taken, False when another holds it, None without flock."""
    try:
        fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return False
        if exc.errno in _NO_LOCKS:
            return None
        raise
    return True


def _acquire(path: Path, operation: int, required: bool, on_wait: Callable[[str], None]) -> tuple:
    """(descriptor, whom it waited for or None), the lock held on the file that is at ``path`` now."""
    waited = None
    while True:
        descriptor = _open(path, required)
        if descriptor is None:
            return None, waited
        try:
            locked = _lock_at_once(descriptor, operation)
            if locked is None:  # a file system without flock: as before there were locks
                os.close(descriptor)
                return None, waited
            if not locked:  # (waited for outside the attempt's except clause: an interruption is no OS error's)
                if waited is None:
                    waited = _holder(descriptor)
                    on_wait(waited)
                fcntl.flock(descriptor, operation)  # a signal interrupts the wait as it interrupts a run
            try:  # a holder that ended meanwhile may have removed the file: then lock the one there now
                same = os.path.samestat(os.fstat(descriptor), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(descriptor)
            raise
        if same:
            return descriptor, waited
        os.close(descriptor)


def _release(path: Path, descriptor: Optional[int]) -> None:
    """Release the lock; its last holder removes the file (while it holds the lock exclusively, so that a
    job waiting on the file takes the next one instead)."""
    if descriptor is None:
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with contextlib.suppress(OSError):
            os.unlink(path)
    except OSError:  # other readers hold it still: the last of them removes it
        pass
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def preparing(folder: Path, what: str, announce: Callable[[str], None], required: bool = True,
              then: str = "then using what it prepared") -> Iterator[Optional[str]]:
    """Hold the lock that lets one job at a time prepare ``folder`` (``what``, in words). Yields None when no
    other job held it, else whom it waited for: the caller then looks at ``folder`` again, which that job may
    have prepared meanwhile. Waiting is said in one line naming the job waited for and what follows (``then``).
    Without ``required``, a data folder where no lock file can be made (read-only) is left unlocked."""
    path = lock_path(folder, "prepare")

    def waiting(holder: str) -> None:
        announce(f"{what} is being prepared by {holder}: waiting for it to finish, {then} (one job prepares, the "
                 "others wait)")

    descriptor, waited = _acquire(path, fcntl.LOCK_EX, required, waiting)
    if descriptor is None:
        yield None
        return
    try:
        command = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        with contextlib.suppress(OSError):  # (a lock file opened read-only names no holder)
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"process {os.getpid()} on {socket.gethostname()} ({command}, since "
                                  f"{time.strftime('%Y-%m-%d %H:%M:%S')})".encode(), 0)
        fault_point("data_lock", path)  # tests: LRA_FAULT=data_lock:1:SIGSTOP holds a job here, the lock held
        yield waited
    finally:
        _release(path, descriptor)


@contextlib.contextmanager
def reading(cache_dir: Path) -> Iterator[None]:
    """Hold off a swap of the cache in ``cache_dir`` while it is loaded (shared: loads do not wait on each
    other). Without a writable data folder, no swap can happen and no lock is taken."""
    path = lock_path(cache_dir, "read")
    descriptor, _ = _acquire(path, fcntl.LOCK_SH, False, lambda holder: None)
    try:
        yield
    finally:
        _release(path, descriptor)


@contextlib.contextmanager
def replacing(cache_dir: Path, announce: Optional[Callable[[str], None]] = None) -> Iterator[None]:
    """Hold the lock under which a cache is swapped in: no job is loading it meanwhile."""
    path = lock_path(cache_dir, "read")

    def waiting(holder: str) -> None:
        if announce is not None:
            announce(f"waiting for the jobs loading {cache_dir} before replacing it (they keep the cache they load)")

    descriptor, _ = _acquire(path, fcntl.LOCK_EX, True, waiting)
    try:
        yield
    finally:
        _release(path, descriptor)
