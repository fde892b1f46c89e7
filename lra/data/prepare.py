"""From a task config to verified, cached splits: generate or locate the raw files, tokenise them
once into the cache, and load the cache (checksums verified)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional

from tqdm import tqdm

from lra.data import listops
from lra.data.cache import (
    SplitWriter,
    TokenSplit,
    check_writable,
    load_cache,
    settings_fingerprint,
    write_cache,
)
from lra.errors import UserError
from lra.io import atomic_write_json

SPLITS = ("train", "val", "test")


@dataclass
class PreparedData:
    splits: Dict[str, TokenSplit]
    manifest: dict
    cache_dir: Path

    @property
    def fingerprint(self) -> str:
        return self.manifest["fingerprint"]


def load_task_data(
    task,
    data_dir: Path,
    *,
    train_subset: Optional[int] = None,
    eval_subset: Optional[int] = None,
    announce: Callable[[str], None] = print,
) -> PreparedData:
    """The splits of ``task`` (a task config node), preparing them first if needed."""
    preparers = {"listops": _prepare_listops}
    if task.name not in preparers:
        raise UserError(
            f"task '{task.name}' has no data loader in this version; available now: {', '.join(preparers)}"
        )
    data = preparers[task.name](task, Path(data_dir).resolve(), train_subset, eval_subset, announce)
    subsets = {"train": train_subset, "val": eval_subset, "test": eval_subset}
    data.splits = {name: split.subset(subsets[name]) for name, split in data.splits.items()}
    return data


def _writable(data_dir: Path) -> None:
    check_writable(
        data_dir, "the data directory", "set data_dir=<a writable folder> (or the LRA_DATA_DIR variable)"
    )


def _prepare_listops(task, data_dir, train_subset, eval_subset, announce) -> PreparedData:
    if task.source == "generate":
        settings = listops.GeneratorSettings(**task.generator)
        # A smoke run needs only its subsets: generate just those (a distinct, smaller dataset).
        if train_subset is not None:
            settings.num_train = min(settings.num_train, train_subset)
        if eval_subset is not None:
            settings.num_val = min(settings.num_val, eval_subset)
            settings.num_test = min(settings.num_test, eval_subset)
        raw_dir = data_dir / "listops" / "generated" / settings_fingerprint(settings.as_dict())
        if not all((raw_dir / f"basic_{s}.tsv").is_file() for s in SPLITS):
            _writable(data_dir)
            total = settings.num_train + settings.num_val + settings.num_test
            announce(
                f"ListOps data not found: generating {total:,} examples (seed {settings.seed}) into {raw_dir}"
            )
            with tqdm(total=total, desc="generating ListOps", unit="ex", disable=None) as bar:
                listops.write_tsv_files(settings, raw_dir, progress=bar)
            atomic_write_json(raw_dir / "generator.json", settings.as_dict())
        identity = {"generator": settings.as_dict()}
    elif task.source == "lra_release":
        raw_dir = _find_listops_release(task.path)
        identity = {
            "folder": str(raw_dir),
            "files": {
                s: [(raw_dir / f"basic_{s}.tsv").stat().st_size, (raw_dir / f"basic_{s}.tsv").stat().st_mtime_ns]
                for s in SPLITS
            },
        }
    else:
        raise UserError(f"unknown ListOps source '{task.source}'; valid: generate, lra_release (task.source=...)")

    settings = {
        "task": "listops",
        "source": task.source,
        "raw": identity,
        "tokenisation": "original: ']' -> 'X', parentheses removed, whitespace split",
        "vocabulary": list(listops.VOCABULARY),
    }
    cache_dir = data_dir / "listops" / "cache" / settings_fingerprint(settings)
    if not (cache_dir / "manifest.json").is_file():
        _writable(data_dir)
        announce(f"tokenising ListOps from {raw_dir} into {cache_dir}")
        writers = {}
        for split in SPLITS:
            writers[split] = writer = SplitWriter(num_documents=1)
            rows = listops.read_tsv(raw_dir / f"basic_{split}.tsv")
            for source, label in tqdm(rows, desc=f"tokenising {split}", unit="ex", disable=None):
                writer.add([listops.encode(source)], label)
        write_cache(cache_dir, writers, settings)
    splits, manifest = load_cache(cache_dir, rebuild_command=f"rm -r {cache_dir} and run the same command again")
    return PreparedData(splits, manifest, cache_dir)


def _find_listops_release(path: Optional[str]) -> Path:
    """Accept the release root at either nesting level, or the ``listops-1000`` folder itself."""
    if not path:
        raise UserError("task.source=lra_release needs the release folder: add task.path=/path/to/lra_release")
    root = Path(path).expanduser().resolve()
    for candidate in (root, root / "listops-1000", root / "lra_release" / "listops-1000"):
        if all((candidate / f"basic_{s}.tsv").is_file() for s in SPLITS):
            return candidate
    raise UserError(
        f"no basic_{{train,val,test}}.tsv under {root} (looked in ., listops-1000/, lra_release/listops-1000/); "
        "point task.path at the extracted LRA release"
    )


def describe(data: PreparedData) -> str:
    return json.dumps({"cache": str(data.cache_dir), "counts": data.manifest["counts"]})
