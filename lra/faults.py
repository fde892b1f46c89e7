"""Fault injection for tests: a named point where a test can have this process signal itself."""

from __future__ import annotations

import errno
import os
import signal
from typing import Dict

_FAULT_COUNTS: Dict[str, int] = {}


def fault_point(name: str, path=None) -> None:
    """Test hook: ``LRA_FAULT=<name>:<count>[:<ACTION>]`` acts the count-th time this process passes
    ``name``. ACTION is a signal (default SIGKILL; SIGINT raises KeyboardInterrupt, as ctrl-C does)
    the process sends itself, to prove that a run killed (or preempted, with SIGUSR2 under submitit)
    there resumes exactly; or an errno name (ENOSPC, EROFS, EACCES, …), raised as that OSError on ``path``, to prove that a full or
    read-only disk is met with one line and nothing lost. With ``LRA_FAULT_ONCE=<file>`` it fires
    only while that file does not exist, and creates it: once per sweep, not once per requeued
    attempt. Inert unless the variable is set."""
    spec = os.environ.get("LRA_FAULT")
    if not spec or not spec.startswith(name + ":"):
        return
    _FAULT_COUNTS[name] = _FAULT_COUNTS.get(name, 0) + 1
    _, count, *action = spec.split(":")
    if _FAULT_COUNTS[name] != int(count):
        return
    once = os.environ.get("LRA_FAULT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    if action and action[0].startswith("E") and hasattr(errno, action[0]):
        code = getattr(errno, action[0])
        raise OSError(code, os.strerror(code), None if path is None else str(path))
    if action == ["SIGINT"]:  # what ctrl-C raises in Python, also where SIGINT is ignored (a background job)
        raise KeyboardInterrupt
    os.kill(os.getpid(), getattr(signal, action[0]) if action else signal.SIGKILL)
