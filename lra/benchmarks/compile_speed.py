"""What ``trainer.compile`` gives, and what the harness costs over a bare loop (a benchmark, not a test).

    python -m lra.benchmarks.compile_speed [--attention softmax yoso nystrom none] [--steps 5] [--batch 8]

Per backend, ListOps at length 2048: training tokens/s of the harness's own step
(``Trainer.train_step``) without and with ``trainer.compile`` (Inductor, after a warm-up that
compiles), and the first compiled step's time (the compile). Then, for the uncompiled step, a bare
loop over the same model and the same batch (forward, cross-entropy, backward, AdamW) without the
harness: the harness must stay within 5 % of it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir

from lra.commands.config_errors import at_the_edge
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.profiling.measure import timed
from lra.training import Trainer


def build(attention: str, compiled: bool, batch: int, run_dir: Path) -> Trainer:
    overrides = ["task=listops", "task.generator.num_train=400", "task.generator.num_val=8", "task.generator.num_test=8",
                 f"attention={attention}", f"trainer.batch_size={batch}", f"trainer.compile={str(compiled).lower()}",
                 "trainer.progress_bar=false"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return Trainer(cfg, run_dir, announce=lambda m: None)


def per_step(step, count: int, device) -> float:
    """Seconds per step over ``count`` steps in a row (a steady-state rate, not a best-of)."""
    return timed(lambda: [step() for _ in range(count)], device)[1] / count


def measure(attention: str, compiled: bool, steps: int, batch: int) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build(attention, compiled, batch, Path(run_dir))
        tokens = batch * trainer.max_length
        first = per_step(trainer.train_step, 1, trainer.device)  # compiles, if compiled
        trainer.train_step()
        step_s = per_step(trainer.train_step, steps, trainer.device)
        row = {"attention": trainer.label, "compile": compiled, "first_step_s": first, "step_s": step_s,
               "train_tokens_per_s": tokens / step_s}
        if not compiled:
            row["bare_step_s"] = bare_loop_step(trainer, steps)
            row["harness_overhead_pct"] = 100 * (step_s / row["bare_step_s"] - 1)
        return row


def bare_loop_step(trainer: Trainer, steps: int) -> float:
    """The same model, optimizer settings and one fixed batch, without the harness."""
    model, split = trainer.model, trainer.data.splits["train"]
    ids, masks, labels = split.gather(trainer.sampler.next_batch(), trainer.max_length)
    ids, masks, labels = [torch.from_numpy(a) for a in ids], [torch.from_numpy(m) for m in masks], torch.from_numpy(labels)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(ids, masks), labels).backward()
        optimizer.step()

    model.train()
    step()
    return per_step(step, steps, trainer.device)


@at_the_edge
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attention", nargs="+", default=["softmax", "yoso", "nystrom", "none"],
                        choices=sorted(path.stem for path in (CONF_DIR / "attention").glob("*.yaml")), metavar="NAME",
                        help="attention configs (default: softmax yoso nystrom none)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    for value, name in ((args.steps, "--steps"), (args.batch, "--batch")):
        if value < 1:
            parser.error(f"{name} {value}: it must be >= 1")
    register_configs()
    register_resolvers()
    rows = [measure(name, compiled, args.steps, args.batch) for name in args.attention for compiled in (False, True)]
    table = pd.DataFrame(rows)
    print(f"ListOps n = 2048, batch {args.batch}, {args.steps} timed steps; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(table.round(3).to_markdown(index=False, disable_numparse=True))


if __name__ == "__main__":
    main()
