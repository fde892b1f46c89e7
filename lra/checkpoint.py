"""Training checkpoints, written atomically: everything needed to continue bit-for-bit."""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from lra.io import atomic_write

LAST = "last.pt"
BEST = "best.pt"


def rng_states() -> Dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: Dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save(path: Path, payload: Dict[str, Any]) -> None:
    """Write ``payload`` with torch.save to a temporary file and rename it over ``path``."""

    def write(handle) -> None:
        torch.save(payload, handle)
        fault_point("checkpoint_write")  # the data is in the temporary file, not yet renamed

    atomic_write(path, write, mode="wb")
    fault_point("after_checkpoint")


def load(path: Path) -> Dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


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
