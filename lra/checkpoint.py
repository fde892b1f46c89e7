"""Training checkpoints, written atomically: everything needed to continue bit-for-bit."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Dict

import numpy as np
import torch

from lra.errors import UserError
from lra.faults import fault_point
from lra.io import atomic_write

LAST = "last.pt"
BEST = "best.pt"
TRAINING_KEYS = ("model", "optimizer", "scheduler", "scaler", "sampler", "rng", "state", "best_weights")


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


KEPT = "the run's metrics.json is left as it was — start a new run with the same overrides"


def load_training(path: Path) -> Dict[str, Any]:
    """A training checkpoint (every one of :data:`TRAINING_KEYS`), or one :class:`UserError` line."""
    try:
        payload = load(path)
    except Exception as exc:
        raise UserError(f"cannot resume from {path}: the checkpoint is unreadable ({type(exc).__name__}); {KEPT}") from None
    missing = [k for k in TRAINING_KEYS if k not in payload] if isinstance(payload, dict) else ["all"]
    if missing:
        raise UserError(f"cannot resume from {path}: it is not a training checkpoint (no {', '.join(missing)}; "
                        f"a {BEST} holds only weights); {KEPT}")
    return payload
