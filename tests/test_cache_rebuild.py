"""A prepared cache is only ever replaced by a complete one: ``lra-prepare --force``, or preparing again from
another raw folder, builds the new cache beside the old one and swaps it in at the end, so a rebuild that
fails on bad input or is killed leaves the cache that was there as it was. A run only ever trains on the data
it is told: a resume whose data changed since it trained, an explicit ``task.path`` other than the cache's
raw folder, and labels the task's ``num_classes`` cannot hold are each refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from conftest import read_json, run_command
from helpers import write_aan
from lra.data import listops


def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


def prepared_retrieval(tmp_path, name="good"):
    """(data dir, the cache folder, its files' digests) after lra-prepare retrieval from ``tmp_path/name``."""
    write_aan(tmp_path / name)
    data = tmp_path / "data"
    run_command(["lra-prepare", "retrieval", "--path", str(tmp_path / name), "--data-dir", str(data)], tmp_path, data)
    (cache,) = (data / "retrieval" / "cache").iterdir()
    return data, cache, digest(cache)


def damaged_copy(tmp_path, name="bad"):
    shutil.copytree(tmp_path / "good", tmp_path / name)
    with open(tmp_path / name / "lra_release" / "tsv_data" / "new_aan_pairs.train.tsv", "a") as handle:
        handle.write("1.0\tid\tid\tone field short\n")
    return tmp_path / name


@pytest.mark.parametrize("how", ["force", "other_folder", "killed"])
def test_a_rebuild_that_fails_or_is_killed_leaves_the_cache_that_was_there(tmp_path, how):
    data, cache, before = prepared_retrieval(tmp_path)
    if how == "force":  # the same folder, damaged since, rebuilt on request
        damaged = damaged_copy(tmp_path, "good-damaged")
        shutil.rmtree(tmp_path / "good")
        damaged.rename(tmp_path / "good")
        args, env = ["--path", str(tmp_path / "good"), "--force"], None
    elif how == "other_folder":  # preparing from another folder rebuilds the cache from it
        args, env = ["--path", str(damaged_copy(tmp_path))], None
    else:  # killed while it writes the new cache's examples
        args, env = ["--path", str(tmp_path / "good"), "--force"], {"LRA_FAULT": "cache_example:5:SIGKILL"}
    result = run_command(["lra-prepare", "retrieval", *args, "--data-dir", str(data)], tmp_path, data,
                         env_extra=env, check=False)
    assert result.returncode in ((-9, 137) if how == "killed" else (1,)), (result.returncode, result.stderr)
    if how != "killed":
        assert "expected" in last_line(result) or "field" in last_line(result), result.stderr
    assert digest(cache) == before, "the cache that was there is kept whole"
    if how != "other_folder":
        shutil.rmtree(tmp_path / "good")
        write_aan(tmp_path / "good")
    trained = run_command(["lra-train", "task=retrieval", "trainer=smoke", "trainer.max_steps=2", "model.num_layers=1",
                           f"data_dir={data}", "hydra.run.dir=run"], tmp_path, data, check=False)
    assert trained.returncode == 0, trained.stderr
    assert read_json(tmp_path / "run" / "metrics.json")["data_cache"] == str(cache)


def test_a_forced_rebuild_replaces_the_cache_in_place(tmp_path):
    data, cache, before = prepared_retrieval(tmp_path)
    result = run_command(["lra-prepare", "retrieval", "--path", str(tmp_path / "good"), "--data-dir", str(data),
                          "--force"], tmp_path, data)
    assert "the cache there is kept until the new one is complete" in result.stdout + result.stderr
    assert digest(cache).keys() == before.keys()
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name], "no staging or retired folder stays"


def test_an_explicit_task_path_is_not_served_another_folders_cache(tmp_path):
    data, cache, _ = prepared_retrieval(tmp_path)
    shutil.copytree(tmp_path / "good", tmp_path / "other")
    result = run_command(["lra-train", "task=retrieval", "task.source=lra_release", f"task.path={tmp_path / 'other'}",
                          "trainer=smoke", "trainer.max_steps=2", f"data_dir={data}", "hydra.run.dir=run"],
                         tmp_path, data, check=False)
    line = last_line(result)
    assert result.returncode == 1 and "was prepared from" in line and str(tmp_path / "good") in line, result.stderr
    assert f"lra-prepare retrieval --source lra_release --path {tmp_path / 'other'}" in line, line
    record = read_json(tmp_path / "run" / "metrics.json")
    assert record["status"] == "failed" and not record.get("steps")


def release(folder, seed=4, reordered=False):
    """A small ListOps release in ``folder`` (its training rows in reverse order with ``reordered``: still rows
    of the release, each labelled with its value, but other data)."""
    target = folder / "lra_release" / "listops-1000"
    listops.write_tsv_files(listops.GeneratorSettings(seed=seed, num_train=96, num_val=24, num_test=24, min_length=20,
                                                      max_length=200), target)
    if reordered:
        path = target / "basic_train.tsv"
        header, *rows = path.read_text().splitlines()
        path.write_text("\n".join([header, *reversed(rows)]) + "\n")
    return folder


@pytest.mark.parametrize("record_lost", [False, True], ids=["by-its-record", "by-its-checkpoint"])
def test_a_resume_whose_data_changed_since_it_trained_is_refused(tmp_path, record_lost):
    """Judged by the data digest in its record, or (the record cut) in its checkpoint."""
    data = tmp_path / "data"
    run = ["task.source=lra_release", f"task.path={release(tmp_path / 'raw')}", "task.max_length=256",
           "trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=2", "trainer.checkpoint_every=2",
           "hydra.run.dir=run"]
    killed = run_command(["lra-train", *run], tmp_path, data, env_extra={"LRA_FAULT": "step:4:SIGTERM"}, check=False)
    assert killed.returncode == 143, killed.stderr
    if record_lost:
        (tmp_path / "run" / "metrics.json").write_text('{"label": "Soft')
    before = (tmp_path / "run" / "metrics.json").read_bytes()
    release(tmp_path / "raw", reordered=True)  # the same files, their rows in another order
    result = run_command(["lra-train", f"resume={tmp_path / 'run'}"], tmp_path, data, check=False)
    line = last_line(result)
    assert result.returncode == 1 and "it trained on other data (fingerprint " in line, result.stderr
    assert "start a new run" in line and (record_lost or read_json(tmp_path / "run" / "metrics.json")[
        "data_fingerprint"] in line), line
    assert (tmp_path / "run" / "metrics.json").read_bytes() == before


def test_a_resume_trains_on_the_data_auto_chose_at_its_start_though_a_release_was_prepared_since(tmp_path):
    """task.source=auto chooses at each start: a run killed on generated data, resumed after a release of the
    same settings was prepared into the same data folder, was refused as trained on other data (or, killed
    before a checkpoint, trained again on the release: one sweep cell averaging two datasets). The resume takes
    the source its record names."""
    data = tmp_path / "data"
    small = ["task.max_length=256", "trainer=smoke", "trainer.max_steps=6", "trainer.eval_every=2",
             "trainer.checkpoint_every=2"]
    generator = [f"task.generator.{k}={v}" for k, v in (("num_train", 96), ("num_val", 24), ("num_test", 24),
                                                         ("min_length", 20), ("max_length", 200))]
    killed = run_command(["lra-train", *small, *generator, "hydra.run.dir=run"], tmp_path, data,
                         env_extra={"LRA_FAULT": "step:4:SIGTERM"}, check=False)
    assert killed.returncode == 143, killed.stderr
    before = read_json(tmp_path / "run" / "metrics.json")
    assert before["data_source"] == "generate"
    run_command(["lra-train", "task.source=lra_release", f"task.path={release(tmp_path / 'raw')}", *small,
                 "trainer.max_steps=2", "hydra.run.dir=other"], tmp_path, data)
    resumed = run_command(["lra-train", f"resume={tmp_path / 'run'}"], tmp_path, data, check=False)
    after = read_json(tmp_path / "run" / "metrics.json")
    assert resumed.returncode == 0 and after["status"] == "completed", resumed.stderr
    assert (after["data_source"], after["data_content"]) == ("generate", before["data_content"])
    assert "task.source=auto: the generate data the run trained on" in resumed.stdout + resumed.stderr


def test_cached_labels_the_classifier_cannot_hold_are_one_line_naming_them():
    """task.num_classes is each task's own (the config refuses another); a cache whose labels exceed it is
    damaged, refused before training (it ended in cross_entropy's IndexError, a 'bug in the harness' line)."""
    import numpy as np
    from types import SimpleNamespace

    from lra.data.cache import TokenSplit
    from lra.data.prepare import _check_labels
    from lra.errors import UserError

    split = TokenSplit(tokens=[np.zeros(3, np.int32)], offsets=[np.array([0, 1, 2, 3])], labels=np.array([0, 12, 3]))
    with pytest.raises(UserError, match=r"has labels up to 12, but task.num_classes=10: the cache is damaged"):
        _check_labels(SimpleNamespace(name="listops", num_classes=10), {"train": split}, Path("cache"))
    _check_labels(SimpleNamespace(name="listops", num_classes=13), {"train": split}, Path("cache"))


def test_changed_user_files_are_prepared_again_or_refused_never_served_stale(tmp_path):
    """The AAN TSVs given one more row after they were prepared: lra-train refuses the stale cache naming
    lra-prepare --force (it trained on it); aclImdb grown by four reviews: lra-prepare as before rebuilds it (it
    kept the old counts without a word), while reviews only touched are no change."""
    from helpers import write_aclimdb

    data, _, _ = prepared_retrieval(tmp_path)
    train = ["lra-train", "trainer=smoke", "trainer.max_steps=2", f"data_dir={data}"]
    with open(tmp_path / "good" / "lra_release" / "tsv_data" / "new_aan_pairs.train.tsv", "a") as handle:
        handle.write("1\tid1\tid2\tone more\tpair\n")
    refused = run_command([*train, "task=retrieval", "hydra.run.dir=stale"], tmp_path, data, check=False)
    line = last_line(refused)
    assert refused.returncode == 1 and "differ from those" in line and line.endswith("--force"), refused.stderr
    write_aclimdb(tmp_path / "imdb")
    prepare = ["lra-prepare", "text", "--source", "aclimdb", "--path", str(tmp_path / "imdb"), "--data-dir", str(data)]
    first = run_command(prepare, tmp_path, data)
    reviews = sorted((tmp_path / "imdb").rglob("*.txt"))
    for review in reviews[:3]:
        review.touch()
    assert "rebuilding" not in (same := run_command(prepare, tmp_path, data)).stdout + same.stderr
    for i in range(4):
        (reviews[0].parent / f"{1000 + i}_2.txt").write_text(f"a new review {i}")  # in test/neg/: rated 1-4
    again = run_command(prepare, tmp_path, data)
    assert "rebuilding it" in again.stdout + again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["counts"] != json.loads(
        first.stdout.strip().splitlines()[-1])["counts"]
    run_command([*train, "task=text", "hydra.run.dir=fresh"], tmp_path, data)


def test_listops_from_the_release_survives_a_touch_and_a_deleted_release_and_follows_a_change(tmp_path):
    """The release's cache is named by its folder, not its files' times: a touched file trains on the same data
    (task.source=auto generated ListOps instead), a deleted release trains on its cache, a changed file
    rebuilds it with one line."""
    data, raw = tmp_path / "data", release(tmp_path / "raw")
    common = ["task.max_length=256", "trainer=smoke", "trainer.max_steps=2"]
    run_command(["lra-train", "task.source=lra_release", f"task.path={raw}", *common, "hydra.run.dir=a"],
                           tmp_path, data)
    fingerprint = read_json(tmp_path / "a" / "metrics.json")["data_fingerprint"]
    (raw / "lra_release" / "listops-1000" / "basic_test.tsv").touch()
    run_command(["lra-train", *common, "hydra.run.dir=b"], tmp_path, data)
    record = read_json(tmp_path / "b" / "metrics.json")
    assert record["data_source"] == "lra_release" and record["data_fingerprint"] == fingerprint
    moved = tmp_path / "raw-moved"
    raw.rename(moved)
    run_command(["lra-train", *common, "hydra.run.dir=c"], tmp_path, data)
    assert read_json(tmp_path / "c" / "metrics.json")["data_fingerprint"] == fingerprint
    moved.rename(raw)
    release(raw, reordered=True)
    changed = run_command(["lra-train", "task.source=lra_release", f"task.path={raw}", *common, "hydra.run.dir=d"],
                          tmp_path, data)
    assert "differ from those the cache was prepared from" in changed.stdout + changed.stderr
    assert read_json(tmp_path / "d" / "metrics.json")["data_fingerprint"] != fingerprint


def lowercased_mins(source):
    return source.replace("[MAX", "[MIN").replace("[MED", "[MIN").replace("[SM", "[MIN").lower()


@pytest.mark.parametrize("damage, said", [(lowercased_mins, "'[min' is not a ListOps token"),
                                          (lambda s: "", "the expression has no token"),
                                          (lambda s: "hello world", "'hello' is not a ListOps token")])
def test_a_release_row_outside_listops_vocabulary_is_refused_naming_its_line(tmp_path, damage, said):
    raw = release(tmp_path / "raw")
    path = raw / "lra_release" / "listops-1000" / "basic_val.tsv"
    header, first, *rows = path.read_text().splitlines()
    source, label = first.split("\t")
    path.write_text("\n".join([header, f"{damage(source)}\t{label}", *rows]) + "\n")
    data = tmp_path / "data"
    result = run_command(["lra-prepare", "listops", "--source", "lra_release", "--path", str(raw), "--data-dir",
                          str(data)], tmp_path, data, check=False)
    assert result.returncode == 1 and last_line(result).startswith(f"error: {path}:2: ") and said in last_line(result)
    assert not any((data / "listops" / "cache").glob("*/manifest.json"))


def test_a_stray_quote_in_a_listops_release_is_refused_at_its_own_line(tmp_path):
    """The files hold no quoting: a '"' is a character of its row (it was read as the start of a quoted field
    running to the end of the file, and the error named the last line)."""
    raw = release(tmp_path / "raw")
    path = raw / "lra_release" / "listops-1000" / "basic_train.tsv"
    lines = path.read_text().splitlines()
    lines[3] = '"' + lines[3]
    path.write_text("\n".join(lines) + "\n")
    data = tmp_path / "data"
    result = run_command(["lra-prepare", "listops", "--source", "lra_release", "--path", str(raw), "--data-dir",
                          str(data)], tmp_path, data, check=False)
    assert result.returncode == 1 and last_line(result).startswith(f"error: {path}:4: "), result.stderr


def test_a_cache_retired_by_a_rebuild_killed_between_its_renames_goes_back_in_place(tmp_path):
    """The swap's window: the old cache renamed aside, the new one not yet in. The next build of that cache puts
    the retired one back before it sweeps dead processes' temporaries, so a failing rebuild still leaves it."""
    import numpy as np

    from lra.data.cache import CacheBuilder

    cache = tmp_path / "cache" / "abc"
    with CacheBuilder(cache, num_classes=2) as builder:
        builder.split("train").add([np.arange(3, dtype=np.uint8)], 1)
        builder.commit({"kind": "test"})
    before = digest(cache)
    cache.rename(cache.parent / f".{cache.name}.999999999.replaced")  # a dead process's
    with pytest.raises(RuntimeError, match="bad input"):
        with CacheBuilder(cache, num_classes=2, replace=True):
            raise RuntimeError("bad input")
    assert digest(cache) == before and sorted(p.name for p in cache.parent.iterdir()) == ["abc"]


def test_a_release_cache_named_by_the_old_rule_is_still_chosen_by_auto_and_rebuilt_once(tmp_path):
    """Release caches were named by their files' sizes and times: task.source=auto must still find such a
    cache (it generated 100,000 examples instead), rebuild it under its folder's name and train on the release."""
    from lra.data.cache import MANIFEST, MANIFEST_DIGEST, manifest_digest, settings_fingerprint

    data, raw = tmp_path / "data", release(tmp_path / "raw")
    common = ["task.max_length=256", "trainer=smoke", "trainer.max_steps=2"]
    run_command(["lra-train", "task.source=lra_release", f"task.path={raw}", *common, "hydra.run.dir=a"], tmp_path, data)
    (cache,) = (data / "listops" / "cache").iterdir()
    manifest = json.loads((cache / MANIFEST).read_text())
    manifest["settings"]["raw"]["files"] = {"train": [1, 2], "val": [3, 4], "test": [5, 6]}  # the old rule's
    manifest["fingerprint"] = settings_fingerprint({"files": manifest["files"], "settings": manifest["settings"]})
    manifest.pop(MANIFEST_DIGEST)
    manifest[MANIFEST_DIGEST] = manifest_digest(manifest)
    (cache / MANIFEST).write_text(json.dumps(manifest))
    cache.rename(cache.parent / settings_fingerprint(manifest["settings"]))
    trained = run_command(["lra-train", *common, "hydra.run.dir=b"], tmp_path, data)
    assert "generating" not in trained.stdout + trained.stderr
    assert read_json(tmp_path / "b" / "metrics.json")["data_source"] == "lra_release"


def test_touched_raw_files_are_read_once_then_known_by_their_times_and_a_changed_byte_still_shows(tmp_path,
                                                                                                  monkeypatch):
    """Raw files touched since their cache was prepared: their bytes are compared once and their new sizes and
    times recorded (the manifest's digest valid), so the next start reads none of them; a byte changed later is
    still noticed; a manifest edited by hand, or replaced by a rebuild since it was read, is never rewritten."""
    import os

    from lra.data import cache as cache_module, raw_files

    raw, cache = tmp_path / "raw", tmp_path / "cache"
    raw.mkdir(), cache.mkdir()
    files = [raw / f"part{i}.tsv" for i in range(3)]
    for i, file in enumerate(files):
        file.write_text(f"row {i}\n")
    lines = []

    def listing():
        return list(files)

    def stale(manifest):
        return raw_files.stale("listops", listing, lambda: str(raw), cache, manifest, "lra-prepare listops",
                               lines.append, rebuild_allowed=True)

    def on_disk():
        return json.loads((cache / cache_module.MANIFEST).read_text())

    prepared = {"raw_folder": str(raw), raw_files.RAW_FILES: raw_files.signature(listing), "counts": {"train": 3}}
    prepared[cache_module.MANIFEST_DIGEST] = cache_module.manifest_digest(prepared)
    (cache / cache_module.MANIFEST).write_text(json.dumps(prepared))
    os.utime(files[1], ns=(10**18, 10**18))

    edited = {**prepared, "counts": {"train": 4}}  # its digest no longer matches
    assert not stale(edited) and on_disk() == prepared
    rebuilt = {**prepared, "counts": {"train": 5}}  # a rebuild swapped in after ``prepared`` was read
    rebuilt[cache_module.MANIFEST_DIGEST] = cache_module.manifest_digest(rebuilt)
    (cache / cache_module.MANIFEST).write_text(json.dumps(rebuilt))
    assert not stale(prepared) and on_disk() == rebuilt
    (cache / cache_module.MANIFEST).write_text(json.dumps(prepared))
    assert not stale(prepared) and not lines
    refreshed = on_disk()
    assert refreshed[cache_module.MANIFEST_DIGEST] == cache_module.manifest_digest(refreshed)
    before, after = prepared[raw_files.RAW_FILES], refreshed[raw_files.RAW_FILES]
    assert after["stat"] != before["stat"] and {**after, "stat": before["stat"]} == before
    assert {k: v for k, v in refreshed.items() if k != raw_files.RAW_FILES and k != cache_module.MANIFEST_DIGEST} \
        == {k: v for k, v in prepared.items() if k != raw_files.RAW_FILES and k != cache_module.MANIFEST_DIGEST}

    def unread(digest, path, *args):
        raise AssertionError(f"{path} was read again")

    monkeypatch.setattr(raw_files, "hash_into", unread)
    assert not stale(refreshed) and on_disk() == refreshed
    monkeypatch.undo()
    files[0].write_text("row 9\n")
    os.utime(files[0], ns=(10**18, 10**18))
    assert stale(refreshed) and "differ from those" in lines[-1]
