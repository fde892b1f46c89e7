"""LRA Image: CIFAR-10 as 1024 grayscale pixels in row-major order (vocabulary 256).

Sources: tensorflow-datasets ``cifar10`` (``train[:90%]``, ``train[90%:]``, ``test``) or the python
pickles of ``cifar-10-batches-py``, split into the same three sets: tensorflow-datasets keys each
CIFAR example by its index in the pickles (data_batch_1 … 5, then test_batch) and orders a split by
the MD5 of the split's name followed by the key (:func:`tfds_order`), so ``train[90%:]`` is the last
5,000 training images in that order, not the last 5,000 pickled ones.
"""

from __future__ import annotations

import hashlib
import math
import pickle
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from lra.errors import UserError

TRAIN_BATCHES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_BATCH = "test_batch"
BATCHES = (*TRAIN_BATCHES, TEST_BATCH)  # every pickle of the python release
TRAIN_FRACTION = 0.9
CLASSES = 10
GRAY_WEIGHTS = tuple(np.float32(w) for w in (0.2989, 0.5870, 0.1140))  # tf.image.rgb_to_grayscale's


def tf_grayscale(rgb: np.ndarray) -> np.ndarray:
    """``tf.image.rgb_to_grayscale`` on uint8 images [..., 3] → uint8 [...], bit for bit: each channel
    converted to float32 in [0, 1] (× float32(1/255), ``convert_image_dtype``), the weighted sum
    (r·0.2989 + g·0.5870) + b·0.1140 taken in float32 element by element, left to right, every
    product and sum rounded (TensorFlow's 3-term ``tensordot`` in its order), and converted back to
    uint8 as TensorFlow does (× 255.5, truncated). Element-wise so that no BLAS chooses the order or
    fuses a multiply-add (a matrix product here put some colours one grey level off, machine by
    machine; docs/data.md, "Image")."""
    scaled = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    red, green, blue = (scaled[..., channel] * weight for channel, weight in enumerate(GRAY_WEIGHTS))
    gray = (red + green) + blue
    return (gray * np.float32(255.5)).astype(np.uint8)


def find_cifar_python(path: Optional[str]) -> Path:
    if not path:
        raise UserError("image from CIFAR-10 pickles needs their folder: add --path /path/to/cifar-10-batches-py")
    root = Path(path).expanduser().resolve()
    for candidate in (root, root / "cifar-10-batches-py"):
        if all((candidate / name).is_file() for name in BATCHES):
            return candidate
    raise UserError(f"no cifar-10-batches-py/{{data_batch_1..5,test_batch}} under {root}; point --path at the "
                    "extracted cifar-10-python.tar.gz")


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 batch and nothing else: the only globals it resolves are the few numpy
    rebuilds an array of pixels needs (a pickle may name any callable, e.g. os.system, and run it)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which no CIFAR-10 batch holds (refused unread)")
        return super().find_class(module, name)


def read_batch(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    """(RGB uint8 [N, 32, 32, 3], labels int64 [N]) of one CIFAR-10 python pickle. Pixels must be the
    official uint8 and labels whole numbers 0 … 9: a cast would change them without a word."""
    try:
        with open(path, "rb") as handle:
            batch = _BatchUnpickler(handle, encoding="bytes").load()
        data, labels = np.asarray(batch[b"data"]), np.asarray(batch[b"labels"])
    except PermissionError as exc:
        raise UserError(f"cannot read {path} ({exc.strerror}): make it readable for this user") from None
    except Exception as exc:
        raise UserError(f"{path} is not a readable CIFAR-10 python batch ({type(exc).__name__}: {exc}); "
                        "re-extract cifar-10-python.tar.gz") from None
    if data.dtype != np.uint8:
        raise UserError(f"{path}: the pixels are {data.dtype}, but CIFAR-10's are uint8 (0 … 255) and converting "
                        "would change them; re-extract cifar-10-python.tar.gz")
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise UserError(f"{path}: the pixel array has shape {data.shape}, expected (images, 3072); "
                        "re-extract cifar-10-python.tar.gz")
    if len(data) != len(labels):
        raise UserError(f"{path}: {len(data)} images but {len(labels)} labels")
    if not len(data):
        raise UserError(f"{path} holds no images, but every CIFAR-10 batch holds 10,000: the batch is damaged; "
                        "re-extract cifar-10-python.tar.gz")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), _class_labels(path, labels)


def _class_labels(path: Path, labels: np.ndarray) -> np.ndarray:
    """``labels`` as int64 when every one is a whole number 0 … 9 (3.0 counts); else the first other
    one raises naming the file and its index."""
    if labels.ndim != 1:
        raise UserError(f"{path}: the labels have shape {labels.shape}, expected one per image; "
                        "re-extract cifar-10-python.tar.gz")
    if labels.dtype.kind in "iu":
        bad = (labels < 0) | (labels >= CLASSES)
    elif labels.dtype.kind == "f":
        whole = np.isfinite(labels) & (labels == np.floor(labels))
        bad = ~whole | (labels < 0) | (labels >= CLASSES)
    else:  # objects (e.g. None among numbers), text, booleans: judged one by one
        bad = np.array([not _is_class(value) for value in labels.tolist()], dtype=bool)
    if bad.any():
        index = int(np.argmax(bad))
        raise UserError(f"{path}: label {index}: the label is {labels.tolist()[index]!r}, but this task's labels are "
                        f"0 … {CLASSES - 1} (whole numbers); the batch is damaged: re-extract cifar-10-python.tar.gz")
    return labels.astype(np.int64)


def _is_class(value) -> bool:
    """Whether a Python value is a whole number 0 … 9 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and float(value).is_integer() and 0 <= value < CLASSES


def tfds_order(split_name: str, count: int) -> np.ndarray:
    """The order tensorflow-datasets stores examples keyed 0 … count − 1 in: by the 128-bit MD5 of
    the split name (the salt) followed by the key's decimal digits, ascending."""
    salted = hashlib.md5(split_name.encode("utf-8"))

    def digest(key: int) -> int:
        md5 = salted.copy()
        md5.update(str(key).encode("utf-8"))
        return int(md5.hexdigest(), 16)

    return np.array(sorted(range(count), key=digest), dtype=np.int64)


def read_cifar_python(root: Path) -> Iterator[Tuple[str, np.ndarray, int]]:
    """(split, RGB image, label) in tensorflow-datasets' order: train = ``train[:90%]``, val =
    ``train[90%:]`` of the 50,000 training images, test = the test batch."""
    batches = [read_batch(root / name) for name in TRAIN_BATCHES]
    test_images, test_labels = read_batch(root / TEST_BATCH)
    _check_batches_whole(root, [images for images, _ in batches], test_images)
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    order = tfds_order("train", len(labels))
    cut = int(round(TRAIN_FRACTION * len(labels)))
    for position, index in enumerate(order):
        yield ("train" if position < cut else "val"), images[index], int(labels[index])
    for index in tfds_order("test", len(test_labels)):
        yield "test", test_images[index], int(test_labels[index])


def _check_batches_whole(root: Path, train_images: List[np.ndarray], test_images: np.ndarray) -> None:
    """The split into ``train[:90%]`` and ``train[90%:]`` takes the release's training batches: as many images in
    each (10,000), no batch a copy of another. A batch cut short or copied over another raises naming them."""
    counts = [len(images) for images in train_images]
    usual = max(set(counts), key=lambda count: (counts.count(count), -counts.index(count)))  # the most common
    for name, count in zip(TRAIN_BATCHES, counts):
        if count != usual:
            others = [other for other, other_count in zip(TRAIN_BATCHES, counts) if other_count == usual]
            raise UserError(f"{root / name} holds {count:,} images but {', '.join(others)} {usual:,} each (every "
                            "training batch of CIFAR-10 holds 10,000): the batch is cut or not CIFAR-10's; re-extract "
                            "cifar-10-python.tar.gz")
    seen: Dict[str, str] = {}
    for name, images in zip(BATCHES, [*train_images, test_images]):
        first = seen.setdefault(hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest(), name)
        if first != name:
            raise UserError(f"{root / name} holds the same images as {root / first} (a copy?): every CIFAR-10 batch "
                            "holds images of its own; re-extract cifar-10-python.tar.gz")
