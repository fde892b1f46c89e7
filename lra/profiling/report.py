"""From ``lra-profile`` rows to files: CSV and JSON of every cell, log-log plots of time and memory
against n with each backend's fitted scaling exponent, and a Markdown table shaped like the YOSO
paper's attention-module table (forward / backward ms; backward cache / training / inference MB).

Each time is the median of the cell's repeats; a cell whose repeats spread more than
:data:`lra.profiling.measure.UNSTEADY` (slowest ÷ fastest) is listed as unsteady, and so is an exponent
fitted over one, since a busy machine bends a curve (a negative time exponent on a shared CPU)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List

import numpy as np
import pandas as pd

from lra.io import atomic_write_text, save_figure
from lra.profiling.measure import UNSTEADY

COLUMNS = ["backend", "label", "n", "batch", "device", "forward_ms", "backward_ms", "step_ms", "inference_ms",
           "backward_cache_mb", "training_peak_mb", "inference_peak_mb", "repeats", "step_spread", "inference_spread",
           "error"]
SPREADS = ("step_spread", "inference_spread")


def fit_exponent(lengths, values) -> float:
    """The slope of log(value) against log(n): value ∝ n^slope (NaN with fewer than 2 points)."""
    points = [(math.log(n), math.log(v)) for n, v in zip(lengths, values) if v and v > 0 and not math.isnan(v)]
    if len(points) < 2:
        return math.nan
    x, y = np.array(points).T
    return float(np.polyfit(x, y, 1)[0])


def exponents(frame: pd.DataFrame, min_length: int) -> pd.DataFrame:
    """Per backend, the fitted exponents of step time and training peak memory over n ≥ min_length."""
    rows = []
    for label, group in frame[frame["error"].isna()].groupby("label", sort=False):
        fit = group[group["n"] >= min_length].sort_values("n")
        spread = fit["step_spread"].max()
        rows.append({"label": label, "time_exponent": fit_exponent(fit["n"], fit["step_ms"]),
                     "memory_exponent": fit_exponent(fit["n"], fit["training_peak_mb"]),
                     "fit_lengths": ",".join(str(n) for n in fit["n"]),
                     "timing": "unsteady" if spread > UNSTEADY else "steady" if spread == spread else "measured once"})
    return pd.DataFrame(rows)


def unsteady(frame: pd.DataFrame) -> pd.DataFrame:
    """The measured cells whose repeated step or inference times spread more than :data:`UNSTEADY`."""
    done = frame[frame["error"].isna()]
    return done[(done[list(SPREADS)].apply(pd.to_numeric, errors="coerce") > UNSTEADY).any(axis=1)]


def timing_notes(frame: pd.DataFrame) -> str:
    """How the times were taken and how steady they were, for profile.md and the console."""
    done = frame[frame["error"].isna()]
    repeats = sorted({int(r) for r in done["repeats"].dropna()})
    lines = []
    if repeats == [1] or not repeats:
        lines.append("Each time was measured once, so how steady the machine was is unknown: raise `repeats` (3 or "
                     "more) for times to trust.")
    else:
        lines.append(f"Each time is the median of {'/'.join(map(str, repeats))} calls after a warm-up; a cell is "
                     f"unsteady when its slowest call took over {UNSTEADY:g}× its fastest.")
    devices = set(done["device"].dropna().astype(str))
    if any(device.startswith("cpu") for device in devices):
        lines.append("Measured on a CPU: times are wall-clock on a machine shared with whatever else ran (not a GPU's "
                     "kernel times); memory is what torch's tensors hold (the CPU allocator's events), not the "
                     "process's peak.")
    shaky = unsteady(frame)
    if len(shaky):
        cells = ", ".join(f"{row['label']} at n = {int(row['n'])} ({_worst(row):.1f}×)" for _, row in shaky.iterrows())
        lines.append(f"**Warning: unsteady timings** (the machine was busy; rerun on a quiet machine or raise "
                     f"`repeats`), and the exponents fitted over them: {cells}.")
    return "\n\n".join(lines)


def _worst(row) -> float:
    return max(float(row[column]) for column in SPREADS if row[column] == row[column])


def growth_table(frame: pd.DataFrame) -> str:
    """Per backend, how much its training step's time and peak memory grow each time n doubles
    (``time× / memory×`` from n/2 to n): about 2× for a linear method, 4× for a quadratic one."""
    done = frame[frame["error"].isna()]
    lengths = sorted(done["n"].unique())
    steps = [(a, b) for a, b in zip(lengths, lengths[1:]) if b == 2 * a]
    if not steps:
        return "(no two complete lengths a doubling apart)"
    table = pd.DataFrame("—", index=list(dict.fromkeys(frame["label"])), columns=[f"{a} → {b}" for a, b in steps])
    for label, group in done.groupby("label", sort=False):
        by_n = group.set_index("n")
        for a, b in steps:
            if a in by_n.index and b in by_n.index:
                time = by_n.loc[b, "step_ms"] / by_n.loc[a, "step_ms"]
                memory = by_n.loc[b, "training_peak_mb"] / by_n.loc[a, "training_peak_mb"]
                table.loc[label, f"{a} → {b}"] = f"{time:.2f}× / {memory:.2f}×"
    return ("**growth per doubling of n, training step time× / training peak memory×**\n\n"
            + table.rename_axis("backend").to_markdown())


def paper_table(frame: pd.DataFrame) -> str:
    """Rows: backends; per n: ``fwd / bwd`` ms and ``cache / train / test`` MB; OOM cells marked."""
    def cell(row, kind) -> str:
        if isinstance(row["error"], str):
            return "OOM" if "memory" in row["error"] else "error"
        if kind == "time":
            return f"{row['forward_ms']:.2f} / {row['backward_ms']:.2f}"
        return f"{row['backward_cache_mb']:.1f} / {row['training_peak_mb']:.1f} / {row['inference_peak_mb']:.1f}"

    labels = list(dict.fromkeys(frame["label"]))
    lengths = sorted(frame["n"].unique())
    parts = []
    for kind, title in (("time", "time per instance, forward / backward (ms)"),
                        ("memory", "memory per instance, backward cache / training peak / inference peak (MB)")):
        table = pd.DataFrame("—", index=labels, columns=[str(n) for n in lengths])
        for _, row in frame.iterrows():
            table.loc[row["label"], str(row["n"])] = cell(row, kind)
        parts.append(f"**{title}**\n\n" + table.rename_axis("backend").to_markdown())
    return "\n\n".join(parts)


def plot(frame: pd.DataFrame, fits: pd.DataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    exponent = fits.set_index("label") if not fits.empty else pd.DataFrame()
    colours = {}  # a backend's line colour, for its failure marks
    for label, group in frame[frame["error"].isna()].groupby("label", sort=False):
        group = group.sort_values("n")
        for axis, column, fit in ((axes[0], "step_ms", "time_exponent"), (axes[1], "training_peak_mb", "memory_exponent")):
            slope = exponent.loc[label, fit] if label in exponent.index else math.nan
            name = f"{label} (n^{slope:.2f})" if not math.isnan(slope) else label
            (line,) = axis.plot(group["n"], group[column].clip(lower=1e-3), marker="o", label=name,
                                color=colours.get(label))
            colours[label] = line.get_color()
            if column == "step_ms":  # an unsteady time: ringed
                shaky = group[group["step_spread"] > UNSTEADY]
                axis.scatter(shaky["n"], shaky[column].clip(lower=1e-3), s=160, facecolors="none",
                             edgecolors=line.get_color(), linewidths=1.2, zorder=3)
    for axis, ylabel in ((axes[0], "training step per instance (ms)"), (axes[1], "training peak per instance (MB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        # A cell that failed (out of memory, or another error) is marked at the top of the plot, in the
        # backend's colour, where its curve stops.
        top = axis.get_ylim()[1]
        for _, row in frame[frame["error"].notna()].iterrows():
            what = "OOM" if "memory" in str(row["error"]) else "error"
            colour = colours.get(row["label"], "black")
            axis.scatter([row["n"]], [top], marker="X", s=60, color=colour, zorder=3, clip_on=False)
            axis.annotate(f"{row['label']}: {what}", (row["n"], top), xytext=(0, -10), textcoords="offset points",
                          ha="center", va="top", fontsize=7, color=colour)
        axis.set_ylim(top=top)
        axis.legend(fontsize=7, loc="upper left")  # failure marks are at the top right, where n is largest
        axis.set_xlabel("sequence length n")
        axis.set_ylabel(ylabel)
        axis.grid(True, which="both", alpha=0.3)
    if len(unsteady(frame)):
        title += f"\nringed: unsteady times (slowest of the repeats over {UNSTEADY:g}× the fastest): not to be trusted"
    figure.suptitle(title, fontsize=10)
    save_figure(figure, path)


def write(rows: List[Dict], out_dir: Path, min_length: int, title: str) -> pd.DataFrame:
    """Write ``profile.csv``, ``profile.json``, ``exponents.csv``, ``profile.md`` and ``profile.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    for column in ("repeats", *SPREADS):  # None (one call: no spread) is NaN
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    known = frame.dropna(subset=["label"]).groupby("backend")["label"].first()
    frame["label"] = frame["label"].fillna(frame["backend"].map(known)).fillna(frame["backend"])
    fits = exponents(frame, min_length)
    atomic_write_text(out_dir / "profile.csv", frame.to_csv(index=False))
    atomic_write_text(out_dir / "profile.json", frame.astype(object).where(frame.notna(), None)
                      .to_json(orient="records", indent=1))
    atomic_write_text(out_dir / "exponents.csv", fits.to_csv(index=False))
    fitted = fits.round(2).to_markdown(index=False) if not fits.empty else "(no complete cells)"
    atomic_write_text(out_dir / "profile.md", f"# {title}\n\n{timing_notes(frame)}\n\n{paper_table(frame)}\n\n"
                                              f"{growth_table(frame)}\n\n"
                                              f"**fitted exponents over n ≥ {min_length}**\n\n{fitted}\n")
    plot(frame, fits, out_dir / "profile.png", title)
    return frame
