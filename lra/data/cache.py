"""The prepared-data cache: per split, ragged token arrays (``.npy``, memory-mapped on load) plus a
``manifest.json`` with the preprocessing settings, counts and a SHA-256 of every file.

A cache directory is built under a temporary name and renamed into place, so it is either complete
or absent. Loading verifies every checksum; a damaged cache is refused with the command that
rebuilds it, never silently used.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from lra.errors import UserError
from lra.io import atomic_write_text

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def sha256_file(path: Path, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def settings_fingerprint(settings: dict) -> str:
    """A short stable hash of JSON-serialisable settings, used to name cache directories."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TokenSplit:
    """One split: ``documents`` ragged token sequences per example and a label per example."""

    tokens: List[np.ndarray]  # per document slot: all sequences concatenated
    offsets: List[np.ndarray]  # per document slot: int64 [num_examples + 1]
    labels: np.ndarray  # int64 [num_examples]

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self, document: int = 0) -> np.ndarray:
        return np.diff(self.offsets[document])

    def subset(self, count: int | None) -> "TokenSplit":
        """The first ``count`` examples (all of them when ``count`` is None)."""
        if count is None or count >= len(self):
            return self
        return TokenSplit(self.tokens, [o[: count + 1] for o in self.offsets], self.labels[:count])

    def gather(self, indices: Sequence[int], max_length: int) -> Tuple[List[np.ndarray], List[np.ndarray], np.ndarray]:
        """Padded ids [B, max_length] (int64, 0 = padding) and real-token masks, per document slot.

        Sequences longer than ``max_length`` are truncated; the mask comes from the lengths, never
        from token values.
        """
        ids_per_doc, masks_per_doc = [], []
        for tokens, offsets in zip(self.tokens, self.offsets):
            ids = np.zeros((len(indices), max_length), dtype=np.int64)
            lengths = np.empty(len(indices), dtype=np.int64)
            for row, index in enumerate(indices):
                start, end = offsets[index], offsets[index + 1]
                length = min(end - start, max_length)
                ids[row, :length] = tokens[start : start + length]
                lengths[row] = length
            ids_per_doc.append(ids)
            masks_per_doc.append(np.arange(max_length)[None, :] < lengths[:, None])
        return ids_per_doc, masks_per_doc, self.labels[np.asarray(indices)]


class SplitWriter:
    """Collects the examples of one split (in memory) for :func:`write_cache`."""

    def __init__(self, num_documents: int = 1, dtype=np.uint8):
        self.dtype = dtype
        self.sequences: List[List[np.ndarray]] = [[] for _ in range(num_documents)]
        self.labels: List[int] = []

    def add(self, documents: Sequence[np.ndarray], label: int) -> None:
        for slot, document in zip(self.sequences, documents):
            slot.append(np.asarray(document, dtype=self.dtype))
        self.labels.append(int(label))

    def arrays(self) -> Dict[str, np.ndarray]:
        out = {"labels": np.asarray(self.labels, dtype=np.int64)}
        for doc, sequences in enumerate(self.sequences):
            lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
            out[f"offsets{doc}"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            out[f"tokens{doc}"] = np.concatenate(sequences) if sequences else np.zeros(0, self.dtype)
        return out


def write_cache(cache_dir: Path, splits: Dict[str, SplitWriter], settings: dict) -> dict:
    """Write all splits and the manifest into ``cache_dir`` atomically; returns the manifest."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.", dir=cache_dir.parent))
    try:
        files, counts = {}, {}
        for split, writer in splits.items():
            counts[split] = len(writer.labels)
            for name, array in writer.arrays().items():
                filename = f"{split}.{name}.npy"
                np.save(staging / filename, array)
                files[filename] = sha256_file(staging / filename)
        manifest = {
            "format_version": FORMAT_VERSION,
            "settings": settings,
            "counts": counts,
            "num_documents": {s: len(w.sequences) for s, w in splits.items()},
            "files": files,
        }
        manifest["fingerprint"] = settings_fingerprint({"files": files, "settings": settings})
        atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        if cache_dir.exists():
            shutil.rmtree(cache_dir)
        os.replace(staging, cache_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def load_cache(cache_dir: Path, rebuild_command: str) -> Tuple[Dict[str, TokenSplit], dict]:
    """Load and verify a cache written by :func:`write_cache`; arrays are memory-mapped."""

    def damaged(reason: str) -> UserError:
        return UserError(
            f"the data cache {cache_dir} is damaged ({reason}); rebuild it with: {rebuild_command}"
        )

    try:
        manifest = json.loads((cache_dir / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise damaged(f"unreadable {MANIFEST}: {exc}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise damaged(f"format version {manifest.get('format_version')}, expected {FORMAT_VERSION}")
    for filename, expected in manifest["files"].items():
        path = cache_dir / filename
        if not path.is_file():
            raise damaged(f"{filename} is missing")
        if sha256_file(path) != expected:
            raise damaged(f"{filename} does not match its checksum")
    splits = {}
    for split, num_documents in manifest["num_documents"].items():
        load = lambda name: np.load(cache_dir / f"{split}.{name}.npy", mmap_mode="r")  # noqa: E731
        splits[split] = TokenSplit(
            tokens=[load(f"tokens{d}") for d in range(num_documents)],
            offsets=[np.asarray(load(f"offsets{d}")) for d in range(num_documents)],
            labels=np.asarray(load("labels")),
        )
    return splits, manifest


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Raise a :class:`UserError` naming ``fix`` unless ``folder`` can be created and written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(f"{what} {folder} is not writable ({exc.strerror}); {fix}") from None


