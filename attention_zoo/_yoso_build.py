"""Build and load the compiled YOSO kernels of ``csrc/yoso`` with torch.utils.cpp_extension (ninja).

The CPU extension is compiled on first use; the CUDA extension (the CPU kernels plus the ``.cu``
kernels) when CUDA tensors first need it. Builds go to ``$LRA_KERNEL_CACHE`` (default
``~/.cache/lra-harness/kernels``) under a name that includes a hash of the sources and the torch
version, so an edited kernel or a new torch rebuilds and concurrent jobs share one build.
CUDA architectures: ``TORCH_CUDA_ARCH_LIST`` if set (the Docker image sets it), else the current GPU's compute
capability with ``+PTX``; the list and the nvcc release enter the build's name, the finished build records its
architectures, and a build that does not cover the GPU it is loaded on is rebuilt with that GPU's architecture
added (one line says why). CPU code is compiled for ``-march=native`` (the build name includes the CPU's identity)
unless ``LRA_KERNEL_CPU_ARCH`` names a portable target. A finished build records its library's size and SHA-256:
a library that no longer matches is rebuilt before anything loads it. A failed build is one line: the compiler's
first error, the setting to fix, and its build.log. Precompile with ``lra-build-kernels cpu cuda [--force]``.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Dict

import torch

from attention_zoo._common import package_folder
from attention_zoo._yoso_build_failure import WORKER_FAILED, explain_failure as _explain_failure

SOURCE_DIR = package_folder("attention_zoo.csrc") / "yoso"  # csrc/yoso in the repository
CPU_SOURCES = ["yoso_cpu.cpp", "yoso_cpu_gradients.cpp"]
CUDA_SOURCES = [*CPU_SOURCES, "yoso_cuda.cpp", "yoso_cuda_host.cpp", "yoso_cuda_hash.cu", "yoso_cuda_kernels.cu",
                "yoso_cuda_heavy.cu", "yoso_cuda_gradients.cu", "yoso_cuda_sort.cu", "yoso_cuda_rows.cu"]
HEADERS = ["yoso_math.h", "yoso_buckets.h", "yoso_checks.h", "yoso_cuda_kernels.h", "yoso_cuda_common.h",
           "yoso_cuda_host.h", "yoso_simt.h"]
COMPLETE_STAMP = "build.complete"  # written after a successful build; nothing in the folder changes after it
BUILD_LOG = "build.log"  # the last build's full output


class KernelUnavailable(RuntimeError):
    """The compiled kernels cannot be built or loaded here; the message says why and what to do."""


_loaded: Dict[str, ModuleType] = {}
_failed: Dict[str, str] = {}
WORKER_STARTED: list = []  # callables run once a build's worker has started (lra-build-kernels' fault point)


def cache_dir() -> Path:
    """``$LRA_KERNEL_CACHE``, or the default when it is unset or empty; whitespace alone (a stray space in a
    shell profile) is refused with one line rather than made a folder named so."""
    root = os.environ.get("LRA_KERNEL_CACHE", "")
    if root and not root.strip():
        raise KernelUnavailable(f"LRA_KERNEL_CACHE is {root!r}, whitespace alone; set it to the kernel cache folder, "
                                "or unset it (~/.cache/lra-harness/kernels is the default)")
    return Path(root or Path.home() / ".cache" / "lra-harness" / "kernels")


def _cpu_identity() -> bytes:
    """The CPU's model and feature flags: builds use -march=native, so a kernel cache shared between
    different machines (a cluster's home directory) must not hand one machine another's build."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor().encode()
    return "".join(sorted({line for line in lines if line.startswith(("model name", "flags"))})).encode()


def cpu_arch() -> str:
    """The -march of CPU code: $LRA_KERNEL_CPU_ARCH (e.g. x86-64-v3 for a portable image), else native."""
    return os.environ.get("LRA_KERNEL_CPU_ARCH", "native")


def _cpu_flags(kind: str) -> list:
    """-fopenmp: at::parallel_for is serial in code compiled without it (the kernels would use one core).
    On x86-64, loops may use 512-bit vectors where -march has them (GCC and Clang default to 256;
    YOSO's CPU backward and hashing measured 5-13 % faster at n = 8192). The C++ standard is torch's
    choice (its headers require theirs)."""
    wide = ["-mprefer-vector-width=512"] if platform.machine().lower() in ("x86_64", "amd64") else []
    return ["-O3", f"-march={cpu_arch()}", *wide, "-fopenmp"] + (["-DYOSO_WITH_CUDA"] if kind == "cuda" else [])


@dataclass(frozen=True)
class BuildPlan:
    """What one build is: decided in the parent process and handed to the build worker, which
    initialises no CUDA of its own."""

    kind: str
    arch_list: str  # TORCH_CUDA_ARCH_LIST of a CUDA build, "" for CPU
    nvcc_release: str  # "" for CPU

    @property
    def sources(self) -> list:
        return CUDA_SOURCES if self.kind == "cuda" else CPU_SOURCES

    @property
    def name(self) -> str:
        digest = hashlib.sha256(f"{torch.__version__} {' '.join(_cpu_flags(self.kind))} {self.arch_list} "
                                f"{self.nvcc_release}".encode())
        if cpu_arch() == "native":
            digest.update(_cpu_identity())
        for source in sorted(set(self.sources) | set(HEADERS)):
            digest.update(source.encode() + (SOURCE_DIR / source).read_bytes())
        return f"lra_yoso_{self.kind}_{digest.hexdigest()[:12]}"

    def argv(self) -> list:
        return ["--worker", self.kind, "--arch-list", self.arch_list, "--nvcc-release", self.nvcc_release]


def device_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


def cuda_arch_list() -> str:
    """``TORCH_CUDA_ARCH_LIST`` if set, else the current GPU's architecture with PTX (so that a newer
    GPU can still JIT it)."""
    return os.environ.get("TORCH_CUDA_ARCH_LIST") or f"{device_arch()}+PTX"


def nvcc_release() -> str:
    """The CUDA toolkit's release as nvcc prints it ('12.8'); the build's name includes it."""
    from torch.utils.cpp_extension import CUDA_HOME

    try:
        printed = subprocess.run([str(Path(CUDA_HOME) / "bin" / "nvcc"), "--version"], capture_output=True,
                                 text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError, TypeError) as error:
        raise KernelUnavailable(f"cannot run nvcc from CUDA_HOME={CUDA_HOME} ({error}); install the CUDA toolkit "
                                "matching torch.version.cuda and set CUDA_HOME, or set attention.impl=torch") from error
    found = re.search(r"release (\d+\.\d+)", printed)
    return found.group(1) if found else printed.strip().splitlines()[-1]


def covers(arch_list: str, capability: tuple) -> bool:
    """Whether a build for ``arch_list`` runs on a GPU of ``capability`` (major, minor): a cubin runs
    on its own major at the same or a higher minor; PTX is JIT-compiled on its architecture or any newer."""
    for entry in arch_list.replace(";", " ").split():
        version, _, ptx = entry.partition("+")
        major, minor = (int(part) for part in version.rstrip("af").split(".")[:2])
        if ptx.upper() == "PTX" and (major, minor) <= tuple(capability):
            return True
        if major == capability[0] and minor <= capability[1] and not version.endswith(("a", "f")):
            return True
        if version.endswith(("a", "f")) and (major, minor) == tuple(capability):
            return True
    return False


def plan(kind: str) -> BuildPlan:
    if kind != "cuda":
        return BuildPlan(kind, "", "")
    return BuildPlan(kind, cuda_arch_list(), nvcc_release())


def _check_toolchain(kind: str) -> None:
    if kind == "cuda" and torch.version.cuda is None:  # before anything else: no setting can fix it
        raise KernelUnavailable(f"this torch ({torch.__version__}) has no CUDA support (torch.version.cuda is None): "
                                "install a CUDA build of torch to build the YOSO CUDA kernels "
                                "(https://pytorch.org/get-started/locally), or set attention.impl=cpu or torch")
    if not SOURCE_DIR.is_dir():
        raise KernelUnavailable(f"the YOSO kernel sources are not at {SOURCE_DIR}: this installation of lra-harness is "
                                "incomplete; reinstall it (pip install lra-harness, or pip install . in a checkout) "
                                "or set attention.impl=torch")
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C++ compiler ('{compiler}') to build the YOSO kernels; install one (e.g. apt "
                                "install g++) or set attention.impl=torch to run the pure-PyTorch implementation")
    if kind == "cuda":
        from torch.utils.cpp_extension import CUDA_HOME

        if not torch.cuda.is_available() and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
            raise KernelUnavailable("CUDA kernels requested but torch sees no CUDA device (to build ahead of time "
                                    "without one, set TORCH_CUDA_ARCH_LIST, e.g. '8.0 9.0')")
        if CUDA_HOME is None:
            raise KernelUnavailable("cannot build the YOSO CUDA kernels: nvcc not found; install the CUDA toolkit "
                                    "matching torch.version.cuda and set CUDA_HOME, or set attention.impl=torch")


def load(kind: str, force: bool = False) -> ModuleType:
    """The compiled extension for ``kind`` ('cpu' or 'cuda'), building it if needed (again if ``force``). Raises
    :class:`KernelUnavailable` (every later call too, without retrying) when it cannot be built."""
    if kind in _loaded and not force:
        return _loaded[kind]
    if kind in _failed:
        raise KernelUnavailable(_failed[kind])
    try:
        _check_toolchain(kind)
        module = _build(plan(kind), force)
    except KernelUnavailable as error:
        _failed[kind] = str(error)
        raise
    except Exception as error:  # an import of the built library that fails (ImportError), an unexpected OSError
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        _failed[kind] = (f"loading the YOSO {kind.upper()} kernels failed: {detail}; rerun with LRA_KERNEL_VERBOSE=1 "
                         "for the compiler output, or set attention.impl=torch")
        raise KernelUnavailable(_failed[kind]) from error
    _loaded[kind] = module
    return module


def _build(build: BuildPlan, force: bool = False) -> ModuleType:
    """A finished build (its ``build.complete`` stamp exists) is imported as it is: torch's loader
    would run ninja again, and ninja recompiles identical sources whenever their path or mtime differs
    from the last build's (another checkout or a reinstalled wheel sharing the cache) or ``.ninja_log``
    is missing, rewriting a library other jobs have loaded. Importing needs no write access, so a cache built
    by root (the Docker image) serves any user. A library that does not match the size and SHA-256 its stamp
    records is rebuilt from scratch, with one line; so is every build with ``force``. A CUDA build whose
    recorded architectures do not cover this GPU is rebuilt with the GPU's architecture added."""
    build_directory = cache_dir() / build.name
    built_for = _recorded_arch_list(build_directory) or build.arch_list
    if build.kind == "cuda" and torch.cuda.is_available() and not covers(built_for, torch.cuda.get_device_capability()):
        here = device_arch()
        wider = BuildPlan("cuda", f"{build.arch_list} {here}+PTX", build.nvcc_release)
        print(f"the YOSO CUDA kernels built for '{built_for}' do not run on this GPU (compute capability "
              f"{here}): building them for TORCH_CUDA_ARCH_LIST='{wider.arch_list}'", file=sys.stderr)
        build, build_directory = wider, cache_dir() / wider.name
    module, damage = (None, "") if force else _import_checked(build.name, build_directory)
    if damage:
        print(f"the YOSO {build.kind.upper()} kernels in {build_directory} cannot be used as they are ({damage}): "
              "rebuilding them", file=sys.stderr)
    if module is None:
        _build_once(build, build_directory, clear=force or bool(damage), damage=damage)
        module, damage = _import_checked(build.name, build_directory)
    if module is None:
        raise KernelUnavailable(f"the YOSO {build.kind.upper()} kernels just built in {build_directory} fail their check "
                                f"({damage or 'unfinished'}); delete that folder and retry, or set attention.impl=torch")
    return module


def _recorded_arch_list(build_directory: Path) -> str:
    """The CUDA architectures a finished build records ("" if none is finished there)."""
    try:
        return json.loads((build_directory / COMPLETE_STAMP).read_text()).get("cuda_arch_list", "")
    except (OSError, ValueError, AttributeError):
        return ""


def _library_record(library: Path) -> dict:
    """What a finished build records of its library: its name, size and SHA-256 (a 50 MB CUDA library
    hashes in about 50 ms; a process checks each kind once)."""
    digest = hashlib.sha256()
    with open(library, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
        return {"file": library.name, "size": os.fstat(handle.fileno()).st_size, "sha256": digest.hexdigest()}


def _damage(build_directory: Path, name: str, hashed: bool = True):
    """None if the finished build in ``build_directory`` is intact; "" if no build finished there; else
    what is wrong with it (its library's size always, its SHA-256 when ``hashed``)."""
    try:
        record = json.loads((build_directory / COMPLETE_STAMP).read_text())
    except FileNotFoundError:
        return ""
    except (OSError, ValueError) as error:
        return f"its {COMPLETE_STAMP} cannot be read: {error}"
    expected = record.get("library") if isinstance(record, dict) else None
    if not isinstance(expected, dict):
        return f"an older lra-harness built it: its {COMPLETE_STAMP} records no size and checksum of its library"
    library = build_directory / f"{name}.so"
    try:
        if (size := library.stat().st_size) != expected.get("size"):
            return f"{library.name} is {size} bytes, {expected.get('size')} when it was built"
        if hashed and _library_record(library)["sha256"] != expected.get("sha256"):
            return f"{library.name} no longer has the SHA-256 recorded when it was built"
    except OSError as error:
        return f"{library.name} cannot be read: {error.strerror}"
    return None


def _import_checked(name: str, build_directory: Path) -> tuple:
    """(the module, None) if the build there is finished and intact, else (None, what _damage says). Checked
    and imported under a shared lock on the folder, so that a rebuild cannot replace the library in between."""
    if not (build_directory / COMPLETE_STAMP).exists():
        return None, ""
    held = contextlib.ExitStack()  # the lock file opened read-only: a cache built by root serves anyone
    with contextlib.suppress(OSError):
        _wait_for_lock(held.enter_context(open(build_directory / "build.flock", "rb")), fcntl.LOCK_SH, build_directory)
    with held:
        damage = _damage(build_directory, name)
        return (None, damage) if damage is not None else (_import_built(name, build_directory), None)


def _build_once(build: BuildPlan, build_directory: Path, clear: bool = False, damage: str = "") -> None:
    """Build into ``build_directory`` under its exclusive lock, unless a job we waited for finished it
    intact; ``clear`` starts from an empty folder (the stamp first, so no one takes it for finished; files
    are unlinked, never rewritten in place, so a process that has the old library loaded keeps it). A build
    interrupted (a signal: KeyboardInterrupt) leaves the folder empty, so that the next one starts clean."""
    try:
        build_directory.mkdir(parents=True, exist_ok=True)
        os.chmod(build_directory, 0o755)  # a shared kernel cache stays readable by the group
        with _exclusive_build(build_directory):
            if _damage(build_directory, build.name) is None and not (clear and not damage):
                return  # built (or repaired) by the job we waited for
            try:
                if clear:
                    _empty(build_directory)
                _compile_in_worker(build)
                stamp = build_directory / f".{COMPLETE_STAMP}.{os.getpid()}"
                record = {"name": build.name, "torch": torch.__version__, "cflags": _cpu_flags(build.kind),
                          "cuda_arch_list": build.arch_list, "nvcc_release": build.nvcc_release,
                          "sources": sorted(set(build.sources) | set(HEADERS)),
                          "library": _library_record(build_directory / f"{build.name}.so")}
                stamp.write_text(json.dumps(record) + "\n")
                os.replace(stamp, build_directory / COMPLETE_STAMP)
            except KeyboardInterrupt:
                if not (build_directory / COMPLETE_STAMP).exists():  # unfinished: nothing of it stays
                    _empty(build_directory)
                raise
    except OSError as error:  # a cache folder that cannot be made or written (a file in its place)
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
            raise
        blocker = next((p for p in (build_directory, *build_directory.parents) if p.exists() and not p.is_dir()), None)
        what = f"{error.strerror}: {blocker} is a file" if blocker is not None else error.strerror
        kernels = f"the YOSO {build.kind.upper()} kernels in {build_directory}"
        raise KernelUnavailable(
            (f"{kernels} are damaged ({damage}) and cannot be rebuilt there ({what}): delete that folder (its owner "
             "can), or" if damage else f"cannot build {kernels} ({what});")
            + " set LRA_KERNEL_CACHE to a folder you can write, or attention.impl=torch") from error


def _empty(build_directory: Path) -> None:
    """Remove everything in ``build_directory`` but its lock file, the stamp first."""
    for path in sorted(build_directory.iterdir(), key=lambda path: path.name != COMPLETE_STAMP):
        if path.name != "build.flock":
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def _import_built(name: str, build_directory: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, build_directory / f"{name}.so")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile_in_worker(build: BuildPlan) -> None:
    """Compile in a child process started in a session of its own (no fork-time hook: this process
    may hold CUDA and threads) that dies with this process (it sets PR_SET_PDEATHSIG itself), taking
    ninja and the compilers with it: a job killed mid-build leaves no compiler running (a Ctrl-C here
    stops it too). Its output goes to ``build.log`` in the build folder (and to stderr when verbose);
    a failure raises KernelUnavailable with one line (see _explain_failure)."""
    worker = subprocess.Popen([sys.executable, "-c", "from attention_zoo._yoso_build import main; main()",
                               *build.argv(), "--parent", str(os.getpid())],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for hook in WORKER_STARTED:
            hook()
        output, _ = worker.communicate()
    except BaseException:  # interrupted here (a signal): stop the build as its parent's death would
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)
        worker.wait()
        deadline = time.monotonic() + 30  # and let ninja (in the worker's process group) stop its compilers
        while time.monotonic() < deadline:
            try:
                os.killpg(worker.pid, 0)
            except OSError:
                break
            time.sleep(0.05)
        raise
    log, verbose = cache_dir() / build.name / BUILD_LOG, os.environ.get("LRA_KERNEL_VERBOSE") == "1"
    try:
        log.write_text(output)
    except OSError as error:  # the output must not be lost: stderr has it instead
        log, verbose = f"above; {BUILD_LOG} could not be written: {error.strerror}", verbose or worker.returncode
    if verbose:
        sys.stderr.write(output)
    if worker.returncode:
        raise KernelUnavailable(_explain_failure(build.kind, output, log))


def _worker(build: BuildPlan, parent: int) -> None:
    """The build process, leader of its own process group. It asks for SIGTERM when its parent dies
    (and exits if that already happened); on SIGTERM it passes SIGTERM to its process group, where
    ninja runs; ninja then stops the compilers it started (each in a process group of its own). A
    failure prints its traceback (for the log) and a one-line summary for the parent."""
    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGTERM)
        os._exit(1)

    signal.signal(signal.SIGTERM, stop)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    try:
        _compile_and_import(build, cache_dir() / build.name)
    except Exception as error:
        traceback.print_exc()
        print(WORKER_FAILED + (f"{' '.join(map(str, error.cmd))} exited with status {error.returncode}"
                               if isinstance(error, subprocess.CalledProcessError) else
                               f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"), file=sys.stderr)
        sys.exit(1)


def _wait_for_lock(handle, mode: int, build_directory: Path) -> None:
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"waiting for another process building the YOSO kernels in {build_directory}", file=sys.stderr)
        fcntl.flock(handle, mode)


@contextlib.contextmanager
def _exclusive_build(build_directory: Path):
    """Hold an OS file lock on the build directory while torch builds or loads into it.

    torch.utils.cpp_extension marks a build in progress with a plain ``lock`` file and waits, forever,
    for it to vanish; a build killed mid-compile (a preempted job, a Ctrl-C) leaves it behind and every
    later job would hang. The OS releases a flock when its holder dies, so once we hold it no one else is
    building, and a ``lock`` file still there is stale: it is removed, with a note.
    """
    with open(build_directory / "build.flock", "w") as handle:
        _wait_for_lock(handle, fcntl.LOCK_EX, build_directory)
        stale = build_directory / "lock"
        if stale.exists():
            print(f"removing {stale}, left by a kernel build that was killed", file=sys.stderr)
            stale.unlink(missing_ok=True)
        yield  # closing the file releases the lock


def _compile_and_import(build: BuildPlan, build_directory: Path) -> ModuleType:
    from torch.utils.cpp_extension import load as load_extension

    if build.kind == "cuda":
        os.environ["TORCH_CUDA_ARCH_LIST"] = build.arch_list  # this worker process only
    return load_extension(
        name=build.name,
        sources=[str(SOURCE_DIR / source) for source in build.sources],
        extra_cflags=_cpu_flags(build.kind),
        extra_ldflags=["-fopenmp"],
        extra_cuda_cflags=["-O3"],
        extra_include_paths=[str(SOURCE_DIR)],
        build_directory=str(build_directory),
        with_cuda=build.kind == "cuda",
        verbose=os.environ.get("LRA_KERNEL_VERBOSE") == "1",
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="lra-build-kernels",
                                     description="Compile the YOSO kernels into the kernel cache ($LRA_KERNEL_CACHE, "
                                     "default ~/.cache/lra-harness/kernels) ahead of the first run that needs them.")
    parser.add_argument("kinds", nargs="+", choices=["cpu", "cuda"])
    parser.add_argument("--force", action="store_true", help="rebuild even a finished build (from an empty folder)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # see _compile_in_worker
    parser.add_argument("--arch-list", default="", help=argparse.SUPPRESS)
    parser.add_argument("--nvcc-release", default="", help=argparse.SUPPRESS)
    parser.add_argument("--parent", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(BuildPlan(args.kinds[0], args.arch_list, args.nvcc_release), args.parent)
        return
    for kind in args.kinds:
        started = time.perf_counter()
        try:
            _check_toolchain(kind)  # first: a torch without CUDA support says so before anything else
            announce_build(kind, args.force)
            module = load(kind, args.force)
        except KernelUnavailable as error:
            parser.exit(1, f"error: {error}\n")
        print(f"{kind}: {module.__file__} ({time.perf_counter() - started:.0f} s)", flush=True)


def announce_build(kind: str, force: bool = False) -> None:
    """One line before a build that will compile, so its minute is never silent: what, for what, and where."""
    build = plan(kind)
    folder = cache_dir() / build.name
    if not force and _damage(folder, build.name, hashed=False) is None:
        return
    target = f"CUDA architectures {build.arch_list}" if kind == "cuda" else f"CPU flags {' '.join(_cpu_flags(kind))}"
    print(f"{kind}: compiling the YOSO kernels ({', '.join(build.sources)}) for {target} into {folder}; "
          f"{'several minutes' if kind == 'cuda' else 'under a minute'} (LRA_KERNEL_VERBOSE=1 shows the compiler)",
          flush=True)


if __name__ == "__main__":
    main()
