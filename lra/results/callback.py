"""A Hydra callback that prints and saves the comparison table at the end of every multirun, and counts
its failed runs for ``lra-train``'s exit status (:data:`ENDED_SWEEPS`)."""

from __future__ import annotations

from pathlib import Path
from typing import List

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

# (failed runs, runs, the sweep's table.md) of each multirun this process ended: lra-train exits 1 when the
# last one has a failed run (its jobs all ran: one failure never stops a sweep).
ENDED_SWEEPS: list = []


def unrecorded_jobs(sweep_dir: Path, depth: int) -> List[Path]:
    """The job folders of a sweep that hold no record: jobs that failed before they could write one (on a
    full disk, say; lra-train records every other failure). A job folder is ``depth`` folders below the
    sweep's (the segments of its hydra.sweep.subdir) and holds what a job writes before its record: its
    train.log, lock or config files. Links are not followed."""
    from lra.run import HYDRA_FILES, LOCK, LOG, RunDirectory

    folders = [sweep_dir]
    for _ in range(depth):
        folders = [entry for folder in folders for entry in _subfolders(folder)]
    return [folder for folder in folders if not RunDirectory(folder).recorded()
            and any((folder / name).exists() for name in (LOG, LOCK, HYDRA_FILES))]


def _subfolders(folder: Path) -> List[Path]:
    try:
        return sorted(entry for entry in folder.iterdir() if entry.is_dir() and not entry.is_symlink())
    except OSError:
        return []


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
        # The pattern of a job's folder (Hydra's default: the job's number), unresolved: no job is running now
        subdir = OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir") or "${hydra.job.num}"
        unrecorded = unrecorded_jobs(sweep_dir, len(Path(str(subdir)).parts))
        if unrecorded:
            text += (f"\njobs that failed before writing their record: {len(unrecorded)} (the console says why, and "
                     f"the folder's train.log where it has one): "
                     f"{', '.join(str(path.relative_to(sweep_dir)) for path in unrecorded)}")
        failed = sum(record["status"] == "failed" for record in records) + len(unrecorded)
        ENDED_SWEEPS.append((failed, len(records) + len(unrecorded), sweep_dir / "table.md"))
        print(f"\nTest accuracy (%), mean ± std (seeds) — {sweep_dir}\n\n{text}\n", flush=True)
        atomic_write_text(sweep_dir / "table.md", text + "\n")
