"""Atomic file writes (a temporary file in the same folder, fsync, rename over the target), the one
check of an output path that every command makes before it writes anything, and the one bounded read
of a file the harness did not necessarily write (a run record, a reference table): only a regular file
of bounded size, never a named pipe (which would wait for a writer for ever) or a device."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

from lra.errors import ConfigError, UserError
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
    except BaseException as exc:
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        named = naming(exc, path)
        if named is not None:
            raise named from exc
        raise


def naming(exc: BaseException, path) -> OSError | None:
    """``exc``'s OS error again, naming ``path``, when it names no file: a write to a full disk does not
    say which (``write(2)`` knows only its descriptor), and the error's one line must say where. None
    when ``exc`` holds no such error (or it names its file already)."""
    seen = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        if isinstance(exc, OSError) and exc.errno:
            return OSError(exc.errno, exc.strerror, str(path)) if exc.filename is None else None
        exc = exc.__cause__ or exc.__context__
    return None


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


def flock_held(path: Path) -> Optional[bool]:
    """Whether some process holds a flock on ``path``, read from the kernel's table of locks (/proc/locks) without
    taking it; None where that table cannot be read (no /proc, not Linux). The file's inode number alone is
    matched (a container's overlay may show its device otherwise): another file of that number locked reads as
    held, the cautious answer."""
    try:
        inode = os.stat(path).st_ino
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():
        fields = line.split()
        if "FLOCK" in fields and "->" not in fields and any(f.rsplit(":", 1)[-1] == str(inode) for f in fields
                                                          if f.count(":") == 2):
            return True
    return False


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


# ----------------------------------------------------------------------------- output paths
def _nearest_existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists() or p.is_symlink())


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` (an existing folder) cannot take new files, or None when it can."""
    try:
        fault_point("output_check", folder)  # tests: LRA_FAULT=output_check:1:EROFS (see lra.faults)
    except OSError as exc:
        return exc.strerror.lower()
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return "read-only file system" if read_only else "permission denied"


def check_output_folder(path: Path | str, setting: str, reads: Iterable[Path | str] = (), fix: str | None = None) -> Path:
    """Check, before anything is written, that ``path`` can be this command's output folder: it is
    a folder or can be made one (missing folders are created when the command writes, like
    ``mkdir -p``), it is not a file, it sits on a writable file system in a folder this process may
    write, and it is none of the folders the command reads (``reads``). Returns the absolute path;
    raises one :class:`UserError` line naming ``setting`` (the option or key that chose the path)
    and ``fix`` (default: give that setting another folder)."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    fix = fix or f"give {setting} another folder"
    existing = _nearest_existing(path)
    if not existing.is_dir():
        kind = "a broken symbolic link" if existing.is_symlink() and not existing.exists() else "a file"
        if existing == path:
            raise UserError(f"{setting}: {path} is {kind}, not a folder; {fix} (a missing one is created)")
        raise UserError(f"{setting}: {existing} is {kind}, so no folder {path} can be made under it; move it away "
                        f"or {fix}")
    why = _unwritable(existing)
    if why is not None:
        where = path if existing == path else f"{existing} (where {path} would be made)"
        raise UserError(f"{setting}: cannot write into {where} ({why}); {fix}")
    resolved = path.resolve()
    for read in reads:
        if resolved == Path(read).expanduser().resolve():
            raise UserError(f"{setting}: {path} is a folder this command reads ({read}); {fix}, so that nothing "
                            "it reads is overwritten")
    return path


def check_output_file(path: Path | str, setting: str, reads: Iterable[Path | str] = (),
                      reserved: Sequence[tuple] = ()) -> Path:
    """Check, before anything is written, that ``path`` can be this command's output file: not a
    folder, its folder as :func:`check_output_folder` requires, and none of the files the command
    reads (``reads``; a symbolic link to one counts as that file). ``reserved`` lists (folder, name,
    why): no file called ``name`` anywhere under ``folder`` (e.g. a run record's name under the
    folders lra-table reads). Returns the absolute path; raises one :class:`UserError` line."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    if path.is_dir():
        raise UserError(f"{setting}: {path} is a folder; give {setting} a file name (e.g. {path / 'table.md'})")
    check_output_folder(path.parent, setting, fix=f"give {setting} a path in another folder")
    resolved = path.resolve()
    for read in reads:
        if resolved == Path(read).expanduser().resolve():
            raise UserError(f"{setting}: {path} is a file this command reads"
                            + (f" ({read})" if Path(read) != path else "") + f"; give {setting} another file, so "
                            "that nothing it reads is overwritten")
    for folder, name, why in reserved:
        folder = Path(folder).expanduser().resolve()
        if resolved.name == name and folder in resolved.parents:
            raise UserError(f"{setting}: {path} would be read back as {why}; give {setting} another name")
    return path


def check_folders_given(argv: Sequence[str], keys: Iterable[str]) -> None:
    """``key=`` with nothing after it on a command line, for settings that name a folder (an unset shell
    variable): one line (exit 2, a config value), where the config would take it as a fresh run's ``resume`` or
    the current folder."""
    for argument in argv:
        key, equals, value = argument.partition("=")
        if equals and key.lstrip("+") in keys and not value.strip("'\" "):
            raise ConfigError(f"{key} is empty (an unset shell variable?); give {key} a folder, or leave it out")


def check_data_dir_variable(overrides: Sequence[str]) -> None:
    """``LRA_DATA_DIR`` set to whitespace alone (a stray space in a shell profile) where the ``overrides`` give no
    ``data_dir=``: one line, where the config would make a folder named so (set to nothing, it is unset: ./data)."""
    value = os.environ.get("LRA_DATA_DIR", "")
    given = any(override.split("=", 1)[0].lstrip("+") == "data_dir" for override in overrides if "=" in override)
    if value and not value.strip() and not given:
        raise ConfigError(f"LRA_DATA_DIR is {value!r}, whitespace alone; set it to the data folder, or unset it "
                          "(./data is the default)")


def check_hydra_output_overrides(argv: Sequence[str], reads: Iterable[Path | str] = (),
                                 within: Iterable[tuple] = (), runs: bool = False) -> None:
    """``hydra.run.dir=`` and ``hydra.sweep.dir=`` on a command line: Hydra makes those folders before
    the command's own code runs, so they are checked here first (values with ``${…}`` are Hydra's to
    resolve and are left to it). ``within``: (folder, what it is) pairs the output folder may be neither
    of nor inside (lra-train's task data folders: a run's files would lie among the caches it reads).
    ``runs`` (lra-train): a sweep's folder may not be a run's."""
    within = list(within)
    for argument in argv:
        key, _, value = argument.partition("=")
        key = key.lstrip("+")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and not value.strip("'\" "):
            raise UserError(f"{key} is empty, which would make the current folder ({Path.cwd()}) the output folder; "
                            f"give {key} a folder, or leave it out")
        if key in ("hydra.run.dir", "hydra.sweep.dir") and "${" not in value:
            from lra.run import parsed_value

            path = check_output_folder(parsed_value(value), key, reads).resolve()
            if runs and key == "hydra.sweep.dir" and any((path / name).exists() for name in ("metrics.json", ".hydra")):
                raise UserError(f"hydra.sweep.dir: {path} is a run's folder (its metrics.json or .hydra); a sweep's "
                                f"jobs never write into a run: give hydra.sweep.dir a new folder")
            check_outside(path, key, within)


def check_outside(path: Path, setting: str, within: Iterable[tuple], reader: str = "this command") -> None:
    """``path`` (an output folder, resolved) is neither of nor inside any of ``within``'s (folder, what it
    is) pairs, which ``reader`` reads: one :class:`UserError` line naming ``setting`` otherwise."""
    for folder, what in within:
        folder = Path(os.path.abspath(Path(folder).expanduser())).resolve()
        if path == folder or folder in path.parents:
            raise UserError(f"{setting}: {path} is {'' if path == folder else 'inside '}{what} {folder}, which "
                            f"{reader} reads; give {setting} a folder outside it")


MAX_READ_BYTES = 16 * 2**20  # a run record is a few kB, a paper's table less: 16 MiB is damage, not a record
KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder", stat.S_IFLNK: "a symbolic link"}


class Unreadable(Exception):
    """A file these readers refuse; its text is the reason, a phrase ("a named pipe, not a regular file")."""


def kind(mode: int) -> str:
    """What a file of ``mode`` (``os.stat``'s ``st_mode``) is, in words: "a named pipe", "a folder", …"""
    return KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_bytes(path: Path, limit: int = MAX_READ_BYTES) -> bytes:
    """The content of ``path`` when it is a regular file (a symbolic link to one counts as that file) of at
    most ``limit`` bytes; else :class:`Unreadable`. Never waits on a named pipe, never reads a device."""
    try:
        fault_point("table_read", path)  # tests: LRA_FAULT=table_read:1:EIO (see lra.faults)
        mode = os.stat(path).st_mode  # nothing that is no regular file is opened (a device's open can act)
        if not stat.S_ISREG(mode):
            raise Unreadable(f"{kind(mode)}, not a regular file")
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(descriptor, "rb") as handle:
            found = os.fstat(handle.fileno())  # what was opened, should the name have been swapped meanwhile
            if not stat.S_ISREG(found.st_mode):
                raise Unreadable(f"{kind(found.st_mode)}, not a regular file")
            if found.st_size > limit:
                raise Unreadable(f"{found.st_size:,} bytes, more than the {byte_size(limit)} a record or table may hold")
            data = handle.read(limit + 1)
    except OSError as exc:
        raise Unreadable(os_reason(exc, path)) from exc
    if len(data) > limit:  # still being written
        raise Unreadable(f"more than the {byte_size(limit)} a record or table may hold (it grew while it was read)")
    return data




def byte_size(count: int) -> str:
    """A byte count as text: whole MiB as such, else bytes."""
    return f"{count // 2**20:,} MiB" if count % 2**20 == 0 else f"{count:,} bytes"


def os_reason(exc: OSError, path) -> str:
    """Why ``path`` could not be read or listed, as a phrase."""
    import errno

    if exc.errno == errno.ELOOP:
        return "a loop of symbolic links"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return "a broken symbolic link"
    if exc.errno == errno.ENOENT:
        return "no such file"
    return (exc.strerror or str(exc)).lower()
