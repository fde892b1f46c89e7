"""A full disk, a read-only or forbidden folder and a name too long end every command with one line,
leave no temporary or staging file behind and change nothing that was finished (the disk errors are
injected at the write: LRA_FAULT=<point>:<count>:<errno name>)."""

import errno
import os

import pytest

from conftest import SMALL_LISTOPS, read_json, run_command

SHORT = ["trainer=smoke", "trainer.max_steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=2", *SMALL_LISTOPS]
GENERATE = [o for o in SMALL_LISTOPS if not o.startswith("task.max_length")]


def one_error_line(result, code=1):
    errors = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert result.returncode == code and len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Error executing job" not in result.stderr, result.stderr
    return errors[0]


def temporaries(folder):
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or p.name.endswith(".partial")]


@pytest.mark.parametrize("count", [1, 4, 7, 10], ids=["config files", "first record", "a record mid-run", "a checkpoint"])
def test_a_full_disk_during_training_is_one_line_and_the_run_resumes_once_there_is_space(tmp_path, data_dir, count):
    run = tmp_path / "run"
    result = run_command(["lra-train", *SHORT, f"hydra.run.dir={run}"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": f"write:{count}:ENOSPC"}, check=False)
    line = one_error_line(result)
    assert line.startswith("error: No space left on device (") and "free space on that disk" in line
    assert temporaries(run) == []
    if (run / ".hydra" / "resolved.yaml").is_file():  # the run had started: it resumes and completes
        run_command(["lra-train", f"resume={run}"], tmp_path, data_dir)
        assert read_json(run / "metrics.json")["status"] == "completed"


@pytest.mark.parametrize("point", ["listops_example:30", "cache_example:30"], ids=["generating", "converting"])
def test_a_full_disk_during_lra_prepare_removes_its_partial_files_and_a_rerun_succeeds(tmp_path, data_dir, point):
    data = tmp_path / "data"
    args = ["lra-prepare", "listops", "--data-dir", str(data), *GENERATE]
    line = one_error_line(run_command(args, tmp_path, data_dir, env_extra={"LRA_FAULT": f"{point}:ENOSPC"}, check=False))
    assert "No space left on device" in line
    assert [p for p in data.rglob("*") if p.name.startswith(".")] == [], "no staging folder or partial file stays"
    assert not list(data.rglob("manifest.json"))
    run_command(args, tmp_path, data_dir)
    assert len(list(data.rglob("manifest.json"))) == 1


@pytest.mark.parametrize("errno_name, words, fix", [
    ("EROFS", "Read-only file system", "write to a writable file system"),
    ("EACCES", "Permission denied", "write to a folder you may write to"),
    ("ENOSPC", "No space left on device", "free space on that disk"),
    ("EIO", "Input/output error", "the disk failed to read or write it: check the disk (dmesg)")])  # was a "bug" line
@pytest.mark.parametrize("option", ["--output", "--plot"])
def test_lra_table_output_to_an_unwritable_place_is_one_line(tmp_path, data_dir, errno_name, words, fix, option):
    """The table and the chart alike: the edge's line for the error (a full disk: free space, not "a folder you
    may write to"), and an older file of that name whole (the chart was written in place: a full disk left
    it empty)."""
    record = tmp_path / "r" / "metrics.json"
    record.parent.mkdir()
    record.write_text('{"label": "Softmax", "task": "listops", "seed": 0, "status": "completed", "test_accuracy": 30.0, '
                      '"train_tokens_per_second": 100.0, "peak_memory_mb": 10.0}')
    output = tmp_path / ("t.md" if option == "--output" else "t.png")
    output.write_text("an older one")
    result = run_command(["lra-table", str(tmp_path / "r"), option, str(output)], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": f"write:1:{errno_name}"}, check=False)
    line = one_error_line(result)
    assert line.startswith(f"error: {words} ({output}): {fix}"), line
    assert output.read_text() == "an older one" and temporaries(tmp_path) == []


def test_a_disk_error_without_a_file_name_is_named_after_the_file_being_written(tmp_path):
    """torch.save on a full disk raises a RuntimeError whose cause's OSError names no file (write(2) knows a
    descriptor): the line said "No space left on device" without where, and the run's record held torch's
    'unexpected pos …' instead of the line."""
    from lra.commands.config_errors import failure
    from lra.io import atomic_write
    from lra.records import RunRecord

    def torch_like(handle):
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 171904 vs 171792")

    with pytest.raises(OSError) as raised:
        atomic_write(tmp_path / "last.pt", torch_like, mode="wb")
    line = failure(raised.value)[0]
    assert line == (f"No space left on device ({tmp_path / 'last.pt'}): free space on that disk, or write elsewhere; "
                    "nothing finished was changed")
    assert list(tmp_path.iterdir()) == [], "no temporary file stays"
    record = RunRecord(tmp_path, status="running")
    record.stop(raised.value)
    assert read_json(tmp_path / "metrics.json")["error"] == f"OSError: {line}", "the record says what the console says"


def test_a_path_component_over_255_bytes_is_one_line(tmp_path, data_dir):
    long = "x" * 300
    trained = run_command(["lra-train", *SHORT, f"hydra.run.dir=runs/{long}"], tmp_path, data_dir, check=False)
    assert "File name too long" in one_error_line(trained) and "at most 255 bytes" in trained.stderr
    prepared = run_command(["lra-prepare", "listops", "--data-dir", str(tmp_path / long), *GENERATE], tmp_path,
                           data_dir, check=False)
    assert "File name too long" in one_error_line(prepared)


def test_a_full_disk_in_lra_fidelity_is_one_line(tmp_path, data_dir):
    result = run_command(["lra-fidelity", "preset=smoke", f"output_dir={tmp_path / 'out'}"], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "write:1:ENOSPC"}, check=False)
    assert "No space left on device" in one_error_line(result)


def test_ctrl_c_in_lra_prepare_is_one_line_and_removes_its_staging_folder(tmp_path, data_dir):
    data = tmp_path / "data"
    result = run_command(["lra-prepare", "listops", "--data-dir", str(data), *GENERATE], tmp_path, data_dir,
                         env_extra={"LRA_FAULT": "cache_example:30:SIGINT"}, check=False)
    assert one_error_line(result, code=130).startswith("error: interrupted (ctrl-C)")
    assert [p for p in data.rglob("*") if p.name.startswith(".")] == [] and not list(data.rglob("manifest.json"))


def test_a_folder_with_spaces_and_parentheses_works_and_every_printed_command_runs_as_printed(tmp_path, data_dir):
    import shlex

    folder = tmp_path / "my data (copy)"
    raw = folder / "listops-1000"
    raw.mkdir(parents=True)
    for split in ("train", "val", "test"):
        (raw / f"basic_{split}.tsv").write_text("Source\tTarget\n" + "( ( [MAX 2 9 ] ) )\t9\n" * 8)
    unquoted = run_command(["lra-train", "trainer=smoke", "task.source=lra_release", f"task.path={folder}"], tmp_path,
                           data_dir, check=False)
    line = one_error_line(unquoted, code=2)
    assert "cannot parse the override" in line and "must be quoted for Hydra" in line
    args = ["lra-train", "trainer=smoke", "trainer.max_steps=2", "task.source=lra_release", f"task.path='{folder}'",
            "task.max_length=64", f"data_dir='{tmp_path / 'the data'}'", "hydra.run.dir=run"]
    run_command(args, tmp_path, data_dir)
    (tokens,) = (tmp_path / "the data").rglob("train.tokens0.npy")
    tokens.write_bytes(tokens.read_bytes()[:-3])
    damaged = one_error_line(run_command([*args[:-1], "hydra.run.dir=run2"], tmp_path, data_dir, check=False))
    rebuild = shlex.split(damaged.split("rebuild it with: ")[1])  # the release's own command, not rm -r: under auto
    assert rebuild[:2] == ["lra-prepare", "listops"] and rebuild[-1] == "--force" and str(folder) in rebuild
    run_command(rebuild, tmp_path, data_dir)  # exactly as printed
    run_command([*args[:-1], "hydra.run.dir=run3"], tmp_path, data_dir)


def test_a_disk_that_fills_under_a_buffered_write_still_removes_the_staging_folder(tmp_path):
    """A full disk fails a buffered file at its next flush, and again when it is closed: the builder's
    clean-up must not stop at that second error (it left its staging folder in the cache). /dev/full
    is such a disk for one file."""
    import errno

    import numpy as np

    from lra.data.cache import CacheBuilder

    with pytest.raises(OSError) as full:
        with CacheBuilder(tmp_path / "cache") as builder:
            writer = builder.split("train")
            writer._raw[0].close()
            writer._raw[0] = open("/dev/full", "wb")  # this split's token file is on a full disk from here on
            for _ in range(1000):  # more than a file buffer: a flush fails
                writer.add([np.zeros(100, dtype=np.uint8)], 0)
    assert full.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == [], "no staging folder stays"


@pytest.fixture
def small_disk(tmp_path):
    """mount(size) → a tmpfs of that size under tmp_path: a real full disk (root with permission to
    mount only; skipped otherwise). Unmounted at the end."""
    import shutil
    import subprocess

    mounted = []

    def mount(size: str):
        folder = tmp_path / f"disk-{size}"
        folder.mkdir()
        if shutil.which("mount") is None or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                                                            str(folder)], capture_output=True).returncode:
            pytest.skip("no permission to mount a small file system here")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.mark.parametrize("size", ["16k", "80k"], ids=["while tokens are written", "while arrays are written"])
def test_lra_prepare_on_a_really_full_disk_is_one_line_and_leaves_no_staging_folder(tmp_path, data_dir, small_disk, size):
    """On a real file system: the token files fill a 16 KiB disk (the staging folder
    stayed), or they fit in 80 KiB and the arrays made of them do not (written through a memory map,
    that ended the process with SIGBUS). Either way: one line, nothing left in the cache."""
    from lra.data import listops

    release = tmp_path / "release"
    listops.write_tsv_files(listops.GeneratorSettings(num_train=200, num_val=50, num_test=50, min_length=20,
                                                      max_length=400), release / "listops-1000")
    disk = small_disk(size)
    result = run_command(["lra-prepare", "listops", "--source", "lra_release", "--path", str(release), "--data-dir",
                          str(disk)], tmp_path, data_dir, check=False)
    assert "No space left on device" in one_error_line(result)
    assert [p for p in disk.rglob("*") if p.name.startswith(".")] == [] and not list(disk.rglob("manifest.json"))


def test_a_refused_read_names_the_read_fix_and_a_refused_write_the_write_fix(tmp_path, monkeypatch):
    """EACCES on a file the user may not read (an input: a TSV, a pickle, a cache array) asks to make it readable,
    not to 'write to a folder you may write to'; on one that is readable (a write was refused), the write fix."""
    import errno
    import os

    from lra.commands import config_errors

    locked, open_ = tmp_path / "basic_train.tsv", tmp_path / "record.json"
    locked.write_text("x")
    open_.write_text("x")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path) == str(locked) else real_access(path, mode))
    read = config_errors.os_error_line(PermissionError(errno.EACCES, "Permission denied", str(locked)))
    write = config_errors.os_error_line(PermissionError(errno.EACCES, "Permission denied", str(open_)))
    assert read == (f"Permission denied ({locked}): make it readable for this user (or give a copy you may read); "
                    "nothing finished was changed")
    assert "write to a folder you may write to" in write
