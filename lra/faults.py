"""Fault injection for tests: a named point where a test can have this process signal itself."""

from __future__ import annotations

import os
import signal
from typing import Dict

_FAULT_COUNTS: Dict[str, int] = {}


def fault_point(name: str) -> None:
    """Test hook: ``LRA_FAULT=<name>:<count>[:<SIGNAL>]`` sends SIGNAL (default SIGKILL) to this
    process the count-th time it passes ``name``, to prove that a run killed (or preempted, with
    SIGUSR2 under submitit) there resumes exactly. With ``LRA_FAULT_ONCE=<file>`` it fires only
    while that file does not exist, and creates it: once per sweep, not once per requeued attempt.
    Inert unless the variable is set."""
    spec = os.environ.get("LRA_FAULT")
    if not spec or not spec.startswith(name + ":"):
        return
    _FAULT_COUNTS[name] = _FAULT_COUNTS.get(name, 0) + 1
    _, count, *signal_name = spec.split(":")
    if _FAULT_COUNTS[name] != int(count):
        return
    once = os.environ.get("LRA_FAULT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return
    os.kill(os.getpid(), getattr(signal, signal_name[0]) if signal_name else signal.SIGKILL)
