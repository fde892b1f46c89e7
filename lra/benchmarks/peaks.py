"""A benchmark's sanity gate: the rate a speed row implies, from a lower bound of the work it must do,
checked against its device's datasheet peak. A rate above the peak means the timing is wrong (a clock
read before the device finished, a result served from a cache), not a fast kernel, so the row fails.

Peaks, the highest a device can reach on anything the benchmarks time: dense tensor-core math (bf16,
no sparsity) and L2 bandwidth (every global load or store passes L2; data that stays there can be read
faster than HBM, never faster than L2). Devices without an entry print their rates unchecked, saying so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lra.benchmarks.yoso_cost.gpu import H100, RTX_2080_TI


@dataclass(frozen=True)
class Peak:
    name: str  # matched as a substring of torch.cuda.get_device_name()
    dense_tflops: float
    l2_tbps: float


PEAKS = (  # the first whose name the device's contains; L2 bandwidths are lra.benchmarks.yoso_cost.gpu's machines'
    Peak("H200", 989.4, H100.l2_bytes_per_s / 1e12),  # GH100 as the H100 SXM: 132 SMs at 1.98 GHz boost
    Peak("H100", 989.4, H100.l2_bytes_per_s / 1e12),  # SXM5: 989.4 TFLOP/s bf16 dense; L2 3,942 B a clock (a PCIe
    # H100 is slower on both, so it is checked against bounds it cannot reach either)
    Peak("RTX 2080 Ti", 107.6, RTX_2080_TI.l2_bytes_per_s / 1e12),
)


class AbovePeak(RuntimeError):
    """A measured rate above its device's peak: the timing is wrong."""


def peak_of(device_name: str) -> Optional[Peak]:
    return next((peak for peak in PEAKS if peak.name in device_name), None)


def attention_flops(pairs: float, head_dim: int, backward: bool) -> float:
    """A lower bound of an attention's floating-point work over ``pairs`` (query, key) pairs: q·k and the
    weighted v, 2·d each, forward; the backward at least twice that (dV, dP, dQ and dK: four products)."""
    return 4.0 * head_dim * pairs * (3 if backward else 1)


def io_bytes(tensors: int, elements: int, bytes_per_element: int = 4) -> float:
    """A lower bound of the global traffic of a call that reads or writes ``tensors`` tensors of ``elements``."""
    return float(tensors * elements * bytes_per_element)


def rates(device_name: Optional[str], seconds: float, flops: float = 0.0, bytes_moved: float = 0.0) -> dict:
    """{"tflops", "gbps"} that a call of ``seconds`` achieves on these lower bounds of its work; on a
    device with a known peak, :class:`AbovePeak` (one line naming both) where either exceeds it."""
    achieved = {"tflops": flops / seconds / 1e12, "gbps": bytes_moved / seconds / 1e9}
    peak = peak_of(device_name) if device_name else None
    if peak is not None:
        for value, limit, unit in ((achieved["tflops"], peak.dense_tflops, "TFLOP/s"),
                                   (achieved["gbps"], peak.l2_tbps * 1e3, "GB/s")):
            if value > limit:
                raise AbovePeak(f"{value:,.0f} {unit} measured, above the {peak.name}'s peak of {limit:,.0f} {unit}: "
                                f"the timing is wrong (an unsynchronized clock or a cached result), not the kernel fast")
    return achieved


def gate_note(device_name: Optional[str]) -> str:
    """What the gate checked, for a report's header."""
    if device_name is None:
        return "rates from lower bounds of the work; a CPU has no peak here: unchecked"
    peak = peak_of(device_name)
    if peak is None:
        return f"rates from lower bounds of the work; no datasheet peak for {device_name}: unchecked"
    return (f"rates from lower bounds of the work, each checked under the {peak.name}'s peaks "
            f"({peak.dense_tflops:,.0f} TFLOP/s dense, {peak.l2_tbps:.1f} TB/s L2)")
