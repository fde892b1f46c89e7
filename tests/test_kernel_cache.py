"""CUDA builds that match the GPU they run on (no GPU needed): the build's name includes the
architecture list and the nvcc release, the detected architecture gets +PTX, a finished build
records its architectures, and a build that does not cover the GPU is rebuilt with one line saying
why. Decided in the parent; the worker initialises no CUDA and starts a session of its own."""

from __future__ import annotations

import json

import pytest
import torch

from attention_zoo import _yoso_build
from attention_zoo._yoso_build import BuildPlan, covers


def test_the_cuda_build_name_changes_with_the_architectures_and_the_nvcc_release():
    names = {BuildPlan("cuda", arch, release).name for arch, release in
             [("8.0", "12.8"), ("9.0+PTX", "12.8"), ("8.0 9.0", "12.8"), ("8.0", "13.0")]}
    assert len(names) == 4
    assert BuildPlan("cuda", "9.0+PTX", "12.8").name == BuildPlan("cuda", "9.0+PTX", "12.8").name
    assert BuildPlan("cpu", "", "").name.startswith("lra_yoso_cpu_")


@pytest.mark.parametrize("arch_list, capability, expected", [
    ("9.0+PTX", (9, 0), True),
    ("9.0+PTX", (10, 0), True),  # PTX is JIT-compiled on any newer architecture
    ("9.0", (10, 0), False),  # a cubin only within its major
    ("8.0", (8, 6), True),  # sm_80 code runs on sm_86
    ("8.6", (8, 0), False),
    ("7.0;7.5 8.0", (9, 0), False),  # the Docker image's list without PTX on an H100
    ("7.0 8.0+PTX", (9, 0), True),
    ("9.0a", (9, 0), True),
    ("9.0a", (10, 0), False),  # arch-specific features run on that architecture only
])
def test_which_gpus_a_build_covers(arch_list, capability, expected):
    assert covers(arch_list, capability) is expected


def test_the_detected_architecture_gets_ptx(monkeypatch):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert _yoso_build.cuda_arch_list() == "9.0+PTX"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0 8.6")
    assert _yoso_build.cuda_arch_list() == "8.0 8.6"


def finished(build: BuildPlan, stamped: bool = True) -> None:
    """The library a build leaves in the kernel cache, and the stamp that records it and its architectures."""
    folder = _yoso_build.cache_dir() / build.name
    folder.mkdir(exist_ok=True)
    (folder / f"{build.name}.so").write_text(f"built for {build.arch_list}")
    if stamped:
        record = {"cuda_arch_list": build.arch_list, "library": _yoso_build._library_record(folder / f"{build.name}.so")}
        (folder / _yoso_build.COMPLETE_STAMP).write_text(json.dumps(record))


def test_a_finished_build_that_does_not_cover_the_gpu_is_rebuilt_with_one_line(tmp_path, monkeypatch, capsys):
    """A kernel cache shared between machines holds the Docker image's build for 8.0 and 8.6; an H100
    (9.0) must not load it ('no kernel image is available' at the first launch) but build for 9.0+PTX."""
    monkeypatch.setenv("LRA_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    built, imported = [], []
    monkeypatch.setattr(_yoso_build, "_compile_in_worker", lambda build: built.append(build) or finished(build, False))
    monkeypatch.setattr(_yoso_build, "_import_built", lambda name, folder: imported.append(name) or name)
    old = BuildPlan("cuda", "8.0 8.6", "12.8")
    finished(old)

    assert _yoso_build._build(old) == BuildPlan("cuda", "8.0 8.6 9.0+PTX", "12.8").name
    assert [b.arch_list for b in built] == ["8.0 8.6 9.0+PTX"]
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and "do not run on this GPU (compute capability 9.0)" in line, line
    record = json.loads((tmp_path / built[0].name / _yoso_build.COMPLETE_STAMP).read_text())
    assert record["cuda_arch_list"] == "8.0 8.6 9.0+PTX" and record["nvcc_release"] == "12.8"

    covered = BuildPlan("cuda", "9.0+PTX", "12.8")  # a build that covers the GPU is imported as it is
    finished(covered)
    assert _yoso_build._build(covered) == covered.name and len(built) == 1


def test_the_build_worker_gets_its_plan_on_the_command_line_and_no_fork_hook(monkeypatch):
    """The worker must not be forked with preexec_fn (this process may hold CUDA and threads) nor query
    the GPU again: it gets the resolved plan and starts a new session."""
    seen = {}

    class Worker:
        returncode = 0
        pid = 0

        def __init__(self, argv, **options):
            seen.update(argv=argv, **options)

        def communicate(self):
            return "", None

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", Worker)
    _yoso_build._compile_in_worker(BuildPlan("cuda", "9.0+PTX", "12.8"))
    assert seen["start_new_session"] is True and "preexec_fn" not in seen
    assert seen["argv"][3:] == ["--worker", "cuda", "--arch-list", "9.0+PTX", "--nvcc-release", "12.8", "--parent",
                                str(__import__("os").getpid())]
