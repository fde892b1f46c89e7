"""What lra-table reads, read one way: run records (``metrics.json``) and reference tables (``--reference
FILE``).

A file is read only when it is a regular file (not a named pipe, which would wait for a writer for ever;
not a device, which may never end; not a folder or a loop of symbolic links) of at most :data:`MAX_BYTES`,
and a record only when its JSON is nested at most :data:`MAX_DEPTH` levels deep (a run record is a flat
object with a few lists). Anything else is :class:`Unreadable`, with the reason: a record is then skipped
with a note like any other unreadable one, a reference table refused with one error line
(:mod:`lra.results.reference`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator, List, Optional, Tuple

from lra.faults import fault_point
from lra.io import MAX_READ_BYTES as MAX_BYTES
from lra.io import Unreadable, os_reason, read_bytes
from lra.records import METRICS
from lra.results import recordless, validity

MAX_DEPTH = 32  # a run record nests two levels ({"invalid_values": {...}}, lists of steps)
REQUIRED = ("label", "task", "status")  # what a record needs to sit in a table


def missing_required(record: dict) -> list:
    """The :data:`REQUIRED` fields ``record`` lacks, or holds as something other than a name."""
    return [field for field in REQUIRED if not isinstance(record.get(field), str) or not record[field].strip()]
# Keys lra-table gives a record as it reads it (what is invalid, its setup and row); lra-train writes none of
# them, so a file's own are an edit, dropped with a note rather than trusted. (run_dir, which lra-train writes
# too, is replaced by where the record was read.)
DERIVED = ("source", validity.INVALID, "setup", "setup_config", "setup_assumed", "preset_row", "row",
           "row_rank", "stand_in")


def read_text(path: Path, limit: int = MAX_BYTES) -> str:
    """:func:`read_bytes` as UTF-8 text; text that is not UTF-8 is :class:`Unreadable`."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unreadable(f"not UTF-8 text (byte {exc.start} is {data[exc.start:exc.start + 1]!r})") from exc


def read_json(path: Path, limit: int = MAX_BYTES, depth: int = MAX_DEPTH):
    """The JSON value in ``path`` (:func:`read_text`), nested at most ``depth`` levels deep; else
    :class:`Unreadable`. A value nested past the parser's own recursion limit is that, not a crash."""
    text = read_text(path, limit)
    try:
        value = json.loads(text)
    except RecursionError:
        raise Unreadable(f"JSON nested deeper than {depth} levels") from None
    except json.JSONDecodeError as exc:
        raise Unreadable(f"not JSON: {exc}") from None
    except ValueError:  # an integer longer than Python converts
        raise Unreadable(f"a number of more than {sys.get_int_max_str_digits():,} digits") from None
    if nesting(value, depth) > depth:
        raise Unreadable(f"JSON nested deeper than {depth} levels")
    try:  # "\ud800" is JSON, but no character: printed, it would end lra-table
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Unreadable(f"a string that is no Unicode text: it holds {exc.object[exc.start]!r}, half of a "
                         "surrogate pair") from None
    return value


def nesting(value, stop: int = MAX_DEPTH) -> int:
    """How many levels of objects and lists ``value`` nests (0 for a number or a string), counted without
    recursion; the count stops once it passes ``stop``."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        deepest = max(deepest, level)
        if level > stop:
            break
        children = item.values() if isinstance(item, dict) else item
        pending.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def record_files(paths: Iterable[Path], warn: Callable[[str], None] = lambda message: None,
                 without_record: Optional[List[Path]] = None) -> List[Path]:
    """Every ``metrics.json`` under the given run or sweep directories (or given directly), each once
    however often it is reached (overlapping arguments, symbolic links). Every entry of that name counts,
    whatever it is (the reader says what is wrong with one that is no record); a folder that cannot be
    listed is named with a ``warn``. The run folders without a record (:func:`recordless.is_job_folder`) are
    added to ``without_record``."""
    found, jobs = {}, {}
    for path in map(Path, paths):
        if not path.is_dir():
            found.setdefault(os.path.realpath(path), path)
            continue
        for candidate in sorted(_named_records(path, warn, jobs)):
            found.setdefault(os.path.realpath(candidate), candidate)  # realpath: a loop of links is no error
    if without_record is not None:
        without_record.extend(sorted(jobs.values()))
    return list(found.values())


def _named_records(folder: Path, warn: Callable[[str], None], jobs: dict) -> Iterator[Path]:
    """The entries called ``metrics.json`` in ``folder`` and the folders below it, without recursion: a sweep
    nested however deep is listed. Links to folders are not followed (a link to ``/`` would list the disk);
    a link to a run folder is named with a ``warn``, as its run is not in the table unless given. A run folder
    without a record, outside any run folder, goes into ``jobs`` (by its real path)."""
    pending = [(folder, False)]
    while pending:
        current, in_run = pending.pop()
        try:
            fault_point("table_list", current)  # tests: LRA_FAULT=table_list:1:EACCES
            with os.scandir(current) as listing:
                entries = list(listing)
        except OSError as exc:
            warn(f"skipped {current}: its files cannot be listed ({os_reason(exc, current)}); the runs in it are "
                 "not in the table")
            continue
        names = [entry.name for entry in entries]
        job = recordless.is_job_folder(names)
        if job and not in_run:
            jobs.setdefault(os.path.realpath(current), current)
        in_run = in_run or job or METRICS in names
        for entry in entries:
            if entry.name == METRICS:
                yield Path(entry.path)
            if entry.is_dir(follow_symlinks=False):
                pending.append((Path(entry.path), in_run))
            elif entry.is_symlink() and _links_to_run(entry.path):
                warn(f"not followed: {entry.path}, a link to the run folder {os.path.realpath(entry.path)}; pass that "
                     "folder too to count its run")


def _links_to_run(link: str) -> bool:
    """Whether ``link`` points at a folder holding a run record (a loop of links or a broken link does not)."""
    try:
        return os.path.isdir(link) and os.path.lexists(os.path.join(link, METRICS))
    except OSError:
        return False


def read_runs(paths: Iterable[Path], warn: Callable[[str], None] = lambda message: None,
              metric: str = "test_accuracy") -> Tuple[List[dict], List[recordless.Unplaced]]:
    """The runs under the run or sweep directories ``paths`` (:func:`record_files`, :func:`read_found`)."""
    jobs: List[Path] = []
    return read_found(record_files(paths, warn, jobs), jobs, warn, metric)


def read_found(files: Iterable[Path], jobs: Iterable[Path], warn: Callable[[str], None] = lambda message: None,
               metric: str = "test_accuracy") -> Tuple[List[dict], List[recordless.Unplaced]]:
    """The runs of the records ``files`` (:func:`read_records`) and of the run folders without one ``jobs``,
    each counted failed in its cell (:func:`recordless.stand_in`); and the runs that no config places
    (:class:`recordless.Unplaced`), each named with a ``warn``."""
    unplaced: List[recordless.Unplaced] = []
    records = read_records(files, warn, metric, unplaced)
    for folder in jobs:
        record = recordless.stand_in(folder, recordless.NO_RECORD, warn)
        if record is None:
            from lra.run import RunDirectory

            starting = RunDirectory(folder).last_holder_alive() is True  # a job starting there now (read, not locked)
            unplaced.append(recordless.Unplaced(folder, recordless.STARTING if starting else recordless.NO_RECORD,
                                                running=starting))
            warn(f"{folder}: a run folder without a record or a readable config; counted "
                 f"{'unfinished' if starting else 'failed'}, in no cell")
        else:
            warn(f"{folder}: a run folder without a record; counted {record['status']} in its cell")
            records.append(record)
    return records, unplaced


def read_records(paths: Iterable[Path], warn: Callable[[str], None] = lambda message: None,
                 metric: str = "test_accuracy", unplaced: Optional[List[recordless.Unplaced]] = None) -> List[dict]:
    """The readable run records among ``paths``; each value a table cannot use (:mod:`lra.results.validity`, a
    completed record without ``metric`` too) is left out with a ``warn``. An unreadable record (:func:`read_json`,
    or one without its :data:`REQUIRED` fields) is counted failed in the cell of its folder's config
    (:func:`recordless.stand_in`); without a config it is skipped with a ``warn``, and named in ``unplaced``."""
    records = []

    def damaged(path: Path, reason: str, skipped: str) -> None:
        why = recordless.damaged_reason(reason)
        record = recordless.stand_in(Path(path).parent, why, warn)
        if record is not None:
            warn(f"{path}: not a usable run record ({reason}); counted failed in the cell of its folder's config")
            records.append(record)
            return
        warn(f"skipped {path}: {skipped}")
        if unplaced is not None:
            unplaced.append(recordless.Unplaced(Path(path).parent, why))

    for path in paths:
        shown = shown_path(path)
        if shown != str(path):  # pandas, the table's formats and W&B take text; a name that is none is renamed
            warn(f"skipped {shown}: its path is not UTF-8 text (the bytes shown as \\x..); rename the folder to "
                 "table its run")
            continue
        try:
            record = read_json(path)
        except Unreadable as exc:
            damaged(path, str(exc), f"not a readable run record ({exc})")
            continue
        if not isinstance(record, dict) or missing_required(record):
            needs = f"a run record needs the fields {', '.join(REQUIRED)}, each a name"
            damaged(path, needs, needs)
            continue
        why = validity.unplaceable(record)
        if why is not None:
            damaged(path, why, f"{why} (the record is damaged or was edited)")
            continue
        derived = [key for key in DERIVED if key in record]
        if derived:
            warn(f"{path}: ignored its {', '.join(derived)} (lra-table derives {'them' if len(derived) > 1 else 'it'}; "
                 "lra-train writes none: the record was edited)")
            for key in derived:
                del record[key]
        record["run_dir"] = str(Path(path).parent)
        validity.screen(record, (*validity.TABLE_FIELDS, *validity.STEP_FIELDS, *validity.FLAGS), warn, str(path))
        validity.require(record, metric, warn, str(path))
        records.append(record)
    return records


def shown_path(path) -> str:
    """``path`` as text: a byte that is no UTF-8 (a folder named in another encoding) written as ``\\xff``."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def modified(record: dict) -> float:
    """When ``record``'s file was last written (0 when it is gone since it was read)."""
    try:
        return os.stat(Path(record["run_dir"], METRICS)).st_mtime
    except OSError:
        return 0.0
