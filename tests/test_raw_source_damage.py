"""Damaged official downloads are refused, never converted into silently wrong data: an emptied or
unlistable aclImdb class folder, an empty review, a file that is not a review of its class, CIFAR-10
pickles whose pixels or labels a cast would change or that hold no image, Pathfinder images that are not
8-bit greyscale, and metadata that names an image twice. Each is one line naming the file (and line or
entry) and the fix, and nothing is cached."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from conftest import run_command
from helpers import write_aclimdb, write_cifar_python, write_pathfinder
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data.prepare import load_task_data
from lra.errors import UserError

register_configs()
register_resolvers()

TEXT = ["task=text", "task.source=aclimdb"]
IMAGE = ["task=image", "task.source=cifar_python"]
PATHFINDER = ["task=pathfinder", "task.source=lra_release"]


def refusal(tmp_path, raw, overrides) -> str:
    """The one-line UserError that preparing ``raw`` with ``overrides`` raises, after checking that
    nothing was cached and no staging folder stayed behind."""
    data_dir = tmp_path / "data"
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=[*overrides, f"task.path={raw}"]).task
    with pytest.raises(UserError) as error:
        load_task_data(task, data_dir, announce=lambda message: None, prepare=True)
    message = str(error.value)
    assert "\n" not in message, message
    cached = [path for path in data_dir.rglob("*") if path.parent.name == "cache" or path.name.startswith(".")]
    assert cached == [], f"a refused conversion left {cached}"
    return message


# ----------------------------------------------------------------------------- aclImdb
@pytest.mark.parametrize("split, label", [("train", "pos"), ("train", "neg"), ("test", "pos"), ("test", "neg")])
def test_an_emptied_aclimdb_class_folder_is_refused_not_dropped(tmp_path, split, label):
    root = write_aclimdb(tmp_path / "raw")
    folder = root / split / label
    for review in folder.glob("*.txt"):
        review.unlink()
    (folder / "notes.md").write_text("not a review")
    message = refusal(tmp_path, root, TEXT)
    assert message == (f"no reviews (*.txt) in {folder.resolve()}: the aclImdb download is incomplete or damaged; "
                       "re-extract aclImdb_v1.tar.gz there")


@pytest.mark.parametrize("folder, name", [("train/pos", "README.txt"), ("test/neg", "._0_3.txt"),
                                          ("train/pos", "12_2.txt"), ("test/neg", "12_8.txt"), ("train/neg", "12_0.txt")])
def test_a_file_that_is_not_a_review_of_its_class_folder_is_refused_naming_it(tmp_path, folder, name):
    """A stray note, a macOS resource fork or a review of the other class would be trained under the
    folder's label: aclImdb names each review <id>_<rating>.txt, rated 1-4 in neg/ and 7-10 in pos/."""
    root = write_aclimdb(tmp_path / "raw")
    stray = root / folder / name
    stray.write_bytes(b"a text that is not this class's review")
    ratings = "7-10 in pos/" if folder.endswith("pos") else "1-4 in neg/"
    assert refusal(tmp_path, root, TEXT) == (
        f"{stray.resolve()} is not an aclImdb review of this folder (named <id>_<rating>.txt, rated {ratings}): "
        "the review would take the folder's label; move or remove it, or re-extract aclImdb_v1.tar.gz there")


def test_an_aclimdb_class_folder_that_cannot_be_listed_is_refused(tmp_path, monkeypatch):
    """The listing fails as it does for a folder without read permission (simulated: tests may run as
    root, whom permissions do not stop; the next test makes the real one where they do)."""
    root = write_aclimdb(tmp_path / "raw")
    unlistable = str((root / "train" / "pos").resolve())
    scandir = os.scandir

    def refusing_scandir(path="."):
        if isinstance(path, (str, os.PathLike)) and os.fspath(path) == unlistable:
            raise PermissionError(13, "Permission denied", unlistable)
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing_scandir)
    message = refusal(tmp_path, root, TEXT)
    assert message == (f"cannot list {unlistable} (Permission denied): make it readable, or re-extract "
                       "aclImdb_v1.tar.gz there")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads folders without read permission")
def test_an_aclimdb_class_folder_without_read_permission_is_refused(tmp_path):
    root = write_aclimdb(tmp_path / "raw")
    folder = root / "test" / "neg"
    folder.chmod(0o300)
    try:
        message = refusal(tmp_path, root, TEXT)
    finally:
        folder.chmod(0o755)
    assert message == (f"cannot list {folder.resolve()} (Permission denied): make it readable, or re-extract "
                       "aclImdb_v1.tar.gz there")


@pytest.mark.parametrize("content, found", [(b"", "is empty (0 bytes)"),
                                            (b" \r\n\t", "holds only whitespace (4 bytes)")])
def test_an_aclimdb_review_without_text_is_refused_naming_it(tmp_path, content, found):
    root = write_aclimdb(tmp_path / "raw")
    review = root / "test" / "neg" / "1_3.txt"
    review.write_bytes(content)
    message = refusal(tmp_path, root, TEXT)
    assert message == (f"{review.resolve()} {found}, but no aclImdb review is: the download is damaged; "
                       "re-extract aclImdb_v1.tar.gz there")


def test_a_folder_named_like_an_aclimdb_review_is_refused_naming_the_fix(tmp_path):
    root = write_aclimdb(tmp_path / "raw")
    folder = root / "train" / "pos" / "12_9.txt"
    folder.mkdir()
    assert refusal(tmp_path, root, TEXT) == (f"cannot read {folder.resolve()} (Is a directory): a folder named like a "
                                             "review: move it out, or re-extract aclImdb_v1.tar.gz there")


def test_lra_prepare_refuses_an_emptied_aclimdb_class_folder_in_one_line(tmp_path, data_dir):
    root = write_aclimdb(tmp_path / "raw")
    shutil.rmtree(root / "train" / "pos")
    (root / "train" / "pos").mkdir()
    result = run_command(["lra-prepare", "text", "--source", "aclimdb", "--path", str(root),
                          "--data-dir", str(tmp_path / "d")], tmp_path, data_dir, check=False)
    (line,) = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert line == (f"error: no reviews (*.txt) in {(root / 'train' / 'pos').resolve()}: the aclImdb download is "
                    "incomplete or damaged; re-extract aclImdb_v1.tar.gz there")
    assert not [path for path in (tmp_path / "d").rglob("*") if path.parent.name == "cache"]


# ----------------------------------------------------------------------------- CIFAR-10 pickles
def damage_batch(folder, name, change):
    """Rewrite the pickle ``folder/name`` with ``change`` applied to its dict."""
    batch = pickle.loads((folder / name).read_bytes())
    change(batch)
    (folder / name).write_bytes(pickle.dumps(batch))


@pytest.mark.parametrize("dtype, scale", [(np.float32, 1 / 255), (np.int32, 4), (np.int64, 1)])
def test_cifar_pixels_that_are_not_uint8_are_refused_not_cast(tmp_path, dtype, scale):
    folder = write_cifar_python(tmp_path / "raw")

    def retype(batch):
        batch[b"data"] = (batch[b"data"].astype(dtype) * dtype(scale)).astype(dtype)

    damage_batch(folder, "data_batch_3", retype)
    message = refusal(tmp_path, folder, IMAGE)
    assert message == (f"{folder.resolve() / 'data_batch_3'}: the pixels are {np.dtype(dtype)}, but CIFAR-10's are "
                       "uint8 (0 … 255) and converting would change them; re-extract cifar-10-python.tar.gz")


@pytest.mark.parametrize("name, labels, index, shown", [
    ("data_batch_1", [0, 1, 3.9, 4] + [5] * 6, 2, "3.9"),
    ("test_batch", [0.0, 9.0, 10.0] + [1] * 7, 2, "10.0"),
    ("data_batch_5", [1] * 7 + [-1, 2, 3], 7, "-1"),
    ("data_batch_2", [1, 2, None] + [3] * 7, 2, "None"),
    ("data_batch_4", [1, float("nan")] + [2] * 8, 1, "nan"),
])
def test_cifar_labels_that_are_not_whole_numbers_0_to_9_are_refused_naming_the_entry(tmp_path, name, labels, index,
                                                                                       shown):
    folder = write_cifar_python(tmp_path / "raw")
    damage_batch(folder, name, lambda batch: batch.update({b"labels": labels}))
    message = refusal(tmp_path, folder, IMAGE)
    assert message == (f"{folder.resolve() / name}: label {index}: the label is {shown}, but this task's labels are "
                       "0 … 9 (whole numbers); the batch is damaged: re-extract cifar-10-python.tar.gz")


def test_a_cifar_batch_holding_no_image_is_refused(tmp_path):
    """An emptied batch would shift every later image's key, and so tensorflow-datasets' split order."""
    folder = write_cifar_python(tmp_path / "raw")
    damage_batch(folder, "data_batch_2", lambda batch: batch.update({b"data": batch[b"data"][:0], b"labels": []}))
    assert refusal(tmp_path, folder, IMAGE) == (f"{folder.resolve() / 'data_batch_2'} holds no images, but every "
                                                "CIFAR-10 batch holds 10,000: the batch is damaged; re-extract "
                                                "cifar-10-python.tar.gz")


def test_cifar_labels_stored_as_whole_floats_are_the_same_classes(tmp_path):
    """3.0 is class 3 exactly: whole-number float labels are read, not refused, and give the same cache."""
    as_ints = write_cifar_python(tmp_path / "ints")
    as_floats = write_cifar_python(tmp_path / "floats")
    damage_batch(as_floats, "data_batch_2",
                 lambda batch: batch.update({b"labels": [float(label) for label in batch[b"labels"]]}))
    prepared = []
    for raw in (as_ints, as_floats):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            task = compose(config_name="config", overrides=[*IMAGE, f"task.path={raw}"]).task
        prepared.append(load_task_data(task, raw.parent / "data", announce=lambda message: None, prepare=True))
    for split in ("train", "val", "test"):
        assert prepared[0].splits[split].labels.tolist() == prepared[1].splits[split].labels.tolist()


# ----------------------------------------------------------------------------- Pathfinder release
@pytest.mark.parametrize("mode, pixels", [
    ("I;16", lambda grey: grey.astype(np.uint16) * 257),  # 16-bit greyscale: convert("L") clipped it to 0/255
    ("RGB", lambda grey: np.stack([grey, grey, grey], axis=-1)),
    ("LA", lambda grey: np.stack([grey, np.full_like(grey, 255)], axis=-1)),
])
def test_a_pathfinder_image_that_is_not_8_bit_greyscale_is_refused_naming_its_mode(tmp_path, mode, pixels):
    from PIL import Image

    folder = write_pathfinder(tmp_path / "release", count=30).resolve()
    image = folder / "imgs" / "1" / "sample_26.png"
    with Image.open(image) as original:
        grey = np.asarray(original)
    Image.fromarray(pixels(grey)).save(image)
    with Image.open(image) as written:
        written_mode = written.mode
    assert written_mode.startswith(mode[0]) and written_mode != "L"
    message = refusal(tmp_path, tmp_path / "release", PATHFINDER)
    assert message == (f"{folder / 'metadata' / '1.npy'}:2: {image} is a mode {written_mode} image, but the "
                       "release's are 8-bit greyscale (mode L); re-extract the release")


def test_a_copied_pathfinder_metadata_file_is_refused_naming_both_lines_and_the_image(tmp_path):
    folder = write_pathfinder(tmp_path / "release", count=30).resolve()
    shutil.copy(folder / "metadata" / "0.npy", folder / "metadata" / "3.npy")
    message = refusal(tmp_path, tmp_path / "release", PATHFINDER)
    assert message == (f"{folder / 'metadata' / '3.npy'}:1 names {folder / 'imgs' / '0' / 'sample_0.png'}, which "
                       f"{folder / 'metadata' / '0.npy'}:1 names already: each image is in the release once; remove "
                       "the duplicate metadata line or file (a copy?)")


def test_a_pathfinder_metadata_line_repeated_in_its_file_is_refused(tmp_path):
    folder = write_pathfinder(tmp_path / "release", count=30).resolve()
    metadata = folder / "metadata" / "1.npy"
    lines = metadata.read_text().splitlines()
    metadata.write_text("\n".join([*lines, lines[2]]) + "\n")
    message = refusal(tmp_path, tmp_path / "release", PATHFINDER)
    assert message.startswith(f"{metadata}:{len(lines) + 1} names {folder / 'imgs' / '1' / 'sample_27.png'}, "
                              f"which {metadata}:3 names already")


@pytest.mark.parametrize("cut, found", [
    (lambda text: text[:text.rindex(" ", 0, len(text) - 2)], "has 9 fields and the file's first line 11"),  # mid-line
    (lambda text: "", "holds no metadata line"),  # emptied: its images were dropped without a word
])
def test_a_pathfinder_metadata_file_cut_short_is_refused_not_read_as_fewer_images(tmp_path, cut, found):
    folder = write_pathfinder(tmp_path / "release", count=30).resolve()
    metadata = folder / "metadata" / "0.npy"
    metadata.write_text(cut(metadata.read_text().rstrip("\n")))
    message = refusal(tmp_path, tmp_path / "release", PATHFINDER)
    assert message.startswith(str(metadata)) and found in message and message.endswith(
        "re-extract the Pathfinder release"), message


@pytest.mark.parametrize("stray", ["0 (copy).npy", "extra.npy", "._0.npy"])
def test_a_pathfinder_metadata_file_not_named_like_the_releases_is_refused(tmp_path, stray):
    folder = write_pathfinder(tmp_path / "release", count=30).resolve()
    shutil.copy(folder / "metadata" / "0.npy", folder / "metadata" / stray)
    message = refusal(tmp_path, tmp_path / "release", PATHFINDER)
    assert message == (f"{folder / 'metadata' / stray} is not a release metadata file (the release names them "
                       f"<k>.npy, k = 0, 1, …); move it out of {folder / 'metadata'}")


def test_a_cifar_batch_the_user_may_not_read_asks_to_make_it_readable(tmp_path, monkeypatch):
    """Not 're-extract the archive': the file is there, only unreadable (simulated: the suite runs as root)."""
    import builtins

    from lra.data import image

    root = write_cifar_python(tmp_path / "cifar")
    batch = next(root.rglob("data_batch_1"))
    real_open = builtins.open

    def refusing(file, *args, **kwargs):
        if str(file) == str(batch):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)
    with pytest.raises(UserError, match=r"cannot read .*data_batch_1 \(Permission denied\): make it readable"):
        image.read_batch(batch)


class _Payload:
    """A pickle that calls os.system when loaded (the risk of pickle.load on a file from elsewhere)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_cifar_batch_runs_no_code_and_its_arrays_load_under_every_pickle_protocol(tmp_path, protocol):
    from lra.data import image

    root = write_cifar_python(tmp_path / "cifar")
    batch = next(root.rglob("data_batch_1"))
    pixels, labels = image.read_batch(batch)
    with open(batch, "rb") as handle:
        batch.write_bytes(pickle.dumps(pickle.load(handle, encoding="bytes"), protocol=protocol))
    again, same_labels = image.read_batch(batch)
    assert np.array_equal(again, pixels) and np.array_equal(same_labels, labels)
    marker = tmp_path / "ran"
    batch.write_bytes(pickle.dumps({b"data": _Payload(marker), b"labels": [0]}, protocol=protocol))
    with pytest.raises(UserError, match=r"is not a readable CIFAR-10 python batch \(UnpicklingError: it names "
                                        r"(posix|os)\.system, which no CIFAR-10 batch holds"):
        image.read_batch(batch)
    assert not marker.exists(), "the pickle's code ran"
