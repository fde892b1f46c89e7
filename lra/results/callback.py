"""A Hydra callback that prints and saves the comparison table at the end of every multirun, and counts
its failed runs for ``lra-train``'s exit status (:data:`ENDED_SWEEPS`)."""

from __future__ import annotations

from pathlib import Path
from typing import List

from hydra.experimental.callback import Callback

# (failed runs, runs, the sweep's table.md) of each multirun this process ended: lra-train exits 1 when the
# last one has a failed run (its jobs all ran: one failure never stops a sweep).
ENDED_SWEEPS: list = []


def unrecorded_jobs(sweep_dir: Path) -> List[Path]:
    """The job folders of a sweep that hold no record: jobs that failed before they could write one (on a
    full disk, say; lra-train records every other failure). A job folder is one Hydra made for a job (its
    hydra.sweep.subdir, any depth): empty, or holding a job's train.log, lock or config files; a folder
    with a record is a run, and neither it nor what it holds is looked into again."""
    from lra.records import METRICS
    from lra.run import HYDRA_FILES, LOCK, LOG

    job_files = {LOG, LOCK, HYDRA_FILES}  # what a job writes into its folder before its record
    found: List[Path] = []

    def visit(folder: Path, depth: int) -> None:
        try:
            entries = [entry for entry in folder.iterdir() if not entry.name.startswith(".") or entry.name in job_files]
        except OSError:
            return
        names = {entry.name for entry in entries}
        if METRICS in names:
            return
        if depth > 0 and (not entries or names & job_files):
            found.append(folder)
            return
        for entry in sorted(entries):
            if entry.is_dir() and not entry.name.startswith(".") and depth < 4:
                visit(entry, depth + 1)

    visit(sweep_dir, 0)
    return found


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
        unrecorded = unrecorded_jobs(sweep_dir)
        if unrecorded:
            text += (f"\njobs that failed before writing their record: {len(unrecorded)} (the console and the folder's "
                     f"train.log say why): {', '.join(str(path.relative_to(sweep_dir)) for path in unrecorded)}")
        failed = sum(record["status"] == "failed" for record in records) + len(unrecorded)
        ENDED_SWEEPS.append((failed, len(records) + len(unrecorded), sweep_dir / "table.md"))
        print(f"\nTest accuracy (%), mean ± std (seeds) — {sweep_dir}\n\n{text}\n", flush=True)
        atomic_write_text(sweep_dir / "table.md", text + "\n")
