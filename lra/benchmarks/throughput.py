"""Training throughput vs. data-loader rate on ListOps (a benchmark, not a test).

    python -m lra.benchmarks.throughput [--attention softmax none] [--steps 10] [override ...]

For each backend: training steps per second and tokens (padded positions) per second at the
task's full length, and the rate of the loader alone (sampling + gathering + tensor conversion of
the same batches). The loader must run at >= 20x the step rate.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.profiling.measure import timed
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attention", nargs="+", default=["softmax", "none"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--loader-batches", type=int, default=200)
    parser.add_argument("overrides", nargs="*", help="config overrides (default: ListOps at length 2048, batch 32)")
    args = parser.parse_args(argv)
    register_configs()
    register_resolvers()
    # Full-length ListOps (500-2000 tokens, padded to 2048); a 2,000-example train split suffices.
    base = ["task=listops", "task.generator.num_train=2000", "task.generator.num_val=100",
            "task.generator.num_test=100", "trainer.progress_bar=false"]
    rows = [measure([*base, f"attention={name}", *args.overrides], args.steps, args.loader_batches)
            for name in args.attention]
    table = pd.DataFrame(rows).set_index("attention")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numpy {np.__version__}")
    print(table.round(2).to_markdown(disable_numparse=True))


if __name__ == "__main__":
    main()
