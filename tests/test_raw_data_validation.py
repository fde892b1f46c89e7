"""Raw data is validated on the way in: labels in range, non-empty splits and well-formed rows, each
problem one line naming the file (and line), and no cache and no staging folder left behind."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from conftest import run_command
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data.prepare import load_task_data
from lra.errors import UserError

register_configs()
register_resolvers()

LISTOPS_ROWS = ["Source\tTarget", "( ( [MAX 2 9 ] ) )\t9", "( ( [MIN 4 1 ] ) )\t1", "( ( [SM 3 3 ] ) )\t6"]


def write_listops(root, train=None, raw_train=None):
    folder = root / "listops-1000"
    folder.mkdir(parents=True)
    for split in ("train", "val", "test"):
        path = folder / f"basic_{split}.tsv"
        if split == "train" and raw_train is not None:
            path.write_bytes(raw_train)
        else:
            path.write_text("\n".join(train if split == "train" and train is not None else LISTOPS_ROWS) + "\n")
    return root


def write_aan(root, train=None):
    folder = root / "tsv_data"
    folder.mkdir(parents=True)
    good = b"1.0\tid1\tid2\tone\ttwo\n0.0\tid3\tid4\tthree\tfour\n"
    for name in ("train", "eval", "test"):
        (folder / f"new_aan_pairs.{name}.tsv").write_bytes(train if name == "train" and train is not None else good)
    return root


def write_aclimdb(root, files=True):
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            if files:
                (folder / ("0_1.txt" if label == "neg" else "0_8.txt")).write_bytes(b"a review")
    return root / "aclImdb"


def write_cifar(root, bad_label):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for index, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        labels = [3, 4] if index else [3, bad_label]
        data = np.zeros((2, 3072), dtype=np.uint8)
        (folder / name).write_bytes(pickle.dumps({b"data": data, b"labels": labels}))
    return folder


def prepare(data_dir, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=list(overrides)).task
    return load_task_data(task, data_dir, announce=lambda m: None, prepare=True)


def assert_nothing_cached(data_dir):
    caches = [p for p in data_dir.rglob("*") if p.parent.name == "cache"]
    assert caches == [], f"a refused conversion left {caches}"


RAW_CASES = {  # id: (task overrides, the raw data writer, words of the error)
    "listops label 42": (["task=listops", "task.source=lra_release"],
                         lambda r: write_listops(r, [*LISTOPS_ROWS[:2], "( ( [MAX 1 2 ] ) )\t42"]),
                         "basic_train.tsv:3: the label is 42, but this task's labels are 0 … 9"),
    "listops empty file": (["task=listops", "task.source=lra_release"], lambda r: write_listops(r, raw_train=b""),
                           "basic_train.tsv is empty"),
    "listops truncated row": (["task=listops", "task.source=lra_release"],
                              lambda r: write_listops(r, [*LISTOPS_ROWS[:2], "( ( [MAX 1 2"]),
                              "basic_train.tsv:3: expected 2 tab-separated fields (Source, Target), found 1"),
    "listops extra columns": (["task=listops", "task.source=lra_release"],
                              lambda r: write_listops(r, [*LISTOPS_ROWS[:2], "( ( [MAX 1 2 ] ) )\t2\tx"]),
                              "basic_train.tsv:3: expected 2 tab-separated fields (Source, Target), found 3"),
    "listops non-utf8": (["task=listops", "task.source=lra_release"],
                         lambda r: write_listops(r, raw_train=b"Source\tTarget\n( ( [MAX 2 \xff ] ) )\t9\n"),
                         "basic_train.tsv:2: not UTF-8 text"),
    "listops label not a number": (["task=listops", "task.source=lra_release"],
                                   lambda r: write_listops(r, [*LISTOPS_ROWS[:2], "( ( [MAX 1 2 ] ) )\tnine"]),
                                   "basic_train.tsv:3: the label 'nine' is not a whole number"),
    "listops no header": (["task=listops", "task.source=lra_release"], lambda r: write_listops(r, LISTOPS_ROWS[1:]),
                          "basic_train.tsv:1: expected the header 'Source<TAB>Target'"),
    "aan label inf": (["task=retrieval"], lambda r: write_aan(r, b"inf\tid1\tid2\tone\ttwo\n"),
                      "new_aan_pairs.train.tsv:1: the label is 'inf', expected 0 or 1"),
    "aan label 0.5": (["task=retrieval"], lambda r: write_aan(r, b"0.5\tid1\tid2\tone\ttwo\n"),
                      "new_aan_pairs.train.tsv:1: the label is '0.5', expected 0 or 1"),
    "aan label nan": (["task=retrieval"], lambda r: write_aan(r, b"nan\tid1\tid2\tone\ttwo\n"),
                      "new_aan_pairs.train.tsv:1: the label is 'nan', expected 0 or 1"),
    "aan label 1_0": (["task=retrieval"], lambda r: write_aan(r, b"1_0\tid1\tid2\tone\ttwo\n"),
                      "new_aan_pairs.train.tsv:1: the label is '1_0', expected 0 or 1 (written 0, 1, 0.0 or 1.0)"),
    "aan label +1": (["task=retrieval"], lambda r: write_aan(r, b"+1\tid1\tid2\tone\ttwo\n"),
                     "new_aan_pairs.train.tsv:1: the label is '+1', expected 0 or 1"),
    "aan empty tsv": (["task=retrieval"], lambda r: write_aan(r, b""), "the train split is empty"),
    "aclimdb no files": (["task=text", "task.source=aclimdb"], lambda r: write_aclimdb(r, files=False),
                         "no reviews (*.txt) in"),
    "cifar label 10": (["task=image", "task.source=cifar_python"], lambda r: write_cifar(r, 10),
                       "the label is 10, but this task's labels are 0 … 9"),
    "cifar label 255": (["task=image", "task.source=cifar_python"], lambda r: write_cifar(r, 255),
                        "the label is 255, but this task's labels are 0 … 9"),
}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_bad_raw_data_is_one_error_naming_file_and_line_and_nothing_is_cached(tmp_path, case):
    overrides, write, expected = RAW_CASES[case]
    raw = tmp_path / "raw"
    write(raw)
    with pytest.raises(UserError) as error:
        prepare(tmp_path / "data", *overrides, f"task.path={raw}")
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert_nothing_cached(tmp_path / "data")
    assert not [p for p in (tmp_path / "data").rglob(".*")], "no staging folder stays behind"


@pytest.mark.parametrize("task, write, expected", [
    ("listops", lambda r: write_listops(r, [*LISTOPS_ROWS[:2], "( ( [MAX 1 2 ] ) )\t42"]), "the label is 42"),
    ("retrieval", lambda r: write_aan(r, b"inf\tid1\tid2\tone\ttwo\n"), "the label is 'inf'"),
])
def test_lra_prepare_and_lra_train_refuse_bad_raw_data_with_one_line(tmp_path, data_dir, task, write, expected):
    raw = tmp_path / "raw"
    write(raw)
    source = ["--source", "lra_release"]
    result = run_command(["lra-prepare", task, *source, "--path", str(raw), "--data-dir", str(tmp_path / "d")],
                         tmp_path, data_dir, check=False)
    (line,) = [l for l in result.stderr.strip().splitlines() if l.startswith("error:")]
    assert result.returncode == 1 and expected in line and "Traceback" not in result.stderr, result.stderr
    assert_nothing_cached(tmp_path / "d")
    if task == "listops":  # ListOps release files are converted by lra-train itself: training never starts
        trained = run_command(["lra-train", "trainer=smoke", "task.source=lra_release", f"task.path={raw}",
                               f"data_dir={tmp_path / 'd'}", "hydra.run.dir=run"], tmp_path, data_dir, check=False)
        assert trained.returncode == 1 and expected in trained.stderr.strip().splitlines()[-1]
        assert "Traceback" not in trained.stderr and not (tmp_path / "run" / "checkpoints").exists()
