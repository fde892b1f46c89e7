"""lra-gpu-check must finish inside one device window: its plan fits 9 minutes, and a step that runs
over its limit, or whose check is interrupted, is stopped as ctrl-C stops a command (the signal passed on,
a grace to record) and then killed with everything it started (no GPU work left running into the next step).
The reference slice's own tests are in test_gpu_check_reference.py."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

import attention_zoo
from command_server import shell_signal_handling
from lra.commands import gpu_check, gpu_steps


def test_the_plan_fits_nine_minutes_and_says_why_each_limit(tmp_path):
    steps = gpu_check.plan("cuda", quick=False, jobs_per_gpu=None, scratch=tmp_path)  # the default: a packed sweep
    assert sum(step.limit_s for step in steps) <= 9 * 60
    assert sum(step.limit_s for step in gpu_check.plan("cuda", quick=False, jobs_per_gpu=4, scratch=tmp_path)) <= 9 * 60
    assert all(step.basis for step in steps), [step.name for step in steps if not step.basis]
    printed = subprocess.run([sys.executable, "-m", "lra.commands.gpu_check", "--plan"], capture_output=True,
                             text=True, check=True).stdout
    assert printed.strip().splitlines()[-1] == (f"in all: {sum(step.limit_s for step in steps):.0f} s at most (a step cut "
                                                f"at its limit has {gpu_steps.STOP_GRACE_S} s more to stop)")
    assert sum(step.limit_s + step.grace_s for step in steps) <= 9.5 * 60
    for step in steps:
        assert f"{step.name}: {step.limit_s:.0f} s (" in printed
    tests = next(step for step in steps if step.name == "CUDA tests").command
    compiled = [arg for arg in tests if "compiles_with_inductor" in arg]
    assert 0 < len(compiled) <= 3 and any(arg.endswith("test_yoso_kernels.py") for arg in tests)
    # the only GPU check of the sorted (deterministic, the trainer's default) CUDA path, and of the atomic one
    assert any(arg.endswith("::test_yoso_cuda_paths_equal_the_pytorch_path_and_the_sorted_one_repeats_bitwise")
               for arg in tests)


def test_the_limits_and_their_reasons_count_every_registered_backend(tmp_path):
    """The profile, sweep and AMP limits were once still sized for 14 backends when 19 ran. They are
    counted from attention_zoo.names(), and so are the reasons: every backend is profiled (the sparse
    patterns on their eager path), every backend without a Flex path swept, the step's node ids collect (on
    any machine) to 2 AMP steps a backend without a Flex path and the one Flex test, and the limits grow
    with the count."""
    backends = attention_zoo.names()
    flex = [name for name in backends if attention_zoo.get(name).cls.has_flex_path]
    eager = [name for name in backends if name not in flex]
    assert flex and eager and gpu_check.flex_backends() == flex
    n, m, rounds = len(backends), len(eager), math.ceil(len(eager) / 4)
    steps = {step.name: step for step in gpu_check.plan("cuda", quick=False, jobs_per_gpu=4, scratch=tmp_path)}
    profile, sweep, tests = steps["profile"], steps["sweep"], steps["CUDA tests"]
    assert f"backends=[{','.join(backends)}]" in profile.command and "sparse_pattern_impl=eager" in profile.command
    assert f"attention={','.join(eager)}" in sweep.command
    assert profile.basis.startswith(f"{n} backends x 5 lengths, one process per backend")
    assert "python -m lra.benchmarks.sparse_speed" in profile.basis
    assert sweep.basis.startswith(f"{m} jobs, 4 per GPU: {rounds} rounds of ")
    packed = {step.name: step for step in gpu_check.plan("cuda", quick=False, jobs_per_gpu=None, scratch=tmp_path)}
    assert packed["sweep"].command[2:4] == ["hydra/launcher=packed", "trainer.capture=true"]
    assert packed["sweep"].basis.startswith(f"{m} jobs packed in one process")
    assert packed["sweep"].limit_s >= gpu_check.SWEEP_START_S + 3 * m
    assert f"{2 * m} AMP steps ({m} backends x fp16/bf16" in tests.basis and "projected" in tests.basis
    assert profile.limit_s >= 3 * n and sweep.limit_s >= 15 * rounds
    assert tests.limit_s >= 15 + 2 * m + 2 * 25 + gpu_check.FLEX_COMPILE_S
    node_ids = tests.command[tests.command.index("--durations=0") + 1:]
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                "-n", "0", "-m", "cuda", *node_ids], capture_output=True, text=True,
                               cwd=gpu_check.REPO_ROOT)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    items = [line for line in collected.stdout.splitlines() if "::" in line]
    amp = [item for item in items if "::test_every_backend_trains_a_step_under_autocast[" in item]
    assert sorted(amp) == sorted(f"tests/test_cuda.py::test_every_backend_trains_a_step_under_autocast[{name}-{precision}]"
                                 for name in eager for precision in ("fp16", "bf16"))
    assert [item for item in items if "test_flex_patterns.py::" in item] == [f"tests/{gpu_check.FLEX_TEST}"]
    assert sum("::test_yoso_cuda_paths_equal_the_pytorch_path" in item for item in items) == 8  # sorted and atomic, four τ
    now, more = gpu_check.limits(n, 4, flex=len(flex)), gpu_check.limits(n + 1, 4, flex=len(flex))
    assert all(more[name][0] > limit for name, (limit, _) in now.items() if name in ("pytest", "profile"))
    assert more["sweep"][0] >= now["sweep"][0]
    assert gpu_check.limits(n + 1, 4, flex=len(flex) + 1)["pytest"][0] == now["pytest"][0]  # a Flex backend: no AMP steps


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


def run_check_with(tmp_path, steps: str) -> subprocess.CompletedProcess:
    """``lra-gpu-check --device cpu --out <tmp_path>/out`` with its plan replaced by ``steps`` (the Python source of a
    list of gpu_check.Step), started as an interactive shell starts a command."""
    driver = ("import sys\n"
              "from lra.commands import gpu_check\n"
              f"gpu_check.plan = lambda *a, **k: {steps}\n"
              "sys.exit(gpu_check.main(['--device', 'cpu', '--out', sys.argv[1]]))\n")
    return subprocess.run([sys.executable, "-c", driver, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, preexec_fn=shell_signal_handling)


def stopping_step(said, takes: str, sends: str, writes: str, first: str = "") -> str:
    """A step's script that, on signal ``takes``, sends the check ``sends``, writes the Python expression
    ``writes`` (``number``: the signal's) to ``said`` and exits 0; it runs ``first``, then waits."""
    return ("import os, signal, threading\n"
            "def stop(number, frame):\n"
            f"    os.kill(os.getppid(), signal.{sends})\n"
            f"    open({str(said)!r}, 'w').write({writes})\n"
            "    raise SystemExit(0)\n"
            f"signal.signal(signal.{takes}, stop)\n"
            f"{first}\n"
            "threading.Event().wait()\n")


def test_a_signal_is_passed_on_to_the_step_which_may_finish_recording_though_another_signal_comes(tmp_path):
    """SIGHUP to the check (a closed terminal) reaches the step as SIGHUP, not as a kill: the step takes it, sends
    the check a second signal (ignored while the check stops, as lra/signals.py has it) and only then writes
    what it recorded; the check waits for it and ends with 128 + 1."""
    said = tmp_path / "said.txt"
    script = stopping_step(said, takes="SIGHUP", sends="SIGTERM", writes="signal.Signals(number).name",
                           first="os.kill(os.getppid(), signal.SIGHUP)")
    done = run_check_with(tmp_path, f"[gpu_check.Step('hung up', [sys.executable, '-c', {script!r}], 60, "
                                    "'hung.log', grace_s=60)]")
    assert done.returncode == 128 + 1, done.stderr
    assert done.stderr.startswith("error: interrupted (SIGHUP); the steps that finished") and done.stderr.count("\n") == 1
    assert said.read_text() == "SIGHUP"
    assert "| hung up | interrupted (SIGHUP) |" in (tmp_path / "out" / "summary.md").read_text()


def test_ctrl_c_while_a_step_cut_at_its_limit_stops_waits_for_the_step_then_ends_the_check(tmp_path):
    """The step's limit passes, the check sends it SIGTERM, and ctrl-C reaches the check while the step is
    still recording: the step gets its grace all the same, and the check ends after it with 128 + 2."""
    said = tmp_path / "said.txt"
    script = stopping_step(said, takes="SIGTERM", sends="SIGINT", writes="open(os.environ['LRA_STOP_NOTE']).read()")
    done = run_check_with(tmp_path, f"[gpu_check.Step('slow', [sys.executable, '-c', {script!r}], 1, 'slow.log', "
                                    "grace_s=60), gpu_check.Step('next', [sys.executable, '-c', 'print(1)'], 60, 'next.log')]")
    assert done.returncode == 128 + 2, done.stderr
    assert done.stderr.startswith("error: interrupted (ctrl-C); the steps that finished") and done.stderr.count("\n") == 1
    assert said.read_text() == "lra-gpu-check's 1 s limit for its slow step"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| slow | timed out after 1 s |" in summary and "| next | not run |" in summary


def test_a_step_stopped_has_its_grace_then_is_killed_and_learns_why(tmp_path):
    """At its limit a step's group gets SIGTERM and SIGCONT: one that stopped itself (SIGSTOP) takes it once it
    runs again, reading why from its stop note; one that ignores SIGTERM is killed once its grace is over."""
    said = tmp_path / "said.txt"
    noted = ("import os, signal\n"
             "def stop(number, frame):\n"
             f"    open({str(said)!r}, 'w').write(open(os.environ['LRA_STOP_NOTE']).read())\n"
             "    raise SystemExit(0)\n"
             "signal.signal(signal.SIGTERM, stop)\n"
             "os.kill(os.getpid(), signal.SIGSTOP)\n"
             "signal.pause()\n")
    step = gpu_check.Step("noted", [sys.executable, "-c", noted], limit_s=1, output="noted.log", grace_s=60)
    gpu_check.run_step(step, tmp_path)
    assert step.status == "timed out after 1 s" and step.seconds < 30
    assert said.read_text() == "lra-gpu-check's 1 s limit for its noted step"
    deaf = ("import signal, threading\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "threading.Event().wait()\n")
    step = gpu_check.Step("deaf", [sys.executable, "-c", deaf], limit_s=1, output="deaf.log", grace_s=2)
    gpu_check.run_step(step, tmp_path)
    assert step.status == "timed out after 1 s" and 3 <= step.seconds < 30


def test_a_passed_sweep_step_whose_table_counts_a_failed_run_fails_with_the_table_quoted(tmp_path):
    """Hydra's multirun ends well when a job fails: the step is failed from the table, the table's last lines
    its note (the quoting raised NameError once, ending lra-gpu-check before its summary)."""
    import json

    run = tmp_path / "scratch" / "sweep" / "0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"task": "listops", "attention": "softmax", "label": "Softmax",
                                                  "seed": 0, "status": "failed", "error": "RuntimeError: boom"}))
    out = tmp_path / "out"
    out.mkdir()
    step = gpu_steps.Step("sweep", ["true"], 10, status="passed")
    gpu_check.collect([step], out, tmp_path / "scratch")
    assert step.status.startswith("failed ("), step.status
    assert step.notes and step.notes[-1] == gpu_steps.tail_of(out / "sweep.md") != ""



def test_steps_runs_the_kernel_build_and_the_steps_named_alone_in_the_plans_order(tmp_path):
    """--steps kernels,tests (a short device window): the build, then the CUDA tests and the kernel benchmark,
    nothing else; the summary lists what ran; --plan prints the same steps and their total."""
    marks = tmp_path / "marks"
    marks.mkdir()
    def step(name, output):
        script = f"open({str(marks / output)!r}, 'w').write('x')"
        return f"gpu_check.Step({name!r}, [sys.executable, '-c', {script!r}], 30, {output!r})"

    every = [step(name, f"{key}.md") for key, name in (("build", "kernel build"), *gpu_check.STEP_NAMES.items())]
    driver = ("import sys\n"
              "from lra.commands import gpu_check\n"
              f"gpu_check.plan = lambda *a, **k: [{', '.join(every)}]\n"
              "sys.exit(gpu_check.main(['--device', 'cpu', '--steps', 'kernels,tests', '--out', sys.argv[1]]))\n")
    done = subprocess.run([sys.executable, "-c", driver, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in marks.iterdir()) == ["build.md", "kernels.md", "tests.md"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    ran = [line.split("|")[1].strip() for line in summary.splitlines() if line.startswith("| ") and "passed" in line]
    assert ran == ["kernel build", "CUDA tests", "kernel benchmark"]
    printed = subprocess.run([sys.executable, "-m", "lra.commands.gpu_check", "--plan", "--steps", "kernels,tests"],
                             capture_output=True, text=True, check=True).stdout
    planned = gpu_check.picked(gpu_check.plan("cuda", quick=False, jobs_per_gpu=None, scratch=tmp_path), ["kernels", "tests"])
    assert [line.split(":")[0] for line in printed.splitlines() if not line.startswith(" ")][:-1] == [
        "kernel build", "CUDA tests", "kernel benchmark"] == [s.name for s in planned]
    assert printed.splitlines()[-1].startswith(f"in all: {sum(s.limit_s for s in planned):.0f} s at most")


def test_steps_that_name_no_step_or_one_twice_or_come_with_the_reference_slice_are_one_line(capsys):
    def refused(*argv):
        with pytest.raises(SystemExit) as ended:
            gpu_check.main(["--plan", *argv])
        printed = capsys.readouterr()
        assert ended.value.code == 2 and printed.out == "", printed
        return printed.err.strip().splitlines()[-1]

    assert refused("--steps", "kernel") == ("lra-gpu-check: error: --steps kernel: not a step; the steps after the "
                                            "kernel build are tests, kernels, kernels-bert, profile, sweep")
    assert refused("--steps", "").endswith("is empty (an unset shell variable?); name at least one, or leave --steps "
                                            "out (default: tests,kernels,kernels-bert,profile,sweep)")
    assert refused("--steps", "tests,tests").endswith("--steps lists tests more than once; a step runs once: list each once")
    assert refused("--steps", "sweep", "--reference").endswith("--reference runs the reference slice alone: give one")
    assert refused("--device", "cpu", "--quick", "--steps", "kernels-bert").endswith("--quick has no BERT-shape benchmark")


def test_an_empty_folder_option_or_another_commands_out_folder_is_one_line_and_nothing_is_written(tmp_path, capsys):
    """--out "" was the working folder (its summary.md replaced); an --out holding an lra-profile report had some
    of its files replaced and the rest kept, and the check named them all as its own."""
    for option in ("--out", "--sweep-dir"):
        with pytest.raises(SystemExit) as ended:
            gpu_check.main(["--plan", "--reference", option, ""] if option == "--sweep-dir" else ["--plan", option, ""])
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert ended.value.code == 2 and line == (f"lra-gpu-check: error: argument {option}: empty (an unset shell "
                                                  "variable?); give it a folder, or leave it out"), line
    report = tmp_path / "profile"
    report.mkdir()
    (report / "profile.md").write_text("an lra-profile report")
    for plan in ([], ["--plan"]):  # the check itself, and the plan that makes the checks the real run makes
        with pytest.raises(SystemExit) as ended:
            gpu_check.main([*plan, "--device", "cpu", "--quick", "--steps", "kernels", "--out", str(report)])
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert ended.value.code != 0 and line == (
            f"error: --out {report} holds other files (profile.md) and no lra-gpu-check summary: the steps would "
            "replace some of them and leave the rest; give --out a new or empty folder (leave it out for a new dated "
            "one)"), line
    assert [p.name for p in report.iterdir()] == ["profile.md"]
    (report / "summary.md").write_text("# lra-gpu-check --quick on cpu: x\n")  # an earlier check's folder: its own
    gpu_check.refuse_another_commands_out(report)


@pytest.mark.parametrize("fails", [True, False])
def test_a_failed_steps_run_folders_are_kept_where_its_lines_say_and_a_passed_checks_scratch_is_removed(tmp_path, fails):
    """A failed step's lines name a run folder in the check's scratch folder: the folder is kept, and the
    summary and the console say where; a check whose steps all passed leaves no scratch behind."""
    record = tmp_path / "scratch-was.txt"
    script = ("import pathlib, sys\n"
              "run = pathlib.Path(sys.argv[1]) / 'tests' / '0'\n"
              "run.mkdir(parents=True)\n"
              "(run / 'train.log').write_text('what went wrong')\n"
              f"pathlib.Path({str(record)!r}).write_text(str(run.parent.parent))\n"
              f"print(f'error: the run failed; its log is {{run}}/train.log'); sys.exit({int(fails)})\n")
    driver = ("import sys\n"
              "from lra.commands import gpu_check\n"
              f"gpu_check.plan = lambda device, quick, jobs, scratch: [gpu_check.Step('tests', [sys.executable, '-c', "
              f"{script!r}, str(scratch)], 60, 'tests.log')]\n"
              "sys.exit(gpu_check.main(['--device', 'cpu', '--out', sys.argv[1]]))\n")
    done = subprocess.run([sys.executable, "-c", driver, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120)
    scratch = record.read_text()
    assert done.returncode == int(fails), done.stderr
    assert os.path.isfile(f"{scratch}/tests/0/train.log") == fails
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert (f"run folders are kept in {scratch}" in summary) == fails
    assert (f"run folders are kept in {scratch}" in done.stdout) == fails
    if fails:
        import shutil
        shutil.rmtree(scratch)
