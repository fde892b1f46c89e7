"""task.source=auto over the caches in data_dir: a cache whose raw folder was deleted or moved since it was
prepared is still served (its arrays checked), and a damaged cache is refused in one line naming its folder
and the fix, never passed over for other data."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import SMALL_LISTOPS, run_command
from helpers import write_aan, write_aclimdb, write_cifar_python, write_pathfinder
from lra.data import listops
from lra.data.cache import MANIFEST, MANIFEST_DIGEST, manifest_digest, settings_fingerprint
from lra.data.prepare import load_task_data
from lra.errors import UserError
from test_data_sources import prepare, task_config

RAW = {  # task: (source, writes the raw files under a folder and returns what --path names)
    "text": ("aclimdb", lambda raw: write_aclimdb(raw)),
    "retrieval": ("lra_release", lambda raw: write_aan(raw).parent.parent),
    "image": ("cifar_python", lambda raw: write_cifar_python(raw)),
    "pathfinder": ("lra_release", lambda raw: write_pathfinder(raw, count=40).parent.parent),
}


def auto(data_dir, *overrides):
    messages = []
    data = load_task_data(task_config(*overrides), data_dir, announce=messages.append)
    return data, messages


def release_cache(tmp_path, name, seed=0):
    folder = tmp_path / name
    listops.write_tsv_files(listops.GeneratorSettings(seed=seed, num_train=8, num_val=4, num_test=4), folder)
    return prepare(tmp_path, "task=listops", "task.source=lra_release", f"task.path={folder}")


def rewrite(cache_dir, edit, digest=False):
    manifest = json.loads((cache_dir / MANIFEST).read_text())
    edit(manifest)
    if digest:  # written as a build would: the edit passes the manifest's own checks
        manifest["fingerprint"] = settings_fingerprint({"files": manifest["files"], "settings": manifest["settings"]})
        manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
    (cache_dir / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("task", sorted(RAW))
def test_a_cache_whose_raw_folder_is_gone_is_served_by_auto_and_refused_for_that_path(tmp_path, task):
    source, write = RAW[task]
    raw = tmp_path / "raw"
    path = write(raw)
    prepared = prepare(tmp_path, f"task={task}", f"task.source={source}", f"task.path={path}")
    raw.rename(tmp_path / "moved")
    data, messages = auto(tmp_path / "data", f"task={task}")
    assert data.source == source and data.cache_dir == prepared.cache_dir and data.content == prepared.content
    assert any(f"its raw folder {prepared.raw_folder} is gone: the cache is used as prepared" in m for m in messages)
    with pytest.raises(UserError, match=f"no prepared {task} data from {path} in "):  # an explicit path: its data only
        auto(tmp_path / "data", f"task={task}", f"task.path={path}")
    if task == "retrieval":  # its arrays are still checked against their digests
        tokens = prepared.cache_dir / "train.tokens0.npy"
        tokens.write_bytes(tokens.read_bytes()[:-2])
        with pytest.raises(UserError, match=f"cache {prepared.cache_dir} is damaged .*train.tokens0.npy"):
            auto(tmp_path / "data", f"task={task}")


def test_changed_raw_files_are_still_refused_while_present_ones_unchanged_say_nothing(tmp_path):
    folder = write_aan(tmp_path / "raw")
    prepare(tmp_path, "task=retrieval", f"task.path={folder}")
    data, messages = auto(tmp_path / "data", "task=retrieval")
    assert data.source == "lra_release" and not any("is gone" in m for m in messages)
    train = folder / "new_aan_pairs.train.tsv"
    train.write_bytes(train.read_bytes().replace(b"0.0\t", b"1.0\t", 1))
    with pytest.raises(UserError, match="differ from those .* was prepared from .*--force$"):
        auto(tmp_path / "data", "task=retrieval")


def test_a_damaged_cache_is_refused_under_auto_never_skipped(tmp_path):
    data_dir = tmp_path / "data"
    first, second = release_cache(tmp_path, "a"), release_cache(tmp_path, "b", seed=1)
    # one damaged (a count edited: its digest no longer matches): refused, not the other one trained on
    rewrite(second.cache_dir, lambda m: m["counts"].update(train=7))
    command = f"lra-prepare listops --source lra_release --path {tmp_path / 'b'} --data-dir {data_dir}"
    with pytest.raises(UserError, match=f"^task.source=auto: the listops cache {second.cache_dir} is damaged "
                                        rf"\({MANIFEST} was changed .*rebuild it with: {command} --force "
                                        rf"\(or remove it: rm -r {second.cache_dir}\)$"):
        auto(data_dir, "task=listops")
    # an unreadable manifest, alone: refused, where the run generated data and trained on it
    shutil.rmtree(second.cache_dir)
    (first.cache_dir / MANIFEST).write_text("{")
    with pytest.raises(UserError, match=f"cache {first.cache_dir} is damaged \\(unreadable {MANIFEST}.*; "
                                        f"remove it: rm -r {first.cache_dir}$"):
        auto(data_dir, "task=listops", *SMALL_LISTOPS)
    # a source the task does not have, though the manifest passes its own checks
    shutil.rmtree(first.cache_dir)
    odd = release_cache(tmp_path, "c", seed=2)
    rewrite(odd.cache_dir, lambda m: m["settings"].update(source="tfds"), digest=True)
    with pytest.raises(UserError, match=f"cache {odd.cache_dir} is damaged \\({MANIFEST} names the source 'tfds', "
                                        f"not one of listops's \\(generate, lra_release\\)\\); remove it: rm -r "):
        auto(data_dir, "task=listops")
    shutil.rmtree(odd.cache_dir)
    # a build's leftover staging folder is no cache, damaged or not: auto takes the one cache there
    kept = release_cache(tmp_path, "d", seed=3)
    staging = kept.cache_dir.parent / f".{kept.cache_dir.name}.999999.abc"
    staging.mkdir()
    (staging / MANIFEST).write_text("{")
    data, _ = auto(data_dir, "task=listops")
    assert data.cache_dir == kept.cache_dir


def test_a_retrieval_cache_with_an_unreadable_manifest_is_one_error_line_naming_it(tmp_path):
    path = write_aan(tmp_path / "raw").parent.parent
    prepared = prepare(tmp_path, "task=retrieval", f"task.path={path}")
    (prepared.cache_dir / MANIFEST).write_text("{")
    result = run_command(["lra-train", "task=retrieval", "trainer=smoke", "trainer.max_steps=2"], tmp_path,
                         tmp_path / "data", check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: task.source=auto: the retrieval cache {prepared.cache_dir} is damaged "
                               f"(unreadable {MANIFEST}") and lines[0].endswith(f"rm -r {prepared.cache_dir}")
