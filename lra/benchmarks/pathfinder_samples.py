"""A sample sheet of generated Pathfinder images with their labels (for the docs).

    python -m lra.benchmarks.pathfinder_samples [--out docs/images/pathfinder_samples.png] [--resolution 32]

Each panel's title is the label and whether the pixel-connectivity check agrees with it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lra.data import pathfinder_generator as generator  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="docs/images/pathfinder_samples.png")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--difficulty", default="contour_length_14")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--columns", type=int, default=8)
    args = parser.parse_args(argv)
    g = generator.geometry_for(args.resolution, args.difficulty)
    figure, axes = plt.subplots(args.rows, args.columns, figsize=(1.4 * args.columns, 1.55 * args.rows))
    for index, axis in enumerate(axes.flat):
        image, label, markers = generator.generate_image(g, args.seed, index)
        agrees = generator.markers_connected(image, markers, g.link) == bool(label)
        axis.imshow(image, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        axis.set_title(f"label {label}" + ("" if agrees else " (check: no)"), fontsize=8)
        axis.axis("off")
    figure.suptitle(f"pathfinder{args.resolution}/{generator.release_folder_name(args.difficulty)}, seed {args.seed}: "
                    "label 1 = markers on one snake", fontsize=9)
    figure.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
