"""From ``lra-fidelity`` rows to files: a CSV per section, JSON of everything, plots, and Markdown
tables (mean ± std over seeds for random inputs; one column per captured layer)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List

import numpy as np
import pandas as pd

from lra.io import atomic_write_text, save_figure

COLUMNS = {
    "backends": ["input", "n", "seed", "backend", "label", "relative_error", "mean_angle", "keys_per_query",
                 "uncovered_queries", "utility", "utility_ceiling", "oblivious_error_at_budget", "query_max_over_mean", "key_max_over_mean",
                 "skewed_bucket_share", "error"],
    "oracles": ["input", "n", "seed", "oracle", "r", "relative_error", "mean_angle", "max_support"],
    "yoso": ["input", "n", "seed", "m", "tau", "relative_error", "mean_angle"],
}


SECTIONS = tuple(COLUMNS)
MEASURES = ("relative_error", "mean_angle", "keys_per_query", "uncovered_queries", "utility", "utility_ceiling",
            "oblivious_error_at_budget", "query_max_over_mean", "key_max_over_mean", "skewed_bucket_share")
NON_FINITE = "non-finite"  # a cell with a NaN or ±∞ among its values: measured, and failed
FAILED = "failed"  # a cell with a measurement that raised (its row's ``error`` says why): not measured


def output_names() -> List[str]:
    """Every file a run writes into its folder: a new run into the same folder removes them first, so
    that the folder's files always describe one run."""
    per_section = [f"fidelity_{section}.{ext}" for section in SECTIONS for ext in ("csv", "png")]
    return ["fidelity.md", "fidelity.json", "fidelity_config.yaml", *per_section]


def remove_outputs(out_dir: Path) -> None:
    for name in output_names():
        (out_dir / name).unlink(missing_ok=True)


def _describe(section: str, row: dict) -> str:
    what = {"backends": f"{row.get('label')}", "oracles": f"{row.get('oracle')}-{row.get('r')}",
            "yoso": f"YOSO-{row.get('m')}"}[section]
    seed = "" if row.get("seed") is None else f", seed {row.get('seed')}"
    return f"{section}: {what} on {row['input']} n={row['n']}{seed}"


def non_finite(rows: Dict[str, List[dict]]) -> List[str]:
    """The measurements (one phrase each) with a NaN or ±∞ among their values."""
    return [_describe(section, row) for section, section_rows in rows.items() for row in section_rows
            if any(isinstance(row.get(m), float) and not math.isfinite(row[m]) for m in MEASURES)]


def failures(rows: Dict[str, List[dict]]) -> List[str]:
    """The measurements that raised, one phrase each with its error line."""
    return [f"{_describe(section, row)}: {row['error']}" for section, section_rows in rows.items()
            for row in section_rows if row.get("error")]


def frames(rows: Dict[str, List[dict]]) -> Dict[str, pd.DataFrame]:
    return {section: pd.DataFrame(rows[section]).reindex(columns=COLUMNS[section])
            for section in COLUMNS if rows.get(section)}


def _setting(frame: pd.DataFrame) -> pd.Series:
    """A column name per set of inputs: "random n=1024", or the captured layer."""
    return np.where(frame["input"] == "random", "random n=" + frame["n"].astype(str), frame["input"])


def _mean_std(values: pd.Series, digits: int = 3) -> str:
    if values.empty:
        return "—"
    if not np.isfinite(values.to_numpy(dtype=float)).all():
        return NON_FINITE
    if len(values) == 1:
        return f"{values.iloc[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std(ddof=1):.{digits}f}"


def _measured_cells(backends: pd.DataFrame) -> pd.DataFrame:
    """The backends' rows with their set of inputs (``setting``), less every (backend, inputs) cell in which a
    measurement raised: a mean over the seeds that did not would pass for the cell's."""
    frame = backends.assign(setting=_setting(backends))
    failed = frame[frame["error"].notna()] if "error" in frame else frame.iloc[:0]
    cells = pd.MultiIndex.from_frame(frame[["label", "setting"]])
    return frame[~cells.isin(pd.MultiIndex.from_frame(failed[["label", "setting"]]))]


def _pivot(frame: pd.DataFrame, index: str, value: str, digits: int = 3) -> pd.DataFrame:
    """``value`` per ``index`` (rows) and set of inputs (columns); a cell with a measurement that raised
    reads "failed" (a mean over the seeds that did not would pass for the whole cell)."""
    frame = frame.assign(setting=_setting(frame))
    settings = list(dict.fromkeys(frame["setting"]))
    failed = frame["error"].notna() if "error" in frame else pd.Series(False, index=frame.index)
    cells = frame.assign(failed=failed).groupby([index, "setting"], sort=False)
    table = cells[value].apply(lambda s: _mean_std(s, digits)).where(~cells["failed"].any(), FAILED).unstack()
    return table.reindex(columns=settings).fillna("—")


def yoso_trend(frame: pd.DataFrame) -> pd.DataFrame:
    """Random inputs, per m: the mean angle's increase per doubling of n (a line in log2 n grows
    logarithmically) and the curvature of a quadratic fit in log2 n (≤ 0: at most logarithmic);
    and whether the mean angle falls with m at every n."""
    random = frame[frame["input"] == "random"]
    # numpy's mean, not pandas': a NaN seed makes its cell NaN rather than vanish from the mean
    means = random.groupby(["m", "n"])["mean_angle"].agg(lambda s: s.to_numpy(dtype=float).mean()).unstack()
    rows = []
    for m, series in means.iterrows():
        x, y = np.log2(series.index.to_numpy(dtype=float)), series.to_numpy(dtype=float)
        fits = np.isfinite(y).all()
        curvature = float(np.polyfit(x, y, 2)[0]) if len(x) >= 3 and fits else math.nan
        rows.append({"m": m, "per_doubling": float(np.polyfit(x, y, 1)[0]) if len(x) >= 2 and fits else math.nan,
                     "curvature": curvature, "angle_at_smallest_n": float(y[0]), "angle_at_largest_n": float(y[-1])})
    trend = pd.DataFrame(rows)
    finite = bool(np.isfinite(means.to_numpy(dtype=float)).all())
    monotone = bool((means.diff().iloc[1:] <= 0).all().all()) if len(means) > 1 and finite else None
    trend.attrs["monotone_in_m"] = monotone  # None: not measured
    if len(means) < 2:
        verdict = f"not measured: it needs at least two hash counts, and yoso_hashes gives {len(means)}"
    elif not finite:
        verdict = "not measured: some mean angles came out non-finite (NaN or ∞)"
    else:
        verdict = "yes" if monotone else "no"
    trend.attrs["verdict"] = verdict
    return trend


def markdown(tables: Dict[str, pd.DataFrame], title: str, notes: Dict[str, str] = None) -> str:
    """The report; ``notes``: a sentence per section, said under its heading (budgets skipped, …)."""
    notes = notes or {}
    parts = [f"# {title}"]
    if "backends" in tables:
        backends = tables["backends"]
        parts.append("## Each backend against exact softmax\n\nmean ± std over seeds\n\n**mean row angle (radians)**\n\n"
                     + _pivot(backends, "label", "mean_angle").to_markdown()
                     + "\n\n**relative error ‖Ô − O‖_F / ‖O‖_F**\n\n" + _pivot(backends, "label", "relative_error").to_markdown())
        sparse = _measured_cells(backends).dropna(subset=["keys_per_query"])
        if not sparse.empty:
            columns = ["keys_per_query", "uncovered_queries", "utility", "utility_ceiling", "relative_error", "oblivious_error_at_budget",
                       "query_max_over_mean", "key_max_over_mean", "skewed_bucket_share"]
            summary = sparse.groupby(["setting", "label"], sort=False)[columns].mean().round(3).reset_index()
            parts.append("## Sparse backends: budget, attention utility, the value-oblivious floor, bucket balance\n\n"
                         "keys per query is the budget r; uncovered = share of real queries with no key; "
                         "utility = mean attention mass on the attended keys, "
                         "ceiling = that of the top-r keys; oblivious error = optimal-v-oblivious-r's relative "
                         "error; bucket counts per bucket, max/mean, and the share of buckets whose query:key "
                         "ratio is beyond 2:1 (means over seeds). Reformer's utility is of its own shared-QK attention, "
                         "LHA's of its attention on LayerNorm'd q and k.\n\n"
                         + summary.rename(columns={"setting": "inputs", "label": "backend"}).to_markdown(index=False))
        failed = backends[backends["error"].notna()]
        if not failed.empty:
            lines = [f"- {row.label} on {'random n=' + str(row.n) if row.input == 'random' else row.input}"
                     + ("" if pd.isna(row.seed) else f", seed {int(row.seed)}") + f": {row.error}"
                     for row in failed.itertuples()]
            parts.append("## Measurements that failed\n\nThe other backends were measured; each line is the "
                         "error of one:\n\n" + "\n".join(lines))
    if "oracles" in tables:
        oracles = tables["oracles"].assign(oracle=lambda f: np.where(
            f["max_support"].notna(), "v-aware-(d+1)", f["oracle"] + "-" + f["r"].astype(str)))
        parts.append("## Value-aware oracles (relative error)\n\nv-oblivious-r keeps each query's r largest weights; "
                     "v-aware-1 is the nearest single value; v-aware-(d+1) is Carathéodory's reduction of the exact "
                     "weights to d + 1 values (sampled queries)"
                     + (f"\n\n{notes['oracles']}" if notes.get("oracles") else "")
                     + "\n\n" + _pivot(oracles, "oracle", "relative_error", digits=4).to_markdown())
    if "yoso" in tables:
        yoso = tables["yoso"]
        text = ["## YOSO-m against YOSO-E (the YOSO paper's Figure 8)\n\nmean row angle in radians, same τ, mean ± std "
                "over seeds\n\n" + _pivot(yoso, "m", "mean_angle").to_markdown()]
        if (yoso["input"] == "random").any():
            trend = yoso_trend(yoso)
            text.append(f"Mean angle falls as m grows at every n: **{trend.attrs['verdict']}**. "
                        "Growth with n on random inputs (a straight line in log2 n is logarithmic growth; "
                        "curvature ≤ 0 means at most logarithmic):\n\n" + trend.round(4).to_markdown(index=False))
        parts.append("\n\n".join(text))
    return "\n\n".join(parts) + "\n"


def plot(tables: Dict[str, pd.DataFrame], out_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "yoso" in tables:
        random = tables["yoso"][tables["yoso"]["input"] == "random"]
        stats = random.groupby(["m", "n"])["mean_angle"].agg(["mean", "std"]).reset_index()
        figure, (by_n, by_m) = plt.subplots(1, 2, figsize=(11, 4.2))
        for m, group in stats.groupby("m"):
            by_n.errorbar(group["n"], group["mean"], yerr=group["std"].fillna(0), marker="o", capsize=3, label=f"m = {m}")
        for n, group in stats.groupby("n"):
            by_m.errorbar(group["m"], group["mean"], yerr=group["std"].fillna(0), marker="o", capsize=3, label=f"n = {n}")
        by_n.set(xlabel="sequence length n", ylabel="mean angle to YOSO-E (rad)", title="YOSO-m vs YOSO-E against n")
        by_m.set(xlabel="hashes m", ylabel="mean angle to YOSO-E (rad)", title="YOSO-m vs YOSO-E against m")
        for axis, ticks in ((by_n, sorted(stats["n"].unique())), (by_m, sorted(stats["m"].unique()))):
            axis.set_xscale("log", base=2)
            axis.set_xticks(ticks, [str(t) for t in ticks])
            axis.legend(fontsize=7)
            axis.grid(alpha=0.3)
        save_figure(figure, out_dir / "fidelity_yoso.png")
    measured = _measured_cells(tables["backends"]) if "backends" in tables else pd.DataFrame()
    if not measured.empty:  # (with every backend failed there is no bar to draw)
        means = measured.groupby(["label", "setting"], sort=False)["mean_angle"].mean().unstack()
        figure, axis = plt.subplots(figsize=(9, 0.45 * len(means) + 1.5))
        means.plot.barh(ax=axis, width=0.8)
        axis.axvline(math.pi / 2, color="grey", linestyle=":", linewidth=1)
        axis.text(math.pi / 2, -0.6, " π/2: orthogonal", fontsize=7, color="grey", va="bottom")
        axis.set(xlabel="mean angle to exact softmax (rad)", ylabel="", title="each backend against exact softmax")
        axis.invert_yaxis()
        axis.grid(axis="x", alpha=0.3)
        axis.legend(fontsize=7)
        save_figure(figure, out_dir / "fidelity_backends.png")
    if "oracles" in tables:
        oracles = tables["oracles"].assign(setting=lambda f: _setting(f))
        settings = list(dict.fromkeys(oracles["setting"]))
        columns = min(2, len(settings))
        rows = math.ceil(len(settings) / columns)
        figure, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.4 * rows), squeeze=False)
        sparse = (_measured_cells(tables["backends"]).dropna(subset=["keys_per_query"])
                  if "backends" in tables else pd.DataFrame(columns=["setting", "label", "keys_per_query",
                                                                     "relative_error"]))  # sections=[oracles] alone
        floor = 1e-3  # errors below it (the exact limits, ~1e-15) are drawn on the floor
        # The oracles in black and grey; each backend one colour and marker in every panel, named in
        # one legend (annotations collided where backends keep similar numbers of keys).
        names = sorted(set(sparse["label"]))
        styles = {name: {"color": plt.get_cmap("tab10")(i % 10), "marker": "xv^<>DPs*"[i % 9]}
                  for i, name in enumerate(names)}
        for axis, setting in zip(axes.flat, settings):
            here = oracles[oracles["setting"] == setting]
            curve = here[here["oracle"] == "v-oblivious"].groupby("r")["relative_error"].mean()
            axis.plot(curve.index, curve.clip(lower=floor), marker="o", color="black", markersize=4,
                      label="optimal-v-oblivious-r")
            aware = here[here["oracle"] == "v-aware"].groupby("r")["relative_error"].mean()
            axis.plot(aware.index, aware.clip(lower=floor), marker="s", linestyle="none", color="0.55",
                      label=f"optimal-v-aware-r, r = 1 and r = d + 1 (< {floor:g} drawn at {floor:g})")
            points = sparse[sparse["setting"] == setting].groupby("label")[["keys_per_query", "relative_error"]].mean()
            for label, point in points.iterrows():
                axis.scatter(point["keys_per_query"], point["relative_error"], s=45, zorder=3, label=label,
                             **styles[label])
            axis.set(xscale="log", yscale="log", xlabel="keys per query r", ylabel="relative error", title=setting)
            axis.set_ylim(bottom=floor / 2)
            axis.grid(alpha=0.3)
        for axis in list(axes.flat)[len(settings):]:
            axis.set_visible(False)
        handles = {}
        for axis in axes.flat:
            handles.update(zip(*reversed(axis.get_legend_handles_labels())))
        figure.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)),
                      fontsize=8, frameon=False)
        legend_rows = math.ceil(len(handles) / 4)
        save_figure(figure, out_dir / "fidelity_oracles.png", rect=(0, 0.045 * legend_rows / rows + 0.02, 1, 1))


def _spelled(value):
    """A measurement that came out NaN or ±∞ as the text "nan", "inf" or "-inf" in the CSV and JSON,
    where an empty cell or null means a measure that does not apply to the row."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def write(rows: Dict[str, List[dict]], out_dir: Path, title: str, notes: Dict[str, str] = None) -> Dict[str, pd.DataFrame]:
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = frames(rows)
    records = {section: [{c: _spelled(row.get(c)) for c in COLUMNS[section]} for row in rows[section]]
               for section in tables}
    for section in tables:
        atomic_write_text(out_dir / f"fidelity_{section}.csv", pd.DataFrame(records[section]).to_csv(index=False))
    atomic_write_text(out_dir / "fidelity.json", json.dumps(records, indent=1, allow_nan=False))
    atomic_write_text(out_dir / "fidelity.md", markdown(tables, title, notes or {}))
    plot(tables, out_dir)
    return tables
