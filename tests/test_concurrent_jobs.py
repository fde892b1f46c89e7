"""Jobs started together on one data folder (a parallel sweep on a bare machine, lra-prepare run twice, a
rebuild while a run loads the cache) share one preparation: one job prepares, the others say whom they wait
for, wait, and use what it prepared; a cache is never swapped under a job that is loading it.

The jobs are real processes started at once. They are synchronised through the data lock itself: the
first job to hold it stops there (``LRA_FAULT=data_lock:1:SIGSTOP``, once across the jobs with
``LRA_FAULT_ONCE``), the test waits for the other job's line saying whom it waits for, checks that the
holder is stopped, and lets it go on (SIGCONT)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from command_server import shell_signal_handling
from conftest import SMALL_LISTOPS, read_json
from lra.data import listops, locking

GUARD_S = 240  # a bound on a test gone wrong (a job that never says it waits), not a synchronisation
TRAIN = ["lra-train", "trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", "model.num_layers=1",
         "attention=none"]
SMALL_PATHFINDER = ["task.generator.num_images=40", "task.generator.images_per_folder=10", "task.generator.workers=1"]


class Jobs:
    """Commands started at once, each with its output (stdout and stderr together) read as it comes."""

    def __init__(self, cwd: Path, data: Path):
        self.cwd, self.data, self.processes, self.output = cwd, data, [], []
        self.selector = selectors.DefaultSelector()
        self.deadline = time.monotonic() + GUARD_S

    def start(self, args, env_extra=None) -> int:
        env = {**os.environ, "LRA_DATA_DIR": str(self.data), "WANDB_MODE": "disabled", "PYTHONHASHSEED": "0",
               "PYTHONUNBUFFERED": "1", **(env_extra or {})}
        env.pop("HYDRA_FULL_ERROR", None)
        process = subprocess.Popen([str(Path(sys.executable).parent / args[0]), *args[1:]], cwd=self.cwd, env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   preexec_fn=shell_signal_handling)
        self.processes.append(process)
        self.output.append("")
        os.set_blocking(process.stdout.fileno(), False)
        self.selector.register(process.stdout, selectors.EVENT_READ, len(self.processes) - 1)
        return len(self.processes) - 1

    def until(self, pattern: str):
        """(job, match) of the first line any job prints that matches ``pattern``; None once every job ended
        without one."""
        while True:
            for index, text in enumerate(self.output):
                found = re.search(pattern, text)
                if found:
                    return index, found
            if not self.selector.get_map():
                return None
            remaining = self.deadline - time.monotonic()
            assert remaining > 0, f"no job printed {pattern!r} in {GUARD_S} s:\n" + "\n---\n".join(self.output)
            for key, _ in self.selector.select(timeout=remaining):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if chunk:
                    self.output[key.data] += chunk.decode(errors="replace")
                else:
                    self.selector.unregister(key.fileobj)

    def stopped(self, index: int) -> bool:
        """Wait until job ``index`` has stopped (True) or ended (False); it stays waitable either way."""
        info = os.waitid(os.P_PID, self.processes[index].pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
        return info.si_code == os.CLD_STOPPED

    def finish(self) -> list:
        """Every job's (exit status, output) once all have ended."""
        self.until(r"(?!x)x")  # reads every output to its end
        return [(process.wait(timeout=max(1.0, self.deadline - time.monotonic())), text)
                for process, text in zip(self.processes, self.output)]

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
                process.wait()
            process.stdout.close()


def holder_released(jobs: Jobs, waiting_line: str):
    """Wait for a job's line saying whom it waits for; check that job waited for is stopped holding the lock
    and let it go on. Returns (the waiting job, the job it waited for)."""
    found = jobs.until(waiting_line)
    assert found is not None, "no job waited for the other:\n" + "\n---\n".join(jobs.output)
    waiter, match = found
    (holder,) = [i for i, p in enumerate(jobs.processes) if p.pid == int(match.group("pid"))]
    assert holder != waiter and jobs.stopped(holder), jobs.output
    jobs.processes[holder].send_signal(signal.SIGCONT)
    return waiter, holder


def leftovers(folder: Path) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


WAITING = r"is being prepared by process (?P<pid>\d+) on .*: waiting for it to finish, then using what it prepared"


def test_two_trainings_started_at_once_on_a_bare_data_folder_generate_listops_once(tmp_path):
    """Both generated the same files and built the same cache over each other (each its own minute of the
    reference set's generation, N times over in a sweep of N parallel jobs)."""
    data, jobs = tmp_path / "data", Jobs(tmp_path, tmp_path / "data")
    fault = {"LRA_FAULT": "data_lock:1:SIGSTOP", "LRA_FAULT_ONCE": str(tmp_path / "stopped-once")}
    try:
        for run in ("a", "b"):
            jobs.start([*TRAIN, *SMALL_LISTOPS, f"hydra.run.dir={run}"], fault)
        waiter, holder = holder_released(jobs, WAITING)
        results = jobs.finish()
    finally:
        jobs.close()
    assert [code for code, _ in results] == [0, 0], results
    generating = [i for i, (_, text) in enumerate(results) if "ListOps data not found: generating" in text]
    assert generating == [holder], "one job generated; the other waited and used its data"
    assert "preparing listops" not in results[waiter][1]
    records = [read_json(tmp_path / run / "metrics.json") for run in ("a", "b")]
    assert all(r["status"] == "completed" for r in records)
    assert records[0]["data_cache"] == records[1]["data_cache"]
    assert records[0]["data_content"] == records[1]["data_content"]
    (cache,) = (data / "listops" / "cache").iterdir()  # the cache alone: no lock file or staging folder stays
    assert str(cache) == records[0]["data_cache"] and not leftovers(data / "listops" / "generated")


def test_two_pathfinder_preparations_share_one_generated_folder(tmp_path):
    """Two split seeds are two caches of one generated folder: their jobs drew every image twice, over each
    other's files."""
    data, jobs = tmp_path / "data", Jobs(tmp_path, tmp_path / "data")
    fault = {"LRA_FAULT": "data_lock:2:SIGSTOP", "LRA_FAULT_ONCE": str(tmp_path / "stopped-once")}  # 2: the folder's
    try:
        for seed in (0, 1):
            jobs.start(["lra-prepare", "pathfinder", "--data-dir", str(data), *SMALL_PATHFINDER,
                        f"task.split_seed={seed}"], fault)
        waiter, holder = holder_released(jobs, r"the generated Pathfinder folder .* " + WAITING)
        results = jobs.finish()
    finally:
        jobs.close()
    assert [code for code, _ in results] == [0, 0], results
    generating = [i for i, (_, text) in enumerate(results) if "Pathfinder data not found: generating" in text]
    assert generating == [holder], results
    caches = [json.loads(text.strip().splitlines()[-1])["cache"] for _, text in results]
    assert len(set(caches)) == 2 and leftovers(data / "pathfinder" / "cache") == []
    (root,) = (data / "pathfinder" / "generated").glob("*/pathfinder32/curv_contour_length_14")
    assert sorted(p.name for p in (root / "metadata").iterdir()) == [f"{k}.npy" for k in range(4)]
    assert leftovers(root.parent) == [] and not list(root.rglob(".sample_*"))


def released_listops_cache(tmp_path: Path):
    """(data folder, raw folder, lra-prepare command, cache) of ListOps release files prepared once."""
    data, raw = tmp_path / "data", tmp_path / "raw" / "listops-1000"
    settings = listops.GeneratorSettings(num_train=96, num_val=24, num_test=24, min_length=20, max_length=200)
    listops.write_tsv_files(settings, raw)
    prepare = ["lra-prepare", "listops", "task.source=lra_release", f"task.path={raw}", "--data-dir", str(data)]
    first = Jobs(tmp_path, data)
    try:
        first.start(prepare)
        assert first.finish()[0][0] == 0, first.output
    finally:
        first.close()
    (cache,) = (data / "listops" / "cache").iterdir()
    return data, raw, prepare, cache


def test_a_forced_rebuild_waits_for_a_training_that_is_loading_the_cache(tmp_path):
    """lra-prepare --force swapped the new cache in while the run was checking the old one's files against its
    manifest: the run then refused its cache as damaged (files of the new cache, the old manifest), or, once
    past the checksums, trained on arrays other than those its record's fingerprint names."""
    data, raw, prepare, cache = released_listops_cache(tmp_path)
    source = ["task.source=lra_release", f"task.path={raw}"]
    before = json.loads((cache / "manifest.json").read_text())
    jobs = Jobs(tmp_path, data)
    try:
        reader = jobs.start([*TRAIN, *source, "task.max_length=256", "hydra.run.dir=run"],
                            {"LRA_FAULT": "cache_load:1:SIGSTOP"})
        assert jobs.stopped(reader), "the run stops while it loads the cache"
        path = raw / "basic_train.tsv"  # the same rows in reverse order: another cache's arrays
        header, *rows = path.read_text().splitlines()
        path.write_text("\n".join([header, *reversed(rows)]) + "\n")
        rebuild = jobs.start([*prepare, "--force"])
        waits = jobs.until(r"waiting for the jobs loading .* before replacing it|\{\"cache\": ")  # or it ended
        swapped = json.loads((cache / "manifest.json").read_text()) != before
        jobs.processes[reader].send_signal(signal.SIGCONT)
        results = jobs.finish()
    finally:
        jobs.close()
    assert [code for code, _ in results] == [0, 0], results
    record = read_json(tmp_path / "run" / "metrics.json")
    assert record["status"] == "completed" and record["data_fingerprint"] == before["fingerprint"], record
    assert not swapped and "waiting for the jobs loading" in waits[1].group(0), "nothing is swapped under a load"
    assert waits[0] == rebuild
    after = json.loads((cache / "manifest.json").read_text())
    assert after["files"]["train.labels.npy"] != before["files"]["train.labels.npy"], "the rebuild took the new labels"
    assert leftovers(cache.parent) == []


def test_ctrl_c_while_a_rebuild_waits_for_a_load_ends_it_with_the_interrupted_line(tmp_path):
    """It ended with "unexpected BlockingIOError …: this is a bug in the harness" (status 1): the wait ran inside
    the except clause of the attempt to lock at once, so the interruption carried that OS error, which the cache
    builder's cleanup named as the error."""
    data, _, prepare, cache = released_listops_cache(tmp_path)
    before = (cache / "manifest.json").read_text()
    jobs = Jobs(tmp_path, data)
    try:
        reader = jobs.start(prepare, {"LRA_FAULT": "cache_load:1:SIGSTOP"})
        assert jobs.stopped(reader), "the load stops holding the cache"
        rebuild = jobs.start([*prepare, "--force"])
        assert jobs.until(r"waiting for the jobs loading .* before replacing it")[0] == rebuild, jobs.output
        jobs.processes[rebuild].send_signal(signal.SIGINT)
        jobs.processes[reader].send_signal(signal.SIGCONT)
        results = jobs.finish()
    finally:
        jobs.close()
    assert results[reader][0] == 0, results
    code, text = results[rebuild]  # stdout and stderr in one pipe: the waiting line's newline may come after the error
    last = text.strip().splitlines()[-1]
    assert code == 128 + signal.SIGINT and last.endswith("error: interrupted (ctrl-C); what was finished is kept, what "
                                                         "was being written is not"), text
    assert (cache / "manifest.json").read_text() == before and leftovers(cache.parent) == []


def as_user(uid: int, gid: int, body) -> tuple:
    """(process id, pipe to read) of a child of this process running ``body(write)`` as user ``uid`` of group
    ``gid`` with umask 022; ``write(text)`` sends a line to the pipe, and an exception is sent as its repr."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(read_end)
            os.setgroups([gid])
            os.setgid(gid)
            os.setuid(uid)
            os.umask(0o022)
            body(lambda text: os.write(write_end, f"{text}\n".encode()))
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            os.write(write_end, f"raised {exc!r}\n".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    return pid, os.fdopen(read_end)


@pytest.mark.skipif(os.geteuid() != 0, reason="two users' jobs: started by root as two other users")
def test_the_jobs_of_two_users_of_a_group_data_folder_share_its_lock():
    """The second user's job failed at once with "Permission denied" on the lock file the first one held (the
    first one's umask had left it its own), and so on every later start once the first was killed holding it."""
    gid, shared = 4321, Path(tempfile.mkdtemp())  # (under TMPDIR: a test's own folder is root's alone)
    os.chown(shared, 0, gid)
    os.chmod(shared, 0o2775)
    cache, lock, children = shared / "cache", locking.lock_path(shared / "cache", "prepare"), []

    def hold(write):
        with locking.preparing(cache, "the cache", write) as waited:
            write(f"held after waiting for {waited}; the lock file names {lock.read_text()}")
            if waited is None:
                signal.pause()

    def start(uid):
        pid, says = as_user(uid, gid, hold)
        children.append(pid)
        return pid, says

    try:
        first, first_says = start(1001)
        assert first_says.readline().startswith("held after waiting for None")
        second, second_says = start(1002)
        waits = second_says.readline()
        assert f"is being prepared by process {first} " in waits, waits
        os.kill(first, signal.SIGKILL)  # its lock file stays behind, its lock goes
        held = second_says.readline()
        assert held.startswith(f"held after waiting for process {first} ") and f"names process {second} " in held, held
        os.waitpid(second, 0)
        assert not lock.exists(), "the last holder removed it"
        lock.write_text("process 1 on a node (lra-train)")  # another user's, made without the group's write
        os.chown(lock, 1001, gid)
        os.chmod(lock, 0o644)
        _, third_says = start(1002)
        assert third_says.readline().startswith("held after waiting for None"), "flock needs no write access"
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        shutil.rmtree(shared)
