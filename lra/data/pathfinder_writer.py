"""The generated Pathfinder images written in the LRA release's file layout (``imgs/<folder>/
sample_<i>.png`` and ``metadata/<folder>.npy``), folder by folder in worker processes, resumable.
The images themselves come from :mod:`lra.data.pathfinder_generator`."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional

from attention_zoo.options import whole
from lra.data.pathfinder_generator import Geometry, generate_scene
from lra.io import atomic_write_text, remove_stale


@dataclass
class GeneratorSettings:
    """What to generate: the variant, how many images, the seed, and the files' grouping."""

    num_images: int = 200_000
    seed: int = 0
    images_per_folder: int = 1000
    workers: int = 0  # processes; 0 = all CPU cores

    def __post_init__(self):
        whole(self, 10, "num_images")  # the 80/10/10 split needs at least one image per split
        whole(self, 1, "images_per_folder")
        whole(self, 0, "seed", "workers")

    def as_dict(self) -> dict:
        return asdict(self)


def metadata_line(g: Geometry, folder: int, index: int, label: int, margin: int) -> str:
    return (f"imgs/{folder} sample_{index}.png {index} {label} {g.continuity} {g.contour_length} "
            f"{g.distractor_length} {g.paddle_length} {g.paddle_thickness} {margin} 1")


def _write_folder(args) -> int:
    from PIL import Image

    g, root, seed, folder, first, count = args
    image_dir = Path(root) / "imgs" / str(folder)
    image_dir.mkdir(parents=True, exist_ok=True)
    remove_stale(image_dir, r"\.sample_\d+\.(?P<pid>\d+)\.png")  # left by a killed generation
    lines = []
    for index in range(first, first + count):
        scene = generate_scene(g, seed, index)
        # Atomic: a concurrent job generating the same (seeded) folder never exposes a half-written PNG.
        temporary = image_dir / f".sample_{index}.{os.getpid()}.png"
        Image.fromarray(scene.image).save(temporary, format="PNG")
        os.replace(temporary, image_dir / f"sample_{index}.png")
        lines.append(metadata_line(g, folder, index, scene.label, scene.margin))
    # The metadata file is written last and atomically: it marks the folder complete.
    atomic_write_text(Path(root) / "metadata" / f"{folder}.npy", "\n".join(lines) + "\n")
    return count


def write_release(g: Geometry, settings: GeneratorSettings, root: Path,
                  progress: Optional[Callable[[int], None]] = None) -> None:
    """Write ``settings.num_images`` images into ``root`` (a ``curv_*`` folder) in the release layout.

    Folders whose metadata file exists are complete and skipped, so an interrupted run resumes.
    """
    root = Path(root)
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    jobs: List[tuple] = []
    for folder, first in enumerate(range(0, settings.num_images, settings.images_per_folder)):
        count = min(settings.images_per_folder, settings.num_images - first)
        if (root / "metadata" / f"{folder}.npy").is_file():
            if progress:
                progress(count)
            continue
        jobs.append((g, str(root), settings.seed, folder, first, count))
    workers = settings.workers or os.cpu_count() or 1
    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            done = _write_folder(job)
            if progress:
                progress(done)
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        for done in pool.map(_write_folder, jobs):
            if progress:
                progress(done)
