"""Shared fixtures: an isolated data directory and runners for the real console commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Small generated ListOps for end-to-end runs: short expressions, short padded length.
SMALL_LISTOPS = [
    "task.generator.num_train=96", "task.generator.num_val=24", "task.generator.num_test=24",
    "task.generator.min_length=20", "task.generator.max_length=200", "task.max_length=256",
]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lra-data")


def run_command(args, cwd: Path, data_dir: Path, env_extra=None, check=True) -> subprocess.CompletedProcess:
    """Run a console script as a user would, with W&B off and the given data directory."""
    env = {**os.environ, "LRA_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "PYTHONHASHSEED": "0"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(env_extra or {})
    Path(cwd).mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / args[0]
    result = subprocess.run([str(exe), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def run_dirs(root: Path) -> list:
    return sorted(p.parent for p in (root / "runs").rglob("metrics.json"))


def read_json(path: Path):
    return json.loads(Path(path).read_text())
