"""Runs the harness's console commands for the tests, each in its own forked process.

Every command starts by importing torch, Hydra and the harness: about 5 s on 2 cores, paid by some
150 commands of the suite. This server imports them once (it runs nothing else, so no thread pool
exists yet and forking is safe) and forks a child per request. The child is a fresh process as far as
the command can tell: it gets the request's argv, working directory, environment and stdout/stderr
files and an interactive shell's signal handling (whatever the test run's own: `nohup pytest`), calls
the command's console-script entry point, runs the exit handlers and exits with its code (or dies of
its signal, which the tests see as a negative return code, as from subprocess).

Protocol, one JSON object per line: request {"command", "args", "cwd", "env", "stdout", "stderr"} on
stdin; reply {"returncode"} on stdout once the child has ended. Started by tests/conftest.py.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import signal
import sys


def shell_signal_handling() -> None:
    """Give this process the handling of SIGINT, SIGTERM and SIGHUP that one started from an interactive
    shell has, which the tests that send them assume: `nohup pytest` makes every process it starts ignore
    SIGHUP, a shell's background job (`pytest &`) SIGINT. Python's own ctrl-C handler for SIGINT (as an
    exec'd process gets anyway), the default action for the others."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _load_commands() -> dict:
    """The harness's console scripts, name → entry function (importing them is the start-up saved)."""
    return {ep.name: ep.load() for ep in importlib.metadata.entry_points(group="console_scripts")
            if ep.value.split(".")[0] in ("lra", "attention_zoo")}


def _run_child(request: dict, main, replies_fd: int) -> None:
    """In the forked child: become the command's process, run it as its console script would
    (``sys.exit(main())``), never return."""
    code = 1
    try:
        shell_signal_handling()
        os.close(replies_fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY),
                                (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            target = os.open(path, flags, 0o644)
            os.dup2(target, fd)
            os.close(target)
        sys.stdin = os.fdopen(0, "r", closefd=False)
        sys.stdout = sys.__stdout__ = os.fdopen(1, "w", closefd=False)
        sys.stderr = sys.__stderr__ = os.fdopen(2, "w", buffering=1, closefd=False)
        sys.argv = [os.path.join(os.path.dirname(sys.executable), request["command"]), *request["args"]]
        if os.environ.get("LRA_ATTENTION_MODULES"):  # what `import attention_zoo` would have imported at start-up
            from attention_zoo import user_modules
            from lra.config import register_configs

            user_modules.load()
            register_configs()
        if "OMP_NUM_THREADS" in os.environ:  # what torch would have read at start-up
            import torch
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        try:
            raise SystemExit(main())
        except SystemExit as stop:  # as the interpreter ends: None is 0, a non-int is printed and is 1
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:  # the traceback on stderr, exit status 1
            import traceback
            traceback.print_exc()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    commands = _load_commands()
    import torch._dynamo  # noqa: F401  (every training run imports it: torch.optim's first param group)

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # stray prints must not corrupt the protocol
    replies.write(json.dumps({"ready": sorted(commands)}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _run_child(request, commands[request["command"]], replies.fileno())
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    serve()
