"""Training throughput vs. data-loader rate on ListOps, and where a reference step's time goes (a
benchmark, not a test).

    python -m lra.benchmarks.throughput [--attention softmax none] [--steps 10] [override ...]
    python -m lra.benchmarks.throughput --profile [--row softmax] [--steps 3] [--device cpu|cuda] [override ...]

Throughput: for each backend, training steps per second and tokens (padded positions) per second at
the task's full length, and the rate of the loader alone (sampling + gathering + tensor conversion of
the same batches). The loader must run at >= 20x the step rate.

``--profile``: one row of the YOSO Table 3 ListOps reference run (``experiment=yoso_table3
task=listops row=yoso_table3/<row>``), built as lra-train builds it, under torch.profiler: a training
step and a validation pass split into the attention backend, the rest of the model, the optimizer,
data and, on CUDA, host gaps, with a run's time per step (:mod:`lra.benchmarks.step_profile`).
``--length`` and ``--batch`` shrink it (trainer.max_length, trainer.batch_size) for a quick look.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from lra.commands.config_errors import at_the_edge
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.profiling.measure import timed
from lra.records import describe_device
from lra.training import Trainer


def measure(overrides, steps: int, loader_batches: int) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, Path(run_dir), announce=lambda m: None)
        trainer.train_step()  # warm-up
        # the loop never waits for the device; the clock does (timed synchronizes)
        tokens, seconds = timed(lambda: sum(trainer.train_step()["tokens"] for _ in range(steps)), trainer.device)
        step_seconds = seconds / steps

        split = trainer.data.splits["train"]
        def load_batches():
            for _ in range(loader_batches):
                ids, masks, labels = split.gather(trainer.sampler.next_batch(), trainer.max_length)
                trainer._to_device(ids), trainer._to_device(masks), torch.from_numpy(labels)

        loader_seconds = timed(load_batches, trainer.device)[1] / loader_batches
    return {
        "attention": trainer.label, "seq_len": trainer.max_length, "batch": cfg.trainer.batch_size,
        "step_s": step_seconds, "steps_per_s": 1 / step_seconds, "train_tokens_per_s": tokens / steps / step_seconds,
        "loader_batches_per_s": 1 / loader_seconds, "loader_vs_step": step_seconds / loader_seconds,
    }


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attention", nargs="+", help="throughput: the backends (default: softmax none)")
    parser.add_argument("--steps", type=int, help="timed steps (default: 10; with --profile 3 profiled steps)")
    parser.add_argument("--loader-batches", type=int, default=200)
    parser.add_argument("--profile", action="store_true", help="profile one YOSO Table 3 ListOps reference row")
    parser.add_argument("--row", help="with --profile: the row (default: softmax)")
    parser.add_argument("--warmup", type=int, help="with --profile: unprofiled steps first (default: 2)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="with --profile: trainer.device (default: auto)")
    parser.add_argument("--length", type=int, help="with --profile: trainer.max_length (default: the task's 2,048)")
    parser.add_argument("--batch", type=int, help="with --profile: trainer.batch_size (default: the task's 32)")
    parser.add_argument("overrides", nargs="*", help="config overrides (default: ListOps at length 2048, batch 32)")
    args = parser.parse_args(argv)
    for name in ("steps", "loader_batches", "length", "batch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value}: it must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup {args.warmup}: it must be >= 0")
    profile_only = [f"--{name}" for name in ("row", "warmup", "device", "length", "batch") if getattr(args, name) is not None]
    register_configs()
    register_resolvers()
    if args.profile:
        if args.attention is not None:
            parser.error("--attention is throughput's; --profile profiles a YOSO Table 3 row: use --row")
        return profile(parser, args)
    if profile_only:
        parser.error(f"{', '.join(profile_only)} only go with --profile")
    # Full-length ListOps (500-2000 tokens, padded to 2048); a 2,000-example train split suffices.
    base = ["task=listops", "task.generator.num_train=2000", "task.generator.num_val=100",
            "task.generator.num_test=100", "trainer.progress_bar=false"]
    rows = [measure([*base, f"attention={name}", *args.overrides], args.steps or 10, args.loader_batches)
            for name in args.attention or ["softmax", "none"]]
    table = pd.DataFrame(rows).set_index("attention")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numpy {np.__version__}")
    print(table.round(2).to_markdown(disable_numparse=True))


def profile(parser, args):
    """``--profile``: compose the row's reference run as lra-train does, refuse what lra-train refuses
    (its own line), build it, profile it, print the table; the :class:`StepProfile`."""
    from lra.benchmarks.step_profile import check_profilable, profile_run, report
    from lra.commands.reference_slice import SETUP, check_job, table3_rows

    row = (args.row or "softmax").removeprefix("yoso_table3/")
    if row not in table3_rows():
        parser.error(f"--row {args.row}: not a row of experiment=yoso_table3; choose one of {', '.join(table3_rows())}")
    job = [*SETUP, f"row=yoso_table3/{row}", f"trainer.device={args.device or 'auto'}", "logger=none",
           "trainer.progress_bar=false", *([f"trainer.max_length={args.length}"] if args.length else []),
           *([f"trainer.batch_size={args.batch}"] if args.batch else []), *args.overrides]
    check_job(job)  # lra-train's rules, its line and exit status 2
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=job)
    check_profilable(cfg)
    steps, warmup = args.steps or 3, 2 if args.warmup is None else args.warmup
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lra-profile-") as run_dir:
        trainer = Trainer(cfg, Path(run_dir), announce=lambda message: print(message, file=sys.stderr))
        with trainer.nondeterminism:
            result = profile_run(trainer, steps, warmup)
    load = " and ".join(", ".join(f"{value:.1f}" for value in loads) for loads in (load_at_start, os.getloadavg()))
    settings = result.settings
    header = (f"{result.label}, `lra-train {' '.join(job)}` on {describe_device(result.device)}: batch "
              f"{settings['batch']}, length {settings['length']}; {steps} training steps profiled after {warmup} "
              f"warm-up steps, one validation pass of {settings['validation']:,} examples in batches of "
              f"{settings['eval_batch']}. torch {torch.__version__}, "
              f"{len(os.sched_getaffinity(0))} cores; load average (1, 5, 15 min) {load} at the start and the end.")
    print(report(result, header))
    return result


if __name__ == "__main__":
    main()
