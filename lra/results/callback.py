"""A Hydra callback that prints and saves the comparison table at the end of every multirun, and counts
its failed and unfinished runs for ``lra-train``'s exit status (:data:`ENDED_SWEEPS`)."""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

# (failed runs, unfinished runs, runs, the sweep's table.md) of each multirun this process ended: lra-train exits
# 1 when the last one has a run that failed or did not finish (its jobs all ran: one failure never stops a sweep).
# A run neither completed nor failed once every job has run is one this sweep could not finish: another process
# holds its folder (its record says running), or its resume failed (it still says interrupted).
ENDED_SWEEPS: list = []


def resumed_runs(config) -> list:
    """The run folders a sweep's ``resume=`` override names (``-m resume=A,B``: each job resumes a run where it
    lies, outside the sweep's folder), as Hydra parses them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OmegaConf.select(config, "hydra.overrides.task", default=None) or []
    try:
        parsed = OverridesParser.create().parse_overrides([str(override) for override in overrides])
    except Exception:  # the sweep ran its jobs: its overrides parsed then; nothing to add if they do not now
        return []
    folders = []
    for override in parsed:
        if override.key_or_group == "resume":
            values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
            folders += [Path(str(value)) for value in values if value not in (None, "")]
    return [folder for folder in folders if folder.is_dir()]


class ComparisonTableCallback(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        from lra.io import atomic_write_text
        from lra.results.formats import note
        from lra.results.reading import read_runs
        from lra.results.rows import FINISHED
        from lra.results.table import render_records  # pandas: only when a sweep has ended

        sweep_dir = Path(config.hydra.sweep.dir)
        # A sweep over other settings than the seed gives each setup its own row (lra.results.setups).
        # Its runs are read as lra-table reads them: a job without a record is counted failed.
        records, unplaced = read_runs([sweep_dir, *resumed_runs(config)], note)
        text = render_records(records, note, unplaced)
        failed = sum(record["status"] == "failed" for record in records) + len(unplaced)
        unfinished = sum(record["status"] not in FINISHED for record in records)
        ENDED_SWEEPS.append((failed, unfinished, len(records) + len(unplaced), sweep_dir / "table.md"))
        print(f"\nTest accuracy (%), mean ± std (seeds) — {sweep_dir}\n\n{text}\n", flush=True)
        atomic_write_text(sweep_dir / "table.md", text + "\n")
