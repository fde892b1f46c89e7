"""How this harness measures, decided once: ``lra-profile``, every benchmark in ``lra.benchmarks``,
``lra-gpu-check`` and the run records all measure through these functions.

- **Time of a step** (:func:`best_of`): one warm-up call (kernels built, caches filled), then the
  minimum over ``repeats`` calls, each timed from a device synchronization to the next, so queued
  GPU work is inside the interval and nothing before it is. The minimum is the least disturbed by
  other work on a shared machine. Work that is measured once (a data set generated, a cache
  loaded, a first compiled step, many training steps for a rate) is :func:`timed` the same way.
- **Repeated timings** (:func:`repeated`, :class:`Timing`): the same synchronized calls, each kept: their
  median is the time ``lra-profile`` reports, and their spread (slowest ÷ fastest) says how steady the
  machine was; a spread over :data:`UNSTEADY` (other work on a shared CPU, a GPU clocking down) makes
  the time a warning, not a fact.
- **Peak memory of a step** (:func:`step_peak_bytes`), the same quantity on both devices: the highest
  point that the memory held by torch's tensors reaches during the step, above what they held when it
  started. CUDA: the caching allocator's ``max_memory_allocated`` after a reset, minus the allocation
  at the start. CPU: the running sum of the allocations and frees of torch's CPU allocator in time
  order, from the profiler's memory events. Neither counts the allocator's cache, the process's other
  memory, or what a kernel allocates outside torch.
- **Peak memory of a process** (:func:`process_peak_mb`), what a training run records: CUDA: the
  allocator's peak since the process started (tensors only); CPU: the process's peak resident set
  (everything the process touched: Python, torch, data, kernels' own buffers).
- **A cell in a fresh process** (:func:`run_cell`): ``python -m <module> <args>`` printing one JSON
  row per line, so that each measurement's memory is its own and a crash, an out-of-memory kill or a
  timeout is a recorded row, never the end of a benchmark.
"""

from __future__ import annotations

import itertools
import json
import resource
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

T = TypeVar("T")

MB = 2**20  # torch is imported where a function needs it: run_cell's callers start no torch


def synchronize(device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work: Callable[[], T], device="cpu") -> Tuple[T, float]:
    """(what ``work`` returned, the seconds it took from a device synchronization to the next)."""
    synchronize(device)
    started = time.perf_counter()
    result = work()
    synchronize(device)
    return result, time.perf_counter() - started


def best_of(step: Callable[[], object], device, repeats: int, warmup: int = 1) -> float:
    """Seconds: the fastest of ``repeats`` synchronized calls of ``step`` after ``warmup`` calls."""
    return min(repeated(step, device, repeats, warmup))


def repeated(step: Callable[[], object], device, repeats: int, warmup: int = 1) -> List[float]:
    """Seconds of each of ``repeats`` synchronized calls of ``step`` after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    return [timed(step, device)[1] for _ in range(repeats)]


UNSTEADY = 1.5  # slowest ÷ fastest of a cell's repeats above which its time is not to be trusted


class Timing:
    """Seconds of repeated calls: the :attr:`median` reported, the :attr:`spread` (slowest ÷ fastest; NaN
    for one call, which shows no spread)."""

    def __init__(self, seconds: Sequence[float]):
        self.seconds = sorted(seconds)

    @property
    def median(self) -> float:
        ordered, middle = self.seconds, len(self.seconds) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

    @property
    def spread(self) -> float:
        if len(self.seconds) < 2:
            return float("nan")
        return self.seconds[-1] / self.seconds[0] if self.seconds[0] > 0 else float("inf")

    @property
    def unsteady(self) -> bool:
        return self.spread > UNSTEADY  # False for NaN: one call is "unknown", said apart


def step_peak_bytes(step: Callable[[], object], device) -> int:
    """The highest point torch's tensors reach during ``step`` above where they started (module docstring)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return max(torch.cuda.max_memory_allocated(device) - start, 0)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    return max(itertools.accumulate((e.self_cpu_memory_usage for e in events), initial=0))


def process_peak_mb(device) -> float:
    """What a run records as ``peak_memory_mb`` (module docstring)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MB
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (MB if sys.platform == "darwin" else 2**10)


def run_cell(module: str, args: Sequence[str], timeout_s: Optional[float] = None) -> List[Dict]:
    """The JSON rows a fresh ``python -m module args`` printed (one per line), or one ``{"error": …}``
    row when it printed none: killed (out of memory: SIGKILL from the kernel, or an out-of-memory
    message), failed (:func:`error_line`) or timed out. Rows printed before a failure are kept."""
    try:
        result = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                                timeout=timeout_s)
        stdout, stderr, code, timed_out = result.stdout, result.stderr, result.returncode, False
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr, code, timed_out = "", None, True
    rows = []
    for line in stdout.splitlines():
        if line.startswith(("{", "[")):
            parsed = json.loads(line)
            rows.extend(parsed if isinstance(parsed, list) else [parsed])
    if code == 0 and rows:
        return rows
    if timed_out:
        reason = f"timed out after {timeout_s:g} s"
    elif code == -9 or "out of memory" in stderr.lower() or "memoryerror" in stderr.lower():
        reason = "out of memory"
    else:
        reason = error_line(stderr) or f"exited with {code}"
    return rows + [{"error": reason}]


def error_line(stderr: str) -> Optional[str]:
    """What a failed process said about why: the exception's line after its last traceback (a message of
    several lines is its first line, with the exception's name), else the last line it wrote."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        after = [line for line in lines[starts[-1] + 1:] if not line[:1].isspace()]
        if after:
            return after[0].strip()
    return lines[-1].strip() if lines else None
