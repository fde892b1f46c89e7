"""lra-prepare and data generation under faults: the printed rebuild command runs as printed, a
damaged manifest is rebuilt, a killed generation or conversion is cleaned up and resumed, an empty
ListOps length window stops with the fix, and a folder in a generated file's place or a disk that fills
while generating leaves no temporary file and is one line naming where."""

import errno
import json
import os
import signal

import pytest

from conftest import SMALL_LISTOPS, run_command
from lra.commands.config_errors import failure
from lra.data import listops


# ---------------------------------------------------------------------------------- lra-prepare
# (text: tests/test_data_sources.py runs its printed commands, asserting them word for word)
@pytest.mark.parametrize("task", ["retrieval", "pathfinder"])
def test_the_printed_rebuild_command_runs_as_printed(tmp_path, task):
    """A damaged cache is refused with the command that rebuilds it: run exactly that command, then
    training works (the printed command has overrides after --data-dir and --force last)."""
    import shlex

    from helpers import write_aan, write_aclimdb, write_pathfinder

    raw, data = tmp_path / "raw", tmp_path / "data"
    source = {"text": lambda: ["task.source=aclimdb", f"task.path={write_aclimdb(raw)}"],
              "retrieval": lambda: [f"task.path={write_aan(raw).parent.parent}"],
              "pathfinder": lambda: ["task.source=lra_release", f"task.path={write_pathfinder(raw, count=30).parent.parent}"]}[task]()
    args = ["lra-train", f"task={task}", "trainer=smoke", "trainer.max_steps=2", "trainer.max_length=64",
            "model.num_layers=1", *source]
    missing = run_command(args, tmp_path, data, check=False)
    prepare = missing.stderr.strip().splitlines()[-1].split("prepare it once with: ")[1]
    run_command(shlex.split(prepare), tmp_path, data)
    (tokens,) = data.rglob("train.tokens0.npy")
    tokens.write_bytes(tokens.read_bytes()[:-3])
    damaged = run_command(args, tmp_path, data, check=False)
    last = damaged.stderr.strip().splitlines()[-1]
    assert damaged.returncode == 1 and "is damaged" in last, damaged.stderr
    rebuild = last.split("rebuild it with: ")[1]
    assert rebuild.endswith("--force") and "--data-dir" in rebuild
    run_command(shlex.split(rebuild), tmp_path, data)
    run_command(args, tmp_path, data)


def test_lra_prepare_rebuilds_a_cache_whose_manifest_is_damaged(tmp_path, data_dir):
    small = [o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]
    first = run_command(["lra-prepare", "listops", "--data-dir", str(tmp_path / "d"), *small], tmp_path, data_dir)
    (manifest,) = (tmp_path / "d").rglob("manifest.json")
    manifest.write_text(manifest.read_text()[:50])
    again = run_command(["lra-prepare", "listops", *small, "--data-dir", str(tmp_path / "d")], tmp_path, data_dir)
    assert "is damaged (unreadable manifest.json); rebuilding it" in again.stderr + again.stdout
    assert json.loads(again.stdout.strip().splitlines()[-1])["fingerprint"] == json.loads(first.stdout.strip().splitlines()[-1])["fingerprint"]


# ---------------------------------------------------------------- kills during long operations
def test_a_killed_listops_generation_is_cleaned_up_and_resumed(tmp_path, data_dir):
    data = tmp_path / "data"
    args = ["lra-prepare", "listops", "--data-dir", str(data), *[o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "listops_example:60"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert list(data.rglob(".basic_*.partial")), "the kill left its temporaries"
    assert not list(data.rglob("basic_*.tsv")), "no official file name for a partial generation"
    run_command(args, tmp_path, data_dir)
    assert not list(data.rglob(".basic_*.partial")) and len(list(data.rglob("basic_*.tsv"))) == 3


def test_an_interrupted_pathfinder_generation_stops_its_workers_at_their_next_image(tmp_path, data_dir):
    """SIGTERM once the first folder is written: the workers had drawn every queued folder before the command
    said "interrupted" (7 minutes of 128-pixel images); they stop after the image at hand, the folders they
    were drawing are left without metadata, and the same command completes the data."""
    data = tmp_path / "data"
    args = ["lra-prepare", "pathfinder", "--data-dir", str(data), "task.generator.num_images=80",
            "task.generator.images_per_folder=10", "task.generator.workers=2"]
    stopped = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "pathfinder_folder:1:SIGTERM"}, check=False)
    assert stopped.returncode == 128 + signal.SIGTERM and stopped.stderr.strip().splitlines()[-1].startswith(
        "error: interrupted (SIGTERM); what was finished is kept"), stopped.stderr
    written = list(data.rglob("metadata/*.npy"))
    assert 1 <= len(written) <= 3, f"{len(written)} of 8 folders written: the workers went on drawing"
    assert not list(data.rglob("cache/*")), "no cache from part of the images"
    completed = run_command(args, tmp_path, data_dir)
    assert json.loads(completed.stdout.strip().splitlines()[-1])["counts"] == {"train": 64, "val": 8, "test": 8}


def test_a_killed_conversion_is_cleaned_up_and_the_cache_is_readable_by_the_group(tmp_path, data_dir):
    data = tmp_path / "data"
    args = ["lra-prepare", "listops", "--data-dir", str(data), *[o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]]
    killed = run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": "cache_example:40"}, check=False)
    assert killed.returncode == -signal.SIGKILL
    cache_root = data / "listops" / "cache"
    assert [p for p in cache_root.iterdir() if p.name.startswith(".")], "the kill left its staging folder"
    run_command(args, tmp_path, data_dir)
    (cache,) = [p for p in cache_root.iterdir()]  # the staging folder is gone, the cache is in place
    assert (cache / "manifest.json").is_file()
    assert cache.stat().st_mode & 0o050 == 0o050, oct(cache.stat().st_mode)  # group may list and read


def test_a_listops_length_window_with_no_expression_stops_the_generator_with_the_fix(monkeypatch):
    """max_length=5 passes the settings' rules but no depth-1 tree fits 3 < length < 5: the generator
    gives up after STALL_LIMIT draws without a new expression instead of looping forever."""
    import lra.data.listops as listops
    from lra.errors import UserError

    monkeypatch.setattr(listops, "STALL_LIMIT", 2000)
    settings = listops.GeneratorSettings(min_length=3, max_length=5, max_depth=1, num_train=10, num_val=1, num_test=1)
    with pytest.raises(UserError, match="found only 0 distinct expressions .* widen task.generator.min_length/max_length"):
        list(listops.generate(settings))


# ---------------------------------------------------------------- the generator's own files in the way or on a full disk
GENERATOR = listops.GeneratorSettings(num_train=96, num_val=24, num_test=24, min_length=20, max_length=200)


def test_a_generated_file_replaced_by_a_folder_is_named_and_no_temporary_stays(tmp_path):
    """The line named the generator's temporary file (.basic_train.tsv.<pid>.partial, never the user's to move)
    and the three temporaries stayed behind."""
    listops.write_generated(GENERATOR, tmp_path)
    (tmp_path / "basic_train.tsv").unlink()
    (tmp_path / "basic_train.tsv").mkdir()
    with pytest.raises(OSError) as raised:
        listops.write_generated(GENERATOR, tmp_path)
    line, code = failure(raised.value)
    assert (line, code) == (f"{tmp_path / 'basic_train.tsv'} is a folder where a file is expected: move it away, or "
                            "choose another path", 1)
    assert not list(tmp_path.glob(".*")), "no temporary file stays behind"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail ENOSPC)")
def test_a_disk_that_fills_while_listops_is_generated_leaves_no_temporary_and_names_the_folder(tmp_path, monkeypatch):
    """The buffered rows could not be written when the files were closed either: that second failure cut the
    clean-up short and the partial files stayed; the disk error named no file."""

    def full_disk(path, *args, **kwargs):  # the temporary is made, its writes go to /dev/full
        open(path, "w").close()
        return open("/dev/full", *args, **kwargs)

    monkeypatch.setattr(listops, "open", full_disk, raising=False)
    with pytest.raises(OSError) as raised:
        listops.write_tsv_files(GENERATOR, tmp_path)
    assert raised.value.errno == errno.ENOSPC
    assert failure(raised.value)[0].startswith(f"No space left on device ({tmp_path}): free space on that disk")
    assert list(tmp_path.iterdir()) == [], "no partial file stays behind"
