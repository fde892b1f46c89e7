"""Runs the harness's console commands for the tests, each in its own forked process.

Every command starts by importing torch, Hydra and the harness: about 5 s on 2 cores, paid by some
150 commands of the suite. This server imports them once (it runs nothing else, so no thread pool
exists yet and forking is safe) and forks a child per request. The child is a fresh process as far as
the command can tell: it gets the request's argv, working directory, environment and stdout/stderr
files, calls the command's console-script entry point, runs the exit handlers and exits with its code
(or dies of its signal, which the tests see as a negative return code, as from subprocess).

Protocol, one JSON object per line: request {"command", "args", "cwd", "env", "stdout", "stderr"} on
stdin; reply {"returncode"} on stdout once the child has ended. Started by tests/conftest.py.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import sys


def _entry_points() -> dict:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group="console_scripts")
            if ep.value.split(".")[0] in ("lra", "attention_zoo")}


def _run_child(request: dict, entry, replies_fd: int) -> None:
    """In the forked child: become the command's process, run it, never return."""
    code = 1
    try:
        os.close(replies_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = os.fdopen(0, "r", closefd=False)
        sys.stdout = sys.__stdout__ = os.fdopen(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = os.fdopen(2, "w", buffering=1, closefd=False)
        sys.argv = [os.path.join(os.path.dirname(sys.executable), request["command"]), *request["args"]]
        if "OMP_NUM_THREADS" in os.environ:  # what torch would have read at start-up
            import torch
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        try:
            result = entry.load()()
            code = 0 if result is None else result if isinstance(result, int) else 1
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if stop.code is not None and not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr)
        except BaseException:  # as the interpreter would: the traceback on stderr, exit status 1
            import traceback
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    entries = _entry_points()
    for entry in entries.values():  # the imports every command would pay for
        entry.load()
    import torch._dynamo  # noqa: F401  (every training run imports it: torch.optim's first param group)

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints must not corrupt the protocol
    replies.write(json.dumps({"ready": sorted(entries)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request, entries[request["command"]], replies.fileno())
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    serve()
