"""lra-gpu-check must finish inside one device window: its plan fits 9 minutes, and a step that runs
over its limit is killed with everything it started (no GPU work left running into the next step)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import attention_zoo
from conftest import SMALL_LISTOPS
from lra.commands import gpu_check


def test_the_plan_fits_nine_minutes_and_says_why_each_limit(tmp_path):
    steps = gpu_check.plan("cuda", quick=False, jobs_per_gpu=4, scratch=tmp_path)
    assert sum(step.limit_s for step in steps) <= 9 * 60
    assert all(step.basis for step in steps), [step.name for step in steps if not step.basis]
    printed = subprocess.run([sys.executable, "-m", "lra.commands.gpu_check", "--plan"], capture_output=True,
                             text=True, check=True).stdout
    assert printed.strip().splitlines()[-1] == f"in all: {sum(step.limit_s for step in steps):.0f} s at most"
    for step in steps:
        assert f"{step.name}: {step.limit_s:.0f} s (" in printed
    tests = next(step for step in steps if step.name == "CUDA tests").command
    compiled = [arg for arg in tests if "compiles_with_inductor" in arg]
    assert 0 < len(compiled) <= 3 and any(arg.endswith("test_yoso_kernels.py") for arg in tests)
    # the only GPU check of the sorted (deterministic, the trainer's default) CUDA path, and of the atomic one
    assert any(arg.endswith("::test_yoso_cuda_paths_equal_the_pytorch_path_and_the_sorted_one_repeats_bitwise")
               for arg in tests)


def test_the_limits_and_their_reasons_count_every_registered_backend(tmp_path):
    """Issue 44: the profile, sweep and AMP limits were still sized for 14 backends when 19 ran. They are
    counted from attention_zoo.names(), and so are the reasons: every backend is profiled and swept, the
    step's node ids collect (on any machine) to 2 AMP steps a backend, and the limits grow with the count."""
    backends = attention_zoo.names()
    n, rounds = len(backends), math.ceil(len(backends) / 4)
    steps = {step.name: step for step in gpu_check.plan("cuda", quick=False, jobs_per_gpu=4, scratch=tmp_path)}
    profile, sweep, tests = steps["profile"], steps["sweep"], steps["CUDA tests"]
    assert f"backends=[{','.join(backends)}]" in profile.command
    assert f"attention={','.join(backends)}" in sweep.command
    assert profile.basis.startswith(f"{n} backends x 5 lengths, one process per backend")
    assert sweep.basis.startswith(f"{n} jobs, 4 per GPU: {rounds} rounds of ")
    assert f"{2 * n} AMP steps ({n} backends x fp16/bf16" in tests.basis
    assert profile.limit_s >= 3 * n and sweep.limit_s >= 15 * rounds and tests.limit_s >= 15 + 2 * n + 2 * 25
    node_ids = tests.command[tests.command.index("--durations=0") + 1:]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "-n", "0", "-m", "cuda", *node_ids], capture_output=True, text=True,
                               cwd=gpu_check.REPO_ROOT)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    items = [line for line in collected.stdout.splitlines() if "::" in line]
    assert sum("::test_every_backend_trains_a_step_under_autocast[" in item for item in items) == 2 * n
    assert sum("::test_yoso_cuda_paths_equal_the_pytorch_path" in item for item in items) == 6  # sorted and atomic, three τ
    more = gpu_check.limits(n + 1, 4)
    assert all(more[name][0] > limit for name, (limit, _) in gpu_check.limits(n, 4).items()
               if name in ("pytest", "profile")) and more["sweep"][0] >= gpu_check.limits(n, 4)["sweep"][0]


def test_a_step_over_its_limit_is_killed_with_everything_it_started(tmp_path):
    """The step starts a grandchild (as pytest or a sweep starts workers) and outlives its limit: the
    whole process group goes, the grandchild too, and the step says it timed out."""
    marker = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
              f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(600)\n")
    step = gpu_check.Step("stuck", [sys.executable, "-c", script], limit_s=3, output="stuck.log")
    gpu_check.run_step(step, tmp_path)
    assert step.status == "timed out after 3 s" and step.seconds < 60
    grandchild = int(marker.read_text())
    try:
        os.kill(grandchild, 0)
        alive = open(f"/proc/{grandchild}/stat").read().split()[2] != "Z"  # a zombie is dead, only unreaped
    except (ProcessLookupError, FileNotFoundError):
        alive = False
    assert not alive, "the step's grandchild survived its step"


def test_a_signal_ends_the_check_with_one_line_its_step_killed_and_a_summary(tmp_path):
    """SIGTERM while a step runs (a cluster's preemption, `timeout`): the step's group is killed, summary.md
    says which step was interrupted and which ran, and the check ends with one error line and 128 + 15.
    The step itself sends the signal to the check, then blocks: the order is fixed, no sleep involved."""
    marker = tmp_path / "step.pid"
    script = ("import os, signal, threading\n"
              f"open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
              "os.kill(os.getppid(), signal.SIGTERM)\n"
              "threading.Event().wait()\n")  # blocks until its group is killed
    driver = ("import sys\n"
              "from lra.commands import gpu_check\n"
              "gpu_check.plan = lambda *a, **k: [\n"
              "    gpu_check.Step('first', [sys.executable, '-c', 'print(1)'], 60, 'first.log'),\n"
              f"    gpu_check.Step('stopped', [sys.executable, '-c', {script!r}], 60, 'stopped.log'),\n"
              "    gpu_check.Step('never', [sys.executable, '-c', 'print(3)'], 60, 'never.log')]\n"
              "sys.exit(gpu_check.main(['--device', 'cpu', '--out', sys.argv[1]]))\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", driver, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + 15, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: interrupted (SIGTERM)"), done.stderr
    assert "summary.md" in errors[0] and "Traceback" not in done.stderr
    summary = (out / "summary.md").read_text()
    assert "| first | passed |" in summary and "| stopped | interrupted (SIGTERM) |" in summary
    assert "| never | not run |" in summary and not (out / "never.log").exists()
    step = int(marker.read_text())
    try:
        alive = open(f"/proc/{step}/stat").read().split()[2] != "Z"
    except FileNotFoundError:
        alive = False
    assert not alive, "the interrupted step outlived the check"


SMOKE = ["trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2", *SMALL_LISTOPS]


def test_a_reference_slice_runs_its_rows_and_seeds_and_packs_their_records(tmp_path):
    """Issue 16: a device command runs at most 10 minutes, the reference ListOps table takes longer: --rows and
    --seeds choose a slice, and its records come back in one archive that unpacks beside other slices'."""
    import json
    import tarfile

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "lra.commands.gpu_check", "--device", "cpu", "--reference",
                           "--rows", "softmax,yoso_32", "--seeds", "0,1", "--limit-s", "300", "--out", str(out),
                           "--", *SMOKE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reference = (out / "reference.md").read_text()
    assert "runs: 4 completed" in reference
    assert "every run (4):" in reference and "| YOSO-32 | listops | 1 | completed | " in reference  # lra-table --runs
    with tarfile.open(out / "reference-records.tar.gz") as archive:
        archive.extractall(tmp_path / "records", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    names = sorted(path.parent.name for path in (tmp_path / "records").rglob("metrics.json"))
    assert names == ["softmax-seed0", "softmax-seed1", "yoso-32-seed0", "yoso-32-seed1"]
    record = json.loads((tmp_path / "records" / "yoso-32-seed1" / "metrics.json").read_text())
    assert (record["status"], record["seed"], record["task"]) == ("completed", 1, "listops")
    assert record["wall_time_seconds"] > 0 and record["device"].startswith("cpu")


def test_reference_slice_options_are_checked_before_anything_runs(tmp_path):
    def refused(*args):
        done = subprocess.run([sys.executable, "-m", "lra.commands.gpu_check", *args, "--out", str(tmp_path / "o")],
                              capture_output=True, text=True)
        assert done.returncode == 2 and not (tmp_path / "o").exists()
        return done.stderr.strip().splitlines()[-1]

    assert "--rows sofmax: not a row of conf/row/yoso_table3; the rows are linformer," in refused(
        "--reference", "--rows", "softmax,sofmax")
    assert "--seeds '0,x': whole numbers" in refused("--reference", "--seeds", "0,x")
    assert "add --reference" in refused("--rows", "softmax")
    assert "add --reference" in refused("--sweep-dir", str(tmp_path / "s"))
    assert "--limit-s 0: it must be > 0" in refused("--reference", "--limit-s", "0")
    plan = subprocess.run([sys.executable, "-m", "lra.commands.gpu_check", "--reference", "--rows", "yoso_e",
                           "--seeds", "2", "--limit-s", "540", "--plan"], capture_output=True, text=True, check=True)
    assert "row=yoso_table3/yoso_e seed=2 " in plan.stdout and plan.stdout.strip().endswith("in all: 540 s at most")


def test_a_reference_slice_cut_short_is_continued_by_the_same_command_in_its_sweep_folder(tmp_path):
    """A slice that outlives its machine (killed at step 30, as at the end of a lease) keeps its checkpoints in
    --sweep-dir; the same command there (or on another machine, unpacked at the same path) resumes the run."""
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    command = [sys.executable, "-m", "lra.commands.gpu_check", "--device", "cpu", "--reference", "--rows", "softmax",
               "--sweep-dir", str(sweep), "--limit-s", "300", "--out", str(out), "--",
               *SMALL_LISTOPS, "trainer=smoke", "trainer.max_steps=60", "trainer.eval_every=20"]
    environment = {**os.environ, "LRA_FAULT": "step:30:SIGKILL", "LRA_FAULT_ONCE": str(tmp_path / "killed-once")}
    cut = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert cut.returncode == 1, cut.stdout[-3000:] + cut.stderr[-3000:]
    (job,) = [path.parent for path in sweep.rglob("metrics.json")]
    assert (job / "checkpoints" / "last.pt").is_file()
    out.rename(tmp_path / "first-out")
    continued = subprocess.run(command, capture_output=True, text=True, timeout=600, env=environment)
    assert continued.returncode == 0, continued.stdout[-3000:] + continued.stderr[-3000:]
    assert "resumed from" in (job / "train.log").read_text() and "at step 20" in (job / "train.log").read_text()
    assert "runs: 1 completed" in (out / "reference.md").read_text()
