"""lra-profile's times: each the median of repeated calls with their spread, a busy machine's cells (and the
exponents fitted over them) warned about, CPU measurements said to be CPU measurements."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lra.profiling import report
from lra.profiling.measure import UNSTEADY, Timing


def test_a_timing_is_the_median_of_its_calls_with_their_spread():
    timing = Timing([0.30, 0.10, 0.12])
    assert timing.median == 0.12 and timing.spread == pytest.approx(3.0) and timing.unsteady
    assert Timing([0.2, 0.1, 0.14, 0.12]).median == pytest.approx(0.13)
    steady = Timing([0.10, 0.12, 0.149])
    assert steady.spread == pytest.approx(1.49) and not steady.unsteady
    assert math.isnan(Timing([0.1]).spread) and not Timing([0.1]).unsteady  # one call shows no spread


def test_a_cell_measured_here_reports_medians_repeats_and_spreads():
    from lra.profiling.cell import measure

    row = measure({"backend": "softmax", "n": 64, "batch": 2, "device": "cpu", "num_heads": 2, "head_dim": 8,
                   "repeats": 3})
    assert row["repeats"] == 3 and row["step_spread"] >= 1 and row["inference_spread"] >= 1
    assert row["step_ms"] >= row["forward_ms"] > 0 and row["error"] is None
    once = measure({"backend": "softmax", "n": 64, "batch": 2, "device": "cpu", "num_heads": 2, "head_dim": 8,
                    "repeats": 1})
    assert once["step_spread"] is None and once["inference_spread"] is None


def rows(spreads, repeats=3, device="cpu"):
    """A backend's cells at n = 256, 512, 1024: quadratic times, the given step spreads."""
    return [{"backend": "nystrom", "label": "Nystromformer", "n": n, "batch": 1, "device": device,
             "forward_ms": 1e-4 * n * n / 2, "backward_ms": 1e-4 * n * n / 2, "step_ms": 1e-4 * n * n,
             "inference_ms": 1e-4 * n * n / 2, "backward_cache_mb": 0.1, "training_peak_mb": 1e-3 * n,
             "inference_peak_mb": 1e-3 * n, "repeats": repeats, "step_spread": spread, "inference_spread": 1.1,
             "error": None} for n, spread in zip((256, 512, 1024), spreads)]


def test_an_unsteady_cell_is_a_warning_and_so_is_the_exponent_fitted_over_it(tmp_path):
    frame = report.write(rows([1.1, 2.4, 1.2]) + [{"backend": "softmax", "label": "Softmax", "n": 256, "batch": 1,
                                                    "error": "out of memory"}], tmp_path, 256, "a title")
    assert list(report.unsteady(frame)["n"]) == [512]
    text = (tmp_path / "profile.md").read_text()
    assert "Each time is the median of 3 calls after a warm-up; a cell is unsteady when its slowest call took " \
           f"over {UNSTEADY:g}× its fastest." in text
    assert "Measured on a CPU: times are wall-clock on a machine shared with whatever else ran" in text
    assert "**Warning: unsteady timings** (the machine was busy; rerun on a quiet machine or raise `repeats`), " \
           "and the exponents fitted over them: Nystromformer at n = 512 (2.4×)." in text
    fits = pd.read_csv(tmp_path / "exponents.csv").set_index("label")
    assert fits.loc["Nystromformer", "timing"] == "unsteady" and fits.loc["Nystromformer", "time_exponent"] == \
        pytest.approx(2.0)
    assert list(pd.read_csv(tmp_path / "profile.csv").columns) == report.COLUMNS


def test_steady_and_single_call_profiles_say_which_they_are(tmp_path):
    frame = report.write(rows([1.1, 1.2, 1.3], device="cuda:0"), tmp_path / "steady", 256, "t")
    text = (tmp_path / "steady" / "profile.md").read_text()
    assert report.unsteady(frame).empty and "Warning" not in text and "Measured on a CPU" not in text
    assert pd.read_csv(tmp_path / "steady" / "exponents.csv")["timing"].tolist() == ["steady"]
    report.write(rows([None, None, None], repeats=1), tmp_path / "once", 256, "t")
    text = (tmp_path / "once" / "profile.md").read_text()
    assert "Each time was measured once, so how steady the machine was is unknown: raise `repeats`" in text
    assert pd.read_csv(tmp_path / "once" / "exponents.csv")["timing"].tolist() == ["measured once"]
