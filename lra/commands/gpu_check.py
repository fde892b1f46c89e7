"""lra-gpu-check: the whole GPU path in one command, its evidence in one flat folder.

    lra-gpu-check [--out DIR] [--jobs-per-gpu 4]          # on a GPU machine, <= 9 minutes
    lra-gpu-check --plan                                   # the steps, their commands and time limits; runs nothing
    lra-gpu-check --steps tests,kernels                    # the build and those steps alone (a short device window)
    lra-gpu-check --device cpu --quick                     # the same pipeline, small, on CPU (the test suite runs it)
    lra-gpu-check --reference [--runs-per-process auto]    # the long part: every backend's reference ListOps run
    lra-gpu-check --reference --rows softmax,yoso_32 --seeds 0,1 --limit-s 520   # a slice that fits one device command

Steps, each a real command in a process group of its own with a time limit (the whole group is
stopped when it runs over, below; a failed or timed-out step is recorded and the check goes on; benchmarks
write their rows as they measure them, so a cut step keeps what it measured): the kernel build
(build.log), the CUDA kernel, AMP, CUDA-graph and a small compile subset of the tests, with one
FlexAttention case (pytest.log), the YOSO kernel benchmark against eager softmax and SDPA (kernels.md;
kernels_bert.md at the BERT-base attention shape, 12 heads of 64), ``lra-profile`` of every backend
(profile.csv, profile.png), a short ListOps sweep of every backend without a Flex path, packed in one
process and, on a GPU, captured as CUDA graphs (sweep.md; ``--jobs-per-gpu N``: N processes, eager);
summary.md says what ran, how long, and what failed. ``--reference`` instead sweeps
``experiment=yoso_table3 task=listops`` (every row of the YOSO paper's Table 3 or ``--rows``, the seeds
of ``--seeds``; 5,000 steps, n = 2048; its runs packed in one process, ``--runs-per-process`` at a time,
default auto: lra/packing.py; ``--jobs-per-gpu N``: N processes instead) into reference.md, and packs every run's record (its
metrics.json, with the resolved config it trained, resolved.yaml, and its overrides.yaml) into
reference-records.tar.gz: slices run on different machines or days make one table together
(``lra-table`` over the unpacked records). Its options and overrides are checked before anything runs,
every job's config composed and validated as ``lra-train`` validates it (lra/commands/reference_slice.py).

The fixed sparse patterns with a FlexAttention path (``has_flex_path``: Local, Longformer, BigBird, Sparse
Transformer) take it on CUDA by default, compiled by Inductor: a cold compile of one pattern's forward and
backward is projected at ~25-35 s on an H100, which these 9 minutes have no room for in every step. So
the profile runs them on their eager path (``sparse_pattern_impl=eager``), the AMP tests and the sweep
leave them out, and one Flex test (Longformer, n = 333, outputs and gradients against the eager path)
checks the Flex path; its speed is measured by ``python -m lra.benchmarks.sparse_speed``.

A step stops as a user's ctrl-C stops a command (lra/signals.py): at its time limit its process group
is sent SIGTERM (and SIGCONT, for a stopped process), and a signal to this command (SIGINT, SIGTERM,
SIGHUP) is passed on to it; the step then has a bounded grace period to end (every lra-train run records
``interrupted``, with the time limit as the reason at a cut) before what is left is killed. The same
command with the same ``--sweep-dir`` continues a cut or interrupted slice, each unfinished run resumed.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import attention_zoo
from lra import signals
from lra.commands.config_errors import at_the_edge
from lra.commands.gpu_steps import Step, error_line, keep_scratch_of_failures, run_step, tail_of
from lra.commands.reference_slice import Slice, check_sweep_dir, listed, pack_records, table3_rows, TABLE3_ROWS
from lra.errors import UserError
from lra.io import atomic_write_text, check_output_folder
from lra.records import REPO_ROOT, git_commit
from lra.run import hydra_value

OUTPUTS = ("summary.md", "build.log", "pytest.log", "kernels.md", "kernels_bert.md", "profile.csv", "profile.png",
           "sweep.md", "reference.md", "reference-records.tar.gz")
# --steps' names for the steps after the kernel build, which always runs first (every other step loads the kernels).
STEP_NAMES = {"tests": "CUDA tests", "kernels": "kernel benchmark", "kernels-bert": "kernel benchmark, BERT-base attention shape",
              "profile": "profile", "sweep": "sweep"}
REFERENCE_GRACE_S = 30  # a reference slice's: its runs record `interrupted` (seconds on a GPU), kept for a resume


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


# Time limits on an H100 (seconds) and why: 9 minutes in all (a device command may run 10). Three steps run
# every backend, or every backend without a Flex path, so their limits are counted from attention_zoo.names()
# (an audit once found them still sized for 14 backends when 19 were registered; test_gpu_check checks the
# counts in the reasons). Measured on 2026-11-27 (the first GPU run, commit 75da463, torch 2.11.0+cu130):
# build 47 s (H100) and 36 s (H200), kernel benchmark 41 s, BERT shape 19 s, sweep 75 s (H100); profile 4-12 s
# a backend, 17 backends in 115 s (H200), where 4 s a backend had cut the H100 run at 80 s after 11 of 19.
# The second run (H100, commit 6275fa5, docs/gpu/2026-11-27b): the CUDA tests 53 s (52 tests; YOSO's Inductor
# compile 9.9 s, its CUDA-graph capture 16.2 s, each AMP step <= 0.6 s), profile 133 s, sweep 73 s. None of
# these ran a Flex path (it came later): its compile time is a projection.
COMPILE_SUBSET = ("yoso",)  # the CUDA-test step's cold Inductor compiles (softmax, lsh: `pytest -m cuda`)
CUDA_PATHS = "test_yoso_cuda_paths_equal_the_pytorch_path_and_the_sorted_one_repeats_bitwise"  # 8 cases
WIDE_SORTS = "test_the_counting_sort_past_48_kb_gives_the_cpu_kernels_results"  # 4: τ 14, 15 × both paths
FLEX_TEST = "test_flex_patterns.py::test_flex_cuda_outputs_and_gradients_equal_eager[longformer-False-333]"
PYTEST_START_S, AMP_STEP_S, KERNEL_TESTS_S, CUDA_PATHS_S, WIDE_SORTS_S, COMPILE_S = 15, 1.0, 12, 8, 6, 25
FLEX_COMPILE_S = 35  # projected, not measured: one pattern's forward and backward compiled cold
PROFILE_BACKEND_S = 8  # one process per backend: 4-12 s each on an H200 (start-up, CUDA init, 5 lengths)
SWEEP_ROUND_S = 18  # ~10 s start-up (a 3,200-example generated set), 100 steps, two evaluations
SWEEP_START_S, SWEEP_RUN_S = 12, 3.5  # packed: one start-up and data; a run's 100 steps, captures and evaluations


def flex_backends() -> List[str]:
    """The registered backends with a FlexAttention path (``impl``: auto | eager | flex)."""
    return [name for name in attention_zoo.names() if attention_zoo.get(name).cls.has_flex_path]


def limits(backends: int, jobs_per_gpu: Optional[int], flex: int = 0) -> dict:
    """{step: (seconds, why)} for ``backends`` backends, ``flex`` of them with a Flex path (profiled on their
    eager path, neither AMP-tested nor swept), and the sweep's runs packed in one process, captured
    (``jobs_per_gpu`` None) or ``jobs_per_gpu`` processes at once (one GPU)."""
    eager = backends - flex
    amp = 2 * eager
    rounds = -(-eager // (jobs_per_gpu or 1))
    pytest_s = (PYTEST_START_S + amp * AMP_STEP_S + KERNEL_TESTS_S + CUDA_PATHS_S + WIDE_SORTS_S
                + (len(COMPILE_SUBSET) + 1) * COMPILE_S + FLEX_COMPILE_S)
    left_out = f"the {flex} backends with a Flex path" if flex else "no backend with a Flex path"
    return {
        "build": (65, "measured 47 s on an H100 and 36 s on an H200 (2026-11-27; the extension's sources "
                      "compile in parallel on 16 cores, so the build takes its longest source, a CPU kernel "
                      "file at -O3 -march=native, and the link); ~1.4x margin"),
        "pytest": (pytest_s, f"start-up and CUDA init ~{PYTEST_START_S} s; {amp} AMP steps ({eager} backends x "
                             f"fp16/bf16, ~{AMP_STEP_S:.0f} s each; {left_out} are left out, as under autocast "
                             f"on CUDA each would compile its pattern cold) and the kernel tests "
                             f"~{KERNEL_TESTS_S} s; the CUDA paths' 8 cases (sorted and atomic, four τ, n = 300) "
                             f"~{CUDA_PATHS_S} s (the bf16-rows test's 4 cases and the kernel tests' output-normalization "
                             f"case, added since, ~3 s more as projected); the counting sort past 48 KB against "
                             f"the CPU kernels, 4 cases (n = 8,200 and 16,400, both paths), ~{WIDE_SORTS_S} s "
                             f"projected; "
                             f"{len(COMPILE_SUBSET) + 1} cold Inductor compiles, "
                             f"{', '.join(COMPILE_SUBSET)} and YOSO's CUDA-graph capture (measured 9.9 s and 16.2 s "
                             f"on an H100, 2026-11-27: <= {COMPILE_S} s each; the whole step, then with 38 AMP "
                             f"steps, 53 s); one Flex test, Longformer's outputs and gradients at n = 333, one cold "
                             f"compile of its forward and backward: ~25-35 s projected on an H100, not measured "
                             f"(<= {FLEX_COMPILE_S} s)"),
        "kernels": (58, "measured 41 s on an H100 (2026-11-27) before the CUDA-graph cell (~1.5 s a length more); one process, 10 cells x 7 lengths, best of 3 after a warm-up (9 calls a cell), ~10 s of "
                        "measuring: SDPA fp32 (no FlashAttention) ~0.3 s a call at 16 x 32,768^2, eager fp32 ~0.1 s "
                        "at 16,384 and out of memory at once at 32,768, the 4 kernel YOSO cells ~1 s in all as "
                        "projected (<= 27 ms a call at 32,768, YOSO-64; lra.benchmarks.yoso_cost), ~10 s were the "
                        "projection 10x short, the PyTorch YOSO cell a few s; ~10 s start-up; the bf16-rows YOSO cell, added since, "
                        "under 1 s more as projected"),
        "bert": (30, "measured 19 s on an H100 before the CUDA-graph cell; 4 lengths x 10 cells at 12 heads of 64, one process: the largest, eager fp32 at 4,096, "
                     "~5 ms a call; ~10 s start-up"),
        "profile": (PROFILE_BACKEND_S * backends + 4,
                    f"{backends} backends x 5 lengths, one process per backend: 4-12 s each on an H200, 17 in "
                    f"115 s, and 19 in 133 s on an H100 (start-up, CUDA init and measuring): ~{PROFILE_BACKEND_S} s "
                    f"a backend; the command's start-up, report and plot ~4 s; {left_out} run their eager path "
                    f"(sparse_pattern_impl=eager), the path those times were measured on: a cold Flex compile "
                    f"a backend (~25-35 s projected) has no room here, and the Flex path's speed is measured by "
                    f"python -m lra.benchmarks.sparse_speed instead"),
        "sweep": ((SWEEP_ROUND_S * rounds,
                   f"{eager} jobs, {jobs_per_gpu} per GPU: {rounds} rounds of ~10 s start-up (a 3,200-example "
                   f"generated set) and 100 steps at n = 2,048 (YOSO's attention 2 x 2.1 ms a step projected, "
                   f"2 x 12.9 ms with the earlier kernels: <= 3 s) and two evaluations: ~{SWEEP_ROUND_S} s "
                   f"a round; {left_out} are not swept: each job would compile its pattern cold (~25-35 s "
                   f"projected), and no one override sets their impl=eager alone (YOSO's impl option takes other "
                   f"values)") if jobs_per_gpu else
                  (math.ceil(SWEEP_START_S + SWEEP_RUN_S * eager),
                   f"{eager} jobs packed in one process (hydra/launcher=packed, auto), their steps and evaluation "
                   f"batches captured as CUDA graphs (trainer.capture=true): the first GPU run of both, each "
                   f"backend's capture recorded completed or failed with its reason; projected, not measured: "
                   f"~{SWEEP_START_S} s start-up and a 3,200-example generated set, then per run ~{SWEEP_RUN_S} s "
                   f"(100 steps at n = 2,048 queued by one host thread, eager until each run's 4th step, two "
                   f"captures, two evaluations); {left_out} are not swept: each would compile its pattern cold "
                   f"(~25-35 s projected), and no one override sets their impl=eager alone")),
    }


def cuda_tests(tests: Path, quick: bool) -> List[str]:
    """The node ids of the CUDA-test step: the AMP steps of every backend without a Flex path, the kernel
    tests, both CUDA cumulation paths of YOSO against the PyTorch path (the sorted one, the trainer's
    default, bitwise repeatable), the counting sort past 48 KB of counters against the CPU kernels, the
    CUDA-graph replay of YOSO, a small Inductor subset and one Flex
    pattern against its eager path (each cold compile costs tens of seconds; the full set is ``pytest -m cuda``)."""
    if quick:
        return [str(tests / "test_cuda.py"), str(tests / "test_yoso_kernels.py")]
    cuda = tests / "test_cuda.py"
    flex = flex_backends()
    amp = [f"{cuda}::test_every_backend_trains_a_step_under_autocast[{name}-{precision}]"
           for name in attention_zoo.names() if name not in flex for precision in ("fp16", "bf16")]
    compiled = [f"{cuda}::test_every_backend_compiles_with_inductor_on_cuda_and_matches_eager[{name}]"
                for name in COMPILE_SUBSET]
    # The kernels' correctness first, the cold compiles last: a step cut at its limit keeps what matters most.
    return [str(tests / "test_yoso_kernels.py"), f"{cuda}::{CUDA_PATHS}", f"{cuda}::{WIDE_SORTS}",
            str(tests / "test_yoso_bf16_rows.py"), *amp,
            f"{cuda}::test_sampling_backends_replay_under_cuda_graphs[yoso]", *compiled, str(tests / FLEX_TEST)]


def plan(device: str, quick: bool, jobs_per_gpu: Optional[int], scratch: Path) -> List[Step]:
    backends = attention_zoo.names()
    tests = REPO_ROOT / "tests"
    if quick:
        lengths, cells, sweep_backends = ["128"], ["YOSO-16"], ["softmax", "yoso"]
        profile = ["preset=smoke", "backends=[yoso]", "lengths=[128]"]
        sweep = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "task.generator.num_train=64",
                 "task.generator.num_val=16", "task.generator.num_test=16", "task.generator.min_length=20",
                 "task.generator.max_length=120",
                 "task.max_length=128"]
        limits_s, bases = {"build": 300, "pytest": 240, "kernels": 120, "profile": 240, "sweep": 240}, {}
    else:
        lengths = ["512", "1024", "2048", "4096", "8192", "16384", "32768"]
        flex = flex_backends()
        cells, sweep_backends = None, [name for name in backends if name not in flex]
        profile = [f"backends=[{','.join(backends)}]", "sparse_pattern_impl=eager"]
        sweep = ["task=listops", "trainer.max_steps=100", "trainer.warmup_steps=10", "trainer.eval_every=50",  # n = 2048
                 "task.generator.num_train=3200", "task.generator.num_val=256", "task.generator.num_test=256"]
        table = limits(len(backends), jobs_per_gpu, flex=len(flex))
        limits_s = {name: limit for name, (limit, _) in table.items()}
        bases = {name: basis for name, (_, basis) in table.items()}
    if jobs_per_gpu:  # no more workers than jobs (each a process)
        launcher = ["hydra/launcher=local_gpus", f"hydra.launcher.jobs_per_gpu={min(jobs_per_gpu, len(sweep_backends))}"]
    else:  # packed; on a GPU captured too: both features' first GPU run
        launcher = ["hydra/launcher=packed", *(["trainer.capture=true"] if device == "cuda" else [])]
    benchmark = [sys.executable, "-m", "lra.benchmarks.yoso_speed", "--device", device]
    bench = [*benchmark, "--lengths", *lengths]
    if cells:
        bench += ["--cells", *cells, "--repeats", "1"]
    return [
        Step("kernel build", [_tool("lra-build-kernels"), device], limits_s["build"], "build.log", basis=bases.get("build", "")),
        Step("CUDA tests", [sys.executable, "-m", "pytest", "-m", "cuda", "-v", "-n", "0", "-p", "no:cacheprovider",
                            "--durations=0", *cuda_tests(tests, quick)], limits_s["pytest"], "pytest.log", cwd=REPO_ROOT,
             basis=bases.get("pytest", ""))
        if tests.is_dir() else Step("CUDA tests", [], 0, "pytest.log", notes=["tests/ not found: run from a checkout"]),
        Step("kernel benchmark", bench, limits_s["kernels"], "kernels.md", basis=bases.get("kernels", "")),
        *([] if quick else [Step("kernel benchmark, BERT-base attention shape",  # 12 heads of 64, one sequence
                                 [*benchmark, "--lengths", "512", "1024", "2048", "4096",
                                  "--batch-heads", "12", "--head-dim", "64"], limits_s["bert"], "kernels_bert.md",
                                 basis=bases["bert"])]),
        Step("profile", [_tool("lra-profile"), f"device={device}", *profile, f"hydra.run.dir={hydra_value(scratch / 'profile')}"],
             limits_s["profile"], basis=bases.get("profile", "")),
        Step("sweep", [_tool("lra-train"), "-m", *launcher, f"attention={','.join(sweep_backends)}",
                       f"trainer.device={device}", "logger=none", *sweep, f"hydra.sweep.dir={hydra_value(scratch / 'sweep')}"],
             limits_s["sweep"], basis=bases.get("sweep", "")),
    ]


def picked(steps: List[Step], names: Optional[List[str]]) -> List[Step]:
    """The kernel build and the steps ``names`` (--steps) picks among ``steps``, in the plan's order; all when None."""
    wanted = None if names is None else {"kernel build", *(STEP_NAMES[name] for name in names)}
    return [step for step in steps if wanted is None or step.name in wanted]


def describe(steps: List[Step]) -> str:
    """``--plan``: each step's limit, why, and its command; the total."""
    lines = []
    for step in steps:
        lines += [f"{step.name}: {step.limit_s:.0f} s" + (f" ({step.basis})" if step.basis else ""),
                  "    $ " + shlex.join(step.command)]
    lines.append(f"in all: {sum(s.limit_s for s in steps):.0f} s at most (a step cut at its limit has "
                 f"{max(s.grace_s for s in steps):.0f} s more to stop)")
    return "\n".join(lines)


def reference_plan(planned: Slice, scratch: Path, limit_s: float = 24 * 3600, sweep_dir: Optional[Path] = None,
                   jobs: Optional[int] = None) -> List[Step]:
    """The reference ListOps runs of the slice ``planned`` (``jobs`` of them, when counted). The sweep folder
    is ``sweep_dir`` when given (kept; the same command continues it: finished runs kept, cut or interrupted
    ones resumed), else a scratch folder removed at the end."""
    counted = f"{jobs} job{'s' * (jobs != 1)}: " if jobs is not None else ""
    return [Step("reference ListOps", [_tool("lra-train"), "-m", *planned.command(sweep_dir or scratch / "reference")],
                 limit_s, grace_s=REFERENCE_GRACE_S, limit_name=f"the slice's time limit, --limit-s {limit_s:g}",
                 basis=f"{counted}{len(planned.rows)} row{'s' * (len(planned.rows) != 1)} x seeds {','.join(planned.seeds)}, "
                       f"{planned.sharing()}")]


def collect(steps: List[Step], out: Path, scratch: Path, reference_dir: Optional[Path] = None) -> None:
    """Copy the files worth keeping out of the scratch runs; tabulate the sweeps (a sweep with a failed
    or missing run fails its step: Hydra's multirun itself ends well when jobs fail)."""
    for name in ("profile.csv", "profile.png"):
        found = sorted((scratch / "profile").glob(name))
        if found:
            shutil.copy(found[0], out / name)
    for sweep, target, reference in (("sweep", "sweep.md", []), ("reference", "reference.md", ["--reference", "yoso", "--runs"])):
        folder = reference_dir if sweep == "reference" and reference_dir else scratch / sweep
        if folder.is_dir():
            table = subprocess.run([_tool("lra-table"), str(folder), "--efficiency", *reference],
                                   capture_output=True, text=True)
            atomic_write_text(out / target, table.stdout + (f"\n{table.stderr}" if table.returncode else ""))
            if sweep == "reference":
                pack_records(folder, out / "reference-records.tar.gz")
            counts = [line for line in table.stdout.splitlines() if line.startswith("runs:")]
            step = next(s for s in steps if s.name in ("sweep", "reference ListOps"))
            if step.status == "passed" and (not counts or "completed" not in counts[-1] or "failed" in counts[-1]):
                step.status = f"failed ({counts[-1] if counts else 'no runs'})"
                step.notes.append(tail_of(out / target))


def stopped_slice_note(step: Step, sweep_dir: Optional[Path]) -> str:
    """What became of a reference slice that was cut or interrupted, and how it goes on."""
    if sweep_dir is None:
        return ("Each run it was running recorded `interrupted` (reference-records.tar.gz); their checkpoints were in "
                "a scratch folder, now removed: pass --sweep-dir to keep a slice that can be continued.")
    return (f"Each run it was running recorded `interrupted` ({step.status}); the same command continues the slice "
            f"in {sweep_dir}: finished runs are kept, unfinished ones resume from their last checkpoints.")


def summary(steps: List[Step], device: str, quick: bool, total_s: float) -> str:
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else platform.processor() or "CPU"
    lines = [f"# lra-gpu-check{' --quick' if quick else ''} on {device}: {name}", "",
             f"{datetime.datetime.now().isoformat(timespec='seconds')}, commit {git_commit()}, torch {torch.__version__}, "
             f"{total_s:.0f} s in all", "", "| step | status | seconds | output |", "|:--|:--|--:|:--|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.1f} | {s.output or '-'} |" for s in steps]
    for s in steps:
        if s.notes or s.advice:
            lines += ["", f"## {s.name}: {s.status}"]
        if s.notes:
            lines += ["", "```", *s.notes, "```"]
        if s.advice:
            lines += ["", *s.advice]
    return "\n".join(lines) + "\n"


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lra-gpu-check", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Writes into --out: " + ", ".join(OUTPUTS) + " (those of the steps run).")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes (the test suite's CPU run)")
    parser.add_argument("--steps", default=None, help="the steps to run after the kernel build, comma-separated: "
                        f"{', '.join(STEP_NAMES)} (default all); not with --reference")
    parser.add_argument("--reference", action="store_true", help="run only the long part: every backend's reference ListOps run")
    parser.add_argument("--jobs-per-gpu", type=int, default=None, help="run the sweep (with --reference: the slice) as "
                        "that many processes sharing the GPU, instead of packed in one process (the default)")
    parser.add_argument("--runs-per-process", default=None, help="with --reference: runs packed in one process, "
                        "their steps interleaved (hydra/launcher=packed): a number, or auto (default; 8 on an H100)")
    parser.add_argument("--rows", default=None, help="with --reference: Table 3 rows, comma-separated (default every "
                        "row of conf/row/yoso_table3)")
    parser.add_argument("--seeds", default=None, help="with --reference: seeds, comma-separated (default 0)")
    parser.add_argument("--sweep-dir", type=folder_argument, default=None,
                        help="with --reference: the sweep's folder, kept (default a scratch folder); the same command "
                        "continues it, here or on another machine it was unpacked on at the same path")
    parser.add_argument("--limit-s", type=float, default=None,
                        help=f"with --reference: the sweep's time limit in seconds (default a day; on a lent device "
                        f"machine, under its command limit less {REFERENCE_GRACE_S} s for the runs to record a cut and "
                        f"the table's few seconds)")
    parser.add_argument("overrides", nargs="*", help="with --reference: Hydra overrides for its runs, after the "
                        "reference setup's (e.g. trainer.max_steps=100 for a shorter check), checked as lra-train checks them")
    parser.add_argument("--plan", action="store_true", help="print the steps, their commands and limits; run nothing")
    parser.add_argument("--out", type=folder_argument, default=None, help="default: runs/gpu-check/<date>/<time>; a "
                        "new or empty folder, or an earlier lra-gpu-check's")
    return parser


def folder_argument(value: str) -> Path:
    """A folder option's value; empty (an unset shell variable) would be the working folder, its files replaced."""
    if not value.strip():
        raise argparse.ArgumentTypeError("empty (an unset shell variable?); give it a folder, or leave it out")
    return Path(value)


SUMMARY_HEAD = "# lra-gpu-check"  # how summary.md begins (summary): the folder is an earlier check's


def refuse_another_commands_out(out: Path) -> None:
    """--out holding files but no lra-gpu-check summary (an lra-profile report, say): the steps would replace
    some of them and leave the rest, one folder contradicting itself. One line, before any step runs."""
    try:
        names = sorted(entry.name for entry in out.iterdir())
    except OSError:  # missing (made later), or what check_output_folder named
        return
    summary_file = out / "summary.md"
    if not names or (summary_file.is_file() and summary_file.read_text(errors="replace").startswith(SUMMARY_HEAD)):
        return
    shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
    raise UserError(f"--out {out} holds other files ({shown}) and no lra-gpu-check summary: the steps would replace "
                    "some of them and leave the rest; give --out a new or empty folder (leave it out for a new dated one)")


def step_refused(name: str, quick: bool) -> Optional[str]:
    """Why --steps cannot run ``name``, or None."""
    if name not in STEP_NAMES:
        return f"not a step; the steps after the kernel build are {', '.join(STEP_NAMES)}"
    return "--quick has no BERT-shape benchmark" if quick and name == "kernels-bert" else None


def checked_steps(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Optional[List[str]]:
    """--steps' names (None: every step), or argparse's line and exit 2."""
    if args.steps is None:
        return None
    if args.reference:
        parser.error("--steps picks the check's own steps; --reference runs the reference slice alone: give one")
    return listed("--steps", args.steps, list(STEP_NAMES), lambda name: step_refused(name, args.quick), parser.error,
                  twice="a step runs once: list each once")


def checked_slice(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Optional[Slice]:
    """The options' own rules (argparse's line and exit 2), then, for --reference, the slice they choose."""
    if args.jobs_per_gpu is not None and args.jobs_per_gpu < 1:
        parser.error(f"--jobs-per-gpu {args.jobs_per_gpu}: it must be >= 1")
    if args.runs_per_process is not None and not (args.runs_per_process == "auto" or (
            args.runs_per_process.isascii() and args.runs_per_process.isdigit() and int(args.runs_per_process) >= 1)):
        parser.error(f"--runs-per-process {args.runs_per_process}: it must be a whole number >= 1 or auto")
    if args.limit_s is not None and not (math.isfinite(args.limit_s) and args.limit_s >= 1):
        parser.error(f"--limit-s {args.limit_s:g}: it must be a finite number of seconds ≥ 1 (no run starts in less)")
    chosen = [name for name, value in (("--rows", args.rows), ("--seeds", args.seeds), ("--limit-s", args.limit_s),
                                       ("--runs-per-process", args.runs_per_process),
                                       ("--sweep-dir", args.sweep_dir), ("overrides", args.overrides or None))
              if value is not None]
    if not args.reference:
        if chosen:
            parser.error(f"{', '.join(chosen)}: only for the --reference runs; add --reference")
        return None
    if args.quick:
        parser.error("--quick makes the check's own steps small; --reference runs the reference slice, made short by "
                     "overrides (e.g. -- trainer.max_steps=100): give one of them")
    rows = listed("--rows", args.rows, table3_rows(), lambda row: None if row in table3_rows() else (
        f"not a row of {TABLE3_ROWS.relative_to(REPO_ROOT)}; the rows are {', '.join(table3_rows())}"), parser.error)
    seeds = listed("--seeds", args.seeds, ["0"], lambda seed: None if seed.isascii() and seed.isdigit() else (
        "not a whole number >= 0; seeds are whole numbers, comma-separated (e.g. 0,1,2)"), parser.error)
    seeds = listed("--seeds", ",".join(str(int(seed)) for seed in seeds), [], lambda seed: None, parser.error)  # 007 is 7
    if args.jobs_per_gpu is not None and args.runs_per_process is not None:
        parser.error("--jobs-per-gpu runs the slice as separate processes, --runs-per-process packs it in one: give one")
    runs = str(int(args.runs_per_process)) if (args.runs_per_process or "auto") != "auto" else "auto"
    return Slice(rows, seeds, list(args.overrides), args.device, args.jobs_per_gpu, runs)


@at_the_edge
def main(argv=None) -> int:
    parser = options()
    args = parser.parse_args(argv)
    step_names = checked_steps(parser, args)
    planned = checked_slice(parser, args)
    if args.device == "cuda" and not args.plan:
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device on this machine: run lra-gpu-check on a GPU machine, or --device cpu"
                         + ("" if args.reference else " --quick"))
    jobs = None
    if planned is not None:  # lra-train's refusal of any job's config, with its line, before anything runs
        import torch

        jobs = planned.check(assume_cuda=args.plan and args.device == "cuda" and not torch.cuda.is_available())
    limit_s = args.limit_s if args.limit_s is not None else 24 * 3600
    sweep_dir = args.sweep_dir.resolve() if args.sweep_dir else None
    make_steps = (lambda scratch: reference_plan(planned, scratch, limit_s, sweep_dir, jobs)) if planned else (
        lambda scratch: picked(plan(args.device, args.quick, args.jobs_per_gpu, scratch), step_names))
    if args.plan:  # the checks the real run makes first, so that a plan that passes runs
        if args.out is not None:
            check_output_folder(args.out, "--out")
            refuse_another_commands_out(args.out)
        if sweep_dir is not None:
            check_sweep_dir(sweep_dir, planned, args.out)
        print(describe(make_steps(Path(tempfile.gettempdir()) / "lra-gpu-check-<scratch>")))
        return 0
    out = args.out or Path("runs") / "gpu-check" / datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    check_output_folder(out, "--out")  # a file there, a read-only disk: one line, before any step runs
    refuse_another_commands_out(out)
    began = time.time()
    if sweep_dir is not None:
        check_sweep_dir(sweep_dir, planned, out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="lra-gpu-check-"))
    steps = make_steps(scratch)
    try:
        try:
            for step in steps:
                print(f"[lra-gpu-check] {step.name} ...", flush=True)
                run_step(step, out)
                print(f"[lra-gpu-check] {step.name}: {step.status} ({step.seconds:.0f} s)", flush=True)
                if error_line(step):
                    print(f"[lra-gpu-check] {step.name} said: {error_line(step)}", flush=True)
                if planned is not None and step.status.startswith("timed out"):
                    step.advice.append(stopped_slice_note(step, sweep_dir))
            collect(steps, out, scratch, sweep_dir)
        except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP: the step was stopped; what ran is summarized
            interrupted = signals.as_interrupted(exc)
            for step in steps:
                if step.status == "running":
                    step.status = interrupted.reason
                    if planned is not None:
                        step.advice.append(stopped_slice_note(step, sweep_dir))
            if planned is not None and (sweep_dir or scratch / "reference").is_dir():
                pack_records(sweep_dir or scratch / "reference", out / "reference-records.tar.gz")
            atomic_write_text(out / "summary.md", summary(steps, args.device, args.quick, time.perf_counter() - started))
            interrupted.advice = f"the steps that finished are summarized in {out / 'summary.md'}" + (
                "; continue the slice with the same command" if sweep_dir is not None else "")
            raise interrupted from None
    finally:
        keep_scratch_of_failures(steps, scratch)
    atomic_write_text(out / "summary.md", summary(steps, args.device, args.quick, time.perf_counter() - started))
    written = sorted(p.name for p in out.iterdir() if p.stat().st_mtime >= began - 1)  # not an earlier check's
    print(f"[lra-gpu-check] wrote {out}/: {', '.join(written)}")
    return 0 if all(s.status in ("passed", "skipped") for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
