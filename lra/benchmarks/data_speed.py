"""Data preparation and loading rates for every task and source (a benchmark, not a test).

    python -m lra.benchmarks.data_speed [--scale 1.0] [--steps 2]

Builds synthetic fixtures of realistic sizes in the official layouts (IMDb reviews of ~1,300 bytes,
AAN pairs of 10,000-byte documents, full-size CIFAR-10 pickles, generated Pathfinder images, and
tensorflow-datasets through ``tfds.testing.mock_data``), then reports per task and source:
conversion rate (examples/s into the cache), the loader's rate (examples/s gathered and turned into
tensors at the task's full length) and the reference model's training rate with softmax attention
(examples/s) on this machine. Also the Pathfinder generator's rate on all cores.
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from lra.benchmarks.throughput import measure
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import pathfinder_generator as generator, pathfinder_writer as writer
from lra.data.prepare import load_task_data
from lra.profiling.measure import timed


def _text(rng, size: int) -> bytes:
    return bytes(rng.integers(32, 127, size=size, dtype=np.uint8))


def write_fixtures(root: Path, scale: float, rng) -> dict:
    """Raw files per (task, source) → the overrides that point a task at them."""
    reviews = int(500 * scale)
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(reviews):
                (folder / f"{i}_1.txt").write_bytes(_text(rng, int(rng.integers(600, 2000))))
    pairs = int(500 * scale)
    tsv = root / "lra_release" / "tsv_data"
    tsv.mkdir(parents=True)
    for name in ("train", "eval", "test"):
        lines = (b"\t".join([b"1.0" if i % 2 else b"0.0", b"a", b"b", _text(rng, 10_000), _text(rng, 10_000)])
                 for i in range(pairs))
        (tsv / f"new_aan_pairs.{name}.tsv").write_bytes(b"\n".join(lines) + b"\n")
    cifar = root / "cifar-10-batches-py"
    cifar.mkdir()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        data = rng.integers(0, 256, size=(10_000, 3072), dtype=np.uint8)
        (cifar / name).write_bytes(pickle.dumps({b"data": data, b"labels": list(rng.integers(0, 10, 10_000))}))
    return {
        ("text", "aclimdb"): ["task.source=aclimdb", f"task.path={root / 'aclImdb'}"],
        ("retrieval", "lra_release"): [f"task.path={root / 'lra_release'}"],
        ("image", "cifar_python"): ["task.source=cifar_python", f"task.path={cifar}"],
    }


def mocked_tfds(task: str, count: int, rng):
    import tensorflow_datasets as tfds

    if task == "text":
        items = [{"text": _text(rng, 1300), "label": i % 2} for i in range(count)]
    else:
        items = [{"image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "label": i % 10, "id": "x"}
                 for i in range(count)]
    return tfds.testing.mock_data(as_data_source_fn=lambda builder, split, *a, **k: items)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fixture size multiplier")
    parser.add_argument("--steps", type=int, default=2, help="training steps timed per task")
    parser.add_argument("--pathfinder-images", type=int, default=2000)
    args = parser.parse_args(argv)
    register_configs()
    register_resolvers()
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        root, data_dir = Path(scratch) / "raw", Path(scratch) / "data"
        cases = write_fixtures(root, args.scale, rng)
        cases[("text", "tfds")] = ["task.source=tfds"]
        cases[("image", "tfds")] = ["task.source=tfds"]

        settings = writer.GeneratorSettings(num_images=args.pathfinder_images, images_per_folder=250)
        release = root / "lra_release" / "pathfinder32" / "curv_contour_length_14"
        _, seconds = timed(lambda: writer.write_release(generator.geometry_for(32, "contour_length_14"), settings, release))
        rate = args.pathfinder_images / seconds
        print(f"Pathfinder generator: {rate:.1f} images/s on {os.cpu_count()} cores "
              f"(200,000 images: {200_000 / rate / 60:.0f} min)")
        cases[("pathfinder", "lra_release")] = ["task.source=lra_release", f"task.path={root / 'lra_release'}"]

        for (task, source), overrides in cases.items():
            with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
                cfg = compose(config_name="config", overrides=[f"task={task}", *overrides])
            mock = mocked_tfds(task, int(2000 * args.scale), rng) if source == "tfds" else nullcontext()
            with mock:
                data, seconds = timed(lambda: load_task_data(cfg.task, data_dir, announce=lambda m: None, prepare=True))
            examples = sum(len(split) for name, split in data.splits.items()
                           if name not in data.manifest.get("aliases", {}))
            rates = measure([f"task={task}", *overrides, f"data_dir={data_dir}", "attention=softmax",
                             "trainer.progress_bar=false", "trainer.eval_subset=8"], args.steps, loader_batches=50)
            batch = rates["batch"]
            rows.append({"task": task, "source": source, "examples": examples,
                         "convert_examples_per_s": examples / seconds,
                         "loader_examples_per_s": rates["loader_batches_per_s"] * batch,
                         "train_examples_per_s": rates["steps_per_s"] * batch,
                         "seq_len": int(rates["seq_len"]), "batch": int(batch)})
    table = pd.DataFrame(rows).set_index(["task", "source"])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, numpy {np.__version__}")
    rounded = table.astype({"convert_examples_per_s": int, "loader_examples_per_s": int}).round(1)
    print(rounded.to_markdown())


if __name__ == "__main__":
    main()
