"""One signal policy for every command and every stage.

SIGINT (ctrl-C), SIGTERM (``kill``, ``timeout``, ``docker stop``, ``scancel``, a cluster's preemption)
and SIGHUP (a closed terminal) end a command the same way: :class:`Interrupted` is raised where the
main thread is, everything unwinds as for ctrl-C (a run records ``interrupted`` with the signal's
name, temporary files are removed, the run folder's lock is released), and the command's edge
(:func:`lra.commands.config_errors.at_the_edge`) prints one ``error:`` line and exits with
128 + the signal's number, the status a shell gives a process that signal killed.

The rules:

- One owner per process: the outermost :func:`interruptible` (a command's edge; in a launcher's
  worker process, the sweep job) installs the handlers, nested ones change nothing.
- Only signals at their default action are taken over: one that is ignored stays ignored (``nohup``
  ignores SIGHUP, a shell's background job SIGINT), and a handler someone else installed stays
  (submitit owns SIGTERM and SIGUSR2 in its jobs: its requeue on preemption).
- The first signal interrupts; any further one while the process stops is noted and ignored, so that
  the record of the interruption is written whole (two SIGHUPs when a terminal closes, ctrl-C
  pressed twice). A process that still does not end can be killed (SIGKILL): that leaves a record
  ``running`` that ``lra-table`` reports as unfinished, and the run resumes exactly all the same.
- A first signal that arrives inside :func:`deferred` (a record being written) is raised when the
  block ends, so a record is never left half-updated by an interruption.
- Before a command's edge is reached (its imports: torch alone takes seconds) and after it is left,
  :func:`guard_startup`'s handler ends the process at once with the same line and status: nothing is
  being written then. Once the last exit handler has run, the interpreter's own teardown (which puts
  Python's handlers back to the default action) ignores these signals: the command's work and its last
  line are done, and it ends a moment later with its own status, not silently with the signal's (a
  teardown that hung there would need SIGKILL).
- A process that stops the processes it started may say why before it signals them: it names a file
  in their environment (:data:`STOP_NOTE`) and writes the reason there (lra-gpu-check's time limit);
  their interruption then reads ``interrupted (SIGTERM: <that reason>)``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
from typing import Callable, List, Optional

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_NOTE = "LRA_STOP_NOTE"  # a file where the process that started this one writes why it stops it


def _noted_cause() -> str:
    """What the file named by :data:`STOP_NOTE` says (one line, at most 200 characters), or ""."""
    path = os.environ.get(STOP_NOTE)
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as note:
            return " ".join(note.read(200).split())
    except OSError:
        return ""


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop by ``signal_number``. A :class:`KeyboardInterrupt`, so that
    code written for ctrl-C (cleanup in ``except BaseException``, libraries) treats every signal alike."""

    def __init__(self, signal_number: int = signal.SIGINT, advice: str = "", cause: Optional[str] = None):
        self.signal_number = int(signal_number)
        self.advice = advice  # what to do next, added by the code that knows (e.g. the resume command)
        self.cause = _noted_cause() if cause is None else cause  # why the signal was sent, where its sender said
        super().__init__(self.signal_name)

    def __reduce__(self):  # pickled whole (a launcher returns a job's exception to the sweep)
        return type(self), (self.signal_number, self.advice, self.cause)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signal_number).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signal_number

    @property
    def reason(self) -> str:
        """``interrupted (ctrl-C)``, ``interrupted (SIGTERM)``: the record's error and the console's line."""
        name = "ctrl-C" if self.signal_number == signal.SIGINT else self.signal_name
        return f"interrupted ({name}: {self.cause})" if self.cause else f"interrupted ({name})"

    def __str__(self) -> str:
        return self.reason + (f"; {self.advice}" if self.advice else "")


def as_interrupted(exc: BaseException) -> Interrupted:
    """``exc`` as an :class:`Interrupted`: a bare KeyboardInterrupt (raised by code, or by Python's own
    SIGINT handler where ours is not installed) is ctrl-C's."""
    return exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)


class _State:
    def __init__(self):
        self.previous: Optional[dict] = None  # signal → the handler before ours, while ours are installed
        self.first: Optional[int] = None  # the signal that interrupts this process
        self.pending: Optional[int] = None  # that signal, when it arrived inside deferred()
        self.deferring = 0
        self.hooks: List[Callable[[int], None]] = []


_state = _State()


def _handle(number: int, frame) -> None:
    if _state.first is not None:
        return  # already stopping: a further signal must not cut the record of the first one short
    _state.first = number
    for hook in list(_state.hooks):
        hook(number)
    if _state.deferring:
        _state.pending = number
        return
    raise Interrupted(number)


def _end_outside_the_edge(number: int, frame) -> None:
    """:func:`guard_startup`'s handler: one line and 128 + the signal's number, nothing to unwind."""
    os.write(2, f"error: {Interrupted(number).reason}; nothing was being written\n".encode())
    os._exit(128 + number)


def _takes_over(current) -> bool:
    return current in (signal.SIG_DFL, signal.default_int_handler, _end_outside_the_edge)


def guard_startup() -> None:
    """From a console command's first import until its edge's :func:`interruptible` takes over (and
    again once that has ended), SIGINT, SIGTERM and SIGHUP end the process with the policy's line and
    status instead of a KeyboardInterrupt traceback in an import, or a silent death. Signals that are
    ignored or someone else's are left alone, as :func:`interruptible` leaves them."""
    if threading.current_thread() is not threading.main_thread():
        return
    for number in HANDLED:
        if _takes_over(signal.getsignal(number)):
            signal.signal(number, _end_outside_the_edge)
    atexit.register(_ignore_signals_in_teardown)  # registered first, so it runs last


def _ignore_signals_in_teardown() -> None:
    """The last exit handler: the policy's signals ignored through the interpreter's teardown, which would
    otherwise reset them to the default action and let a late signal end a finished command silently."""
    for number in HANDLED:
        if signal.getsignal(number) in (_handle, _end_outside_the_edge):
            signal.signal(number, signal.SIG_IGN)


@contextlib.contextmanager
def interruptible():
    """Within this block, SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` (module docstring).
    Nested blocks, and blocks outside the main thread (where Python allows no handler), change nothing."""
    if _state.previous is not None or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for number in HANDLED:
        current = signal.getsignal(number)
        if _takes_over(current):
            previous[number] = current
            signal.signal(number, _handle)
    _state.previous, _state.first, _state.pending = previous, None, None
    try:
        yield
    finally:
        if _state.first is None:  # ended normally: the handlers go back as they were
            for number, handler in previous.items():
                signal.signal(number, handler)
            _state.previous = None
        # Interrupted: ours stay, ignoring any further signal while the process ends (exit handlers included).


def installed() -> bool:
    """Whether an :func:`interruptible` block owns this process's signals."""
    return _state.previous is not None


def handles(number: int) -> bool:
    """Whether ``number`` raises :class:`Interrupted` here (False where it is ignored or someone else's)."""
    return signal.getsignal(number) is _handle


@contextlib.contextmanager
def deferred():
    """A first signal arriving in this block is raised when it ends (a record written whole)."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
        if not _state.deferring and _state.pending is not None:
            number, _state.pending = _state.pending, None
            raise Interrupted(number)


@contextlib.contextmanager
def on_interruption(hook: Callable[[int], None]):
    """Call ``hook(signal number)`` on this block's first signal, before :class:`Interrupted` is raised
    (e.g. a launcher passes the signal on to its worker processes and waits for their records)."""
    _state.hooks.append(hook)
    try:
        yield
    finally:
        _state.hooks.remove(hook)
