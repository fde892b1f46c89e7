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
import re
import shutil
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lra.errors import UserError
from lra.faults import fault_point
from lra.io import atomic_write_text, readable_by_group, remove_stale

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
    offsets: List[np.ndarray]  # per document slot: int64 [stored examples + 1]
    labels: np.ndarray  # int64 [num_examples]
    rows: Optional[np.ndarray] = None  # example i is stored example rows[i] (a selection); None: all, in order

    def __len__(self) -> int:
        return len(self.labels)

    def _stored(self, index):
        return index if self.rows is None else self.rows[index]

    def lengths(self, document: int = 0) -> np.ndarray:
        lengths = np.diff(self.offsets[document])
        return lengths if self.rows is None else lengths[self.rows]

    def subset(self, count: int | None) -> "TokenSplit":
        """The first ``count`` examples (all of them when ``count`` is None)."""
        if count is None or count >= len(self):
            return self
        if self.rows is not None:
            return TokenSplit(self.tokens, self.offsets, self.labels[:count], self.rows[:count])
        return TokenSplit(self.tokens, [o[: count + 1] for o in self.offsets], self.labels[:count])

    def select(self, indices: np.ndarray) -> "TokenSplit":
        """The examples at ``indices`` (in that order), sharing this split's stored tokens."""
        indices = np.asarray(indices, dtype=np.int64)
        return TokenSplit(self.tokens, self.offsets, self.labels[indices], self._stored(indices))

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
                stored = self._stored(index)
                start, end = offsets[stored], offsets[stored + 1]
                length = min(end - start, max_length)
                ids[row, :length] = tokens[start : start + length]
                lengths[row] = length
            ids_per_doc.append(ids)
            masks_per_doc.append(np.arange(max_length)[None, :] < lengths[:, None])
        return ids_per_doc, masks_per_doc, self.labels[np.asarray(indices)]


class SplitWriter:
    """Streams the examples of one split to disk: tokens are appended to raw files as they come, so
    a conversion holds one example at a time (plus 16 bytes of length and label per example)."""

    def __init__(self, folder: Path, split: str, num_documents: int, dtype, num_classes: Optional[int] = None):
        self.folder, self.split, self.dtype, self.num_classes = folder, split, np.dtype(dtype), num_classes
        self._raw = [open(folder / f".{split}.tokens{d}.raw", "wb") for d in range(num_documents)]
        self._lengths = [array("q") for _ in range(num_documents)]
        self._labels = array("q")

    @property
    def num_documents(self) -> int:
        return len(self._raw)

    def __len__(self) -> int:
        return len(self._labels)

    def add(self, documents: Sequence[np.ndarray], label: int, where: str | Callable[[], str] | None = None) -> None:
        """Append one example; a label outside 0 … num_classes − 1 raises naming ``where`` (the raw file
        and line, or a callable giving it), before anything is cached."""
        if len(documents) != self.num_documents:
            raise ValueError(f"expected {self.num_documents} documents per example, got {len(documents)}")
        if self.num_classes is not None and not (isinstance(label, (int, np.integer)) and 0 <= label < self.num_classes):
            place = (where() if callable(where) else where) or f"{self.split} example {len(self) + 1}"
            raise UserError(f"{place}: the label is {label!r}, but this task's labels are 0 … {self.num_classes - 1}; "
                            "the raw data is damaged or not this task's (nothing was cached)")
        fault_point("cache_example", self.folder)
        for handle, lengths, document in zip(self._raw, self._lengths, documents):
            handle.write(np.ascontiguousarray(document, dtype=self.dtype).tobytes())
            lengths.append(len(document))
        self._labels.append(int(label))

    def finish(self) -> Dict[str, Path]:
        """Close the raw files and turn them into ``.npy`` arrays; returns file name → path."""
        out = {f"{self.split}.labels.npy": np.asarray(self._labels, dtype=np.int64)}
        for doc, (handle, lengths) in enumerate(zip(self._raw, self._lengths)):
            handle.close()
            out[f"{self.split}.offsets{doc}.npy"] = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        paths = {}
        for name, values in out.items():
            np.save(self.folder / name, values)
            paths[name] = self.folder / name
        for doc, handle in enumerate(self._raw):
            raw = Path(handle.name)
            name = f"{self.split}.tokens{doc}.npy"
            count = raw.stat().st_size // self.dtype.itemsize
            target = np.lib.format.open_memmap(self.folder / name, mode="w+", dtype=self.dtype, shape=(count,))
            if count:
                source = np.memmap(raw, dtype=self.dtype, mode="r")
                for start in range(0, count, 1 << 24):  # chunked copy: memory stays bounded
                    target[start : start + (1 << 24)] = source[start : start + (1 << 24)]
                del source
            target.flush()
            del target
            raw.unlink()
            paths[name] = self.folder / name
        return paths


class CacheBuilder:
    """Builds a cache directory under a temporary name and renames it into place on :meth:`commit`;
    on an error (or without a commit) the partial directory is removed.

    >>> with CacheBuilder(cache_dir) as builder:
    ...     writer = builder.split("train", num_documents=1, dtype=np.uint16)
    ...     writer.add([tokens], label)
    ...     builder.commit(settings)
    """

    def __init__(self, cache_dir: Path, num_classes: Optional[int] = None):
        self.cache_dir = Path(cache_dir)
        self.num_classes = num_classes  # labels must lie in 0 … num_classes − 1 (None: unchecked)
        self.writers: Dict[str, SplitWriter] = {}
        self.extra: dict = {}

    def __enter__(self) -> "CacheBuilder":
        self.cache_dir.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.cache_dir.parent, rf"\.{re.escape(self.cache_dir.name)}\.(?P<pid>\d+)\..*")  # a killed build's
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.cache_dir.name}.{os.getpid()}.", dir=self.cache_dir.parent))
        readable_by_group(self.staging)  # a shared data directory stays readable by the group
        return self

    def __exit__(self, *exc_info) -> None:
        for writer in self.writers.values():
            for handle in writer._raw:
                handle.close()
        shutil.rmtree(self.staging, ignore_errors=True)

    def split(self, name: str, num_documents: int = 1, dtype=np.uint8) -> SplitWriter:
        self.writers[name] = SplitWriter(self.staging, name, num_documents, dtype, self.num_classes)
        return self.writers[name]

    def commit(self, settings: dict) -> dict:
        """Finish every split, write the manifest (plus ``self.extra``) and move the cache into place.
        A split without examples is refused: nothing is cached."""
        empty = [split for split, writer in self.writers.items() if len(writer) == 0]
        if empty:
            raw = self.extra.get("raw_folder")
            raise UserError(f"the {', '.join(empty)} split{'s are' if len(empty) > 1 else ' is'} empty"
                            + (f" (raw data: {raw})" if raw else "") + "; nothing was cached: check that the raw "
                            "files hold examples (and are the complete download)")
        files, counts = {}, {}
        for split, writer in self.writers.items():
            counts[split] = len(writer)
            for name, path in writer.finish().items():
                files[name] = sha256_file(path)
        manifest = {
            "format_version": FORMAT_VERSION,
            "settings": settings,
            "counts": counts,
            "num_documents": {s: w.num_documents for s, w in self.writers.items()},
            "files": files,
            **self.extra,
        }
        manifest["fingerprint"] = settings_fingerprint({"files": files, "settings": settings})
        atomic_write_text(self.staging / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        if self.cache_dir.exists() and not (self.cache_dir / MANIFEST).is_file():
            shutil.rmtree(self.cache_dir)  # a leftover without a manifest is not a cache
        try:
            os.replace(self.staging, self.cache_dir)
        except OSError:
            if not (self.cache_dir / MANIFEST).is_file():
                raise
            # Another job (same settings) finished first: keep its cache, which readers may hold open.
            return json.loads((self.cache_dir / MANIFEST).read_text())
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
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), dict) for k in ("files", "num_documents", "counts")):
        raise damaged(f"{MANIFEST} lacks its files, documents or counts")
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
    for alias, target in manifest.get("aliases", {}).items():  # e.g. IMDb: validation = test
        splits[alias] = splits[target]
        manifest["counts"][alias] = manifest["counts"][target]
    return splits, manifest


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Raise a :class:`UserError` naming ``fix`` unless ``folder`` can be created and written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(f"{what} {folder} is not writable ({exc.strerror}); {fix}") from None


