"""lra-gpu-check's steps: each a real command in a process group of its own with a time limit, stopped as
a user's ctrl-C stops a command (lra/signals.py) at that limit or when the check itself is interrupted,
then killed with whatever it started, so no GPU work outlives its step."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from lra import signals

STOP_GRACE_S = 5  # how long a step stopped by a signal may take to end before it is killed


@dataclass
class Step:
    name: str
    command: List[str]
    limit_s: float
    output: Optional[str] = None  # the file its standard output and error go to
    basis: str = ""  # why this limit
    cwd: Optional[Path] = None
    grace_s: float = STOP_GRACE_S  # once stopped by a signal, how long it may take to end before it is killed
    limit_name: str = ""  # what its time limit is called where a run records why it was stopped
    seconds: float = 0.0
    status: str = "not run"
    notes: List[str] = field(default_factory=list)  # what it printed last (summary.md quotes it)
    advice: List[str] = field(default_factory=list)  # what became of it and what to do next


def run_step(step: Step, out: Path) -> None:
    """Run ``step`` in a new session (its own process group). At its time limit, or when this process is
    interrupted, the group is stopped as ctrl-C stops a command (:func:`stop_group`), and whatever is
    left of it is killed, so no GPU work outlives its step."""
    if not step.command:
        step.status = "skipped"
        return
    started = time.perf_counter()
    step.status = "running"
    target = out / step.output if step.output else out / ".step.log"
    handle, note = tempfile.mkstemp(prefix="lra-gpu-check-stop-", suffix=".txt")  # why it was stopped, if it is
    os.close(handle)
    try:
        with open(target, "w") as log:
            log.write("$ " + shlex.join(step.command) + "\n")
            log.flush()
            process = subprocess.Popen(step.command, stdout=log, stderr=subprocess.STDOUT, cwd=step.cwd,
                                       start_new_session=True, env={**os.environ, signals.STOP_NOTE: note})
            try:
                try:
                    code = process.wait(timeout=step.limit_s)
                    step.status = "passed" if code == 0 else f"failed (exit {code})"
                except subprocess.TimeoutExpired:
                    step.status = f"timed out after {step.limit_s:.0f} s"
                if step.status.startswith("timed out"):
                    Path(note).write_text(step.limit_name or f"lra-gpu-check's {step.limit_s:g} s limit for its "
                                                             f"{step.name} step")
                    stop_group(process, signal.SIGTERM, step.grace_s)
            except KeyboardInterrupt as exc:
                stop_group(process, signals.as_interrupted(exc).signal_number, step.grace_s)
                raise
            finally:
                with signals.deferred():  # a signal now is raised once the group is gone
                    _kill_group(process)
                step.seconds = time.perf_counter() - started
    finally:
        os.unlink(note)
        if step.status != "passed":
            step.notes.append(tail_of(target))
        if not step.output:
            target.unlink()


def stop_group(process: subprocess.Popen, number: int, grace_s: float) -> None:
    """The signal policy's stop (lra/signals.py) for a step's process group: ``number`` to each of its
    processes, as a terminal's ctrl-C reaches each process of its job, and SIGCONT (a stopped process takes
    a signal only once it runs again); then up to ``grace_s`` seconds for the group to end, each lra-train run
    recording ``interrupted``. A signal to this process meanwhile is raised once the wait is over."""
    for number_sent in (number, signal.SIGCONT):
        try:
            os.killpg(process.pid, number_sent)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    interrupted = None
    while True:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            while _group_alive(process.pid) and time.monotonic() < deadline:  # what the step started, too
                time.sleep(0.05)
            break
        except subprocess.TimeoutExpired:
            break
        except KeyboardInterrupt as exc:  # the policy's first signal here: the runs still record, then it is raised
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _kill_group(process: subprocess.Popen, patience_s: float = 30.0) -> None:
    """Kill what is left of the step's process group (the step itself, and anything it started), and
    return only once every member has exited: a SIGKILL is delivered asynchronously, and a
    grandchild still exiting would hold the GPU into the next step."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    deadline = time.monotonic() + patience_s
    while _group_alive(process.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _group_alive(group: int) -> bool:
    """Whether a process of process group ``group`` has not exited yet (a zombie has: it holds nothing
    but its exit status), from /proc; False where there is no /proc."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()  # the name may hold spaces
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False


def tail_of(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a step's file (summary.md quotes them), or nothing when it is not there."""
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return "\n".join(text[-lines:])


def keep_scratch_of_failures(steps: List[Step], scratch: Path) -> None:
    """Remove the check's scratch folder, unless a step failed: its lines may name a run folder there, so
    the folder is kept and each failed step's summary says where. (A step stopped at its limit or by a
    signal says what became of its runs in its own note.)"""
    failed = [step for step in steps if step.status.startswith("failed")]
    stopped = any(step.status.startswith("interrupted") for step in steps)  # its summary says the folder goes
    if not failed or stopped or not any(scratch.iterdir()):
        shutil.rmtree(scratch, ignore_errors=True)
        return
    for step in failed:
        step.advice.append(f"The check's run folders are kept in {scratch}: remove it when done.")
    print(f"[lra-gpu-check] a step failed: its run folders are kept in {scratch}", flush=True)


def error_line(step: Step) -> Optional[str]:
    """The last ``error:`` line a failed step printed (the command's own words for what went wrong)."""
    lines = [line.strip() for note in step.notes for line in note.splitlines() if line.strip().startswith("error:")]
    return lines[-1] if lines else None
