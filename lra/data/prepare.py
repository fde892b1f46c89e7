"""From a task config to verified, cached splits: locate (or generate) the raw data, tokenise it once into the cache,
and load the cache (checksums verified). ``lra-train`` prepares on its own only what needs nothing from the user
(generated ListOps and Pathfinder, ListOps release files); the rest (downloads, raw IMDb / CIFAR / AAN files,
Pathfinder release images) is converted once by ``lra-prepare``, whose exact command ``lra-train`` names."""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from lra.config import typed_task
from lra.data import (byte_text, generated, image, listops, listops_rows, locking, pathfinder, pathfinder_generator,
                      raw_files, raw_text, retrieval)
from lra.data.cache import (MANIFEST, CacheBuilder, TokenSplit, checked_manifest, heldout, load_cache,
                            settings_fingerprint)
from lra.data.sources import AUTO, PATH_OF, SOURCES
from lra.errors import UserError

SPLITS = ("train", "val", "test")


@dataclass
class PreparedData:
    splits: Dict[str, TokenSplit]
    manifest: dict
    cache_dir: Path
    validation: str = "the validation split"  # what the val split is (recorded with every run)

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]

    @property
    def content(self) -> str:
        """A digest of what the cache holds (its arrays' SHA-256s and aliases), not of how it was named or
        built: the same data prepared under other settings strings keeps it."""
        return settings_fingerprint({"files": self.manifest["files"], "aliases": self.manifest.get("aliases", {})})

    @property
    def source(self) -> str:
        return self.manifest["settings"]["source"]

    @property
    def raw_folder(self) -> Optional[str]:
        return self.manifest.get("raw_folder")


@dataclass
class Conversion:
    """How to build one task's cache: its identity, whether lra-train may build it, and the builder."""

    settings: dict
    build: Callable[[CacheBuilder, Callable[[str], None]], None]
    automatic: bool  # lra-train may build it (no download, no user files beyond small ones)
    locate: Callable[[], Optional[str]] = lambda: None  # the raw folder, recorded in the manifest
    raw_files: Optional[Callable[[], List[Path]]] = None  # the user's files it reads (lra.data.raw_files)
    checked_by_train: bool = True  # lra-train checks them too (a few files); else lra-prepare alone (thousands)


def load_task_data(
    task,
    data_dir: Path,
    *,
    train_subset: Optional[int] = None,
    eval_subset: Optional[int] = None,
    announce: Callable[[str], None] = print,
    prepare: bool = False,
    rebuild: bool = False,
) -> PreparedData:
    """The splits of ``task`` (a task config node), preparing them first when allowed.

    ``prepare`` (lra-prepare) converts any source; without it only automatic conversions run.
    ``rebuild`` discards an existing (or damaged) cache first.
    """
    task = typed_task(task)  # its rules (a known task and source among them) hold from here on
    data_dir = Path(data_dir).resolve()
    chosen_by_auto = task.source == AUTO and not task.path and not prepare  # task.path: the folder its cache records
    if task.source == AUTO:
        task = with_values(task, source=SOURCES[task.name][0]) if prepare else resolve_auto_source(task, data_dir, announce)
    conversion = CONVERSIONS[task.name](task, data_dir, train_subset, eval_subset, announce)
    cache_dir = _cache_dir(task, conversion, data_dir)
    command = prepare_command(task, data_dir)
    replace, raw_folder = _build_needed(task, conversion, cache_dir, command, prepare, rebuild, announce)
    if replace or not (cache_dir / MANIFEST).is_file():
        if not (prepare or conversion.automatic):
            raise UserError(f"no prepared {task.name} data ({task.source}) in {data_dir}; prepare it once with: {command}")
        generated.writable(cache_dir.parent)
        then = "then rebuilding it as asked (--force)" if rebuild else "then using what it prepared"
        with locking.preparing(cache_dir, f"the {task.name} cache {cache_dir}", announce, then=then) as waited:
            if waited:  # the job waited for may have prepared it: judged again, as it is now
                replace, raw_folder = _build_needed(task, conversion, cache_dir, command, prepare, rebuild, announce)
            if replace or not (cache_dir / MANIFEST).is_file():
                _build(task, conversion, cache_dir, replace, raw_folder, announce)
    rebuild_with = (f"rm -r {shlex.quote(str(cache_dir))} and run the same command again" if task.source == "generate"
                    else f"{command} --force")  # a release's by its source: under auto, a removed cache is generated
    expected = json.loads(json.dumps(cache_settings(task, conversion)))  # as its manifest records them
    splits, manifest = load_cache(cache_dir, rebuild_command=rebuild_with, settings=expected, splits=SPLITS)
    _check_raw_folder(task, conversion, manifest, cache_dir, command, announce if chosen_by_auto else None)
    _check_labels(task, splits, cache_dir)
    data = PreparedData(splits, manifest, cache_dir)
    if task.validation == "heldout":
        data.splits, data.validation = heldout(data.splits, task.heldout_size, task.heldout_seed, task.name)
    else:
        aliased = manifest.get("aliases", {}).get("val") == "test"
        data.validation = "the test split (the reference's protocol)" if aliased else "the validation split"
    subsets = {"train": train_subset, "val": eval_subset, "test": eval_subset}
    data.splits = {name: split.subset(subsets[name]) for name, split in data.splits.items()}
    return data


def _build_needed(task, conversion: Conversion, cache_dir: Path, command: str, prepare: bool, rebuild: bool,
                  announce) -> Tuple[bool, Optional[str]]:
    """(whether the cache in place must be rebuilt, the raw folder when it was located to judge that)."""
    raw_folder, existing = None, _existing_manifest(cache_dir)  # None: no cache; {}: an unreadable manifest
    if prepare and existing is not None and not rebuild:
        if "raw_folder" not in existing:
            announce(f"the cache {cache_dir} is damaged (unreadable {MANIFEST}); rebuilding it")
            rebuild = True
        raw_folder = conversion.locate()
        if not rebuild and existing["raw_folder"] != raw_folder:
            announce(f"the cache was built from {existing['raw_folder']}; rebuilding it from {raw_folder}")
            rebuild = True
    if not rebuild and existing and conversion.raw_files is not None and (prepare or conversion.checked_by_train):
        rebuild = raw_files.stale(task.name, conversion.raw_files, conversion.locate, cache_dir, existing, command,
                                  announce, rebuild_allowed=prepare or conversion.automatic)
    return rebuild, raw_folder


def _build(task, conversion: Conversion, cache_dir: Path, replace: bool, raw_folder: Optional[str], announce) -> None:
    kept = " (the cache there is kept until the new one is complete)" if (cache_dir / MANIFEST).is_file() else ""
    announce(f"preparing {task.name} ({task.source}) into {cache_dir}{kept}")
    with CacheBuilder(cache_dir, num_classes=task.num_classes, replace=replace, announce=announce) as builder:
        builder.extra["raw_folder"] = raw_folder or conversion.locate()
        if conversion.raw_files is not None:  # before the build: a change while it reads shows next time
            builder.extra[raw_files.RAW_FILES] = raw_files.signature(conversion.raw_files)
        conversion.build(builder, announce)
        builder.commit(cache_settings(task, conversion))


def _existing_manifest(cache_dir: Path) -> Optional[dict]:
    """The manifest in ``cache_dir``: None when there is none, {} when it is unreadable or not an object."""
    manifest = checked_manifest(cache_dir)[0] if (cache_dir / MANIFEST).is_file() else None
    return {} if (cache_dir / MANIFEST).is_file() and not isinstance(manifest, dict) else manifest


def _check_raw_folder(task, conversion: Conversion, manifest: dict, cache_dir: Path, command: str,
                      auto_announce: Optional[Callable[[str], None]]) -> None:
    """An explicit ``task.path`` is served only a cache prepared from that folder (a cache's folder name is
    the fingerprint of its settings, which for the user's own files do not include where they are); under
    task.source=auto (``auto_announce``: the path is the manifest's), a folder gone since leaves it usable."""
    if not task.path or task.source == "generate" or manifest.get("raw_folder") is None:
        return  # (None: tensorflow-datasets' own folder, which it reads itself)
    try:
        folder = conversion.locate()
    except UserError:
        if auto_announce is None:
            raise
        folder = None
    if auto_announce is not None and not (folder and Path(folder).exists()):
        return auto_announce(f"task.source=auto: its raw folder {manifest['raw_folder']} is gone: the cache is used as "
                             "prepared (its arrays checked against their digests; whether the raw files changed cannot be)")
    if folder is not None and manifest["raw_folder"] != folder:
        raise UserError(f"the {task.name} cache {cache_dir} was prepared from "
                        f"{manifest['raw_folder']}, not task.path={folder}; prepare it from there with: {command}")


def _check_labels(task, splits: Dict[str, TokenSplit], cache_dir: Path) -> None:
    """The cache's labels fit the task's ``num_classes``: a cache whose labels do not is damaged."""
    highest = max((int(split.labels.max()) for split in splits.values() if len(split)), default=-1)
    if highest >= task.num_classes:
        raise UserError(f"the prepared {task.name} data ({cache_dir}) has labels up to {highest}, but task.num_classes="
                        f"{task.num_classes}: the cache is damaged; remove it (rm -r {cache_dir}) and prepare it again")


def cache_settings(task, conversion: Conversion) -> dict:
    return {"task": task.name, "source": task.source, **conversion.settings}


def _cache_dir(task, conversion: Conversion, data_dir: Path) -> Path:
    return data_dir / task.name / "cache" / settings_fingerprint(cache_settings(task, conversion))


def with_values(task, **values):
    """A copy of the task config with some values replaced (and its rules run again)."""
    return dataclasses.replace(task, **values)


def resolve_auto_source(task, data_dir: Path, announce: Callable[[str], None]):
    """The task config with ``source=auto`` made concrete: the prepared cache of this task's settings
    when there is exactly one (from any source but the generator; with ``task.path``, only caches
    built from that folder); the generator when there is none and the task has one; otherwise a
    one-line error that lists the candidates or names the lra-prepare command."""
    candidates = []
    # (not the staging folders of builds, named .<name>.<pid>.*: in progress, or interrupted and removed by the next)
    for manifest_file in sorted((data_dir / task.name / "cache").glob(f"[!.]*/{MANIFEST}")):
        manifest = _intact_manifest(task, manifest_file.parent, data_dir)
        source, folder = manifest["settings"]["source"], manifest.get("raw_folder")
        if source == "generate":
            continue
        candidate = with_values(task, source=source, path=task.path or folder)
        try:
            conversion = CONVERSIONS[task.name](candidate, data_dir, None, None, announce)
            if task.path and conversion.locate() != folder:
                continue  # built from another folder than task.path
        except UserError:
            continue  # its raw folder is gone (an explicit task.source says so) or task.path is not of this source
        named_now = _cache_dir(candidate, conversion, data_dir) == manifest_file.parent
        strip = lambda given: {key: value for key, value in given.items() if key != "raw"}  # noqa: E731
        # or the same but for how its raw files were identified (ListOps', once by their sizes): rebuilt once, below
        if (named_now or strip(manifest["settings"]) == strip(cache_settings(candidate, conversion))) and not any(
                (c.source, c.path) == (candidate.source, candidate.path) for c in candidates):
            candidates.append(candidate)
    if len(candidates) == 1:
        chosen = candidates[0]
        announce(f"task.source=auto: the prepared {chosen.source} data"
                 + (f" from {chosen.path}" if chosen.path else "") + f" in {data_dir}")
        return chosen
    if len(candidates) > 1:
        listed = ", ".join(sorted(f"task.source={c.source}" + (f" task.path={c.path}" if c.path else "") for c in candidates))
        raise UserError(f"task.source=auto found {len(candidates)} prepared {task.name} caches for these settings in "
                        f"{data_dir}; choose one: {listed}")
    if "generate" in SOURCES[task.name] and not task.path:
        return with_values(task, source="generate")
    readers = [source for source in SOURCES[task.name] if source != "generate"]  # the generator takes no task.path
    default = with_values(task, source=readers[0] if task.path else SOURCES[task.name][0])
    raise UserError(f"no prepared {task.name} data" + (f" from {_resolved(task.path)}" if task.path else "")
                    + f" in {data_dir} (sources: {', '.join(SOURCES[task.name])}; see lra-prepare --help); "
                    f"prepare it once with: {prepare_command(default, data_dir)}")


def _intact_manifest(task, cache_dir: Path, data_dir: Path) -> dict:
    """The manifest of a cache task.source=auto looks at, passing its own checks and naming a source of the task;
    else one line naming the folder and the fix: a damaged cache is refused, never passed over."""
    manifest, problem = checked_manifest(cache_dir)
    manifest = manifest if isinstance(manifest, dict) else {}
    source = manifest["settings"].get("source") if isinstance(manifest.get("settings"), dict) else None
    generated = with_values(task, source="generate", path=None) if "generate" in SOURCES[task.name] else None
    if source == "generate" or (generated and cache_dir == _cache_dir(
            generated, CONVERSIONS[task.name](generated, data_dir, None, None, None), data_dir)):
        return {"settings": {"source": "generate"}}  # the generator's own: checked, with its own line, where it loads
    if problem is None and source not in SOURCES[task.name]:
        problem = f"{MANIFEST} names the source {source!r}, not one of {task.name}'s ({', '.join(SOURCES[task.name])})"
    if problem is None:
        return manifest
    fix = f"remove it: rm -r {shlex.quote(str(cache_dir))}"
    folder = manifest.get("raw_folder") if source in SOURCES[task.name] else 0
    try:  # the source it still names rebuilds it, when it is the cache of this run's settings
        candidate = with_values(task, source=source, path=folder) if isinstance(folder, (str, type(None))) else None
        if candidate and _cache_dir(candidate, CONVERSIONS[task.name](candidate, data_dir, None, None, None),
                                    data_dir) == cache_dir:
            fix = f"rebuild it with: {prepare_command(candidate, data_dir)} --force (or {fix})"
    except UserError:
        pass
    raise UserError(f"task.source=auto: the {task.name} cache {cache_dir} is damaged ({problem}); {fix}")


def prepare_command(task, data_dir: Path) -> str:
    """The ``lra-prepare`` command that builds this task's cache."""
    parts = ["lra-prepare", task.name, "--source", task.source]
    if task.path:
        parts += ["--path", str(Path(task.path).expanduser().resolve())]
    elif task.source in PATH_OF:  # where the user's copy of the files is: theirs to fill in
        parts += ["--path", PATH_OF[task.source]]
    parts += ["--data-dir", str(data_dir)]
    if getattr(task, "document_bytes", None) is not None:
        parts.append(f"task.document_bytes={task.document_bytes}")
    for key in ("resolution", "difficulty", "split_seed"):
        if hasattr(task, key):
            parts.append(f"task.{key}={getattr(task, key)}")
    return shlex.join(parts)  # quoted for the shell: paths may hold spaces


def _progress(items: Iterable, total: Optional[int], description: str):
    return tqdm(items, total=total, desc=description, unit="ex", disable=None, mininterval=1.0)


# ----------------------------------------------------------------------------- ListOps
def _listops(task, data_dir, train_subset, eval_subset, announce) -> Conversion:
    if task.source == "generate":
        generator = dataclasses.replace(task.generator)  # a copy: a smoke run shrinks it
        # A smoke run needs only its subsets: generate just those (a distinct, smaller dataset).
        if train_subset is not None:
            generator.num_train = min(generator.num_train, train_subset)
        if eval_subset is not None:
            generator.num_val = min(generator.num_val, eval_subset)
            generator.num_test = min(generator.num_test, eval_subset)
        raw_dir = data_dir / "listops" / "generated" / settings_fingerprint(generator.as_dict())
        identity = {"generator": generator.as_dict()}
    else:
        raw_dir = listops.find_release(task.path, strict=False)
        identity = {"folder": str(raw_dir)}

    def build(builder: CacheBuilder, announce) -> None:
        if task.source == "generate":
            generated.listops_files(generator, raw_dir, announce)
        else:
            listops.find_release(task.path)  # its files are there, or one line says where it looked
        for split in SPLITS:
            writer = builder.split(split, num_documents=1, dtype=np.uint8)
            path = raw_dir / f"basic_{split}.tsv"
            listops_rows.add_tsv_rows(path, writer, lambda rows: _progress(rows, None, f"tokenising {split}"))
            if task.source == "lra_release":
                raw_text.note_unlike_release(path, len(writer), listops.RELEASE_ROWS[split], announce)

    settings = {
        "raw": identity,
        "tokenisation": "original: ']' -> 'X', parentheses removed, whitespace split",
        "vocabulary": list(listops.VOCABULARY),
    }
    released = task.source == "lra_release"
    return Conversion(settings, build, automatic=True, locate=lambda: str(raw_dir) if released else None,
                      raw_files=(lambda: [raw_dir / f"basic_{s}.tsv" for s in SPLITS]) if released else None)


# ----------------------------------------------------------------------------- Text
def _text(task, data_dir, train_subset, eval_subset, announce) -> Conversion:
    limit = task.document_bytes
    settings = {"encoding": "utf-8 bytes + 1", "document_bytes": limit, "val": "the test split (as the original)",
                "review": "file bytes, surrounding whitespace stripped (as tfds imdb_reviews)"}

    def build(builder: CacheBuilder, announce) -> None:
        builder.extra["aliases"] = {"val": "test"}
        for split in ("train", "test"):
            writer = builder.split(split, num_documents=1, dtype=np.uint16)
            if task.source == "aclimdb":
                root = byte_text.find_aclimdb(task.path)
                files = byte_text.aclimdb_files(root, split)  # each class folder holds reviews, or it raises
                rows, total = byte_text.read_aclimdb(files), len(files)
            else:
                source = byte_text.read_tfds("imdb_reviews", split, task.path, ("text", "label"), builder.extra)
                rows, total = ((item["text"], int(item["label"])) for item in source), len(source)
            for text, label in _progress(rows, total, f"encoding {split}"):
                writer.add([byte_text.encode_bytes(text, limit)], label)

    def locate() -> Optional[str]:
        return str(byte_text.find_aclimdb(task.path)) if task.source == "aclimdb" else _resolved(task.path)

    def reviews() -> List[Path]:
        root = byte_text.find_aclimdb(task.path)
        return [file for split in ("train", "test") for file, _ in byte_text.aclimdb_files(root, split)]

    return Conversion(settings, build, automatic=False, locate=locate,
                      raw_files=reviews if task.source == "aclimdb" else None, checked_by_train=False)


# ----------------------------------------------------------------------------- Retrieval
def _retrieval(task, data_dir, train_subset, eval_subset, announce) -> Conversion:
    limit = task.document_bytes
    settings = {"encoding": "utf-8 bytes + 1", "document_bytes": limit}

    def build(builder: CacheBuilder, announce) -> None:
        folder = retrieval.find_release(task.path)
        for split, name in retrieval.FILES.items():
            writer = builder.split(split, num_documents=2, dtype=np.uint16)
            path = folder / name
            for text1, text2, label in _progress(retrieval.read_pairs(path), retrieval.count_lines(path), f"encoding {split}"):
                writer.add([byte_text.encode_bytes(text1, limit), byte_text.encode_bytes(text2, limit)], label)
            raw_text.note_unlike_release(path, len(writer), retrieval.RELEASE_PAIRS[split], announce)

    return Conversion(settings, build, automatic=False, locate=lambda: str(retrieval.find_release(task.path)),
                      raw_files=lambda: [retrieval.find_release(task.path) / name for name in retrieval.FILES.values()])


# ----------------------------------------------------------------------------- Image
def _image(task, data_dir, train_subset, eval_subset, announce) -> Conversion:
    settings = {"pixels": "tf.image.rgb_to_grayscale, row-major",
                "splits": "tfds cifar10 train[:90%], train[90%:], test (tfds order: md5 of split name and index)"}

    def build(builder: CacheBuilder, announce) -> None:
        writers = {split: builder.split(split, num_documents=1, dtype=np.uint8) for split in SPLITS}
        for split, rgb, label in _image_rows(task, builder.extra):
            writers[split].add([image.tf_grayscale(rgb).reshape(-1)], label,
                               where=lambda: f"{task.source} {split} image {len(writers[split]) + 1}")

    def locate() -> Optional[str]:
        return str(image.find_cifar_python(task.path)) if task.source == "cifar_python" else _resolved(task.path)

    def batches() -> List[Path]:
        return [image.find_cifar_python(task.path) / name for name in image.BATCHES]

    return Conversion(settings, build, automatic=False, locate=locate,
                      raw_files=batches if task.source == "cifar_python" else None)


def _image_rows(task, record: dict) -> Iterable[Tuple[str, np.ndarray, int]]:
    if task.source == "cifar_python":
        root = image.find_cifar_python(task.path)
        record["split_order"] = "tensorflow-datasets cifar10 (md5 of the split name and the example index)"
        yield from _progress(image.read_cifar_python(root), 60_000, "converting CIFAR-10")
        return
    for split, tfds_split in (("train", "train[:90%]"), ("val", "train[90%:]"), ("test", "test")):
        source = byte_text.read_tfds("cifar10", tfds_split, task.path, ("image", "label"), record)
        for item in _progress(source, len(source), f"converting {split}"):
            yield split, np.asarray(item["image"], dtype=np.uint8), int(item["label"])


# ----------------------------------------------------------------------------- Pathfinder
def _pathfinder(task, data_dir, train_subset, eval_subset, announce) -> Conversion:
    if task.max_length < task.resolution ** 2:
        raise UserError(f"pathfinder{task.resolution} has {task.resolution ** 2} pixels but task.max_length="
                        f"{task.max_length}; set task.max_length={task.resolution ** 2}")
    try:
        geometry = pathfinder_generator.geometry_for(task.resolution, task.difficulty)
    except ValueError as exc:
        raise UserError(f"{exc} (task.resolution / task.difficulty)") from None
    if task.source == "generate":
        generator = dataclasses.replace(task.generator)  # a copy: a smoke run shrinks it
        if train_subset is not None or eval_subset is not None:  # a smoke run: only what its subsets need
            fractions = pathfinder.SPLIT_FRACTIONS
            needed = max(train_subset / fractions["train"] if train_subset else 0,
                         eval_subset / fractions["val"] if eval_subset else 0)
            generator.num_images = min(generator.num_images, int(np.ceil(needed * 1.1)) + 10)
        identity = {"generator": {**generator.as_dict(), "workers": None}, "geometry": geometry.__dict__,
                    "revision": pathfinder_generator.REVISION}
        root = (data_dir / "pathfinder" / "generated" / settings_fingerprint(identity)
                / f"pathfinder{task.resolution}" / pathfinder_generator.release_folder_name(task.difficulty))
    else:
        root = None
        identity = {"release": "lra_release"}
    settings = {"raw": identity, "resolution": task.resolution, "difficulty": task.difficulty,
                "split": f"seeded 80/10/10 permutation of the metadata lines, seed {task.split_seed}",
                "split_seed": task.split_seed}

    def build(builder: CacheBuilder, announce) -> None:
        if task.source == "generate":
            generated.pathfinder_images(geometry, generator, identity, root, announce)
        writers = {split: builder.split(split, num_documents=1, dtype=np.uint8) for split in SPLITS}
        skipped = {split: 0 for split in SPLITS}
        rows = pathfinder.iterate_split_examples(locate(), task.resolution, task.split_seed, announce)
        for split, pixels, label in _progress(rows, None, "reading Pathfinder images"):
            if pixels is None:
                skipped[split] += 1
            else:
                writers[split].add([pixels], label)  # labels checked where the metadata is read
        builder.extra["skipped_empty_images"] = skipped
        if any(skipped.values()):
            announce(f"skipped {sum(skipped.values())} empty (zero-byte) images: {skipped}")

    def locate() -> Path:
        return root if root is not None else pathfinder.find_release(task.path, task.resolution, task.difficulty)

    def release_files() -> List[Path]:  # the metadata files and every image they name
        folder = locate()
        return [*pathfinder.metadata_files(folder), *(entry.image for entry in pathfinder.read_metadata(folder))]

    return Conversion(settings, build, automatic=task.source == "generate", locate=lambda: str(locate()),
                      raw_files=release_files if task.source == "lra_release" else None, checked_by_train=False)


def _resolved(path: Optional[str]) -> Optional[str]:
    return str(Path(path).expanduser().resolve()) if path else None


CONVERSIONS = {"listops": _listops, "text": _text, "retrieval": _retrieval, "image": _image, "pathfinder": _pathfinder}


def describe(data: PreparedData) -> str:
    return json.dumps({"cache": str(data.cache_dir), "counts": data.manifest["counts"],
                       "fingerprint": data.fingerprint})
