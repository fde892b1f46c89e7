"""Building the YOSO kernels: a missing compiler is one clear error (and impl=auto warns), a finished
build is imported without ninja or a write, a killed build neither hangs later jobs nor leaves a
compiler running, the CUDA sources compile with nvcc, the CPU build uses OpenMP, and the package
ships every source."""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attention_zoo
from attention_zoo import _yoso_build, _yoso_ops as ops
from conftest import run_command
from helpers import needs_kernels


def test_missing_compiler_is_a_clear_error_and_auto_warns(monkeypatch):
    monkeypatch.setattr(_yoso_build, "_loaded", {})
    monkeypatch.setattr(_yoso_build, "_failed", {})
    monkeypatch.setattr(ops, "_warned", set())
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(_yoso_build.KernelUnavailable, match="no C\\+\\+ compiler.*attention.impl=torch"):
        ops.resolve_engine("cpu", torch.device("cpu"))
    attn = attention_zoo.build("yoso", num_heads=1, head_dim=8, max_seq_len=16)
    q = torch.randn(1, 1, 16, 8)
    with pytest.warns(ops.KernelFallbackWarning, match="pure-PyTorch implementation.*no C\\+\\+ compiler"):
        assert torch.isfinite(attn(q, q, q, None)).all()


LOAD_CPU_KERNELS = "from attention_zoo import _yoso_build; print(_yoso_build.load('cpu').__name__)"


def copied_build(cache: Path, finished: bool) -> Path:
    """A copy of the test cache's CPU build (mtimes kept) in the kernel cache ``cache``; without its
    ``build.complete`` stamp when not ``finished``, as a build killed before it ended leaves it."""
    built = Path(_yoso_build.load("cpu").__file__).parent
    copy = cache / built.name
    shutil.copytree(built, copy)
    if not finished:
        (copy / _yoso_build.COMPLETE_STAMP).unlink()
    return copy


def load_in_subprocess(cache: Path, **popen):
    env = {**os.environ, "LRA_KERNEL_CACHE": str(cache)}
    return subprocess.Popen([sys.executable, "-c", LOAD_CPU_KERNELS], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


@needs_kernels
def test_a_finished_build_is_imported_without_running_ninja_or_writing(tmp_path):
    """A finished build was once compiled again by later jobs, because torch's loader
    runs ninja in the build folder and ninja recompiles identical sources when .ninja_log is missing
    or the sources are newer than the objects (another checkout, a reinstalled wheel). Both are set
    up here; the folder must not change at all, not even a lock file: a read-only cache built by
    root (the Docker image) is used as it is by any user."""
    build = copied_build(tmp_path, finished=True)
    (build / ".ninja_log").unlink()
    (build / "build.flock").unlink()
    for path in build.iterdir():
        os.utime(path, (946684800, 946684800))  # 2000-01-01: older than every source file
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in build.iterdir()}
    out, err = load_in_subprocess(tmp_path).communicate(timeout=300)
    assert out.startswith("lra_yoso_cpu_"), err
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size) for p in build.iterdir()}
    assert after == before


@needs_kernels
def test_a_build_killed_midway_does_not_hang_later_jobs(tmp_path):
    """torch marks a build in progress with a ``lock`` file and waits for it to vanish; a killed build
    leaves it behind. With no live builder holding the OS lock, the next job removes it, finishes
    the build and stamps it."""
    build = copied_build(tmp_path, finished=False)
    (build / "lock").touch()
    out, err = load_in_subprocess(tmp_path).communicate(timeout=300)
    assert out.startswith("lra_yoso_cpu_"), err
    assert "left by a kernel build that was killed" in err
    assert not (build / "lock").exists() and (build / _yoso_build.COMPLETE_STAMP).exists()


@needs_kernels
def test_a_job_waits_for_a_live_build_and_leaves_its_lock_alone(tmp_path):
    build = copied_build(tmp_path, finished=False)
    with open(build / "build.flock", "w") as live_builder:
        fcntl.flock(live_builder, fcntl.LOCK_EX)
        (build / "lock").touch()
        job = load_in_subprocess(tmp_path)
        assert "waiting for another process building the YOSO kernels" in job.stderr.readline()
        assert (build / "lock").exists() and job.poll() is None
        (build / "lock").unlink()
        fcntl.flock(live_builder, fcntl.LOCK_UN)
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err
    assert out.startswith("lra_yoso_cpu_") and "killed" not in err


def nvcc_flags(standard: str) -> list:
    """The flags torch.utils.cpp_extension gives nvcc for a .cu source of the extension (and ours: -O3)."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS

    return [*COMMON_NVCC_FLAGS, "--compiler-options", "-fPIC", f"-std={standard}", "-O3"]


def stack_frames(ptxas_report: str, architecture: str = "sm_90") -> dict:
    """{kernel (demangled, parameters dropped): bytes of stack frame} for one architecture, from
    ``nvcc -Xptxas -v``."""
    import re

    frames = {}
    for chunk in ptxas_report.split("Compiling entry function")[1:]:
        mangled, compiled_for = re.match(r"\s*'(\w+)' for '(\w+)'", chunk).groups()
        if compiled_for != architecture:
            continue
        name = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip() or mangled
        frames[name.replace("yoso::(anonymous namespace)::", "").split("(")[0]] = int(
            re.search(r"(\d+) bytes stack frame", chunk).group(1))
    return frames


def docker_architectures() -> list:
    """sm_XY of each architecture the Docker image builds the kernels for (its TORCH_CUDA_ARCH_LIST)."""
    import re

    text = (Path(__file__).resolve().parent.parent / "Dockerfile").read_text()
    listed = re.search(r'TORCH_CUDA_ARCH_LIST="([^"]+)"', text).group(1).split()
    return ["sm_" + arch.replace("+PTX", "").replace(".", "") for arch in listed]


def test_cuda_sources_compile_with_nvcc_and_keep_the_gradients_in_registers(tmp_path):
    """Every .cu source compiles with torch's nvcc flags for an H100 (sm_90); ptxas reports no stack frame
    for any gradient kernel (their accumulators in registers: before the kernels were templated on the head dim
    they took 2-3 KB of local memory per thread) nor for the hash at any head dim (P up to 4,096)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed: the .cu kernels were not compile-checked")
    frames = {}
    compiles = {name: subprocess.Popen([nvcc, *nvcc_flags("c++17"), "-c", str(_yoso_build.SOURCE_DIR / name), "-o",
                                        str(tmp_path / f"{name}.o"), "-gencode", "arch=compute_90,code=sm_90",
                                        "-Xptxas", "-v"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name in _yoso_build.CUDA_SOURCES if name.endswith(".cu")}  # at once: the machine's cores
    for name, compile_job in compiles.items():
        _, report = compile_job.communicate()
        assert compile_job.returncode == 0, report
        assert (tmp_path / f"{name}.o").stat().st_size > 0
        frames.update(stack_frames(report))
    gradients = {k: v for k, v in frames.items() if "gradients_kernel" in k or "pairs_kernel" in k
                 or "heavy_apply_kernel" in k or "pair_gradient_kernel" in k or "rows_kernel" in k}
    for head_dim in (16, 32, 64, 128, 0):  # 0: the generic instance
        for kernel in (*CHAINED_KERNELS, "scatter_pairs", "heavy_apply", "pair_gradient", "gather_rows"):
            assert f"void {kernel}_kernel<{head_dim}>" in gradients, sorted(gradients)
    assert set(gradients.values()) == {0}, gradients
    hashes = {k: v for k, v in frames.items() if "fast_hash_kernel" in k}  # 1 … 128 coordinates a lane
    assert len(hashes) == 8 and set(hashes.values()) == {0}, hashes
    # The torch-side CUDA bindings and host logic, syntax-checked against torch's headers. A CPU-only torch
    # wheel lacks one generated header (cuda_cmake_macros.h); an empty stand-in is enough for a check.
    stub = tmp_path / "stub" / "c10" / "cuda" / "impl"
    stub.mkdir(parents=True)
    (stub / "cuda_cmake_macros.h").write_text("#pragma once\n")
    from torch.utils.cpp_extension import include_paths
    import sysconfig

    includes = [tmp_path / "stub", *include_paths(), sysconfig.get_paths()["include"], cuda_include(nvcc),
                _yoso_build.SOURCE_DIR]
    # (yoso_cpu.cpp with -DYOSO_WITH_CUDA adds the CUDA dispatch of its bindings; the CPU build compiles the rest.)
    for source in ("yoso_cuda.cpp", "yoso_cuda_host.cpp", "yoso_cpu.cpp"):
        check = subprocess.run(["c++", "-std=c++20", "-fsyntax-only", "-DYOSO_WITH_CUDA",
                                "-DTORCH_EXTENSION_NAME=check", *(f"-I{path}" for path in includes),
                                str(_yoso_build.SOURCE_DIR / source)], capture_output=True, text=True)
        assert check.returncode == 0, f"{source}: {check.stderr[-3000:]}"


CHAINED_KERNELS = ("query_gradients", "key_gradients", "bucket_rows")  # a token's rows 8 coordinates a lane


def test_the_chained_kernels_keep_their_rows_in_registers_on_every_architecture_the_image_builds(tmp_path):
    """query_gradients, key_gradients and bucket_rows hold twice the coordinates a lane (kChainedCoords), and
    query_gradients is capped for 8 blocks an SM on the architectures where ptxas then spills nothing
    (yoso_simt.h's YOSO_LAUNCH_BOUNDS: the cap spilled on sm_86, sm_89, sm_100 and sm_120): on every
    architecture of the Docker image's list, no instance of them has a stack frame."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed: the .cu kernels were not compile-checked")
    others = [arch for arch in docker_architectures() if arch != "sm_90"]  # sm_90: the test above
    assert len(others) >= 5, others
    targets = [flag for arch in others for flag in ("-gencode", f"arch=compute_{arch[3:]},code={arch}")]
    compiles = [subprocess.Popen([nvcc, *nvcc_flags("c++17"), "-fatbin", str(_yoso_build.SOURCE_DIR / name), "-o",
                                  str(tmp_path / f"{name}.fatbin"), *targets, "-Xptxas", "-v"],  # no host code
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for name in ("yoso_cuda_gradients.cu", "yoso_cuda_kernels.cu")]
    reports = []
    for compile_job in compiles:
        _, report = compile_job.communicate()
        assert compile_job.returncode == 0, report
        reports.append(report)
    for arch in others:
        frames = {}
        for report in reports:
            frames.update(stack_frames(report, arch))
        chained = {f"void {kernel}_kernel<{head_dim}>": frames.get(f"void {kernel}_kernel<{head_dim}>")
                   for kernel in CHAINED_KERNELS for head_dim in (16, 32, 64, 128, 0)}
        assert set(chained.values()) == {0}, (arch, chained)


def cuda_include(nvcc: str) -> Path:
    roots = [os.environ.get("CUDA_HOME", ""), Path(nvcc).resolve().parents[1], "/usr/local/cuda"]
    return next(Path(r) / "include" for r in roots if r and (Path(r) / "include" / "cuda_runtime.h").is_file())


OTHER_TORCH = "LRA_CHECK_TORCH_INCLUDE"


def test_the_cuda_extension_compiles_against_another_torchs_headers(tmp_path):
    """The GPU machine runs torch 2.11.0+cu130, not the pinned 2.13: every source of the CUDA extension
    compiles with nvcc against 2.11's headers and its C++ standard (c++17), given as
    LRA_CHECK_TORCH_INCLUDE=<the include/ folder unpacked from its wheel> (docs/attention.md, "YOSO's CUDA
    kernels", has the commands)."""
    include = os.environ.get(OTHER_TORCH)
    nvcc = shutil.which("nvcc")
    if not include or nvcc is None:
        pytest.skip(f"set {OTHER_TORCH} to another torch's include folder (and install nvcc) to compile the CUDA "
                    "extension against it")
    import sysconfig

    includes = [include, Path(include) / "torch" / "csrc" / "api" / "include", sysconfig.get_paths()["include"],
                _yoso_build.SOURCE_DIR]
    for name in _yoso_build.CUDA_SOURCES:
        flags = nvcc_flags("c++17") if name.endswith(".cu") else ["-std=c++17", "-O3", "-Xcompiler", "-fPIC"]
        result = subprocess.run([nvcc, *flags, "-c", "-DYOSO_WITH_CUDA", "-DTORCH_EXTENSION_NAME=check",
                                 "-DTORCH_API_INCLUDE_EXTENSION_H", *(f"-I{path}" for path in includes),
                                 str(_yoso_build.SOURCE_DIR / name), "-o", str(tmp_path / f"{name}.o"),
                                 "-gencode", "arch=compute_90,code=sm_90"], capture_output=True, text=True)
        assert result.returncode == 0, f"{name}: {result.stderr[-3000:]}"


def test_the_cuda_kernels_read_no_property_of_the_device_that_could_change_their_bits():
    """Chunks once followed the L2 size, so an H100 and an H200 summed in different orders. Whatever
    the kernels and their host logic decide comes from the arguments (attention.workspace_mb included),
    never from the device: the same bits on every GPU. The one property read, the shared memory a block may
    opt into, only chooses between two sorts whose outputs are the same bits (the counting sort or torch's:
    test_cuda_emulation's and test_cuda's wide-sort tests), and only there."""
    import re

    reads = {}
    for name in [*_yoso_build.CUDA_SOURCES, *_yoso_build.HEADERS]:
        text = (_yoso_build.SOURCE_DIR / name).read_text()
        reads[name] = re.findall(r"cudaDeviceGetAttribute|DeviceProperties|cudaDevAttr\w*|multiProcessorCount|"
                                 r"l2CacheSize|sharedMemPerBlock\w*|cudaOccupancy\w*|cudaFuncGetAttributes|"
                                 r"most_shared_bytes\(\)", text)
    assert {name: found for name, found in reads.items() if found} == {
        "yoso_cuda.cpp": ["most_shared_bytes()", "cudaDeviceGetAttribute", "cudaDevAttrMaxSharedMemoryPerBlockOptin"],
        "yoso_cuda_host.h": ["most_shared_bytes()"],
        "yoso_cuda_host.cpp": ["most_shared_bytes()"]}
    host = (_yoso_build.SOURCE_DIR / "yoso_cuda_host.cpp").read_text()
    sorting = host[host.index("SortedCodes sorted_by_code("):]
    assert "most_shared_bytes()" in sorting[:sorting.index("\n}\n")]  # read inside sorted_by_code alone


@needs_kernels
def test_cpu_kernels_are_built_with_openmp_so_they_use_every_core():
    """at::parallel_for silently runs serially in code compiled without OpenMP."""
    assert _yoso_build.load("cpu").parallel


def test_package_ships_every_kernel_source():
    for name in _yoso_build.CUDA_SOURCES + _yoso_build.HEADERS:
        assert (Path(_yoso_build.SOURCE_DIR) / name).is_file()


@needs_kernels
def test_a_killed_kernel_build_leaves_no_compiler_running(tmp_path):
    """The job that builds the kernels is SIGKILLed while a compiler runs: the compiler must go too.
    A stand-in compiler announces itself on a FIFO and then waits forever holding it open; the FIFO
    reaching end-of-file proves every process holding it is gone (a bounded select, no sleeps)."""
    import select

    fifo = tmp_path / "compiler.fifo"
    os.mkfifo(fifo)
    compiler = tmp_path / "slow-c++"
    compiler.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) exec 3>"{fifo}"; echo started >&3; exec sleep 100000;; esac\n'
                        'exec c++ "$@"\n')
    compiler.chmod(0o755)
    env = {**os.environ, "LRA_KERNEL_CACHE": str(tmp_path / "cache"), "CXX": str(compiler)}
    job = subprocess.Popen([sys.executable, "-c", "from attention_zoo import _yoso_build as b; b.load('cpu')"], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with open(fifo, "rb", buffering=0) as reader:  # returns once a compiler has opened it
            assert reader.read(8) == b"started\n"
            job.kill()
            job.wait()
            while True:  # ninja may have started a compiler per source: every one must go (end of file)
                ready, _, _ = select.select([reader], [], [], 120)
                assert ready, "a compiler is still running after its job was killed"
                chunk = reader.read(4096)
                if not chunk:
                    break
                assert set(chunk.split()) == {b"started"}, chunk
    finally:
        job.kill()
    assert not list((tmp_path / "cache").rglob("*.so"))


@needs_kernels
def test_lra_build_kernels_answers_each_signal_with_one_line_and_leaves_no_half_build(tmp_path):
    """A signal while the build's worker runs (delivered there by LRA_FAULT, no sleeps) ends lra-build-kernels
    as every command: one ``error:`` line, 128 + the signal's number, no traceback; the worker is stopped and
    the unfinished build removed (its lock file alone stays, as before a first build), so that the next run
    builds cleanly."""
    env = {"LRA_KERNEL_CACHE": str(tmp_path / "cache")}
    for name, code, words in [("SIGINT", 130, "interrupted (ctrl-C)"), ("SIGTERM", 143, "interrupted (SIGTERM)"),
                              ("SIGHUP", 129, "interrupted (SIGHUP)")]:
        result = run_command(["lra-build-kernels", "cpu"], tmp_path, tmp_path, check=False,
                             env_extra={**env, "LRA_FAULT": f"kernel_build:1:{name}"})
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == code and errors == [result.stderr.strip().splitlines()[-1]], result.stderr
        assert errors[0].startswith(f"error: {words}") and "Traceback" not in result.stderr, result.stderr
        (folder,) = (tmp_path / "cache").iterdir()
        assert [path.name for path in folder.iterdir()] == ["build.flock"], name  # as before a first build


def test_a_kernel_cache_variable_of_whitespace_alone_is_one_line(tmp_path):
    result = run_command(["lra-build-kernels", "cpu"], tmp_path, tmp_path, check=False,
                         env_extra={"LRA_KERNEL_CACHE": " "})
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        "error: LRA_KERNEL_CACHE is ' ', whitespace alone; set it to the kernel cache folder, or unset it "
        "(~/.cache/lra-harness/kernels is the default)"], result.stderr
    assert list(tmp_path.iterdir()) == []
