"""The H100's fitted constants, from the one calibration trace (docs/gpu/2026-11-27b/trace.md) alone.

- **Device** (:data:`gpu.FITTED`): ``issue_factor``, ``latency_factor``, ``atomic_sector_cost``,
  ``shared_atomic_cycles`` and ``launch_s`` minimise the squared log ratio of model to measurement over
  the trace's kernel rows (each YOSO kernel, the operators' other kernels, PyTorch's kernels), by
  coordinate descent (golden sections in log space, each constant within physical bounds).
- **Host**: ``HOST_OP_S`` makes the modelled queued step equal the trace's (a step's host time over its
  PyTorch ops' worth, :mod:`.host`); the ops' relative weights (:mod:`.ops`) are the trace's profiler CPU
  columns, which :func:`host_weights` reads again.

:func:`fit` takes the calibration rows and nothing else; ``H100`` (:mod:`.gpu`) and ``HOST_OP_S`` carry
the fitted values, rounded, and the tests check that fitting again reproduces them.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, List, Sequence

from lra.benchmarks.yoso_cost import compare, host, measured
from lra.benchmarks.yoso_cost.gpu import FITTED, H100, Machine

BOUNDS = {"issue_factor": (1.0, 4.0), "latency_factor": (1.0, 8.0), "atomic_sector_cost": (1.0, 16.0),
          "shared_atomic_cycles": (1.0, 64.0), "launch_s": (0.5e-6, 6e-6)}
SWEEPS = 6


def calibration_rows() -> List[compare.Row]:
    """The rows the constants are fitted on: the calibration trace's, role ``fitted``."""
    return _fitted(compare.trace_rows(measured.CALIBRATION))


def _fitted(rows: Sequence[compare.Row]) -> List[compare.Row]:
    return [row for row in rows if row.role == "fitted"]


def _device_rows(rows: Sequence[compare.Row]) -> List[compare.Row]:
    return [row for row in _fitted(rows) if not row.what.startswith("a step")]


def _loss(rows: Sequence[compare.Row], machine: Machine) -> float:
    return sum(math.log(row.projected(machine) / row.measured_s) ** 2 for row in rows)


def _golden(f, low: float, high: float, steps: int = 40) -> float:
    """The minimum of f over [low, high] in log space (golden-section search)."""
    a, b = math.log(low), math.log(high)
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(math.exp(d))
    return math.exp((a + b) / 2)


def fit_device(rows: Sequence[compare.Row], start: Machine = H100) -> Machine:
    """``start`` with :data:`FITTED` fitted to the ``fitted`` kernel rows among ``rows``."""
    kernels = _device_rows(rows)
    machine = start
    for _ in range(SWEEPS):
        for name in FITTED:
            best = _golden(lambda value: _loss(kernels, replace(machine, **{name: value})), *BOUNDS[name])
            machine = replace(machine, **{name: best})
    return machine


def fit_host(rows: Sequence[compare.Row], machine: Machine) -> float:
    """Seconds per PyTorch op on the host that make the modelled queued step equal the measured one."""
    queued = next(row for row in _fitted(rows) if row.what.startswith("a step queued"))
    low, high = 1e-6, 1e-4  # the queued step is the larger of host and device: monotonic in the host's share
    for _ in range(60):
        middle = math.sqrt(low * high)
        low, high = (middle, high) if queued.projected(machine, middle) < queued.measured_s else (low, middle)
    return math.sqrt(low * high)


def fit(rows: Sequence[compare.Row]) -> Dict[str, float]:
    """Every fitted constant from the rows of role ``fitted`` among ``rows`` (any others are ignored): the
    device's, then the host's."""
    machine = fit_device(rows)
    return {**{name: getattr(machine, name) for name in FITTED}, "host_op_s": fit_host(rows, machine)}


def host_weights(source: str = measured.CALIBRATION) -> Dict[str, float]:
    """The ops' host weights (:mod:`.ops`) from a trace's profiler CPU columns, in aten::mul's per call."""
    t = measured.trace(source)

    def per_call(prefix: str, column: int = 1) -> float:
        entry = t.row(prefix)
        return entry[column] / entry[3]

    unit = per_call("aten::mul")
    sample = per_call("GeneratedBackwardFor_attention_zoo_yoso_sample_default")
    return {"custom op": per_call("attention_zoo::yoso_fast_hash") / unit - 1,
            "autograd wrapper": (sample - per_call("attention_zoo::yoso_cumulation")) / unit - 1,
            "backward node": (per_call("GeneratedBackwardFor_attention_zoo_yoso_sample_defaultBac")
                              - per_call("attention_zoo::yoso_exact_weight_backward")) / unit,
            "exact-weight operator": per_call("attention_zoo::yoso_exact_weight_backward", 2) / unit,
            "function": (per_call("_UnitRows") / unit - 3 + per_call("_UnitRowsBackward") / unit - 7) / 2,
            "sort": per_call("aten::sort") / unit}


def current() -> Dict[str, float]:
    return {**{name: getattr(H100, name) for name in FITTED}, "host_op_s": host.HOST_OP_S}


def main() -> None:
    rows = calibration_rows()
    fitted = fit(rows)
    for name, value in fitted.items():
        print(f"{name}: {value:.4g} (in the code: {current()[name]:.4g})")
    for name, value in host_weights().items():
        print(f"host weight of a {name}: {value:.2f}")


if __name__ == "__main__":
    main()
