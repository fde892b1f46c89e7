"""Byte-level text (LRA Text and Retrieval): each UTF-8 byte b becomes id b + 1; 0 is padding.

Sources of IMDb reviews: tensorflow-datasets ``imdb_reviews`` (read through ``tfds.data_source``,
no TensorFlow needed) or the raw ``aclImdb/{train,test}/{pos,neg}/*.txt`` folders, each file's
bytes with surrounding ASCII whitespace stripped, exactly as the ``imdb_reviews`` builder stores
them. As in the original, the test split doubles as the validation split.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import numpy as np

from lra.errors import UserError

IMDB_LABELS = {"neg": 0, "pos": 1}
IMDB_RATINGS = {"neg": range(1, 5), "pos": range(7, 11)}  # aclImdb's README: negative ≤ 4, positive ≥ 7 of 10
REVIEW_NAME = re.compile(r"(\d+)_(\d+)\.txt")  # <review id>_<rating>.txt


def encode_bytes(data: bytes | str, limit: Optional[int] = None) -> np.ndarray:
    """``data`` (UTF-8 when given as text), its first ``limit`` bytes, as ids byte + 1 (uint16)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return np.frombuffer(data[:limit], dtype=np.uint8).astype(np.uint16) + 1


def find_aclimdb(path: Optional[str]) -> Path:
    """The ``aclImdb`` folder: ``path`` itself or its child of that name."""
    if not path:
        raise UserError("text from raw IMDb files needs their folder: add --path /path/to/aclImdb (task.path=...)")
    root = Path(path).expanduser().resolve()
    for candidate in (root, root / "aclImdb"):
        if all((candidate / split / label).is_dir() for split in ("train", "test") for label in IMDB_LABELS):
            return candidate
    raise UserError(f"no aclImdb/{{train,test}}/{{pos,neg}}/ folders under {root}; point --path at the extracted "
                    "aclImdb_v1.tar.gz (https://ai.stanford.edu/~amaas/data/sentiment/)")


def aclimdb_files(root: Path, split: str) -> List[Tuple[Path, int]]:
    """(review file, label) for ``split`` (train | test): negatives then positives, files in name order.
    Each class folder must exist, be listable and hold a review: a missing class is refused, never
    dropped (the rest would train with one label)."""
    return [(file, label) for name, label in IMDB_LABELS.items() for file in _class_reviews(root / split / name)]


def _class_reviews(folder: Path) -> List[Path]:
    """The ``*.txt`` files of one class folder in name order; a folder that is missing, cannot be
    listed or holds no review raises naming it, and so does a file not named as aclImdb names a review
    of that class (``<id>_<rating>.txt``): a stray note or a review of the other class would be trained
    under this folder's label."""
    try:
        with os.scandir(folder) as entries:
            reviews = sorted(Path(entry.path) for entry in entries if entry.name.endswith(".txt"))
    except (FileNotFoundError, NotADirectoryError):
        raise UserError(f"{folder} is missing: the aclImdb download is incomplete; re-extract aclImdb_v1.tar.gz "
                        "there") from None
    except OSError as exc:
        raise UserError(f"cannot list {folder} ({exc.strerror}): make it readable, or re-extract "
                        "aclImdb_v1.tar.gz there") from None
    if not reviews:
        raise UserError(f"no reviews (*.txt) in {folder}: the aclImdb download is incomplete or damaged; "
                        "re-extract aclImdb_v1.tar.gz there")
    ratings = IMDB_RATINGS[folder.name]
    for review in reviews:
        name = REVIEW_NAME.fullmatch(review.name)
        if name is None or int(name.group(2)) not in ratings:
            raise UserError(f"{review} is not an aclImdb review of this folder (named <id>_<rating>.txt, rated "
                            f"{ratings.start}-{ratings.stop - 1} in {folder.name}/): the review would take the folder's "
                            "label; move or remove it, or re-extract aclImdb_v1.tar.gz there")
    return reviews


def read_aclimdb(files: List[Tuple[Path, int]]) -> Iterator[Tuple[bytes, int]]:
    """(review bytes, label) per file of :func:`aclimdb_files`, stripped as tfds' ``imdb_reviews``. A file
    with no review text raises naming it: no official review is empty."""
    for file, label in files:
        try:
            raw = file.read_bytes()
        except OSError as exc:
            fix = ("a folder named like a review: move it out" if file.is_dir() else
                   "make it readable for this user") + ", or re-extract aclImdb_v1.tar.gz there"
            raise UserError(f"cannot read {file} ({exc.strerror}): {fix}") from None
        review = raw.strip()
        if not review:
            found = "is empty (0 bytes)" if not raw else f"holds only whitespace ({len(raw)} bytes)"
            raise UserError(f"{file} {found}, but no aclImdb review is: the download is damaged; re-extract "
                            "aclImdb_v1.tar.gz there")
        yield review, label


def read_tfds(name: str, split: str, data_dir: Optional[str], fields: Tuple[str, str], record: Optional[dict] = None):
    """A ``tfds.data_source`` over a prepared tensorflow-datasets split (prepared on first use).
    ``record`` (a manifest's extra fields) gets the dataset's full name with its version and the
    tensorflow-datasets version."""
    try:
        import tensorflow_datasets as tfds
    except ImportError:
        raise UserError("the tfds source needs tensorflow-datasets: pip install 'lra-harness[tfds]' "
                        "(or use another --source)") from None
    builder = tfds.builder(name, data_dir=data_dir)
    try:
        builder.download_and_prepare(file_format="array_record")
    except Exception as exc:  # network, disk or format problems, reported with the fix
        raise UserError(f"tensorflow-datasets could not prepare '{name}' in {builder.data_dir}: {exc}; "
                        "check the network, or pass --path to a folder with the prepared dataset") from None
    source = builder.as_data_source(split=split)
    missing = [f for f in fields if f not in builder.info.features]
    if missing:
        raise UserError(f"tensorflow-datasets '{name}' has no feature(s) {missing}")
    if record is not None:
        record["tfds"] = {"dataset": builder.info.full_name, "tensorflow_datasets": tfds.__version__}
    return source
