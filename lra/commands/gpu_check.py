"""lra-gpu-check: the whole GPU path in one command, its evidence in one flat folder.

    lra-gpu-check [--out DIR] [--jobs-per-gpu 4]          # on a GPU machine, <= 9 minutes
    lra-gpu-check --device cpu --quick                     # the same pipeline, small, on CPU (the test suite runs it)
    lra-gpu-check --reference [--jobs-per-gpu 4]           # the long part: every backend's reference ListOps run

Steps, each a real command with a time limit (a failed or timed-out step is recorded and the
check goes on): the kernel build (build.log), ``pytest -m cuda`` from the checkout (pytest.log),
the YOSO kernel benchmark against eager softmax and SDPA (kernels.md; kernels_bert.md at the
BERT-base attention shape, 12 heads of 64), ``lra-profile`` of every
backend (profile.csv, profile.png), a short concurrent ListOps sweep of every backend, several jobs
per GPU (sweep.md); summary.md says what ran, how long, and what failed. ``--reference`` instead
sweeps ``experiment=yoso_table3 task=listops`` (every row, 5,000 steps, n = 2048) into reference.md.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import attention_zoo
from lra.records import REPO_ROOT, git_commit

OUTPUTS = ("summary.md", "build.log", "pytest.log", "kernels.md", "kernels_bert.md", "profile.csv", "profile.png",
           "sweep.md", "reference.md")


@dataclass
class Step:
    name: str
    command: List[str]
    limit_s: float
    output: Optional[str] = None  # the file its standard output and error go to
    cwd: Optional[Path] = None
    seconds: float = 0.0
    status: str = "not run"
    notes: List[str] = field(default_factory=list)


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def plan(device: str, quick: bool, jobs_per_gpu: int, scratch: Path) -> List[Step]:
    backends = attention_zoo.names()
    tests = REPO_ROOT / "tests"
    if quick:
        lengths, cells, sweep_backends = ["128"], ["YOSO-16"], ["softmax", "yoso"]
        profile = ["preset=smoke", "backends=[yoso]", "lengths=[128]"]
        sweep = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "task.generator.num_train=64",
                 "task.generator.num_val=16", "task.generator.num_test=16", "task.generator.min_length=20",
                 "task.generator.max_length=120",
                 "task.max_length=128"]
        limits = {"build": 300, "pytest": 240, "kernels": 120, "profile": 240, "sweep": 240}
    else:
        lengths = ["512", "1024", "2048", "4096", "8192", "16384", "32768"]
        cells, sweep_backends = None, backends
        profile = [f"backends=[{','.join(backends)}]"]
        sweep = ["task=listops", "trainer.max_steps=100", "trainer.warmup_steps=10", "trainer.eval_every=50"]  # n = 2048, batch 32
        limits = {"build": 120, "pytest": 120, "kernels": 75, "bert": 45, "profile": 75, "sweep": 60}
    benchmark = [sys.executable, "-m", "lra.benchmarks.yoso_speed", "--device", device]
    bench = [*benchmark, "--lengths", *lengths]
    if cells:
        bench += ["--cells", *cells, "--repeats", "1"]
    return [
        Step("kernel build", [_tool("lra-build-kernels"), device], limits["build"], "build.log"),
        Step("CUDA tests", [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-n", "0", "-p", "no:cacheprovider",
                            "--durations=0", *([str(tests / "test_cuda.py"), str(tests / "test_yoso_kernels.py")]
                                               if quick else [str(tests)])], limits["pytest"], "pytest.log", cwd=REPO_ROOT)
        if tests.is_dir() else Step("CUDA tests", [], 0, "pytest.log", notes=["tests/ not found: run from a checkout"]),
        Step("kernel benchmark", bench, limits["kernels"], "kernels.md"),
        *([] if quick else [Step("kernel benchmark, BERT-base attention shape",  # 12 heads of 64, one sequence
                                 [*benchmark, "--lengths", "512", "1024", "2048", "4096",
                                  "--batch-heads", "12", "--head-dim", "64"], limits["bert"], "kernels_bert.md")]),
        Step("profile", [_tool("lra-profile"), f"device={device}", *profile, f"hydra.run.dir={scratch / 'profile'}"],
             limits["profile"]),
        Step("sweep", [_tool("lra-train"), "-m", "hydra/launcher=local_gpus", f"hydra.launcher.jobs_per_gpu={jobs_per_gpu}",
                       f"attention={','.join(sweep_backends)}", f"trainer.device={device}", "logger=none", *sweep,
                       f"hydra.sweep.dir={scratch / 'sweep'}"], limits["sweep"]),
    ]


def reference_plan(device: str, jobs_per_gpu: int, scratch: Path) -> List[Step]:
    return [Step("reference ListOps", [_tool("lra-train"), "-m", "hydra/launcher=local_gpus",
                                       f"hydra.launcher.jobs_per_gpu={jobs_per_gpu}", "experiment=yoso_table3",
                                       "task=listops", f"trainer.device={device}", "logger=none",
                                       f"hydra.sweep.dir={scratch / 'reference'}"], 24 * 3600)]


def run_step(step: Step, out: Path) -> None:
    if not step.command:
        step.status = "skipped"
        return
    started = time.perf_counter()
    target = out / step.output if step.output else out / ".step.log"
    with open(target, "w") as log:
        log.write("$ " + " ".join(step.command) + "\n")
        log.flush()
        try:
            code = subprocess.run(step.command, stdout=log, stderr=subprocess.STDOUT, cwd=step.cwd,
                                  timeout=step.limit_s).returncode
            step.status = "passed" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            step.status = f"timed out after {step.limit_s:.0f} s"
    step.seconds = time.perf_counter() - started
    if step.status != "passed":
        step.notes.append(_tail(target))
    if not step.output:
        target.unlink()


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.is_file() else []
    return "\n".join(text[-lines:])


def collect(steps: List[Step], out: Path, scratch: Path) -> None:
    """Copy the files worth keeping out of the scratch runs; tabulate the sweeps (a sweep with a failed
    or missing run fails its step: Hydra's multirun itself ends well when jobs fail)."""
    for name in ("profile.csv", "profile.png"):
        found = sorted((scratch / "profile").glob(name))
        if found:
            shutil.copy(found[0], out / name)
    for sweep, target, reference in (("sweep", "sweep.md", []), ("reference", "reference.md", ["--reference", "yoso"])):
        folder = scratch / sweep
        if folder.is_dir():
            table = subprocess.run([_tool("lra-table"), str(folder), "--efficiency", *reference],
                                   capture_output=True, text=True)
            (out / target).write_text(table.stdout + (f"\n{table.stderr}" if table.returncode else ""))
            counts = [line for line in table.stdout.splitlines() if line.startswith("runs:")]
            step = next(s for s in steps if s.name in ("sweep", "reference ListOps"))
            if step.status == "passed" and (not counts or "completed" not in counts[-1] or "failed" in counts[-1]):
                step.status = f"failed ({counts[-1] if counts else 'no runs'})"
                step.notes.append(_tail(out / target))


def summary(steps: List[Step], device: str, quick: bool, total_s: float) -> str:
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else platform.processor() or "CPU"
    lines = [f"# lra-gpu-check{' --quick' if quick else ''} on {device}: {name}", "",
             f"{datetime.datetime.now().isoformat(timespec='seconds')}, commit {git_commit()}, torch {torch.__version__}, "
             f"{total_s:.0f} s in all", "", "| step | status | seconds | output |", "|:--|:--|--:|:--|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.1f} | {s.output or '-'} |" for s in steps]
    for s in steps:
        if s.notes:
            lines += ["", f"## {s.name}: {s.status}", "", "```", *s.notes, "```"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lra-gpu-check", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Writes into --out: " + ", ".join(OUTPUTS) + " (those of the steps run).")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="small sizes (the test suite's CPU run)")
    parser.add_argument("--reference", action="store_true", help="run only the long part: every backend's reference ListOps run")
    parser.add_argument("--jobs-per-gpu", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None, help="default: runs/gpu-check/<date>/<time>")
    args = parser.parse_args(argv)
    if args.jobs_per_gpu < 1:
        parser.error(f"--jobs-per-gpu {args.jobs_per_gpu}: it must be >= 1")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("no CUDA device on this machine: run lra-gpu-check on a GPU machine, or --device cpu --quick")
    out = args.out or Path("runs") / "gpu-check" / datetime.datetime.now().strftime("%Y-%m-%d/%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lra-gpu-check-") as scratch_name:
        scratch = Path(scratch_name)
        steps = (reference_plan(args.device, args.jobs_per_gpu, scratch) if args.reference
                 else plan(args.device, args.quick, args.jobs_per_gpu, scratch))
        for step in steps:
            print(f"[lra-gpu-check] {step.name} ...", flush=True)
            run_step(step, out)
            print(f"[lra-gpu-check] {step.name}: {step.status} ({step.seconds:.0f} s)", flush=True)
        collect(steps, out, scratch)
    (out / "summary.md").write_text(summary(steps, args.device, args.quick, time.perf_counter() - started))
    print(f"[lra-gpu-check] wrote {out}/: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0 if all(s.status in ("passed", "skipped") for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
