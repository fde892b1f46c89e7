"""Shared fixtures: an isolated data directory and runners for the real console commands."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from command_server import shell_signal_handling

REPO = Path(__file__).resolve().parent.parent


def usable_cores() -> int:
    """The cores this process may use: its affinity, capped by a container's CPU quota (cgroup v2)."""
    cores = len(os.sched_getaffinity(0))
    try:  # e.g. "200000 100000" for 2 cores
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


# The suite's own kernel cache (in the checkout's ignored build/ folder), never the user's: tests that
# break builds on purpose cannot touch it, and the user's cache is never written by a test. Finished
# builds there (the set-up's `lra-build-kernels cpu`) are copied in, read-only use of the user's cache,
# so that a fresh checkout's suite does not compile the same sources again (a minute on 2 cores).
_USER_KERNELS = Path(os.environ.get("LRA_KERNEL_CACHE") or Path.home() / ".cache" / "lra-harness" / "kernels")
_TEST_KERNELS = REPO / "build" / "test-kernels"
os.environ["LRA_KERNEL_CACHE"] = str(_TEST_KERNELS)
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(REPO / "build" / "test-inductor")  # torch.compile's, likewise


def _copy_finished_builds(source: Path, target: Path) -> None:
    sources = str(REPO / "csrc" / "yoso")
    for stamp in source.glob("lra_yoso_*/build.complete"):
        if (target / stamp.parent.name).exists():
            continue
        ninja_file = stamp.parent / "build.ninja"  # built from this checkout's sources: else ninja would
        if not ninja_file.is_file() or sources not in ninja_file.read_text():  # rebuild any unstamped copy
            continue
        staging = Path(tempfile.mkdtemp(prefix=".copy-", dir=target.mkdir(parents=True, exist_ok=True) or target))
        shutil.copytree(stamp.parent, staging / "build")
        try:  # atomic: a concurrent xdist worker's copy may win
            os.rename(staging / "build", target / stamp.parent.name)
        except OSError:
            pass
        shutil.rmtree(staging, ignore_errors=True)


if _USER_KERNELS.resolve() != _TEST_KERNELS.resolve():
    _copy_finished_builds(_USER_KERNELS, _TEST_KERNELS)
# pytest-xdist runs the suite in several workers: each gets its share of the cores for torch's
# threads (and passes it on to the commands it runs), so the workers do not oversubscribe the CPU.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, usable_cores() // _WORKERS)))

# Small generated ListOps for end-to-end runs: short expressions, short padded length.
SMALL_LISTOPS = [
    "task.generator.num_train=96", "task.generator.num_val=24", "task.generator.num_test=24",
    "task.generator.min_length=20", "task.generator.max_length=200", "task.max_length=256",
]


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per usable core (a container's share, not the host's count)."""
    return usable_cores()


# The modules that take longest on 2 cores (15 s or more each, measured with --junitxml), longest first; the
# rest follow in file order. pytest-xdist gives a worker a whole module at a time (--dist loadscope), and its
# own order (the most tests first, turned off below) left these few-test, long modules to the end, where one
# kept a worker busy for up to a minute and a half after the other had run out of modules.
LONGEST_FIRST = ("test_cuda_emulation", "test_gpu_check_reference", "test_compile", "test_kernel_build", "test_run_folder",
                 "test_config", "test_config_errors", "test_launchers", "test_pretraining", "test_lra_presets",
                 "test_training", "test_gpu_check", "test_commands", "test_profile", "test_sweep_records",
                 "test_attention_efficiency", "test_concurrent_jobs", "test_user_modules", "test_packed_runs",
                 "test_signals", "test_paper_presets", "test_flex_patterns", "test_cache_rebuild", "test_yoso_speed",
                 "test_provenance", "test_table_inputs")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist >= 3.6 reorders by default
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(item.path.stem, len(first)))  # stable: a module's tests keep their order


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lra-data")


class _CommandServer:
    """tests/command_server.py, one per xdist worker: forks each harness command from a process that has
    imported torch and the harness once, instead of paying ~5 s of start-up per command (about 150 in
    the suite), on Linux. LRA_TEST_FORK=0 runs every command as a plain subprocess instead."""

    process = None
    commands: frozenset = frozenset()

    @classmethod
    def run(cls, args, cwd, env, streams) -> "subprocess.CompletedProcess | None":
        if os.environ.get("LRA_TEST_FORK") == "0" or not sys.platform.startswith("linux"):
            return None  # macOS forbids fork after some of torch's imports; Windows has no fork
        if cls.process is None:
            cls.process = subprocess.Popen([sys.executable, str(REPO / "tests" / "command_server.py")],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           env={**os.environ, "PYTHONHASHSEED": "0"})
            cls.commands = frozenset(json.loads(cls.process.stdout.readline())["ready"])
        if args[0] not in cls.commands or env.get("PYTHONHASHSEED") != "0":
            return None
        if env.get("LRA_ATTENTION_MODULES") and args[0] in ("lra-fidelity", "lra-profile"):
            return None  # their schemas list the backends as imported at start-up, before the server forks
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder) / "stdout", Path(folder) / "stderr"
            request = {"command": args[0], "args": list(args[1:]), "cwd": str(cwd), "env": env,
                       "stdout": str(out), "stderr": str(err), **streams}
            cls.process.stdin.write(json.dumps(request) + "\n")
            cls.process.stdin.flush()
            reply = cls.process.stdout.readline()
            if not reply:
                raise RuntimeError("tests/command_server.py died; rerun with LRA_TEST_FORK=0 to see the command alone")
            code = json.loads(reply)["returncode"]
            return subprocess.CompletedProcess(list(args), code, *(path.read_text(errors="replace") if path.exists()
                                                                    else "" for path in (out, err)))


def run_command(args, cwd: Path, data_dir: Path, env_extra=None, check=True,
                streams=None) -> subprocess.CompletedProcess:
    """Run a console script as a user would, with W&B off and the given data directory. ``streams``:
    {"stdout" or "stderr": a file the command writes that stream to instead (e.g. /dev/full), read back as ""}."""
    streams = {name: str(path) for name, path in (streams or {}).items()}
    env = {**os.environ, "LRA_DATA_DIR": str(data_dir), "WANDB_MODE": "disabled", "PYTHONHASHSEED": "0"}
    env.pop("HYDRA_FULL_ERROR", None)
    env.update(env_extra or {})
    Path(cwd).mkdir(parents=True, exist_ok=True)
    result = _CommandServer.run(args, cwd, env, streams)
    if result is None:
        exe = Path(sys.executable).parent / args[0]
        with contextlib.ExitStack() as files:
            redirected = {name: files.enter_context(open(path, "w")) for name, path in streams.items()}
            # No timeout of its own: pytest-timeout bounds each test, and subprocess.run kills the command
            # when the test is interrupted (a fixed limit had failed slow machines mid-run).
            result = subprocess.run([str(exe), *args[1:]], cwd=cwd, env=env, text=True,
                                    stdout=redirected.get("stdout", subprocess.PIPE),
                                    stderr=redirected.get("stderr", subprocess.PIPE), preexec_fn=shell_signal_handling)
        result.stdout, result.stderr = result.stdout or "", result.stderr or ""
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def run_dirs(root: Path) -> list:
    return sorted(p.parent for p in (root / "runs").rglob("metrics.json"))


def one_run(root: Path, data_dir: Path, overrides: list, env_extra=None) -> Path:
    """``lra-train *overrides`` in ``root``, uninterrupted: its run folder (the reference a resumed run must equal)."""
    run_command(["lra-train", *overrides], root, data_dir, env_extra)
    (run,) = run_dirs(root)
    return run


def read_json(path: Path):
    return json.loads(Path(path).read_text())
