"""Statistics of generated Pathfinder images, next to the original generator's where given, and a
sample grid.

    python -m lra.benchmarks.pathfinder_statistics [--resolutions 32 64 128] [--images 2000]
        [--reference 32=original32.npz ...] [--grid docs/images/pathfinder_{resolution}.png]

Per resolution (difficulty contour_length_14): the fraction of non-zero pixels, distinct grey
levels per image, the label balance, how often both markers sit on ends of target snakes, how
often a label-0 image's markers are nevertheless joined by inked pixels (crossing and touching
snakes; 8-connected, value > 0), how well the marker distance alone predicts the label (ROC AUC),
whether the contour connectivity agrees with the label (every image), redraws, and seconds per
image. A reference file (``.npz`` with ``images`` [N, r, r] uint8, ``labels`` [N], ``markers``
[N, 2, 2] as x, y) gets the same image statistics.
"""

from __future__ import annotations

import argparse
import math
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from lra.data import pathfinder_generator as generator
from lra.profiling.measure import timed


def marker_distance_auc(markers: np.ndarray, labels: np.ndarray) -> float:
    """ROC AUC of "closer markers ⇒ label 1" (0.5: the distance says nothing)."""
    distance = np.hypot(*(markers[:, 0] - markers[:, 1]).T)
    ones, zeros = -distance[labels == 1], -distance[labels == 0]
    if len(ones) == 0 or len(zeros) == 0:
        return float("nan")
    greater = (ones[:, None] > zeros[None, :]).mean()
    ties = (ones[:, None] == zeros[None, :]).mean()
    return float(greater + ties / 2)


def image_statistics(images: np.ndarray, labels: np.ndarray, markers: np.ndarray) -> dict:
    joined = np.array([generator.markers_joined_by_ink(image, m) for image, m in zip(images, markers)])
    return {
        "images": len(images),
        "ink fraction": float((images > 0).mean()),
        "grey levels per image": float(np.mean([len(np.unique(image)) for image in images])),
        "label 1 share": float(labels.mean()),
        "label 0 joined by ink": float(joined[labels == 0].mean()) if (labels == 0).any() else float("nan"),
        "label 1 joined by ink": float(joined[labels == 1].mean()) if (labels == 1).any() else float("nan"),
        "marker distance AUC": marker_distance_auc(markers, labels),
    }


def _scene_summary(args):
    resolution, seed, index = args
    g = generator.geometry_for(resolution, "contour_length_14")
    scene, elapsed = timed(lambda: generator.generate_scene(g, seed, index))
    ends_ok = markers_at_target_ends(scene)
    agrees = generator.contour_connected(scene, g) == bool(scene.label)
    return scene.image, scene.label, scene.markers, ends_ok, agrees, scene.redraws, elapsed


def markers_at_target_ends(scene: generator.Scene) -> bool:
    """Both markers within half a pixel of an end of a target snake: the first on an origin, the
    second on a far end."""
    targets = [[p for p in scene.paddles if p.snake == s] for s in (0, 1)]
    origins = [t[0].start for t in targets]
    ends = [t[-1].end for t in targets]
    first, second = scene.markers[0][::-1], scene.markers[1][::-1]
    near = lambda points, x: min(math.hypot(p[0] - x[0], p[1] - x[1]) for p in points) <= 0.5  # noqa: E731
    return near(origins, first) and near(ends, second)


def generate(resolution: int, count: int, seed: int, workers: int):
    jobs = [(resolution, seed, index) for index in range(count)]
    if workers == 1:
        return [_scene_summary(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_scene_summary, jobs, chunksize=4))


def save_grid(images: np.ndarray, labels: np.ndarray, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(6, 6, figsize=(8.4, 9.0))
    for axis, image, label in zip(axes.flat, images, labels):
        axis.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        axis.set_title(f"label {label}", fontsize=8)
        axis.axis("off")
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resolutions", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--reference", nargs="*", default=[], help="RESOLUTION=FILE.npz of the original's images")
    parser.add_argument("--grid", default=None, help="a PNG path with {resolution}: 36 images per resolution")
    args = parser.parse_args(argv)
    references = dict(item.split("=", 1) for item in args.reference)
    rows = []
    for resolution in args.resolutions:
        results, wall = timed(lambda: generate(resolution, args.images, args.seed, args.workers))
        images, labels, markers, ends_ok, agrees, redraws, seconds = (np.array(x) for x in zip(*results))
        row = {"resolution": resolution, "generator": "ours", **image_statistics(images, labels, markers),
               "markers at target ends": float(ends_ok.mean()), "contour check agrees": float(agrees.mean()),
               "redrawn images": int(redraws.sum()), "CPU s per image": float(seconds.mean()),
               "images/s (all workers)": len(images) / wall}
        rows.append(row)
        if str(resolution) in references:
            reference = np.load(references[str(resolution)])
            rows.append({"resolution": resolution, "generator": "original",
                         **image_statistics(reference["images"], reference["labels"], reference["markers"])})
        if args.grid:
            save_grid(images[:36], labels[:36], Path(args.grid.format(resolution=resolution)),
                      f"pathfinder{resolution}/curv_contour_length_14, seed {args.seed}: label 1 = markers on one snake")
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3g"))


if __name__ == "__main__":
    main()
