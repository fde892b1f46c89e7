"""Build and run the CUDA kernels of csrc/yoso emulated on the CPU (tests/simt/yoso_driver.cpp): the
same .cu sources and the same host logic (yoso_cuda_host.cpp) compiled by the host compiler with
-DYOSO_SIMT_EMULATION and the SIMT runtime (tests/simt/runtime.cpp), plainly or under AddressSanitizer
or ThreadSanitizer."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List

import numpy as np

from attention_zoo import _yoso_build

REPO = Path(__file__).resolve().parents[2]
# The CUDA extension's kernels and host logic (not its torch wrapper, nor the CPU kernels).
SOURCES = [REPO / "csrc" / "yoso" / name for name in _yoso_build.CUDA_SOURCES
           if name.endswith(".cu") or name == "yoso_cuda_host.cpp"]
SIMT = REPO / "tests" / "simt"
DRIVER = SIMT / "yoso_driver.cpp"
RUNTIME = [SIMT / "runtime.cpp", SIMT / "runtime.h", SIMT / "context.h"]
FLAGS = {
    "plain": ["-O2"],
    "asan": ["-O1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all"],
    "tsan": ["-O1", "-fsanitize=thread"],
}
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",
                 "TSAN_OPTIONS": "halt_on_error=1:exitcode=66:report_signal_unsafe=0:atexit_sleep_ms=0",
                 "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


@functools.lru_cache(maxsize=None)
def toolchain_lacks(variant: str) -> str:
    """Why this machine's compiler cannot build ``variant`` (a sanitizer it does not ship), or ""."""
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler})"
    with tempfile.TemporaryDirectory() as folder:
        probe = Path(folder) / "probe.cpp"
        probe.write_text("#include <thread>\nint main() { std::thread([] {}).join(); }\n")
        result = subprocess.run([compiler, "-std=c++20", *FLAGS[variant], str(probe), "-o", str(Path(folder) / "probe"),
                                 "-lpthread"], capture_output=True, text=True)
        if result.returncode:
            return f"{compiler} cannot build with {' '.join(FLAGS[variant])}: {result.stderr.strip()[-200:]}"
        ran = subprocess.run([str(Path(folder) / "probe")], capture_output=True, text=True)
        return "" if ran.returncode == 0 else f"a {variant} program does not run here: {ran.stderr.strip()[-200:]}"


def build(variant: str, sources: List[Path] = SOURCES) -> Path:
    """The driver built with ``variant``'s flags, cached by the sources' and flags' hash (built once
    per checkout and worker-safe: a finished build is renamed into place)."""
    compiler = os.environ.get("CXX", "c++")
    flags = ["-std=c++20", "-g1", "-Wno-unknown-pragmas", "-DYOSO_SIMT_EMULATION", f"-I{REPO / 'csrc' / 'yoso'}",
             f"-I{SIMT}", *FLAGS[variant]]
    digest = hashlib.sha256(" ".join([compiler, *flags]).encode())
    for path in [*sources, DRIVER, *RUNTIME, *sorted((REPO / "csrc" / "yoso").glob("*.h"))]:
        digest.update(path.name.encode() + path.read_bytes())
    target = REPO / "build" / "test-simt" / f"{variant}-{digest.hexdigest()[:12]}" / "yoso_driver"
    if target.is_file():
        return target
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent.parent))
    command = [compiler, *flags, *(arg for s in sources for arg in ("-x", "c++", str(s))), "-x", "c++", str(DRIVER),
               "-x", "c++", str(RUNTIME[0]), "-o", str(staging / "yoso_driver"), "-lpthread"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        shutil.rmtree(staging, ignore_errors=True)
        raise RuntimeError(f"building the emulated kernels failed:\n{result.stderr[-4000:]}")
    try:
        os.rename(staging, target.parent)
    except OSError:  # another worker finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


@dataclass
class Launch:
    kernel: str
    grid: tuple
    block: tuple
    shared_bytes: int
    loaded_bytes: int
    stored_bytes: int
    atomic_bytes: int


@dataclass
class Result:
    outputs: Dict[str, np.ndarray]
    launches: List[Launch] = field(default_factory=list)
    workspace_floats: int = 0
    max_rss_kb: int = 0
    returncode: int = 0
    stderr: str = ""

    def traffic(self, kernel: str) -> tuple:
        """(loaded, stored) bytes summed over every launch of ``kernel`` (a template's every instance)."""
        chosen = [launch for launch in self.launches if launch.kernel.split("<")[0] == kernel]
        return sum(x.loaded_bytes for x in chosen), sum(x.stored_bytes for x in chosen)

    def atomics(self, kernel: str) -> int:
        """Bytes added atomically by every launch of ``kernel``."""
        return sum(x.atomic_bytes for x in self.launches if x.kernel.split("<")[0] == kernel)

    def kernels(self) -> List[str]:
        """The kernels launched, in order (template arguments as written in the source)."""
        return [launch.kernel for launch in self.launches]


OUTPUTS = {"fast_hash": {"codes": np.int32}, "cumulation": {"out": np.float32},
           "exact_backward": {"grad_q": np.float32, "grad_k": np.float32, "grad_v": np.float32},
           "pair_gradient": {"out": np.float32}, "unit_rows": {"unit": np.float32, "norms": np.float32},
           "through_unit_rows": {"grad": np.float32}, "sort": {"sorted": np.int32, "order": np.int32, "starts": np.int32},
           "probe": {"codes": np.int32}, "round_bf16": {"codes": np.int32}, "racing_blocks": {"out": np.float32},
           "neighbours": {"out": np.float32}, "unwritten_shared": {"codes": np.int32}}


def bf16_bits(x) -> np.ndarray:
    """A float tensor rounded to bfloat16 (torch's rounding, to nearest even), as the uint16 bits the driver
    reads as bfloat16 rows."""
    import torch

    return x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def run(variant: str, op: str, arrays: Dict[str, np.ndarray], ints: Dict[str, int], floats: Dict[str, float] = None,
        driver: Path = None, check: bool = True) -> Result:
    """Run ``op`` of the emulated kernels; a sanitizer report or a failed emulation check raises, and
    so does an error of the host logic (exit status 3, one ``error:`` line) unless ``check`` is False.
    ``ints`` may hold ``seed`` (the emulation's block and thread orders) and ``deterministic`` (0: the
    atomic paths)."""
    driver = driver or build(variant)
    with tempfile.TemporaryDirectory() as folder:
        lines = [f"op {op}"] + [f"int {k} {int(v)}" for k, v in ints.items()]
        lines += [f"float {k} {float(v)!r}" for k, v in (floats or {}).items()]
        for name, array in arrays.items():  # uint16: bfloat16 rows, as their bits (:func:`bf16_bits`)
            kind = "b2" if array.dtype == np.uint16 else "i4" if array.dtype.kind in "iu" else "f4"
            data = np.ascontiguousarray(array, dtype={"b2": np.uint16, "i4": np.int32, "f4": np.float32}[kind])
            data.tofile(Path(folder) / f"{name}.bin")
            lines.append(f"{kind} {name} {data.size}")
        (Path(folder) / "request.txt").write_text("\n".join(lines) + "\n")
        completed = subprocess.run([str(driver), folder], capture_output=True, text=True,
                                   env={**os.environ, **SANITIZER_ENV})
        if check and completed.returncode:
            headlines = [line for line in completed.stderr.splitlines()
                         if line.startswith(("ERROR: ", "SUMMARY: ", "WARNING: ThreadSanitizer", "error: "))
                         or line.startswith("simt: ") or " of size " in line or "runtime error" in line]
            raise AssertionError(f"the emulated {op} ({variant}) failed with status {completed.returncode}:\n"
                                 + "\n".join(headlines[:12]) + f"\n...\n{completed.stderr[-3000:]}")
        if completed.returncode:
            return Result({}, returncode=completed.returncode, stderr=completed.stderr)
        outputs = {name: np.fromfile(Path(folder) / f"{name}.out.bin", dtype=dtype)
                   for name, dtype in OUTPUTS[op].items()}
        result = Result(outputs, stderr=completed.stderr)
        for line in (Path(folder) / "stats.txt").read_text().splitlines():
            word, *rest = line.split()
            if word == "launch":
                values = list(map(int, rest[1:]))
                result.launches.append(Launch(rest[0], tuple(values[0:3]), tuple(values[3:6]), *values[6:10]))
            elif word == "workspace_floats":
                result.workspace_floats = int(rest[0])
            elif word == "max_rss_kb":
                result.max_rss_kb = int(rest[0])
        return result
