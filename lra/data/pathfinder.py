"""Pathfinder from the release layout (``pathfinder<res>/curv_<difficulty>/{metadata,imgs}``), which
the generator in :mod:`lra.data.pathfinder_writer` also writes.

``metadata/<k>.npy`` is plain text despite its name: per image a line ``imgs/<k> sample_<i>.png <i>
<label> ...``. The split is a seeded 80/10/10 permutation of all metadata lines (files in numeric
order, lines in file order); zero-byte images (present in the release) are skipped and counted.
Refused, each in one line naming it: a metadata file not named ``<k>.npy``, a line naming an image that
another line names (it would leak between splits), and an image other than 8-bit greyscale (mode L). The
images of a named folder that no line names (its metadata file lost lines?) are left out with a note. A
leading byte-order mark is read past (:mod:`lra.data.raw_text`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np

from lra.data.pathfinder_generator import release_folder_name
from lra.data.raw_text import without_byte_order_mark
from lra.errors import UserError

SPLIT_FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}
RELEASE_IMAGE = re.compile(r"sample_[0-9]+\.png")  # the release's (and the generator's) image names


@dataclass(frozen=True)
class Entry:
    image: Path
    label: int
    source: str  # "metadata/<k>.npy:<line>", for error messages


def find_release(path: Optional[str], resolution: int, difficulty: str) -> Path:
    """The ``curv_<difficulty>`` folder under ``path`` at any of the release's nesting levels."""
    folder = release_folder_name(difficulty)
    if not path:
        raise UserError("pathfinder from the release needs its folder: add --path /path/to/lra_release (task.path=...)")
    root = Path(path).expanduser().resolve()
    candidates = [root, root / folder, root / f"pathfinder{resolution}" / folder,
                  root / "lra_release" / f"pathfinder{resolution}" / folder]
    for candidate in candidates:
        if (candidate / "metadata").is_dir() and (candidate / "imgs").is_dir():
            return candidate
    raise UserError(f"no {folder}/{{metadata,imgs}} under {root} (looked in ., {folder}/, "
                    f"pathfinder{resolution}/{folder}/, lra_release/pathfinder{resolution}/{folder}/); point --path at "
                    "the extracted LRA release")


def metadata_files(root: Path) -> List[Path]:
    """``root/metadata/<k>.npy`` in numeric order; any other ``*.npy`` there (a stray copy, say) raises
    naming it, as the release names its metadata files by folder number only."""
    files = sorted((root / "metadata").glob("*.npy"))
    if not files:
        raise UserError(f"{root / 'metadata'} holds no metadata files (<k>.npy)")
    for file in files:
        if not re.fullmatch(r"[0-9]+", file.stem):
            raise UserError(f"{file} is not a release metadata file (the release names them <k>.npy, k = 0, 1, …); "
                            f"move it out of {root / 'metadata'}")
    return sorted(files, key=lambda file: int(file.stem))


def read_metadata(root: Path) -> List[Entry]:
    """Every image named by ``root/metadata/*.npy``, in order; a malformed line, one with other fields than its
    file's first (cut short), an empty file, or a line naming an image that an earlier line names (it would be
    in two splits), raises naming it."""
    entries: List[Entry] = []
    named: Dict[str, str] = {}
    for file in metadata_files(root):
        width = None  # the fields of the file's first line: a line cut short has fewer
        text = without_byte_order_mark(file.read_bytes()).decode(errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            where = f"{file}:{number}"
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise UserError(f"{where}: expected 'imgs/<k> <file> <index> <label 0|1> ...', found {line[:80]!r}")
            width = width or len(fields)
            if len(fields) != width:
                raise UserError(f"{where} has {len(fields)} fields and the file's first line {width}: the file is cut "
                                "or damaged; re-extract the Pathfinder release")
            image = root / fields[0] / fields[1]
            first = named.setdefault(os.path.normpath(image), where)
            if first != where:
                raise UserError(f"{where} names {image}, which {first} names already: each image is in the release "
                                "once; remove the duplicate metadata line or file (a copy?)")
            entries.append(Entry(image, int(fields[3]), where))
        if width is None:
            raise UserError(f"{file} holds no metadata line (the release's name 1,000 images each): it is cut or "
                            "damaged; re-extract the Pathfinder release")
    return entries


def unnamed_images(entries: List[Entry]) -> List[Tuple[Path, int, str]]:
    """(folder, how many, the metadata file naming its images) for each folder the metadata names that holds
    images no line names: the generator writes one line per image it saves, so these mean a metadata file lost
    its last lines (cut at a line boundary, it reads as whole), or strays. Zero-byte images, which the release
    holds, carry nothing and are let be; a folder that cannot be listed is passed over (reading its images
    names the problem)."""
    named = {os.path.normpath(entry.image) for entry in entries}
    folders: Dict[Path, str] = {}
    for entry in entries:
        folders.setdefault(entry.image.parent, entry.source.rsplit(":", 1)[0])
    found = []
    for folder, metadata in folders.items():
        try:
            with os.scandir(folder) as listing:
                count = sum(1 for item in listing if RELEASE_IMAGE.fullmatch(item.name)
                            and os.path.normpath(item.path) not in named and item.stat().st_size > 0)
        except OSError:
            continue
        if count:
            found.append((folder, count, metadata))
    return found


def assign_splits(count: int, seed: int) -> np.ndarray:
    """0 / 1 / 2 (train / val / test) per metadata line: a seeded 80/10/10 permutation."""
    order = np.random.default_rng(seed).permutation(count)
    cut_train = int(round(SPLIT_FRACTIONS["train"] * count))
    cut_val = cut_train + int(round(SPLIT_FRACTIONS["val"] * count))
    split = np.empty(count, dtype=np.int8)
    split[order[:cut_train]], split[order[cut_train:cut_val]], split[order[cut_val:]] = 0, 1, 2
    return split


def read_pixels(entry: Entry, resolution: int) -> Optional[np.ndarray]:
    """The image's pixels, row-major uint8 [resolution²]; None for a zero-byte (empty) file. Only 8-bit
    greyscale (mode L), the release's, is read: any other mode raises naming it (a conversion would
    clip 16-bit values or mix colours without a word)."""
    from PIL import Image

    try:
        if entry.image.stat().st_size == 0:
            return None
        with Image.open(entry.image) as image:
            mode = image.mode
            pixels = np.asarray(image, dtype=np.uint8) if mode == "L" else None
    except FileNotFoundError:
        raise UserError(f"{entry.source}: the image {entry.image} does not exist") from None
    except Exception as exc:
        raise UserError(f"{entry.source}: cannot read {entry.image} ({type(exc).__name__}: {exc})") from None
    if pixels is None:
        raise UserError(f"{entry.source}: {entry.image} is a mode {mode} image, but the release's are 8-bit "
                        "greyscale (mode L); re-extract the release")
    if pixels.shape != (resolution, resolution):
        raise UserError(f"{entry.source}: {entry.image} is {pixels.shape[1]}x{pixels.shape[0]}, expected "
                        f"{resolution}x{resolution} (task.resolution={resolution})")
    return pixels.reshape(-1)


def iterate_split_examples(root: Path, resolution: int, seed: int, announce: Callable[[str], None] = print
                           ) -> Iterator[Tuple[str, Optional[np.ndarray], int]]:
    """(split, pixels or None when empty, label) for every metadata line, in metadata order; the images no
    line names (:func:`unnamed_images`) are left out, each folder's with an ``announce``."""
    names = list(SPLIT_FRACTIONS)
    entries = read_metadata(root)
    for folder, count, metadata in unnamed_images(entries):
        announce(f"note: {count:,} images in {folder} are named by no metadata line and left out: {metadata} may be "
                 "cut (the release names every image of a folder); re-extract the Pathfinder release if so")
    for entry, split in zip(entries, assign_splits(len(entries), seed)):
        yield names[split], read_pixels(entry, resolution), entry.label
