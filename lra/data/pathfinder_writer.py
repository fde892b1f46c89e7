"""The generated Pathfinder images written in the LRA release's file layout (``imgs/<folder>/
sample_<i>.png`` and ``metadata/<folder>.npy``), folder by folder in worker processes, resumable,
with the SHA-256 of each folder's files (``checksums/<folder>.json``) to check them against before
they are read. The images themselves come from :mod:`lra.data.pathfinder_generator`."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set

from attention_zoo.options import whole
from lra.data.pathfinder_generator import Geometry, generate_scene
from lra.faults import fault_point
from lra.io import atomic_write_text, remove_stale

CHECKSUMS = "checksums"  # <root>/checksums/<folder>.json: {"metadata": sha256, "images": {name: sha256}}


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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _draw(g: Geometry, image_dir: Path, seed: int, folder: int, index: int) -> tuple:
    """Draw image ``index`` and write it atomically (a concurrent job generating the same, seeded,
    folder never exposes a half-written PNG); returns (its metadata line, the PNG's SHA-256)."""
    import io

    from PIL import Image

    scene = generate_scene(g, seed, index)
    buffer = io.BytesIO()
    Image.fromarray(scene.image).save(buffer, format="PNG")
    temporary = image_dir / f".sample_{index}.{os.getpid()}.png"
    temporary.write_bytes(buffer.getvalue())
    os.replace(temporary, image_dir / f"sample_{index}.png")
    return metadata_line(g, folder, index, scene.label, scene.margin), _sha256(buffer.getvalue())


_stop: Optional[Event] = None  # in a worker process: set by the parent when the generation is interrupted


def _start_worker(stop: Event) -> None:
    """A worker leaves ctrl-C and SIGTERM (which reach a job's whole group) to the parent, which stops it through
    ``stop`` after the image at hand and then says why it stopped."""
    global _stop
    _stop = stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _write_folder(args) -> int:
    g, root, seed, folder, first, count = args
    root = Path(root)
    image_dir = root / "imgs" / str(folder)
    image_dir.mkdir(parents=True, exist_ok=True)
    remove_stale(image_dir, r"\.sample_\d+\.(?P<pid>\d+)\.png")  # left by a killed generation
    lines, images = [], {}
    for index in range(first, first + count):
        if _stop is not None and _stop.is_set():
            return 0  # interrupted: the folder has no metadata file, so the next generation writes it whole
        line, images[f"sample_{index}.png"] = _draw(g, image_dir, seed, folder, index)
        lines.append(line)
    metadata = "\n".join(lines) + "\n"
    (root / CHECKSUMS).mkdir(exist_ok=True)
    atomic_write_text(root / CHECKSUMS / f"{folder}.json",
                      json.dumps({"metadata": _sha256(metadata.encode()), "images": images}, indent=1))
    # The metadata file is written last and atomically: it marks the folder complete.
    atomic_write_text(root / "metadata" / f"{folder}.npy", metadata)
    return count


def _folders(settings: "GeneratorSettings") -> List[tuple]:
    """(folder, first image, image count) of every folder ``settings`` asks for."""
    return [(folder, first, min(settings.images_per_folder, settings.num_images - first))
            for folder, first in enumerate(range(0, settings.num_images, settings.images_per_folder))]


def damaged_files(settings: "GeneratorSettings", root: Path) -> tuple:
    """What differs from what was generated in ``root``: (folders to draw again, each with why;
    single images to draw again, as (folder, index); metadata files that no folder of ``settings``
    has). A folder whose metadata file or checksum record is missing, unreadable or changed is drawn
    again whole; a changed, missing or replaced image alone."""
    root = Path(root)
    folders: Dict[int, str] = {}
    images: Set[tuple] = set()
    expected = {f"{folder}.npy" for folder, _, _ in _folders(settings)}
    extra = sorted(p for p in (root / "metadata").glob("*.npy") if p.name not in expected)
    for folder, first, count in _folders(settings):
        metadata = root / "metadata" / f"{folder}.npy"
        try:
            record = json.loads((root / CHECKSUMS / f"{folder}.json").read_text())
            recorded_images = record["images"]
            if _sha256(metadata.read_bytes()) != record["metadata"]:
                folders[folder] = f"metadata/{folder}.npy changed"
                continue
        except FileNotFoundError as exc:
            folders[folder] = f"{Path(exc.filename).relative_to(root)} is missing"
            continue
        except (OSError, ValueError, KeyError, TypeError):
            folders[folder] = f"{CHECKSUMS}/{folder}.json is unreadable"
            continue
        for index in range(first, first + count):
            name = f"sample_{index}.png"
            try:
                same = _sha256((root / "imgs" / str(folder) / name).read_bytes()) == recorded_images.get(name)
            except OSError:
                same = False
            if not same:
                images.add((folder, index))
    return folders, images, extra


def repair_release(g: Geometry, settings: "GeneratorSettings", root: Path, announce: Callable[[str], None]) -> None:
    """Check the generated release in ``root`` against its checksum records and draw again, from the
    seed, whatever differs (an edited, replaced, truncated or missing file), saying so in one line:
    generated data is never read unchecked, and never refused when the seed can make it again."""
    root = Path(root)
    folders, images, extra = damaged_files(settings, root)
    if not (folders or images or extra):
        return
    named = [f"{why} (folder {folder})" for folder, why in sorted(folders.items())]
    named += [f"imgs/{folder}/sample_{index}.png changed" for folder, index in sorted(images)]
    named += [f"metadata/{path.name} is not one of its folders" for path in extra]
    announce(f"the generated Pathfinder data in {root} differs from what was generated ({'; '.join(named[:3])}"
             + (f"; {len(named)} differences in all" if len(named) > 3 else "")
             + f"): drawing it again from seed {settings.seed}")
    for path in extra:
        path.unlink()
    for folder, first, count in _folders(settings):
        if folder in folders:
            _write_folder((g, str(root), settings.seed, folder, first, count))
    for folder in sorted({folder for folder, _ in images} - set(folders)):
        record_path = root / CHECKSUMS / f"{folder}.json"
        record = json.loads(record_path.read_text())
        for index in sorted(index for f, index in images if f == folder):
            _, record["images"][f"sample_{index}.png"] = _draw(g, root / "imgs" / str(folder), settings.seed, folder,
                                                               index)
        atomic_write_text(record_path, json.dumps(record, indent=1))


def write_release(g: Geometry, settings: GeneratorSettings, root: Path,
                  progress: Optional[Callable[[int], None]] = None) -> None:
    """Write ``settings.num_images`` images into ``root`` (a ``curv_*`` folder) in the release layout.

    Folders whose metadata file exists are complete and skipped, so an interrupted run resumes.
    """
    root = Path(root)
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    jobs: List[tuple] = []
    for folder, first, count in _folders(settings):
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
    stop = multiprocessing.get_context().Event()
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), initializer=_start_worker, initargs=(stop,)) as pool:
        try:
            for done in pool.map(_write_folder, jobs):
                if progress:
                    progress(done)
                fault_point("pathfinder_folder")  # tests: a signal while the workers draw the next folders
        except BaseException:  # a signal or a failed folder: the workers stop at their next image, not folder
            stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
