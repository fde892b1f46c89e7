"""Data preparation and loading rates for every task and source (a benchmark, not a test).

    python -m lra.benchmarks.data_speed [--scale 1.0] [--steps 2]
    python -m lra.benchmarks.data_speed --generators-only [--workers 1,2] [--repeats 3] [--cores 16] [--listops]

Builds synthetic fixtures of realistic sizes in the official layouts (IMDb reviews of ~1,300 bytes,
AAN pairs of 10,000-byte documents, full-size CIFAR-10 pickles, generated Pathfinder images, and
tensorflow-datasets through ``tfds.testing.mock_data``), then reports per task and source:
conversion rate (examples/s into the cache), the loader's rate (examples/s gathered and turned into
tensors at the task's full length) and the reference model's training rate with softmax attention
(examples/s) on this machine. Also the generators' rates: Pathfinder-32 (``curv_contour_length_14``,
written in the release layout, PNGs and checksums included) with each number of worker processes
in ``--workers``, repeated ``--repeats`` times (min and median: a shared machine's load varies),
with the CPU-seconds each image took (the process and its workers), and projected to ``--cores``
cores from those CPU-seconds (a projection: it assumes cores as fast as these, each busy with one
worker); with ``--listops``, the reference ListOps set (96,000/2,000/2,000 examples, one seeded
stream, so one core).
"""

from __future__ import annotations

import argparse
import os
import pickle
import resource
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from hydra import compose, initialize_config_dir

from lra.benchmarks.throughput import measure
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import listops, pathfinder_generator as generator, pathfinder_writer as writer
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


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {low}")
        return value
    return parse


def _worker_counts(text: str) -> list:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of worker counts >= 1 (e.g. 1,2)")
    return counts


def _cpu_seconds() -> float:
    """User + system CPU-seconds of this process and of its ended (waited-for) child processes."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pathfinder_rates(images: int, workers: int, repeats: int) -> dict:
    """Pathfinder-32 generation, ``repeats`` times into fresh folders: images/s (wall) and
    CPU-seconds per image of each run."""
    g = generator.geometry_for(32, "contour_length_14")
    settings = writer.GeneratorSettings(num_images=images, images_per_folder=max(images // (4 * workers), 1),
                                        workers=workers)
    rates, cpu = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as scratch:
            started_cpu, started = _cpu_seconds(), time.perf_counter()
            writer.write_release(g, settings, Path(scratch) / "curv_contour_length_14")
            rates.append(images / (time.perf_counter() - started))
            cpu.append((_cpu_seconds() - started_cpu) / images)
    return {"rates": rates, "cpu_per_image": cpu}


def report_generators(images: int, workers: list, repeats: int, cores: int, with_listops: bool) -> None:
    print(f"Pathfinder-32 generator (curv_contour_length_14), {images:,} images a run, {repeats} runs per row, "
          f"on this machine ({os.cpu_count()} cores, shared with other work):")
    print("| workers | images/s, min | images/s, median | CPU ms per image, median |")
    print("|---:|---:|---:|---:|")
    measured = {}
    for count in workers:
        measured[count] = pathfinder_rates(images, count, repeats)
        rates, cpu = measured[count]["rates"], measured[count]["cpu_per_image"]
        print(f"| {count} | {min(rates):.1f} | {statistics.median(rates):.1f} | {1000 * statistics.median(cpu):.2f} |")
    most = max(workers)
    cpu = statistics.median(measured[most]["cpu_per_image"])
    projected = cores / cpu
    print(f"Projection to {cores} cores (not measured: {cores} workers, each on a core as fast as these, from the "
          f"median CPU time per image with {most} workers): {projected:,.0f} images/s, 200,000 images in "
          f"{200_000 / projected / 60:.1f} min")
    if with_listops:
        settings = listops.GeneratorSettings()
        with tempfile.TemporaryDirectory() as scratch:
            started_cpu, started = _cpu_seconds(), time.perf_counter()
            listops.write_generated(settings, Path(scratch))
            wall, used = time.perf_counter() - started, _cpu_seconds() - started_cpu
        print(f"ListOps generator, reference set ({settings.num_train:,}/{settings.num_val:,}/{settings.num_test:,}, "
              f"one seeded stream, one core): {wall:.0f} s ({used:.0f} CPU-s)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fixture size multiplier")
    parser.add_argument("--steps", type=int, default=2, help="training steps timed per task")
    parser.add_argument("--pathfinder-images", type=_at_least(10), default=2000, help="images a generation run")
    parser.add_argument("--generators-only", action="store_true", help="measure only the data generators")
    parser.add_argument("--workers", type=_worker_counts, default=[1, 2],
                        help="worker processes to time Pathfinder generation with (comma-separated)")
    parser.add_argument("--repeats", type=_at_least(1), default=3, help="runs per worker count")
    parser.add_argument("--cores", type=_at_least(1), default=16, help="cores to project Pathfinder generation to")
    parser.add_argument("--listops", action="store_true", help="also time the reference ListOps generation")
    args = parser.parse_args(argv)
    report_generators(args.pathfinder_images, args.workers, args.repeats, args.cores, args.listops)
    if args.generators_only:
        return
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
        writer.write_release(generator.geometry_for(32, "contour_length_14"), settings, release)
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
