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


REFUSED_RESUMES = ".refused-resumes"  # in a sweep's folder: a file per job of -m resume=A,B refused before it ran


def note_refused_resume(sweep_dir: Path, job: int, resume: str, line: str) -> None:
    """Job ``job`` of a ``-m resume=…`` sweep was refused before its run went on (no run of the user's is written
    for it): noted in the sweep's folder, so that the sweep's end counts it failed and names it."""
    from lra.io import atomic_write_json

    folder = Path(sweep_dir) / REFUSED_RESUMES
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / f"{job}.json", {"job": job, "resume": resume, "error": line})


def clear_refused_resume(sweep_dir: Path, job: int) -> None:
    """The note of an earlier attempt of job ``job`` (the same command again), gone as the job starts."""
    (Path(sweep_dir) / REFUSED_RESUMES / f"{job}.json").unlink(missing_ok=True)


def refused_resumes(sweep_dir: Path) -> list:
    """The notes of :func:`note_refused_resume`, in job order (unreadable ones as the file's name)."""
    import json

    notes = []
    for path in sorted((Path(sweep_dir) / REFUSED_RESUMES).glob("*.json"), key=lambda p: (len(p.stem), p.stem)):
        try:
            notes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            notes.append({"job": path.stem, "resume": "?", "error": f"its note {path} is unreadable"})
    return notes


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
    from lra.run import not_a_run

    return [folder for folder in folders if folder.is_dir() and not not_a_run(str(folder))]  # not a sweep's folder


STARTED_SWEEPS: list = []  # the folder of each multirun this process started (named by a line if it dies)


class ComparisonTableCallback(Callback):
    def on_multirun_start(self, config, **kwargs) -> None:
        STARTED_SWEEPS.append(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config, **kwargs) -> None:
        from lra.io import atomic_write_text
        from lra.results.formats import note
        from lra.results.reading import read_runs
        from lra.results.rows import FINISHED
        from lra.results.table import render_records  # pandas: only when a sweep has ended

        sweep_dir = Path(config.hydra.sweep.dir)
        refused = refused_resumes(sweep_dir)  # their runs are as they were: no row shows them as this sweep's
        untouched = {Path(str(r["resume"])).resolve() for r in refused}
        resumed = [folder for folder in resumed_runs(config) if folder.resolve() not in untouched]
        # A sweep over other settings than the seed gives each setup its own row (lra.results.setups).
        # Its runs are read as lra-table reads them: a job without a record is counted failed.
        records, unplaced = read_runs([sweep_dir, *resumed], note)
        text = render_records(records, note, unplaced)
        if refused:
            text += "\n\njobs refused before they resumed (their runs are left as they were):\n" + "\n".join(
                f"- job {r['job']}, resume={r['resume']}: {r['error']}" for r in refused)
        starting = sum(item.running for item in unplaced)  # held by a live process: another process's job
        failed = sum(record["status"] == "failed" for record in records) + len(unplaced) - starting + len(refused)
        unfinished = sum(record["status"] not in FINISHED for record in records) + starting
        ENDED_SWEEPS.append((failed, unfinished, len(records) + len(unplaced) + len(refused), sweep_dir / "table.md"))
        print(f"\nTest accuracy (%), mean ± std (seeds) — {sweep_dir}\n\n{text}\n", flush=True)
        atomic_write_text(sweep_dir / "table.md", text + "\n")
