"""The benchmarks' sanity gate: rates from lower bounds of the work, refused above a device's datasheet peak."""

import pytest

from lra.benchmarks import peaks


def test_the_gate_passes_a_plausible_rate_and_fails_an_impossible_one_naming_both():
    flops = peaks.attention_flops(16 * 4096**2, 32, backward=True)  # SDPA fp32 fwd + bwd at 16 x 4,096 x 32
    assert flops == 12 * 32 * 16 * 4096**2
    achieved = peaks.rates("NVIDIA H100 80GB HBM3", 6.33e-3, flops=flops)  # measured on an H100: 6.33 ms
    assert 16 < achieved["tflops"] < 17  # fp32 SDPA: far under the bf16 tensor peak, as it must be
    with pytest.raises(peaks.AbovePeak, match=r"above the H100's peak of 989 TFLOP/s: the timing is wrong"):
        peaks.rates("NVIDIA H100 80GB HBM3", 6.33e-6, flops=flops)  # a clock read before the device finished
    with pytest.raises(peaks.AbovePeak, match=r"GB/s measured, above the H200's peak of 7,806 GB/s"):
        peaks.rates("NVIDIA H200", 1e-6, bytes_moved=peaks.io_bytes(8, 16 * 4096 * 32))


def test_a_device_without_a_datasheet_peak_prints_its_rates_unchecked():
    assert peaks.rates(None, 1e-9, flops=1e15)["tflops"] == pytest.approx(1e12)
    assert peaks.rates("NVIDIA GeForce RTX 9090", 1e-9, flops=1e15)["tflops"] == pytest.approx(1e12)
    assert "unchecked" in peaks.gate_note("NVIDIA GeForce RTX 9090") and "unchecked" in peaks.gate_note(None)
    assert "989 TFLOP/s dense, 7.8 TB/s L2" in peaks.gate_note("NVIDIA H100 80GB HBM3")
