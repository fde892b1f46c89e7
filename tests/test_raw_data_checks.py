"""Raw files in the official layouts but not as the official tools wrote them are refused, each in one line
naming the file (and line) and the fix, with nothing cached: ListOps labels not in ASCII digits, expressions that
are malformed or whose value is not their label, lines ending in CR alone; CIFAR-10 training batches of unequal
size or copied over each other. Pathfinder metadata that lost its last lines is named in a note. A leading UTF-8
byte-order mark is read past by every raw text reader, giving the cache the same file without it gives."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from helpers import write_aan, write_cifar_python, write_pathfinder
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import listops, listops_rows
from lra.data.prepare import load_task_data
from lra.errors import UserError

register_configs()
register_resolvers()

LISTOPS = ["task=listops", "task.source=lra_release"]
IMAGE = ["task=image", "task.source=cifar_python"]
PATHFINDER = ["task=pathfinder", "task.source=lra_release"]
BOM = b"\xef\xbb\xbf"


def prepare(tmp_path, raw, overrides, data_name="data"):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=[*overrides, f"task.path={raw}"]).task
    return load_task_data(task, tmp_path / data_name, announce=lambda message: None, prepare=True)


def refusal(tmp_path, raw, overrides) -> str:
    with pytest.raises(UserError) as error:
        prepare(tmp_path, raw, overrides)
    message = str(error.value)
    assert "\n" not in message, message
    left = [path for path in (tmp_path / "data").rglob("*") if path.parent.name == "cache" or path.name.startswith(".")]
    assert left == [], f"a refused conversion left {left}"
    return message


def write_listops_release(root, seed=3, **settings):
    """The three TSVs as the LRA generator writes them (its string form, header, tab, label)."""
    folder = root / "listops-1000"
    sizes = dict(num_train=30, num_val=6, num_test=6, min_length=10, max_length=120)
    listops.write_tsv_files(listops.GeneratorSettings(seed=seed, **{**sizes, **settings}), folder)
    return folder


def replace_row(path, row, source=None, label=None):
    """``path`` with its data row ``row`` (1 = the line after the header) given another source or label."""
    header, *rows = path.read_text().splitlines()
    old_source, old_label = rows[row - 1].split("\t")
    rows[row - 1] = f"{old_source if source is None else source}\t{old_label if label is None else label}"
    path.write_text("\n".join([header, *rows]) + "\n")


# ----------------------------------------------------------------------------- ListOps
@pytest.mark.parametrize("label", ["0_2", "+2", " 2 ", "\u0662", "2.0", ""])
def test_a_listops_label_in_other_than_ascii_digits_is_refused(tmp_path, label):
    folder = write_listops_release(tmp_path / "raw")
    train = folder / "basic_train.tsv"
    replace_row(train, 2, label=label)
    assert refusal(tmp_path, tmp_path / "raw", LISTOPS) == (
        f"{train.resolve()}:3: the label {ascii(label)} is not a whole number written in the digits 0-9; the file is "
        "damaged or not a ListOps TSV")


@pytest.mark.parametrize("source, found", [
    ("( ( ( [MAX 2 ) 9 )", "'[MAX' at token 1 is never closed by a ']'"),
    ("( ( ( [MAX 2 ) 9 ) ] ) ]", "token 5 (']') follows the end of the expression at token 4"),
    ("] ( ( ( [MAX 2 ) 9 ) ] )", "the ']' at token 1 closes no operator"),
    ("( ( [MIN ( ( [SM ] ) 4 ) ] )", "'[SM' at token 2 has no arguments"),
    ("( ( [MAX 2 ) ] ) 7", "token 4 ('7') follows the end of the expression at token 3"),
    ("3 4", "token 2 ('4') follows the end of the expression at token 1"),
])
def test_a_malformed_listops_expression_is_refused_saying_what_was_found(tmp_path, source, found):
    folder = write_listops_release(tmp_path / "raw")
    val = folder / "basic_val.tsv"
    replace_row(val, 4, source=source)
    tokens = len(listops.tokenize(source))
    assert refusal(tmp_path, tmp_path / "raw", LISTOPS) == (
        f"{val.resolve()}:5: the expression is malformed ({found}, of {tokens} tokens); the file is damaged or not "
        "the LRA release; re-extract listops-1000 from it")


def test_a_listops_label_that_is_not_the_expressions_value_is_refused(tmp_path):
    folder = write_listops_release(tmp_path / "raw")
    test = folder / "basic_test.tsv"
    replace_row(test, 1, source="( ( ( [MAX 2 ) 9 ) ] )", label="3")
    assert refusal(tmp_path, tmp_path / "raw", LISTOPS) == (
        f"{test.resolve()}:2: the label is 3, but the expression's value is 9 (MIN, MAX, MED = int(median), SM = sum "
        "mod 10, as the LRA generator computes it); the file is damaged or not the LRA release; re-extract "
        "listops-1000 from it")


def test_the_first_wrong_listops_row_is_named_whichever_check_finds_it(tmp_path):
    """A wrong value on line 3 is named before a row the TSV reader refuses (line 5) or a label out of range."""
    folder = write_listops_release(tmp_path / "raw")
    train = folder / "basic_train.tsv"
    replace_row(train, 2, source="( ( ( [MED 2 ) 9 ) ] )", label="6")  # int(median(2, 9)) = 5
    replace_row(train, 4, label="12")
    lines = train.read_text().splitlines()
    lines[6] += "\textra"
    train.write_text("\n".join(lines) + "\n")
    assert refusal(tmp_path, tmp_path / "raw", LISTOPS).startswith(f"{train.resolve()}:3: the label is 6, but the "
                                                                   "expression's value is 5")


@pytest.mark.parametrize("settings", [dict(), dict(min_length=0, max_length=30, max_depth=3, operator_probability=0.5),
                                      dict(min_length=40, max_length=400, max_args=2), dict(max_args=16, max_depth=4)],
                         ids=["release-like", "lone digits", "binary", "wide"])
def test_generated_listops_files_are_accepted_with_the_ids_of_the_original_tokenisation(tmp_path, settings):
    folder = write_listops_release(tmp_path / "raw", seed=11, num_train=300, **settings)
    data = prepare(tmp_path, tmp_path / "raw", LISTOPS)
    for split in ("train", "val", "test"):
        rows = list(listops.read_tsv(folder / f"basic_{split}.tsv"))
        cached = data.splits[split]
        ids, masks, labels = cached.gather(range(len(cached)), 512)
        for index, (source, label) in enumerate(rows):
            assert ids[0][index][masks[0][index]].tolist() == listops.release_ids(source, "row").tolist()
            assert labels[index] == label == listops.evaluate_tokens(listops.tokenize(source))


def random_source(rng: random.Random) -> str:
    """A ListOps-like line: a generated expression, one with a character put in, or a run of tokens and
    characters (among them other whitespace, a non-ASCII digit, a control byte and pieces of operators)."""
    characters = list("()[] 0123456789MINAXEDSx\x01\x0b\u0662\u00a0")
    tokens = [*listops.OPERATORS, "]", "X", *listops.DIGITS]
    kind = rng.random()
    if kind < 0.4:
        def tree(depth):
            if depth < 4 and rng.random() < 0.5:
                return [rng.choice(listops.OPERATORS), *(tree(depth + 1) for _ in range(rng.randint(1, 6)))]
            return str(rng.randint(0, 9))
        source = listops.to_string(tree(1))
        if rng.random() < 0.5:
            at = rng.randrange(len(source) + 1)
            source = source[:at] + rng.choice(characters) + source[at:]
        return source
    if kind < 0.8:
        return rng.choice([" ", "  ", " ( ", ") "]).join(rng.choice(tokens) for _ in range(rng.randint(0, 12)))
    return "".join(rng.choice(characters) for _ in range(rng.randint(0, 15)))


def test_the_batch_tokeniser_and_checker_agree_with_the_row_by_row_ones():
    rng = random.Random(0)
    sources = [random_source(rng) for _ in range(6000)]
    verdicts = []
    for first in range(0, len(sources), 1000):
        batch = sources[first:first + 1000]
        fast = listops_rows.fast_ids(batch)
        taken = [(source, ids) for source, ids in zip(batch, fast) if ids is not None]
        well_formed, values = listops_rows.row_values(np.concatenate([ids for _, ids in taken]),
                                                      np.array([len(ids) for _, ids in taken]))
        for (source, ids), formed, batch_value in zip(taken, well_formed, values):
            assert ids.tolist() == listops.release_ids(source, "row").tolist(), source
            value, malformed = listops.expression_value([listops.VOCABULARY[i] for i in ids.tolist()])
            assert bool(formed) == (malformed is None) and batch_value == (-1 if malformed else value), source
            verdicts.append(bool(formed))
    # most rows went through the batch path, many of them well formed and many malformed
    assert len(verdicts) > 2000 and sum(verdicts) > 200 and len(verdicts) - sum(verdicts) > 200


def test_listops_lines_ending_in_cr_alone_are_refused_with_the_fix(tmp_path):
    folder = write_listops_release(tmp_path / "raw")
    train = folder / "basic_train.tsv"
    train.write_bytes(train.read_bytes().replace(b"\n", b"\r"))
    assert refusal(tmp_path, tmp_path / "raw", LISTOPS) == (
        f"{train.resolve()}:1: a carriage return (CR) inside a line: the file's lines end in CR alone (old Mac line "
        "endings) or it is damaged; the release's end in LF: convert them (tr '\\r' '\\n' < old.tsv > new.tsv) or "
        "re-extract the release")


# ----------------------------------------------------------------------------- byte-order marks
def with_bom(path):
    path.write_bytes(BOM + path.read_bytes())


def test_a_byte_order_mark_is_read_past_by_the_listops_and_retrieval_readers(tmp_path):
    plain = {"listops": write_listops_release(tmp_path / "plain").parent, "retrieval": write_aan(tmp_path / "plain")}
    marked = {"listops": write_listops_release(tmp_path / "marked").parent, "retrieval": write_aan(tmp_path / "marked")}
    for name in ("basic_train.tsv", "basic_val.tsv"):
        with_bom(marked["listops"] / "listops-1000" / name)
    with_bom(marked["retrieval"] / "new_aan_pairs.train.tsv")
    for task, overrides in (("listops", LISTOPS), ("retrieval", ["task=retrieval"])):
        caches = [prepare(tmp_path, raw[task], overrides, data_name) for raw, data_name in
                  ((plain, "plain-data"), (marked, "marked-data"))]
        assert caches[0].content == caches[1].content, task


def test_a_byte_order_mark_is_read_past_in_pathfinder_metadata(tmp_path):
    plain, marked = (write_pathfinder(tmp_path / name, count=30) for name in ("plain", "marked"))
    with_bom(marked / "metadata" / "0.npy")
    with_bom(marked / "metadata" / "1.npy")
    caches = [prepare(tmp_path, tmp_path / name, PATHFINDER, f"{name}-data") for name in ("plain", "marked")]
    assert caches[0].content == caches[1].content


# ----------------------------------------------------------------------------- CIFAR-10
def rewrite_batch(folder, name, change):
    with open(folder / name, "rb") as handle:
        batch = pickle.load(handle, encoding="bytes")
    change(batch)
    (folder / name).write_bytes(pickle.dumps(batch))


def test_a_cifar_training_batch_holding_fewer_images_than_the_others_is_refused(tmp_path):
    folder = write_cifar_python(tmp_path / "raw").resolve()
    rewrite_batch(folder, "data_batch_3", lambda batch: batch.update({b"data": batch[b"data"][:7],
                                                                      b"labels": batch[b"labels"][:7]}))
    assert refusal(tmp_path, folder, IMAGE) == (
        f"{folder / 'data_batch_3'} holds 7 images but data_batch_1, data_batch_2, data_batch_4, data_batch_5 10 each "
        "(every training batch of CIFAR-10 holds 10,000): the batch is cut or not CIFAR-10's; re-extract "
        "cifar-10-python.tar.gz")


@pytest.mark.parametrize("copy, original", [("data_batch_4", "data_batch_2"), ("test_batch", "data_batch_1")])
def test_a_cifar_batch_holding_the_images_of_another_is_refused(tmp_path, copy, original):
    folder = write_cifar_python(tmp_path / "raw").resolve()
    with open(folder / original, "rb") as handle:
        images = pickle.load(handle, encoding="bytes")[b"data"]
    rewrite_batch(folder, copy, lambda batch: batch.update({b"data": images.copy()}))  # its own labels kept
    assert refusal(tmp_path, folder, IMAGE) == (
        f"{folder / copy} holds the same images as {folder / original} (a copy?): every CIFAR-10 batch holds images "
        "of its own; re-extract cifar-10-python.tar.gz")


# ----------------------------------------------------------------------------- Pathfinder
@pytest.mark.parametrize("metadata_file", ["0.npy", "2.npy"], ids=["a full folder's", "the last, partial folder's"])
def test_a_pathfinder_metadata_file_that_lost_its_last_lines_is_named_in_a_note(tmp_path, metadata_file):
    """Cut at a line boundary, a metadata file reads as whole: the images it no longer names are counted and the
    file named (a note, not a refusal: an image of the release no line names would be a stray, not damage)."""
    folder = write_pathfinder(tmp_path / "release", count=60).resolve()  # folders of 25, 25 and 10 images
    metadata = folder / "metadata" / metadata_file
    lines = metadata.read_text().splitlines()
    metadata.write_text("\n".join(lines[:-2]) + "\n")  # cut at a line boundary: every line left is whole
    images = folder / lines[-2].split()[0]
    notes = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=[*PATHFINDER, f"task.path={tmp_path / 'release'}"]).task
    data = load_task_data(task, tmp_path / "data", announce=notes.append, prepare=True)
    assert f"note: 2 images in {images} are named by no metadata line and left out: {metadata} may be cut (the " \
        "release names every image of a folder); re-extract the Pathfinder release if so" in notes, notes
    assert sum(len(split) for split in data.splits.values()) == 58


def test_an_unnamed_empty_pathfinder_image_is_let_be(tmp_path):
    """Zero-byte images carry nothing (the release holds some); one no line names changes no example."""
    folder = write_pathfinder(tmp_path / "release", count=30).resolve()
    expected = prepare(tmp_path, tmp_path / "release", PATHFINDER, "before").content
    (folder / "imgs" / "1" / "sample_999.png").write_bytes(b"")
    assert prepare(tmp_path, tmp_path / "release", PATHFINDER, "after").content == expected


# ----------------------------------------------------------------------------- release row counts
def prepare_noting(tmp_path, raw, overrides, data_name):
    notes = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=[*overrides, f"task.path={raw}"]).task
    data = load_task_data(task, tmp_path / data_name, announce=notes.append, prepare=True)
    return data, [note for note in notes if note.startswith("note:")]


def test_a_release_file_cut_at_a_line_boundary_or_inside_its_last_line_is_named_in_a_note(tmp_path, monkeypatch):
    """A download cut at a line boundary reads as whole, and one cut inside Retrieval's last text leaves a
    shorter text: each file's row count is held to the release's (here the fixture's), a note naming the file."""
    from lra.data import retrieval

    folder = write_aan(tmp_path / "aan")
    rows = len((folder / "new_aan_pairs.train.tsv").read_bytes().splitlines())
    monkeypatch.setattr(retrieval, "RELEASE_PAIRS", {"train": rows, "val": rows, "test": rows})
    listops_folder = write_listops_release(tmp_path / "ops") / "basic_val.tsv"
    monkeypatch.setattr(listops, "RELEASE_ROWS", {"train": 30, "val": 6, "test": 6})
    assert prepare_noting(tmp_path, tmp_path / "aan", ["task=retrieval"], "whole")[1] == []
    assert prepare_noting(tmp_path, tmp_path / "ops", LISTOPS, "whole-ops")[1] == []

    train = folder / "new_aan_pairs.train.tsv"
    train.write_bytes(train.read_bytes()[:-1].rsplit(b"\n", 1)[0] + b"\n")  # the last line gone, at its boundary
    assert prepare_noting(tmp_path, tmp_path / "aan", ["task=retrieval"], "boundary")[1] == [
        f"note: {train} holds {rows - 1:,} rows where the LRA release's holds {rows:,}: if it should be the release, "
        "it is cut or edited; re-extract the release"]
    train.write_bytes(train.read_bytes()[:-3])  # and the line before it cut inside its text2
    data, notes = prepare_noting(tmp_path, tmp_path / "aan", ["task=retrieval"], "inside")
    assert notes == [f"note: {train} holds {rows - 1:,} rows where the LRA release's holds {rows:,} and its last line "
                     "has no line end (cut inside it?): if it should be the release, it is cut or edited; re-extract "
                     "the release"]
    assert len(data.splits["train"]) == rows - 1

    lines = listops_folder.read_text().splitlines()
    listops_folder.write_text("\n".join(lines[:-1]) + "\n")
    assert prepare_noting(tmp_path, tmp_path / "ops", LISTOPS, "cut-ops")[1] == [
        f"note: {listops_folder.resolve()} holds 5 rows where the LRA release's holds 6: if it should be the release, "
        "it is cut or edited; re-extract the release"]
