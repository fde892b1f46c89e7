"""The installed package is whole: a wheel carries the configs and the kernel sources, found through
importlib.resources, and trains (with the compiled YOSO kernels) from a folder outside the checkout."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from setuptools import find_packages

from conftest import REPO, SMALL_LISTOPS, read_json, run_command, run_dirs

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package_and_maps_every_resource_folder():
    code = set(find_packages(str(REPO), include=["lra", "lra.*", "attention_zoo", "attention_zoo.*"]))
    code |= {f"hydra_plugins.{p}" for p in find_packages(str(REPO / "hydra_plugins"))}
    resources = {"lra.conf": "conf", "lra.conf_profile": "conf_profile", "lra.conf_fidelity": "conf_fidelity",
                 "attention_zoo.csrc": "csrc"}
    assert set(SETUPTOOLS["packages"]) == code | set(resources)
    assert SETUPTOOLS["package-dir"] == resources


def test_a_wheel_installed_in_a_fresh_venv_trains_yoso_with_its_kernels_outside_the_checkout(tmp_path, data_dir):
    source = tmp_path / "source"  # a copy, so that building leaves the checkout untouched
    source.mkdir()
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy(REPO / name, source / name)
    for folder in ["lra", "attention_zoo", "hydra_plugins", "conf", "conf_profile", "conf_fidelity", "csrc"]:
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
                   check=True, capture_output=True, text=True)
    wheel, = (tmp_path / "wheel").glob("lra_harness-*.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site, = venv.glob("lib/python*/site-packages")
    # The dependencies come from this environment (no network in tests); the package itself only from
    # the wheel: a path added by a .pth file is not scanned for .pth files, so the checkout's editable
    # install does not come along.
    (site / "dependencies.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, text=True)

    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import lra.config as c, attention_zoo._yoso_build as b; print(c.CONF_DIR); print(b.SOURCE_DIR)"],
                           cwd=tmp_path, check=True, capture_output=True, text=True).stdout.split()
    assert all(Path(folder).is_relative_to(site) and Path(folder).is_dir() for folder in where), where

    elsewhere = tmp_path / "elsewhere"
    run_command([str(venv / "bin" / "lra-train"), "task=listops", "attention=yoso", "attention.impl=cpu",
                 "trainer=smoke", "trainer.max_steps=4", *SMALL_LISTOPS], elsewhere, data_dir,
                env_extra={"LRA_GIT_COMMIT": "0123abc"})  # as the Docker image sets it from its build argument
    record, = (read_json(run / "metrics.json") for run in run_dirs(elsewhere))
    # impl=cpu runs the compiled kernels or stops with an error, never the PyTorch fallback.
    assert record["status"] == "completed" and record["steps"] == 4 and record["label"] == "YOSO-32", record
    assert record["git_commit"] == "0123abc"  # an installed package is no checkout, wherever it lives
