"""Fault injection for tests: a named point where a test can have this process signal itself, or fail."""

from __future__ import annotations

import errno
import os
import signal
from typing import Dict

_FAULT_COUNTS: Dict[str, int] = {}


def fault_point(name: str, path=None) -> None:
    """Test hook: ``LRA_FAULT=<name>:<count>[:<ACTION>]`` acts the count-th time this process passes
    ``name``; several faults are separated by commas (``step:3:SIGTERM,stopping:1:SIGHUP``: a signal,
    then a second one while the run stops). ACTION is a signal (default SIGKILL) the process sends
    itself, to prove that a run killed (or preempted, with SIGUSR2 under submitit), or interrupted
    (SIGINT, SIGTERM, SIGHUP: :mod:`lra.signals`) there resumes exactly — where such a signal is ignored
    (a background job's SIGINT, SIGHUP under nohup) the interruption it would cause is raised instead;
    an errno name (ENOSPC, EROFS, EACCES, …), raised as that OSError on ``path``, to prove that a full
    or read-only disk is met with one line and nothing lost; or OOM, an out-of-memory error as CUDA's
    allocator raises it; or BUG, a RuntimeError no rule of the error edge knows (a bug in the harness), to
    prove that it too ends with one line and its traceback in a file. With ``LRA_FAULT_ONCE=<file>`` it
    fires only while that file does not exist, and creates it: once per sweep, not once per requeued
    attempt. Inert unless the variable is set."""
    spec = os.environ.get("LRA_FAULT")
    if not spec or name + ":" not in spec:
        return
    for fault in spec.split(","):
        if fault.startswith(name + ":"):
            _act(name, fault, path)


def _act(name: str, fault: str, path) -> None:
    _FAULT_COUNTS[fault] = _FAULT_COUNTS.get(fault, 0) + 1
    _, count, *action = fault.split(":")
    if _FAULT_COUNTS[fault] != int(count):
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
    if action == ["OOM"]:
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (injected at {name})")
    if action == ["BUG"]:
        raise RuntimeError(f"a fault injected at {name} (LRA_FAULT={fault})")
    number = getattr(signal, action[0]) if action else signal.SIGKILL
    if number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) and signal.getsignal(number) == signal.SIG_IGN:
        from lra.signals import Interrupted

        raise Interrupted(number)
    os.kill(os.getpid(), number)
