"""The LRA paper's Figure 3 from run records: accuracy against training speed, bubble area = peak
memory, one bubble per row (one setup), with the accuracy's standard deviation over seeds as an error
bar; the YOSO paper's numbers (its Table 3 accuracy with its Table 4 attention-module cost, measured on a
GPU) as a faint layer behind them.

Speed and memory are relative to the Softmax row of each row's own setup, measured on the same kind of
device (× its training tokens/s, × its peak memory), so that our runs and the paper's, measured on
different machines, share the axes; without such a Softmax row they are absolute and the paper layer is
left out. Runs measured on a CPU say so on the axes and in the title: their speed is wall-clock time on a
shared machine and their memory the process's peak, not the attention module's cost on a GPU that the
paper's points are.
"""

from __future__ import annotations

import math
from importlib import resources
from io import StringIO
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

from lra.io import atomic_write
from lra.results.efficiency import CPU, MIXED, on_pytorch_path
from lra.results.formats import visible
from lra.results.reference import load_reference
from lra.results.validity import AVERAGE

PAPER_EFFICIENCY = "yoso_iclr_table4_attention_efficiency.csv"
PAPER_SEQ_LEN = 4096  # the LRA figure's speed and memory are at 4K tokens
BASELINE = "Softmax"


def our_points(summary: pd.DataFrame, task: Optional[str]) -> pd.DataFrame:
    """One row per table row: accuracy (the task's mean, or the average over every task when ``task`` is
    None, only for rows with all of them) and its std over seeds (NaN with one seed; for the average, the
    tasks' stds combined as for a mean of independent numbers), tokens/s, peak MB, device and the Softmax
    row of its setup on ``speed_task``."""
    tasks = sorted(set(summary["task"]))
    done = summary[summary["seeds"] > 0]
    accuracy = done.pivot(index="backend", columns="task", values="mean")
    spread = done.pivot(index="backend", columns="task", values="std")
    if task is None:
        accuracy = accuracy.reindex(columns=tasks).dropna()
        spread = spread.reindex(index=accuracy.index, columns=tasks)
        std = (spread ** 2).sum(axis=1, min_count=len(tasks)) ** 0.5 / len(tasks)
        accuracy = accuracy.mean(axis=1)
        speed_task = tasks[0]
    else:
        accuracy = accuracy[task].dropna() if task in accuracy.columns else pd.Series(dtype=float)
        std = spread[task].reindex(accuracy.index) if task in spread.columns else pd.Series(dtype=float)
        speed_task = task
    columns = ["tokens_per_s", "peak_memory_mb", "device", "engine", "softmax_row"]
    cost = done[done["task"] == speed_task].set_index("backend").reindex(columns=columns)
    points = pd.DataFrame({"accuracy": accuracy, "accuracy_std": std}).join(cost, how="inner")
    points = points.dropna(subset=["accuracy", "tokens_per_s", "peak_memory_mb"])
    points.attrs["speed_task"] = speed_task
    return points


def relative(points: pd.DataFrame) -> Optional[pd.DataFrame]:
    """``points`` with ``speed`` and ``memory`` relative to the Softmax row of each row's setup measured on the
    same kind of device, the rows without one left out; None when no row has one."""
    baselines = [b if isinstance(b, str) and b in points.index and points.loc[b, "device"] == device else None
                 for b, device in zip(points["softmax_row"], points["device"])]
    if not any(baselines):
        return None
    kept = points[[b is not None for b in baselines]].copy()
    base = points.loc[[b for b in baselines if b is not None]]
    kept["speed"] = kept["tokens_per_s"].to_numpy() / base["tokens_per_s"].to_numpy()
    kept["memory"] = kept["peak_memory_mb"].to_numpy() / base["peak_memory_mb"].to_numpy()
    kept.attrs = dict(points.attrs)
    return kept


def paper_points(task: Optional[str]) -> pd.DataFrame:
    """The YOSO paper's backends with both an accuracy (Table 3, the task's column or the average) and
    an attention-module cost at 4K tokens (Table 4): speed = Softmax's forward+backward time ÷ the
    backend's, memory = its training peak ÷ Softmax's. A Table 3 name matches the Table 4 row of the
    same name, or the only row named ``<name>-<parameter>`` (Reformer → Reformer-2)."""
    accuracy = load_reference("yoso")
    column = AVERAGE if task is None else task
    if column not in accuracy.columns:
        return pd.DataFrame(columns=["accuracy", "speed", "memory"])
    text = resources.files("lra.results").joinpath("paper_numbers", PAPER_EFFICIENCY).read_text()
    cost = pd.read_csv(StringIO(text), comment="#")
    cost = cost[cost["seq_len"] == PAPER_SEQ_LEN].set_index("method")
    seconds = cost["forward_ms"] + cost["backward_ms"]
    rows = {}
    for name, value in accuracy[column].items():
        matches = [m for m in cost.index if m == name] or [m for m in cost.index if m.startswith(f"{name}-")]
        if len(matches) == 1 and not math.isnan(value):
            row = matches[0]
            rows[name] = {"accuracy": value, "speed": seconds[BASELINE] / seconds[row],
                          "memory": cost.loc[row, "training_peak_mb"] / cost.loc[BASELINE, "training_peak_mb"]}
    return pd.DataFrame.from_dict(rows, orient="index")


def plot(summary: pd.DataFrame, output: Path, task: Optional[str] = None,
         warn: Callable[[str], None] = lambda message: None) -> pd.DataFrame:
    """Write the chart to ``output`` (any format matplotlib knows by its suffix); returns our points (the chart's
    title and x label in their ``attrs``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = our_points(summary, task)
    left_out = sorted(set(summary["backend"]) - set(points.index))
    on_task = summary[(summary["task"] == points.attrs["speed_task"]) & (summary["seeds"] > 0)]
    unmeasured = sorted(set(on_task["backend"][on_task["tokens_per_s"].isna()]) & set(left_out))
    if unmeasured:  # no mean speed: its seeds ran on CPU and GPU, or on YOSO's kernels and its PyTorch path
        warn(f"not in the chart (its seeds' speed has no mean: efficiency cells say why): {', '.join(unmeasured)}")
    incomplete = [name for name in left_out if name not in unmeasured]
    if incomplete:
        warn(f"not in the chart (no completed run on every task it needs): {', '.join(incomplete)}")
    if points.empty:
        raise ValueError("no backend has completed runs to plot" + (f" on {task}" if task else " on every task"))
    drawn, speed_task = list(points.index), points.attrs["speed_task"]
    scaled = relative(points)
    is_relative = scaled is not None
    if not is_relative:
        points["speed"], points["memory"] = points["tokens_per_s"], points["peak_memory_mb"]
        warn(f"no {BASELINE} run of the rows' setups on {speed_task}: speed and memory are absolute and the "
             "paper's points are left out")
    elif len(points := scaled) < len(drawn):
        warn(f"not in the chart (no {BASELINE} run of its setup on {speed_task}, on the same kind of device, to "
             f"measure it against): {', '.join(name for name in drawn if name not in points.index)}")
    kinds = set(points["device"].dropna())
    on_cpu, mixed = bool(kinds & {CPU, MIXED}), len(kinds) > 1
    paper = paper_points(task) if is_relative else pd.DataFrame()
    scale = 900 / max([*points["memory"], *paper.get("memory", [])])  # the largest bubble: 900 pt²

    figure, axes = plt.subplots(figsize=(7.5, 5.5), dpi=150)
    labels = []  # (name, x, y, bubble area, style): placed after every bubble is drawn
    for name, row in paper.iterrows():
        axes.scatter(row["speed"], row["accuracy"], s=row["memory"] * scale, color="0.6", alpha=0.25,
                     edgecolors="0.5", linewidths=0.8, zorder=1)
        labels.append((name, row["speed"], row["accuracy"], row["memory"] * scale,
                       {"fontsize": 7, "color": "0.45", "style": "italic"}))
    colours = plt.get_cmap("tab10")(range(len(points)))
    for colour, (name, row) in zip(colours, points.sort_values("memory", ascending=False).iterrows()):
        axes.scatter(row["speed"], row["accuracy"], s=row["memory"] * scale, color=colour, alpha=0.75,
                     edgecolors="black", linewidths=0.6, zorder=2)
        if not math.isnan(row["accuracy_std"]):  # the std over seeds
            axes.errorbar(row["speed"], row["accuracy"], yerr=row["accuracy_std"], fmt="none", ecolor="black",
                          elinewidth=0.9, capsize=3, zorder=2.5)
        name += " (CPU)" if mixed and row["device"] == CPU else ""
        name += " (PyTorch path)" if on_pytorch_path(row["engine"]) else ""  # not YOSO's kernels
        labels.append((name, row["speed"], row["accuracy"], row["memory"] * scale, {"fontsize": 8}))
    axes.margins(0.15)
    where = "LRA average" if task is None else task
    axes.set_ylabel(visible(f"test accuracy (%), {where}; bars: ± std over seeds"), parse_math=False)
    device = (" (CPU runs: wall clock)" if mixed else " (CPU, wall clock)") if on_cpu else ""
    axes.set_xlabel(visible(f"training speed on {speed_task}{device}, × the {BASELINE} run of the same setup"
                            if is_relative else f"training tokens/s on {speed_task}{device}"), parse_math=False)
    memory = f"× {BASELINE}'s" if is_relative else "MB"
    title = f"Accuracy, speed and peak {'process ' if on_cpu and not mixed else ''}memory (bubble area, {memory})"
    if on_cpu:
        title += ("\ncoloured: these runs; marked (CPU): on a CPU (wall-clock speed, the process's peak memory)"
                  if mixed else "\ncoloured: these runs, on a CPU (wall-clock speed on a shared machine; the "
                  "process's peak memory)")
    if not paper.empty:
        title += (f"\ngrey: the YOSO paper on a GPU (Table 3 accuracy; Table 4 attention-module cost at "
                  f"n = {PAPER_SEQ_LEN:,})")
    axes.set_title(title, fontsize=9)
    points.attrs.update(title=title, xlabel=axes.get_xlabel(), labels=[label[0] for label in labels])
    axes.grid(alpha=0.3)
    figure.tight_layout()
    axes.set_xlim(axes.get_xlim())  # fixed before the labels are placed in display coordinates
    axes.set_ylim(axes.get_ylim())
    figure.canvas.draw()
    _place_labels(figure, axes, labels)
    try:  # atomic: a full disk or a signal leaves no half-written chart, and an older one whole
        atomic_write(output, lambda handle: figure.savefig(handle, format=Path(output).suffix[1:] or "png"), mode="wb")
    finally:
        plt.close(figure)
    return points


def _place_labels(figure, axes, labels) -> None:
    """Each label beside its bubble (right, left, above, below, then farther out), at the first place
    where it covers no other bubble and no label already placed."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    renderer = figure.canvas.get_renderer()
    points_to_pixels = figure.dpi / 72
    bubbles = []
    for _, x, y, area, _ in labels:
        cx, cy = axes.transData.transform((x, y))
        r = math.sqrt(area / math.pi) * points_to_pixels
        bubbles.append(Bbox([[cx - r, cy - r], [cx + r, cy + r]]))
    placed = []
    # A thin line from each label to its bubble's centre (marked with a dot): bubbles may nest.
    leader = {"arrowstyle": "-", "color": "0.55", "linewidth": 0.5, "shrinkA": 1, "shrinkB": 0}
    for index, (name, x, y, area, style) in enumerate(labels):
        axes.scatter([x], [y], s=3, color=style.get("color", "black"), zorder=3)
        obstacles = placed + [b for i, b in enumerate(bubbles) if i != index]
        gap = math.sqrt(area / math.pi) + 3  # the bubble's radius in points, plus a little
        offsets = [(gap, 0, "left", "center"), (-gap, 0, "right", "center"), (0, gap, "center", "bottom"),
                   (0, -gap, "center", "top")]
        offsets += [(dx + math.copysign(12, dx) if dx else 0, dy + math.copysign(12, dy) if dy else 0, ha, va)
                    for dx, dy, ha, va in offsets]
        for dx, dy, ha, va in offsets:
            text = axes.annotate(visible(name), (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                 zorder=3, arrowprops=leader, parse_math=False, **style)
            text.update_positions(renderer)
            box = Text.get_window_extent(text, renderer)  # the words only, not the leader line
            if not any(box.overlaps(other) for other in obstacles):
                break
            text.remove()
        else:  # nowhere free: the first place, as it was
            dx, dy, ha, va = offsets[0]
            text = axes.annotate(visible(name), (x, y), xytext=(dx, dy), textcoords="offset points", ha=ha, va=va,
                                 zorder=3, arrowprops=leader, parse_math=False, **style)
        text.update_positions(renderer)
        placed.append(Text.get_window_extent(text, renderer))
