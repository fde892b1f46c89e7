"""A command's edge: every failure one line that names the fix (disk, path, memory, configuration through
:mod:`lra.commands.composition_errors`), a bug's line with its traceback's file, the exit status."""

from __future__ import annotations

import errno
import os
from typing import Optional

from lra.commands.composition_errors import causes, explain


def log_to_file(message: str, level: str = "ERROR") -> None:
    """Log to the run's log file only, for a line the console already gets another way (an error's
    one line on stderr, a run's result on stdout)."""
    import logging

    record = logging.makeLogRecord({"name": "lra", "levelno": getattr(logging, level), "levelname": level, "msg": message})
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


DISK_ERRORS = {  # errno → the fix, for errors of the file system a command writes to
    errno.ENOSPC: "free space on that disk, or write elsewhere",
    errno.EDQUOT: "free space within your quota, or write elsewhere",
    errno.EFBIG: "raise the limit on file sizes (ulimit -f) or write to a file system that takes larger files",
    errno.ENAMETOOLONG: "use a shorter name (at most 255 bytes per path component)",
    errno.EROFS: "write to a writable file system",
    errno.EACCES: "write to a folder you may write to (or fix its permissions)",
    errno.EPERM: "write to a folder you may write to (or fix its permissions)",
    errno.EIO: "the disk failed to read or write it: check the disk (dmesg) or use another folder",
}


def os_error_line(exc: BaseException) -> Optional[str]:
    """One line for a full disk, a read-only or forbidden folder or a name too long (anywhere in
    ``exc``'s causes), or None for any other error."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno in DISK_ERRORS:
            name = str(cause.filename) if cause.filename else ""
            where = f" ({name if len(name) <= 160 else name[:70] + ' … ' + name[-70:]})" if name else ""
            fix = DISK_ERRORS[cause.errno]
            if cause.errno in (errno.EACCES, errno.EPERM) and name and _unreadable(name):
                fix = "make it readable for this user (or give a copy you may read)"
            return f"{os.strerror(cause.errno)}{where}: {fix}; nothing finished was changed"
    return None


def _unreadable(name: str) -> bool:
    """Whether ``name`` is a file or folder there that this user may not read (a refused read, not a write)."""
    return os.path.exists(name) and not os.access(name, os.R_OK | (os.X_OK if os.path.isdir(name) else 0))


def path_kind_line(exc: BaseException) -> Optional[str]:
    """One line for a file where a folder is expected (or a folder where a file is), anywhere in
    ``exc``'s causes: e.g. ``LRA_DATA_DIR/<task>`` or ``LRA_KERNEL_CACHE`` being a file; None otherwise."""
    from pathlib import Path

    for cause in causes(exc):
        loop = (isinstance(cause, RuntimeError) and str(cause).startswith("Symlink loop from ")) or (
            isinstance(cause, OSError) and cause.errno == errno.ELOOP)  # pathlib's resolve(): 3.11 / 3.13
        if loop:
            where = str(cause).split("Symlink loop from ", 1)[-1].strip("'") if isinstance(cause, RuntimeError) \
                else os.fsdecode(cause.filename or "a path")
            return (f"{where} is a loop of symbolic links (each points on to the next, never to a folder): point it "
                    "at a real folder, or choose another path")
        if not isinstance(cause, OSError) or cause.errno not in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
            continue
        # A rename names its target second: that is the path in the way, not the temporary file renamed.
        paths = [Path(os.fsdecode(name)) for name in (cause.filename2, cause.filename) if name]
        if cause.errno == errno.EISDIR:
            folder = next((path for path in paths if path.is_dir()), paths[0] if paths else None)
            if folder is not None:
                return f"{folder} is a folder where a file is expected: move it away, or choose another path"
        for path in paths:
            blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
            if blocker is not None:
                return (f"{blocker} is a file where a folder is expected: move or delete that file, or choose "
                        "another folder")
        if cause.errno == errno.EEXIST and paths:
            return f"{paths[0]} already exists: move it away, or choose another path"
    return None


MEMORY_ADVICE = {  # command → what takes less memory there
    "lra-fidelity": "leave the longest of lengths (or yoso_lengths) out, or lower batch_size or num_heads",
}
TRAINING_MEMORY_ADVICE = ("for lra-train, a larger trainer.grad_accumulation runs the same batch in smaller pieces, "
                          "or lower trainer.batch_size, trainer.eval_batch_size or trainer.max_length, or a smaller "
                          "model (model.dim, model.ff_dim, model.num_layers, task.vocab_size)")


def _memory_line(exc: BaseException) -> Optional[str]:
    import sys

    torch = sys.modules.get("torch")
    out_of_memory = (MemoryError,) + ((torch.OutOfMemoryError,) if torch is not None else ())
    for cause in causes(exc):
        cpu_allocator = isinstance(cause, RuntimeError) and "can't allocate memory" in str(cause)
        if isinstance(cause, out_of_memory) or cpu_allocator:
            detail = str(cause).strip().splitlines()[0][:200] if str(cause).strip() else type(cause).__name__
            advice = MEMORY_ADVICE.get(os.path.basename(sys.argv[0]), TRAINING_MEMORY_ADVICE)
            return f"out of memory ({detail}); {advice}"
    return None


def failure(exc: BaseException) -> Optional[tuple]:
    """The one decision of which failures have a line naming their fix: ``(line, exit status)``, or
    None for a bug (:func:`bug_line`: one line too, its traceback written to a file to report).

    An interruption (SIGINT, SIGTERM, SIGHUP: :mod:`lra.signals`) → 128 + the signal's number; bad
    input (:class:`lra.errors.UserError`: a diverged run too) → its status; the compiled kernels
    unavailable, a full disk, a read-only or forbidden folder, a name too long, a file where a folder is
    expected and memory exhausted → 1."""
    import sys

    from lra import signals
    from lra.errors import UserError

    if isinstance(exc, KeyboardInterrupt):
        interrupted = signals.as_interrupted(exc)
        advice = interrupted.advice or "what was finished is kept, what was being written is not"
        return f"{interrupted.reason}; {advice}", interrupted.exit_code
    if isinstance(exc, UserError):
        return str(exc), exc.exit_code
    kernels = sys.modules.get("attention_zoo._yoso_build")  # loaded by whoever could have raised its error
    for cause in causes(exc):
        if kernels is not None and isinstance(cause, kernels.KernelUnavailable):
            return str(cause), 1
        if isinstance(cause, UserError) and cause is exc.__cause__:  # raised through a library (Hydra's instantiate)
            return str(cause), cause.exit_code
    for line in (os_error_line(exc), path_kind_line(exc), _memory_line(exc), _killed_job_line(exc),
                 _lost_process_line(exc)):
        if line is not None:
            return line, 1
    return None


PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "communicator was aborted")


def _lost_process_line(exc: BaseException) -> Optional[str]:
    """Under torchrun, the error of a collective whose other process is gone (killed, or stopped by its own
    error): not this process's fault. The line says so and how the run resumes, on the same process count."""
    import sys

    world = os.environ.get("WORLD_SIZE", "1")
    torch = sys.modules.get("torch")
    if not world.isdigit() or int(world) < 2 or torch is None:
        return None
    network = getattr(torch.distributed, "DistNetworkError", ())
    local = os.environ.get("LOCAL_WORLD_SIZE", world)
    command = (f"torchrun --standalone --nproc_per_node={world} $(which lra-train) resume=<its folder>" if local == world
               else "the torchrun command that started it on every node, with resume=<its folder> alone")
    for cause in causes(exc):
        said = " ".join(str(cause).split())
        if isinstance(cause, network) or (isinstance(cause, RuntimeError) and any(m in said for m in PEER_GONE)):
            return (f"another process of this torchrun run stopped, and this one with it ({type(cause).__name__}: "
                    f"{said[:160]}{' …' if len(said) > 160 else ''}); the other process's output says why; then "
                    f"resume the run with {command} (each process goes on from the last checkpoint)")
    return None


# What a launcher raises when a job's process died without a word (SIGKILL: the out-of-memory killer, kill -9)
KILLED_JOB_ERRORS = ("TerminatedWorkerError", "UncompletedJobError")  # joblib's (local_gpus), submitit's


def _killed_job_line(exc: BaseException) -> Optional[str]:
    """A sweep whose launcher lost a job's process: the launcher stops the sweep (joblib ends its other workers'
    jobs too, their records left running); the same command continues it, resuming each unfinished run. The
    cause is named only as far as the launcher's error tells it: SIGKILL (the out-of-memory killer, a kill -9)
    where the exit codes say so or the job left no word at all; else the job's own last ``error:`` line."""
    import shlex
    import sys

    killed = next((cause for cause in causes(exc) if type(cause).__name__ in KILLED_JOB_ERRORS), None)
    if killed is None:
        return None
    text = str(killed)
    said = " ".join(text.split())
    if "The exit codes" in said:  # joblib: the workers' exit codes
        codes = said[said.find("The exit codes"):].split(" Detailed")[0]
        why = (f"{codes}: SIGKILL is the out-of-memory killer's signal, or a kill -9" if "SIGKILL" in codes else
               f"{codes}: the process crashed")
    elif "No error stream produced" in said or "No output/error stream" in said:  # submitit: not a word
        why = f"{said.split(' with path ')[0]}, which left no output: killed (SIGKILL: the out-of-memory killer?)"
    else:
        last = [line.strip() for line in text.splitlines() if line.strip().startswith("error:")]
        why = f"{said.split(' with path ')[0]}, whose last line was: {last[-1]}" if last else \
            f"{said.split(' with path ')[0]} (its output: {said[:160]} …)"
    callback = sys.modules.get("lra.results.callback")
    sweeps = callback.STARTED_SWEEPS if callback is not None else []
    again = f"hydra.sweep.dir={shlex.quote(str(sweeps[-1]))}" if sweeps else "the sweep's hydra.sweep.dir"
    return (f"a job of the sweep ended without its result ({type(killed).__name__}: {why}); the launcher stopped the "
            f"sweep, and the runs it was running say running; continue it with the same command and {again}: "
            f"finished jobs are kept, unfinished ones resume from their last checkpoints (lra-table lists them)")


def exit_on_known_failure(exc: BaseException) -> None:
    """End the process with one line if :func:`failure` has one for ``exc``; return otherwise."""
    import sys

    known = failure(exc)
    if known is not None:
        log_to_file(f"error: {known[0]}")
        print(f"error: {known[0]}", file=sys.stderr)
        sys.exit(known[1])


def failure_line(exc: BaseException) -> str:
    """The one line for ``exc`` without ending the process: :func:`failure`'s, or for a bug :func:`bug_line`'s
    (its traceback written to the log file), for a command that goes on with its other work."""
    known = failure(exc)
    return known[0] if known is not None else bug_line(exc)


def exit_on_failure(exc: BaseException) -> None:
    """End the process with one ``error:`` line for any ``exc``: :func:`failure`'s line and status, or
    for a bug :func:`bug_line` (its traceback in a file) and exit 1. Never returns."""
    import sys

    exit_on_known_failure(exc)
    line = f"error: {bug_line(exc)}"
    log_to_file(line)
    print(line, file=sys.stderr)
    sys.exit(1)


def bug_line(exc: BaseException) -> str:
    """The one line for an error :func:`failure` does not know (a bug, in the harness or in what it calls):
    its full traceback is written to the command's log file (the run's ``train.log``, a tool's Hydra log),
    or where it has none to a file of its own in the temporary folder; the line names the error, that file
    and what to do. Only if no file can be written does the traceback go to stderr, before the line."""
    import logging
    import sys
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = " ".join(str(exc).split())
    what = type(exc).__name__ + (f": {message if len(message) <= 300 else message[:300] + ' …'}" if message else "")
    record = logging.makeLogRecord({"name": "lra", "levelno": logging.ERROR, "levelname": "ERROR",
                                    "msg": f"unexpected {what}", "exc_info": (type(exc), exc, exc.__traceback__)})
    written = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and handler.filter(record):  # a packed run's log: its own thread's
            try:
                with open(handler.baseFilename, "a", encoding="utf-8", errors="surrogateescape") as log:
                    log.write(handler.format(record) + "\n")
                written.append(handler.baseFilename)
            except OSError:
                pass
    if not written:
        command = os.path.basename(sys.argv[0]) if os.path.basename(sys.argv[0]).startswith("lra") else "lra"
        try:
            fd, path = tempfile.mkstemp(prefix=f"{command}-traceback-", suffix=".txt")
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as file:  # argv as typed: any bytes
                file.write(" ".join([command, *sys.argv[1:]]) + "\n\n" + text)
            written.append(path)
        except OSError:
            print(text, end="", file=sys.stderr)
    where = f"its traceback is in {written[0]}" if written else "its traceback is above"
    yours = backend_of_yours(exc)
    if yours is not None:
        return f"{what} ({where}): it comes from the code of your attention backend ({yours}); fix it there"
    return (f"unexpected {what} ({where}); this is a bug in the harness, not in your input: please report it "
            f"with {'that file' if written else 'that traceback'}")


def backend_of_yours(exc: BaseException, chained: bool = True) -> Optional[str]:
    """Where in a backend of the user's (``LRA_ATTENTION_MODULES``) ``exc`` (``chained``: or an exception it was
    raised from) comes from, or None."""
    import sys

    user_modules = sys.modules.get("attention_zoo.user_modules")
    found = [exc]
    while chained and found[-1].__cause__ is not None and len(found) < 20:  # raised from (not: while handling)
        found.append(found[-1].__cause__)
    return None if user_modules is None else next(filter(None, map(user_modules.culprit, found)), None)


def exit_on_user_error(exc, folder=None) -> None:
    """End a Hydra job that met bad input: one line on stderr and the error's exit status (raising
    would add Hydra's own "Error executing job" line); a refused config leaves no folder when Hydra
    made it for this job (an empty folder the run never claimed), and so does any refusal before the run
    claims it (a pretrain.from source whose encoder is not the one its record names)."""
    import sys

    message = f"error: {exc}"
    log_to_file(message)
    if folder is not None and not folder.owned:
        folder.remove_if_empty()
    print(message, file=sys.stderr)
    sys.exit(exc.exit_code)




def at_the_edge(main):
    """Decorate a console command's ``main``: it runs under the signal policy (:mod:`lra.signals`:
    SIGINT, SIGTERM and SIGHUP interrupt it), its standard output may fail without stopping it
    (:mod:`lra.commands.streams`: a reader gone, a full disk), and every failure ends it with one ``error:``
    line instead of a traceback: what :func:`failure` knows (bad input, an interruption, a full disk, …) with
    its exit status, anything else (a bug) with exit 1 and its traceback in a file the line names (:func:`bug_line`)."""
    import functools

    from lra import signals
    from lra.commands import streams

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        with signals.interruptible(), streams.guarded():
            try:
                return main(*args, **kwargs)
            except (Exception, KeyboardInterrupt) as exc:
                exit_on_failure(exc)
            except SystemExit as exc:  # the harness's own exits pass; one raised in a backend of yours is its failure
                if backend_of_yours(exc, chained=False) is None:
                    raise
                exit_on_failure(exc)

    return wrapped


def remove_hydra_leftovers(run_dir, job_name: str) -> None:
    """A tool's refused config leaves no folder behind: remove the one Hydra made for it (its
    ``.hydra/`` and log file, nothing else) and the folder above it if that is now empty."""
    import contextlib
    import shutil
    from pathlib import Path

    run_dir = Path(run_dir)
    hydra_files = {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", f"{job_name}.log"}
    if not run_dir.is_dir() or not {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if not p.is_dir()} <= hydra_files:
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd, folder = Path.cwd().resolve(), run_dir.parent.resolve()
    while folder != cwd and cwd in folder.parents:  # the empty folders Hydra made above it (runs/profile/<date>)
        try:
            folder.rmdir()
        except OSError:
            break
        folder = folder.parent
    if cwd not in run_dir.resolve().parents and run_dir.parent.resolve() != cwd:  # outside: the one above only
        with contextlib.suppress(OSError):
            run_dir.parent.rmdir()


def one_line_user_errors(task):
    """Decorate a tool's Hydra task function (lra-profile, lra-fidelity: Hydra saves their .hydra/)
    so that its bad-input errors end the process with one line, a refused config leaving no folder, and
    any other error with one line too (:func:`exit_on_failure`: a bug's traceback in the tool's log)."""
    import functools
    import sys

    from hydra.core.hydra_config import HydraConfig

    from lra.errors import ConfigError, UserError

    @functools.wraps(task)
    def wrapped(cfg):
        try:
            return task(cfg)
        except UserError as exc:
            message = f"error: {exc}"
            log_to_file(message)
            if isinstance(exc, ConfigError):
                hydra_cfg = HydraConfig.get()
                remove_hydra_leftovers(hydra_cfg.runtime.output_dir, hydra_cfg.job.name)
            print(message, file=sys.stderr)
            sys.exit(exc.exit_code)
        except Exception as exc:  # inside Hydra's job (its log file still open), before its "Error executing job"
            exit_on_failure(exc)

    return wrapped


def run_app(run, valid_keys, check_shown=None) -> None:
    """Run a Hydra app's ``run`` so that a config mistake ends with one line (exit 2) naming the fix,
    and every other failure with one line as :func:`at_the_edge` says. Set HYDRA_FULL_ERROR=1 to see
    Hydra's own traceback of a config mistake.

    ``check_shown(overrides)``: the app's validation of a composed config, run before Hydra prints it
    for ``--cfg job|hydra|all``, so that a dry run refuses what the real run would, with the same line."""
    import os
    import sys

    from lra import signals

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        from lra.commands import streams

        with signals.interruptible(), streams.guarded():
            run()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"
    from lra.errors import UserError

    @at_the_edge
    def guarded():
        try:
            sys.argv[1:] = _options_first(sys.argv[1:])
            if check_shown is not None:
                _check_dry_run(check_shown)
            run()
        except (UserError, KeyboardInterrupt):
            raise
        except Exception as exc:
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, UserError):  # e.g. a launcher's option, raised while Hydra instantiates it
                raise cause from None
            message = explain(exc, valid_keys)
            if message is None:
                raise
            print(f"error: {message}", file=sys.stderr)
            sys.exit(2)

    guarded()


def _options_first(argv: list) -> list:
    """``argv`` with Hydra's options (-m, --cfg job, …) before the overrides when an option stands between
    overrides (``lra-train task=text -m seed=0,1``), which Hydra's parser refuses with its usage and
    "unrecognized arguments"; a command line that does not parse either way is one ConfigError line."""
    import contextlib
    import io
    import sys

    from hydra._internal.utils import get_args_parser

    from lra.errors import ConfigError

    parser, errors = get_args_parser(), io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        try:
            parser.parse_args(argv)
            return argv
        except SystemExit as stop:
            if not stop.code:  # --help, --version: Hydra answers them itself
                return argv
        try:
            overrides = parser.parse_intermixed_args(argv).overrides
        except (SystemExit, TypeError):
            problem = (errors.getvalue().strip().splitlines() or ["cannot parse the command line"])[-1]
            command = os.path.basename(sys.argv[0])
            raise ConfigError(f"{problem.split('error: ', 1)[-1]}; `{command} --help` lists its options and "
                              "--hydra-help Hydra's") from None
    remaining, options = list(overrides), []
    for token in argv:
        if remaining and token == remaining[0]:
            remaining.pop(0)
        else:
            options.append(token)
    return options + list(overrides)


def _check_dry_run(check_shown) -> None:
    """``--cfg``/``-c`` on the command line: validate the config Hydra is about to print."""
    import sys

    import contextlib
    import io

    from hydra._internal.utils import get_args_parser

    if not any(a in ("-c", "--cfg") or a.startswith("--cfg=") for a in sys.argv[1:]):
        return
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(sys.argv[1:])
    except SystemExit:  # Hydra's own parser reports a malformed command line when it runs
        return
    if args.cfg is not None and not args.multirun:  # with -m, Hydra refuses the pair itself (_run_mode_line)
        check_shown(list(args.overrides))
