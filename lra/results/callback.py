"""A Hydra callback that prints and saves the comparison table at the end of every multirun, and counts
its failed runs for ``lra-train``'s exit status (:data:`ENDED_SWEEPS`)."""

from __future__ import annotations

from pathlib import Path

from hydra.experimental.callback import Callback

# (failed runs, runs, the sweep's table.md) of each multirun this process ended: lra-train exits 1 when the
# last one has a failed run (its jobs all ran: one failure never stops a sweep).
ENDED_SWEEPS: list = []


class ComparisonTableCallback(Callback):
    def on_multirun_end(self, config, **kwargs) -> None:
        from lra.io import atomic_write_text
        from lra.results.formats import note
        from lra.results.reading import read_records, record_files
        from lra.results.table import render_records  # pandas: only when a sweep has ended

        sweep_dir = Path(config.hydra.sweep.dir)
        # A sweep over other settings than the seed gives each setup its own row (lra.results.setups).
        # Its records are read as lra-table reads them.
        records = read_records(record_files([sweep_dir], note), note)
        text = render_records(records, note)
        atomic_write_text(sweep_dir / "table.md", text + "\n")
        print(f"\nTest accuracy (%), mean ± std (seeds) — {sweep_dir}\n\n{text}\n", flush=True)
        failed = sum(record["status"] == "failed" for record in records)
        ENDED_SWEEPS.append((failed, len(records), sweep_dir / "table.md"))
