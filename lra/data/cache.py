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

from lra.data import locking
from lra.errors import UserError
from lra.faults import fault_point
from lra.io import atomic_write_text, naming, pid_alive, readable_by_group, remove_stale

MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest_sha256"  # the SHA-256 of the manifest's other fields, required
FORMAT_VERSION = 1


def hash_into(digest, path: Path, chunk_size: int = 1 << 22) -> None:
    """Feed the bytes of ``path`` into ``digest`` (a hashlib object), a chunk at a time."""
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)


def sha256_file(path: Path, chunk_size: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    hash_into(digest, path, chunk_size)
    return digest.hexdigest()


def settings_fingerprint(settings: dict) -> str:
    """A short stable hash of JSON-serialisable settings, used to name cache directories."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def manifest_digest(manifest: dict) -> str:
    """The SHA-256 of every field of a manifest but the digest itself (keys sorted): an edit of any
    field — counts, aliases, the raw folder — shows."""
    fields = {key: value for key, value in manifest.items() if key != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def refresh_manifest(cache_dir: Path, read: dict, fields: dict) -> bool:
    """Write ``fields`` over those of the manifest in ``cache_dir``, its digest recomputed, in one atomic step,
    when that manifest is still ``read`` and intact (a cache rebuilt meanwhile, or a manifest edited by hand,
    is left as it is). False where nothing was written: the cache then stays valid as it was."""
    if read.get(MANIFEST_DIGEST) != manifest_digest(read):
        return False
    try:
        with locking.replacing(cache_dir):  # never over the manifest of a rebuild swapped in meanwhile
            if json.loads((cache_dir / MANIFEST).read_text()).get(MANIFEST_DIGEST) != read[MANIFEST_DIGEST]:
                return False
            manifest = {**read, **fields}
            manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
            atomic_write_text(cache_dir / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
    except (UserError, OSError, ValueError, AttributeError):
        return False  # a read-only data folder: the next start compares the contents again
    return True


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


def heldout(splits: Dict[str, TokenSplit], size: int, seed: int, task: str):
    """(splits, description) with ``size`` training examples, drawn with ``seed``, as the validation
    split and the rest as the training split: validation never touches the test split."""
    train = splits["train"]
    if size >= len(train):
        raise UserError(f"task.heldout_size={size} leaves no training examples ({task} has {len(train)}); "
                        "choose a smaller task.heldout_size")
    order = np.random.default_rng(seed).permutation(len(train))
    chosen, rest = np.sort(order[:size]), np.sort(order[size:])
    return ({**splits, "train": train.select(rest), "val": train.select(chosen)},
            f"held out: {size} training examples (seed {seed})")


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
            _raw_to_npy(raw, self.folder / name, self.dtype)
            raw.unlink()
            paths[name] = self.folder / name
        return paths


def _raw_to_npy(raw: Path, target: Path, dtype: np.dtype) -> None:
    """The raw token file as a one-dimensional ``.npy``: the header, then the bytes copied in chunks
    with plain writes (memory stays bounded; a full disk is an ``OSError``, where writing through a
    memory map would kill the process with SIGBUS and leave the staging folder behind)."""
    count = raw.stat().st_size // dtype.itemsize
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (count,)}
    with open(target, "wb") as out, open(raw, "rb") as source:
        np.lib.format.write_array_header_1_0(out, header)
        while chunk := source.read(1 << 24):
            out.write(chunk)
            fault_point("cache_finish", target)


class CacheBuilder:
    """Builds a cache directory under a temporary name and renames it into place on :meth:`commit`;
    on an error (or without a commit) the partial directory is removed.

    >>> with CacheBuilder(cache_dir) as builder:
    ...     writer = builder.split("train", num_documents=1, dtype=np.uint16)
    ...     writer.add([tokens], label)
    ...     builder.commit(settings)
    """

    def __init__(self, cache_dir: Path, num_classes: Optional[int] = None, replace: bool = False,
                 announce: Optional[Callable[[str], None]] = None):
        self.cache_dir = Path(cache_dir)
        self.announce = announce  # says when the swap waits for jobs loading the cache in place
        self.num_classes = num_classes  # labels must lie in 0 … num_classes − 1 (None: unchecked)
        self.replace = replace  # a rebuild: the cache in place (if any) is swapped out at the commit, not before
        self.writers: Dict[str, SplitWriter] = {}
        self.extra: dict = {}

    def __enter__(self) -> "CacheBuilder":
        self.cache_dir.parent.mkdir(parents=True, exist_ok=True)
        self._restore_retired()
        remove_stale(self.cache_dir.parent, rf"\.{re.escape(self.cache_dir.name)}\.(?P<pid>\d+)\..*")  # a killed build's
        self.staging = Path(tempfile.mkdtemp(prefix=f".{self.cache_dir.name}.{os.getpid()}.", dir=self.cache_dir.parent))
        readable_by_group(self.staging)  # a shared data directory stays readable by the group
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            for writer in self.writers.values():
                for handle in writer._raw:
                    try:
                        handle.close()
                    except OSError:  # its buffer could not be written (a full disk): the folder goes anyway
                        if exc_info[0] is None:
                            raise
        finally:
            shutil.rmtree(self.staging, ignore_errors=True)
        named = naming(exc_info[1], self.cache_dir) if exc_info[1] is not None else None
        if named is not None:  # a full disk: the line says which cache could not be written
            raise named from exc_info[1]

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
        manifest = json.loads(json.dumps(manifest))  # as a reader will see it (tuples are lists)
        manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
        atomic_write_text(self.staging / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
        with locking.replacing(self.cache_dir, self.announce):  # no job is loading the cache in place meanwhile
            if self.cache_dir.exists() and not (self.cache_dir / MANIFEST).is_file():
                shutil.rmtree(self.cache_dir)  # a leftover without a manifest is not a cache
            if self.replace and self.cache_dir.exists():
                self._swap_in()
                return manifest
            try:
                os.replace(self.staging, self.cache_dir)
            except OSError:
                if not (self.cache_dir / MANIFEST).is_file():
                    raise
                # Another job (same settings) finished first: keep its cache, which readers may hold open.
                return json.loads((self.cache_dir / MANIFEST).read_text())
        return manifest


    def _restore_retired(self) -> None:
        """A cache a dead process retired for its rebuild but never replaced (killed between the swap's two
        renames) goes back in place before anything else (the stale-temporary sweep below would delete it)."""
        if self.cache_dir.exists():
            return
        for retired in self.cache_dir.parent.glob(f".{self.cache_dir.name}.*.replaced"):
            match = re.fullmatch(rf"\.{re.escape(self.cache_dir.name)}\.(\d+)\.replaced", retired.name)
            if match and not pid_alive(int(match.group(1))) and (retired / MANIFEST).is_file():
                os.replace(retired, self.cache_dir)
                return

    def _swap_in(self) -> None:
        """The staged cache in place of the one there, which is kept until then (a failed or interrupted
        rebuild leaves it as it was): two renames with signals held off between them, then the old one
        removed (readers holding its arrays open keep them)."""
        from lra import signals

        retired = self.cache_dir.parent / f".{self.cache_dir.name}.{os.getpid()}.replaced"
        with signals.deferred():
            os.replace(self.cache_dir, retired)
            try:
                os.replace(self.staging, self.cache_dir)
            except OSError:
                os.replace(retired, self.cache_dir)  # the old cache back in place, then the error
                raise
        shutil.rmtree(retired, ignore_errors=True)


def load_cache(cache_dir: Path, rebuild_command: str, settings: Optional[dict] = None,
               splits: Sequence[str] = ()) -> Tuple[Dict[str, TokenSplit], dict]:
    """Load a cache written by :class:`CacheBuilder`, arrays memory-mapped, after checking it against
    its manifest: the manifest's own digest and fingerprint, every file's SHA-256, the files each split
    must have and nothing else, counts and offsets that agree with the arrays, ``settings`` (the
    settings this cache must have been built with) and the ``splits`` it must provide. Anything else
    is one :class:`UserError` naming ``rebuild_command``."""

    def damaged(reason: str) -> UserError:
        return UserError(
            f"the data cache {cache_dir} is damaged ({reason}); rebuild it with: {rebuild_command}"
        )

    with locking.reading(cache_dir):  # one cache throughout, never half of a rebuild swapped in meanwhile
        return _load(cache_dir, damaged, settings, splits)


def _load(cache_dir: Path, damaged: Callable[[str], UserError], settings: Optional[dict],
          splits: Sequence[str]) -> Tuple[Dict[str, TokenSplit], dict]:
    try:
        manifest = json.loads((cache_dir / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise damaged(f"unreadable {MANIFEST}: {exc}") from None
    fault_point("cache_load", cache_dir)  # tests: LRA_FAULT=cache_load:1:SIGSTOP holds a load here
    problem = _manifest_problem(manifest, settings)
    if problem:
        raise damaged(f"{MANIFEST} {problem}")
    for filename, expected in manifest["files"].items():
        path = cache_dir / filename
        if not path.is_file():
            raise damaged(f"{filename} is missing")
        if sha256_file(path) != expected:
            raise damaged(f"{filename} does not match its checksum")
    loaded = {}
    for split, num_documents in manifest["num_documents"].items():
        load = lambda name: np.load(cache_dir / f"{split}.{name}.npy", mmap_mode="r")  # noqa: E731
        try:
            loaded[split] = TokenSplit(
                tokens=[load(f"tokens{d}") for d in range(num_documents)],
                offsets=[np.asarray(load(f"offsets{d}")) for d in range(num_documents)],
                labels=np.asarray(load("labels")),
            )
        except (OSError, ValueError) as exc:
            raise damaged(f"the {split} split's arrays are unreadable ({exc})") from None
        problem = _split_problem(loaded[split], manifest["counts"][split])
        if problem:
            raise damaged(f"the {split} split {problem}")
    for alias, target in manifest.get("aliases", {}).items():  # e.g. IMDb: validation = test
        loaded[alias] = loaded[target]
        manifest["counts"][alias] = manifest["counts"][target]
    missing = [split for split in splits if split not in loaded]
    if missing:
        raise damaged(f"it has no {', '.join(missing)} split")
    return loaded, manifest


def checked_manifest(cache_dir: Path) -> Tuple[Optional[dict], Optional[str]]:
    """The manifest in ``cache_dir`` (None when unreadable) and what is wrong with its own fields (None: nothing)."""
    try:
        manifest = json.loads((cache_dir / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        return None, f"unreadable {MANIFEST}: {exc}"
    problem = _manifest_problem(manifest, None)
    return manifest, problem and f"{MANIFEST} {problem}"


def _manifest_problem(manifest, settings: Optional[dict]) -> Optional[str]:
    """What is wrong with a manifest's own fields (None when nothing): their types, its digest and
    fingerprint, the file list each split implies, the aliases, and the settings it must record."""
    if not isinstance(manifest, dict) or not all(isinstance(manifest.get(k), dict)
                                                  for k in ("files", "num_documents", "counts")):
        return "lacks its files, documents or counts"
    if manifest.get("format_version") != FORMAT_VERSION:
        return f"has format version {manifest.get('format_version')!r}, expected {FORMAT_VERSION}"
    if MANIFEST_DIGEST not in manifest:  # an edit could drop it to pass (the aliases, say); no cache comes without
        return f"has no {MANIFEST_DIGEST} (removed, or written before caches recorded one)"
    if manifest[MANIFEST_DIGEST] != manifest_digest(manifest):
        return "was changed after the cache was built (its fields do not match their digest)"
    recomputed = settings_fingerprint({"files": manifest["files"], "settings": manifest.get("settings")})
    if manifest.get("fingerprint") != recomputed:
        return "does not match its fingerprint (its files or settings were changed)"
    if settings is not None and manifest.get("settings") != settings:
        return "records other settings than this cache's (its folder name is the fingerprint of the settings)"
    documents, counts = manifest["num_documents"], manifest["counts"]
    expected = set()
    for split, number in documents.items():
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            return f"gives the {split} split {number!r} documents per example"
        if not isinstance(counts.get(split), int) or isinstance(counts.get(split), bool):
            return f"has no count for the {split} split"
        expected |= {f"{split}.labels.npy",
                     *(f"{split}.{kind}{d}.npy" for kind in ("tokens", "offsets") for d in range(number))}
    if set(manifest["files"]) != expected:
        wrong = sorted(set(manifest["files"]) ^ expected)
        return f"lists other files than its splits have ({', '.join(wrong[:3])})"
    aliases = manifest.get("aliases", {})
    if not isinstance(aliases, dict) or any(a in documents or t not in documents for a, t in aliases.items()):
        return f"has aliases {aliases!r} that do not name a stored split under a new name"
    return None


def _split_problem(split: TokenSplit, count: int) -> Optional[str]:
    """What is wrong with one loaded split (None when nothing): its count and offsets against its arrays."""
    if len(split.labels) != count:
        return f"has {len(split.labels)} labels but its count is {count}"
    for tokens, offsets in zip(split.tokens, split.offsets):
        if (offsets.ndim != 1 or len(offsets) != count + 1 or (len(offsets) and offsets[0] != 0)
                or offsets[-1] != len(tokens) or bool(np.any(np.diff(offsets) < 0))):
            return "has offsets that do not cut its tokens into its examples"
    return None
