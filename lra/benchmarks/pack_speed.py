"""Summed training throughput of K reference runs packed in one process, with and without captured
steps (a benchmark, not a test): what ``hydra/launcher=packed`` and ``trainer.capture`` buy on a GPU.

    python -m lra.benchmarks.pack_speed --device cuda [--runs 1,2,4,8] [--capture false,true] [--row yoso_32]
                                        [--steps 20] [--warmup 5] [--out FILE.md] [override ...]

Each cell builds K runs of one YOSO Table 3 ListOps row (``experiment=yoso_table3 task=listops``, checked
with lra-train's rules; seeds 0 … K-1; a 2,000-example training split of the full-length task, as
``lra.benchmarks.throughput`` uses) inside a :class:`lra.packing.Pack`, exactly as the packed launcher
runs them: each run in its own thread and CUDA stream, the turn passed on after every step. Every run
takes ``--warmup`` steps (under capture: its three eager steps and the capture), then the clock runs
from the moment all runs are warm (the device synchronized) until every run has taken ``--steps`` more.
Reported: summed training tokens per second (padded positions, as the records count them), per run, and
against K = 1 with the same capture setting. Rows are printed (and appended to ``--out``) as measured.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import torch

from lra import packing
from lra.commands.config_errors import at_the_edge
from lra.capture import EAGER_STEPS
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.profiling.measure import synchronize

SMALL_SPLITS = ["task.generator.num_train=2000", "task.generator.num_val=100", "task.generator.num_test=100"]


class Clock:
    """The packed runs' shared stopwatch: the runs pass their turns until all are warm, the last one to
    get there starts it; likewise for the end. One run holds the turn at a time, so no lock is needed."""

    def __init__(self, runs: int, device: torch.device):
        self.runs, self.device = runs, device
        self.warm = self.done = 0
        self.started = self.ended = 0.0
        self.tokens = 0

    def wait_for_all(self, counter: str) -> None:
        setattr(self, counter, getattr(self, counter) + 1)
        if getattr(self, counter) == self.runs:
            synchronize(self.device)
            setattr(self, "started" if counter == "warm" else "ended", time.perf_counter())
        while getattr(self, counter) < self.runs:
            packing.take_turn()

    def leave(self, warm: bool) -> None:
        """A run that failed counts as arrived everywhere it will not reach (the others do not wait for it)."""
        self.warm += not warm
        self.done += 1


def run_job(cfg, folder: Path, clock: Clock, warmup: int, steps: int):
    from lra.training import Trainer

    def job():
        warm = False
        try:
            trainer = Trainer(cfg, folder, announce=lambda message: None)
            for _ in range(warmup):
                trainer.train_step()
                packing.take_turn()
            warm = True
            clock.wait_for_all("warm")
            for _ in range(steps):
                clock.tokens += trainer.train_step()["tokens"]
                packing.take_turn()
        except BaseException:
            clock.leave(warm)
            raise
        clock.wait_for_all("done")

    return job


def measure(job: List[str], runs: int, capture: bool, warmup: int, steps: int) -> dict:
    from hydra import compose, initialize_config_dir

    from lra.build import resolve_device

    overrides = [*job, f"trainer.capture={str(capture).lower()}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        configs = [compose(config_name="config", overrides=[*overrides, f"seed={seed}"]) for seed in range(runs)]
    device = resolve_device(configs[0].trainer.device)
    clock = Clock(runs, device)
    with tempfile.TemporaryDirectory(prefix="lra-pack-speed-") as root:
        jobs = [run_job(cfg, Path(root) / str(index), clock, warmup, steps) for index, cfg in enumerate(configs)]
        outcomes = packing.run_packed(jobs, packing.gpu_index(device))
    errors = [outcome.error for outcome in outcomes if outcome.error is not None]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if errors:
        raise errors[0]
    seconds = clock.ended - clock.started
    return {"runs": runs, "capture": capture, "seconds": seconds, "tokens_per_s": clock.tokens / seconds,
            "per_run": clock.tokens / seconds / runs}


def table_row(result: dict, alone: float) -> str:
    return (f"| {result['runs']} | {'yes' if result['capture'] else 'no'} | {result['seconds']:.2f} | "
            f"{result['tokens_per_s'] / 1e6:.3f} | {result['per_run'] / 1e6:.3f} | {result['tokens_per_s'] / alone:.2f}x |")


@at_the_edge
def main(argv=None) -> None:
    from lra.commands.reference_slice import SETUP, check_job, table3_rows
    from lra.records import describe_device, git_commit

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    parser.add_argument("--runs", default="1,2,4,8", help="K, comma-separated (default 1,2,4,8)")
    parser.add_argument("--capture", default="false,true", help="false, true or both (default false,true)")
    parser.add_argument("--row", default="yoso_32", help="a YOSO Table 3 row (default yoso_32)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", type=Path, help="append the table's rows to this markdown file as they are measured")
    parser.add_argument("overrides", nargs="*", help="lra-train overrides after the row's (e.g. trainer.precision=bf16)")
    args = parser.parse_args(argv)
    try:
        runs = [int(value) for value in args.runs.split(",")]
        captures = [{"false": False, "true": True}[value] for value in args.capture.split(",")]
    except (ValueError, KeyError):
        parser.error(f"--runs {args.runs!r} / --capture {args.capture!r}: whole numbers >= 1 / false and true, "
                     "comma-separated")
    if min(runs) < 1 or args.steps < 1 or args.warmup <= EAGER_STEPS:
        parser.error(f"--runs and --steps must be >= 1, --warmup > {EAGER_STEPS} (a captured run's eager steps and "
                     "its capture)")
    if args.row not in table3_rows():
        parser.error(f"--row {args.row}: not a row of experiment=yoso_table3; choose one of {', '.join(table3_rows())}")
    register_configs()
    register_resolvers()
    job = [*SETUP, f"row=yoso_table3/{args.row}", f"trainer.device={args.device}", "logger=none",
           "trainer.progress_bar=false", *SMALL_SPLITS, *args.overrides]
    check_job(job)
    for capture in captures:
        check_job([*job, f"trainer.capture={str(capture).lower()}"])
    lines = [f"{args.row}, `{' '.join(job)}` on {describe_device(torch.device(args.device))}, torch {torch.__version__}, "
             f"commit {git_commit()}, {datetime.date.today()}; {args.steps} steps a run timed after {args.warmup}", "",
             "| runs | captured | seconds | Mtokens/s, summed | Mtokens/s a run | vs the first row's run |", "|--:|:--|--:|--:|--:|--:|"]
    print("\n".join(lines), flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    for capture in captures:
        alone = None  # one run's rate: the first row's per run (K = 1 first, by default)
        for count in runs:
            result = measure(job, count, capture, args.warmup, args.steps)
            alone = alone or result["per_run"]
            line = table_row(result, alone)
            print(line, flush=True)
            if args.out:
                with args.out.open("a") as out:
                    out.write(line + "\n")


if __name__ == "__main__":
    sys.exit(main())
