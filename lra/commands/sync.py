"""``lra-sync DIR...``: upload the offline W&B runs of run or sweep folders, and say of each run whether it
reached W&B.

Offline runs live in each run's folder (``runs/…/<job>/wandb/offline-run-*``), not in ``./wandb``,
so a plain ``wandb sync`` from the project root finds nothing; this finds them all under the given
folders. A run synced again continues the same W&B run (the run id is derived from the run folder).

Each run folder is checked first: a run still training (its folder's lock held) or a transaction log
that is cut or damaged (:mod:`lra.wandb_log`) is not uploaded, with the reason. The others go to
``wandb sync`` one run folder at a time (its offline runs together, in the order they were written),
each call bounded by ``--timeout``: an unreachable server makes wandb retry for ever, silently. A run
counts as synced only when wandb said "Finished syncing" for each of its files and printed no error:
``wandb sync`` exits 0 even after its own "ERROR Failed to sync all data". A synced file gets wandb's
own marker (``run-<id>.wandb.synced``), so the same command again uploads only what is left.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, List, Optional

from lra import signals, wandb_log
from lra.commands.config_errors import at_the_edge
from lra.io import atomic_write_text

DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 86400.0  # a day: far past any sync that will still finish, and within what a subprocess timeout takes
STOP_PATIENCE_S = 5.0  # how long a timed-out or interrupted wandb gets to end after SIGTERM, before SIGKILL
def _name(text: str) -> str:
    """A W&B name given on the command line: not empty (an unset shell variable), no surrounding spaces."""
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is no name (empty, an unset shell variable?, or with spaces around "
                                         "it); give a name, or leave the option out")
    return text


def _tag_renames(text: str) -> str:
    """wandb sync's --replace-tags: OLD=NEW pairs, comma-separated, neither side empty."""
    if not all(len(pair.split("=")) == 2 and all(side.strip() for side in pair.split("=")) for pair in text.split(",")):
        raise argparse.ArgumentTypeError(f"{text!r} is not OLD=NEW pairs (e.g. --replace-tags smoke=plumbing,v1=v2)")
    return text


PASSED_ON = [  # wandb sync's options that lra-sync passes on (its others make no sense here)
    (("-p", "--project"), "PROJECT", _name, "upload into this W&B project instead of the runs' own (logger.project)"),
    (("-e", "--entity"), "ENTITY", _name, "upload under this W&B entity instead of the runs' own"),
    (("--job-type",), "TYPE", _name, "set this job type on every run (default: the run's task)"),
    (("--replace-tags",), "OLD=NEW,...", _tag_renames, "rename the runs' tags"),
]
_ERROR_LINE = re.compile(r"^(?:wandb:\s+)?(?:\[[^\]]*\]\s+)?(?:ERROR\b|Error\b)")
_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")  # colours, a progress line redrawn


@dataclass
class RunFolder:
    path: Path  # the folder holding wandb/: a run's folder
    offline: List[Path]  # its wandb/offline-run-* folders, oldest first (a resumed run has one per process)

    def logs(self) -> List[Path]:
        return [log for folder in self.offline for log in sorted(folder.glob("run-*.wandb"))]


def offline_runs(directories: Iterable[Path]) -> List[Path]:
    """Every wandb/offline-run-* folder under ``directories``, once (a folder named twice, or inside another
    one named, counts once)."""
    found = {}
    for directory in directories:
        for path in sorted(Path(directory).rglob("offline-run-*")):
            if path.is_dir() and path.parent.name == "wandb":
                found.setdefault(path.resolve(), path)
    return sorted(found.values())


def run_folders(directories: Iterable[Path]) -> List[RunFolder]:
    by_run: dict = {}
    for folder in offline_runs(directories):
        by_run.setdefault(folder.parent.parent, []).append(folder)
    return [RunFolder(path, sorted(folders, key=lambda f: f.name)) for path, folders in sorted(by_run.items())]


def _marker(log: Path) -> Path:
    return log.with_name(log.name + ".synced")  # wandb sync's own: such a file it skips unless --include-synced


def refusal(run: RunFolder) -> Optional[str]:
    """Why ``run`` is not uploaded as it is (None: it can be)."""
    from lra.run import RunDirectory

    holder = RunDirectory(run.path).holder()
    if holder is not None:
        return f"still being trained by {holder}: sync it once that run has ended"
    for folder in run.offline:
        logs = sorted(folder.glob("run-*.wandb"))
        if not logs:
            return (f"{folder.relative_to(run.path)} holds no run-*.wandb file (W&B wrote nothing there, or it was "
                    "deleted): nothing of it can be uploaded; delete that folder if the run is otherwise synced")
        for log in logs:
            found = wandb_log.problem(log)
            if found is not None and found.startswith(wandb_log.PARTLY_READABLE):
                return (f"{log.relative_to(run.path)} {found}; if the run is still going, sync after it ends; else "
                        f"`wandb sync {shlex.quote(str(folder))}` uploads the part before the damage")
            if found is not None:
                return f"{log.relative_to(run.path)} {found}: nothing of it can be uploaded"
    return None


def verdict(logs: List[Path], output: str, returncode: int) -> Optional[str]:
    """Why the wandb sync call that uploaded ``logs`` did not sync them all, from what it printed and its
    exit status (None: every one finished, nothing went wrong)."""
    lines = [line.strip() for line in _TERMINAL_CODES.sub("", output).splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    if errors:
        return "wandb sync said: " + " | ".join(errors)
    last = f" (its last line: {lines[-1]})" if lines else " (it printed nothing)"
    if returncode != 0:
        return f"wandb sync failed with exit status {returncode}{last}"
    unfinished = [log for log in logs if not any("Finished syncing" in line and _names(line, log) for line in lines)]
    if unfinished:
        names = ", ".join(f"{log.parent.name}/{log.name}" for log in unfinished)
        return f"wandb sync exited 0 without saying it finished {names}{last}"
    return None


def _names(line: str, log: Path) -> bool:
    return f"{log.parent.name}/{log.name}" in line


class TimedOut(Exception):
    pass


def run_wandb(command: List[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``command``'s output (stdout and stderr together) and exit status; its whole process group (wandb
    starts a service of its own) stopped when it runs past ``timeout_s`` (:class:`TimedOut`) or when this
    process is interrupted."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, errors="replace", start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _stop_group(process)
        raise TimedOut() from None
    except BaseException:
        _stop_group(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, output)


def _stop_group(process: subprocess.Popen) -> None:
    for number in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, number)
        except ProcessLookupError:
            pass
        try:
            process.communicate(timeout=STOP_PATIENCE_S)
            break
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(process.pid, signal.SIGKILL)  # what it started and left behind
    except ProcessLookupError:
        pass


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 (e.g. --timeout 300)")
    if value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r} is more than a day ({MAX_TIMEOUT_S:.0f} s), the longest timeout; "
                                         "give at most that (e.g. --timeout 3600)")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lra-sync", description=__doc__.split("\n\n")[0].replace("``", "").replace("\n", " "),
        epilog="Exit status: 0 when every run found is synced (or was already), 1 when any is not (each listed "
               "with why), 2 for a mistake on the command line.")
    parser.add_argument("directories", nargs="+", help="run or sweep folders (e.g. runs/multirun/<date>/<time>)")
    parser.add_argument("--dry-run", action="store_true",
                        help="check every run and print the wandb sync command each would get; upload nothing")
    parser.add_argument("--timeout", type=_timeout, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"give up on a run whose wandb sync has not finished after this long (default "
                             f"{DEFAULT_TIMEOUT_S:.0f}, at most {MAX_TIMEOUT_S:.0f}: a day; an unreachable server makes wandb retry "
                             "for ever); the runs after it are not tried")
    passed = parser.add_argument_group("passed on to wandb sync")
    for flags, metavar, kind, text in PASSED_ON:
        passed.add_argument(*flags, metavar=metavar, type=kind, help=text)
    passed.add_argument("--include-synced", action="store_true",
                        help="upload runs that an earlier sync finished too (their run-*.wandb.synced marker)")
    return parser


def _wandb_options(args) -> List[str]:
    options = []
    for flags, _, _, _ in PASSED_ON:
        value = getattr(args, flags[-1].lstrip("-").replace("-", "_"))
        if value is not None:
            options += [flags[-1], value]
    return options + (["--include-synced"] if args.include_synced else [])


@at_the_edge
def main(argv=None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if any(not d.strip() for d in args.directories):  # Path("") would be the current folder
        parser.exit(2, "error: a directory argument is empty (an unset shell variable?); give run or sweep folders, "
                       "e.g. runs/multirun/<date>/<time>\n")
    args.directories = [Path(d) for d in args.directories]
    files = [str(d) for d in args.directories if d.exists() and not d.is_dir()]
    if files:
        parser.exit(2, f"error: {', '.join(files)}: a file, not a folder; pass run or sweep folders under runs/\n")
    missing = [str(d) for d in args.directories if not d.is_dir()]
    if missing:
        parser.exit(2, f"error: no such directory: {', '.join(missing)}; pass run or sweep folders under runs/\n")
    runs = run_folders(args.directories)
    if not runs:
        parser.exit(1, f"error: no offline W&B runs (wandb/offline-run-*) under {', '.join(map(str, args.directories))}; "
                       "runs log to W&B offline with logger=wandb when not logged in (or with WANDB_MODE=offline)\n")
    if not args.dry_run and shutil.which("wandb") is None:
        parser.exit(1, "error: the wandb command is not on PATH; install wandb (pip install wandb)\n")
    options = _wandb_options(args)
    print(f"{len(runs)} run(s) with offline W&B runs; " + ("checked, nothing uploaded (--dry-run)" if args.dry_run else
          f"each run's wandb sync is given {args.timeout:g} s (--timeout)"), flush=True)
    not_synced = 0
    try:
        for index, run in enumerate(runs):
            line, synced, timed_out = _sync(run, options, args)
            print(line, flush=True)
            not_synced += not synced
            if timed_out:
                for later in runs[index + 1:]:
                    print(f"not synced: {later.path}: not tried (after the time-out above)")
                not_synced += len(runs) - index - 1
                break
    except KeyboardInterrupt as exc:
        stopped = signals.as_interrupted(exc)
        stopped.advice = ("each run above says whether it was synced; the same command uploads the rest (runs "
                          "already synced are skipped)")
        raise stopped from None
    if not_synced and args.dry_run:
        parser.exit(1, f"error: {not_synced} of {len(runs)} runs would not be synced (each listed above with why); fix "
                       "what its line says, then sync\n")
    if not_synced:
        parser.exit(1, f"error: {not_synced} of {len(runs)} runs not synced (each listed above with why): nothing was "
                       "deleted; fix what its line says and run the same command again (synced runs are skipped)\n")
    if not args.dry_run:
        print(f"all {len(runs)} runs synced")


def _sync(run: RunFolder, options: List[str], args) -> tuple:
    """``(the line that reports run, whether it is synced, whether wandb timed out)``."""
    refused = refusal(run)
    if refused is not None:
        return f"{'would not sync' if args.dry_run else 'not synced'}: {run.path}: {refused}", False, False
    pending = [log for log in run.logs() if args.include_synced or not _marker(log).exists()]
    if not pending:
        return (f"already synced: {run.path} (an earlier sync finished it: its run-*.wandb.synced marker; "
                "--include-synced uploads it again)"), True, False
    command = ["wandb", "sync", *options, *sorted({str(log.parent) for log in pending})]
    if args.dry_run:
        return f"would sync: {run.path}: {shlex.join(command)}", True, False
    try:
        done = run_wandb(command, args.timeout)
    except TimedOut:
        host = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        return (f"not synced: {run.path}: wandb sync had not finished after {args.timeout:g} s, so it was stopped: "
                f"the W&B server ({host}) is unreachable or slow; check the network and your login (wandb login), "
                "or pass a longer --timeout"), False, True
    reason = verdict(pending, done.stdout, done.returncode)
    if reason is not None:
        return f"not synced: {run.path}: {reason}", False, False
    try:
        for log in pending:
            if not _marker(log).exists():
                atomic_write_text(_marker(log), "")
    except OSError as exc:
        return (f"synced: {run.path} (but its marker {_marker(log).name} could not be written: {exc.strerror}; the "
                "same command would upload it again)"), True, False
    return f"synced: {run.path}", True, False


if __name__ == "__main__":
    main()
