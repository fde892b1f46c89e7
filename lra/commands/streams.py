"""A console command's standard output and standard error, held by its edge
(:func:`lra.commands.config_errors.at_the_edge`).

What a command prints is a copy of what it keeps (a run's record and ``train.log``, a table's
``--output``) or the answer itself (``lra-table`` without ``--output``, ``--help``): when standard
output cannot be written, the work goes on and the command says so once.

- A reader that went away (``| head``): nothing more is printed, nothing is said, and the command
  ends with SIGPIPE's status, 141, as a shell's ``cmd | head`` gives.
- Any other write error (a full disk or ``> /dev/full``, a closed descriptor ``>&-``, a terminal
  gone): one ``error:`` line on standard error naming the fix, nothing more is printed, the command
  finishes its work (a run completes and its record says so) and ends with status 1, as ``cat`` and
  ``echo`` end on a write error, so that a script does not take a lost answer for one given.
- Standard error itself unwritable: what it would say is lost; the status stays the command's own.

After the first failure the descriptor is pointed at ``/dev/null``: what is still buffered, the
interpreter's last flush and child processes started later write there without another error. A
closed descriptor is pointed there before anything runs, so that no file the command opens takes
its number (a run's record written through descriptor 1)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from typing import Optional

_FIXES = {
    errno.EBADF: "it was closed (>&-): send it to a file, or to /dev/null to discard it",
    errno.EIO: "the terminal it wrote to is gone: send it to a file, or run the command inside tmux or screen",
}


class _Stream:
    """A text stream whose write errors are noted instead of raised (the rest is the wrapped stream's)."""

    def __init__(self, stream, name: str, guard: "_Guard"):
        self._stream = stream
        self._name = name
        self._guard = guard

    def write(self, text):
        if self._name in self._guard.lost:
            return len(text)
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:
            self._guard.failed(self._name, self._stream, exc)
            return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if self._name in self._guard.lost:
            return
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._guard.failed(self._name, self._stream, exc)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _ClosedStream:
    """Standard output that was closed when the process started (Python leaves ``sys.stdout`` None)."""

    encoding, errors = "utf-8", "strict"

    def write(self, text):
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    def flush(self):
        pass

    def isatty(self):
        return False


class _Guard:
    def __init__(self):
        self.lost: dict = {}  # "stdout" / "stderr" → the errno that lost it

    def failed(self, name: str, stream, exc: BaseException) -> None:
        code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EBADF  # ValueError: a closed file
        self.lost[name] = code
        _to_devnull(stream)
        if name == "stdout" and code != errno.EPIPE:
            _say(f"error: cannot write to standard output ({os.strerror(code)}): {_fix(code)}; {_command()} carries on "
                 "without printing (the files it writes are kept as usual) and ends with status 1")

    def status(self, code) -> Optional[int]:
        """The exit status for a command that would end with ``code`` (SystemExit's: None, an int or a
        message), where losing its output changes it: a success whose output was lost is not one."""
        if code not in (None, 0) or "stdout" not in self.lost:
            return None
        return 128 + signal.SIGPIPE if self.lost["stdout"] == errno.EPIPE else 1


_guard: Optional[_Guard] = None


def _fix(code: int) -> str:
    from lra.commands.config_errors import DISK_ERRORS

    return _FIXES.get(code) or DISK_ERRORS.get(code) or "send it elsewhere (a file, or /dev/null to discard it)"


def _command() -> str:
    name = os.path.basename(sys.argv[0]) if sys.argv else ""
    return name if name.startswith("lra-") else "the command"


def _say(line: str) -> None:
    stderr = sys.stderr
    try:
        stderr.write(line + "\n")
        stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def _to_devnull(stream) -> None:
    """Point ``stream``'s descriptor at /dev/null and drop what it still buffers there."""
    try:
        descriptor = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, descriptor)
    finally:
        os.close(null)
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


def keep_descriptors_open() -> None:
    """Standard output or error closed at start (``>&-``, ``2>&-``): /dev/null takes descriptor 1 or 2, so
    that no file the command opens gets it; a closed standard output is written as one that fails (EBADF)."""
    for descriptor in (1, 2):
        try:
            os.fstat(descriptor)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != descriptor:
                os.dup2(null, descriptor)
                os.close(null)
    if sys.stdout is None:
        sys.stdout = _ClosedStream()
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)


@contextlib.contextmanager
def guarded():
    """The block's standard output and error as the module docstring says; the block's exit status (its
    SystemExit, or 0 when it returns) settled when it ends. Nested blocks change nothing."""
    global _guard
    if _guard is not None:
        yield
        return
    keep_descriptors_open()
    _guard = guard = _Guard()
    saved = sys.stdout, sys.stderr
    out = sys.stdout = _Stream(sys.stdout, "stdout", guard)
    sys.stderr = _Stream(sys.stderr, "stderr", guard)
    try:
        try:
            yield
        except SystemExit as stopped:
            out.flush()  # what is still buffered fails here, not in the interpreter's last flush
            changed = guard.status(stopped.code)
            if changed is not None:
                raise SystemExit(changed) from None
            raise
        out.flush()
        changed = guard.status(0)
        if changed is not None:
            raise SystemExit(changed)
    finally:
        sys.stdout, sys.stderr = saved
        _guard = None
