"""The four non-ListOps tasks from fixtures in their official layouts: exact ids for known inputs,
both nesting levels of the release, bad input named by file and line, and real training runs."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from conftest import SMALL_LISTOPS, read_json, run_command, run_dirs
from helpers import AAN_LINE, KNOWN_REVIEW, write_aan, write_aclimdb, write_cifar_python, write_pathfinder
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import listops, pathfinder_generator as generator, pathfinder_writer as writer
from lra.data.pathfinder_canvas import seed_kernel
from lra.data.image import tf_grayscale
from lra.data.prepare import load_task_data
from lra.errors import UserError

register_configs()
register_resolvers()


def task_config(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides)).task


def prepare(tmp_path, *overrides):
    return load_task_data(task_config(*overrides), tmp_path / "data", announce=lambda m: None, prepare=True)


def ids(split, index, document=0):
    start, end = split.offsets[document][index], split.offsets[document][index + 1]
    return list(np.asarray(split.tokens[document][start:end]))


# ----------------------------------------------------------------------------- fixtures
# ----------------------------------------------------------------------------- Text
def test_aclimdb_review_becomes_its_bytes_plus_one_and_validation_is_the_test_split(tmp_path):
    write_aclimdb(tmp_path / "raw")
    data = prepare(tmp_path, "task=text", "task.source=aclimdb", f"task.path={tmp_path / 'raw'}")
    train = data.splits["train"]
    assert data.manifest["counts"] == {"train": 6, "test": 6, "val": 6}
    position = [i for i in range(len(train)) if ids(train, i) == [b + 1 for b in KNOWN_REVIEW]]
    assert len(position) == 1 and train.labels[position[0]] == 1
    assert ids(train, position[0])[3:5] == [0xC3 + 1, 0xA9 + 1]
    assert data.splits["val"] is data.splits["test"]
    assert sorted(train.labels.tolist()) == [0, 0, 0, 1, 1, 1]


def test_document_bytes_truncates_when_preparing(tmp_path):
    write_aclimdb(tmp_path / "raw")
    data = prepare(tmp_path, "task=text", "task.source=aclimdb", f"task.path={tmp_path / 'raw' / 'aclImdb'}",
                   "task.document_bytes=4")
    assert set(data.splits["train"].lengths().tolist()) == {4}


def test_tfds_imdb_reviews_through_mock_data(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    examples = {"train": [{"text": KNOWN_REVIEW, "label": 1}, {"text": "bad", "label": 0}],
                "test": [{"text": "fine", "label": 1}]}

    def as_data_source(builder, split, *args, **kwargs):
        assert builder.name == "imdb_reviews"
        return examples[split]

    with tfds.testing.mock_data(as_data_source_fn=as_data_source):
        data = prepare(tmp_path, "task=text", f"task.path={tmp_path / 'tfds'}")
    assert data.manifest["tfds"] == {"dataset": "imdb_reviews/plain_text/1.0.0", "tensorflow_datasets": tfds.__version__}
    assert ids(data.splits["train"], 0) == [b + 1 for b in KNOWN_REVIEW]
    assert ids(data.splits["test"], 0) == [b + 1 for b in b"fine"]
    assert data.splits["train"].labels.tolist() == [1, 0]


# ----------------------------------------------------------------------------- Retrieval
@pytest.mark.parametrize("nesting", ["tsv_data", "lra_release/tsv_data"])
def test_aan_line_becomes_two_byte_documents_and_its_label(tmp_path, nesting):
    write_aan(tmp_path / "release", nesting, long_bytes=5000)
    data = prepare(tmp_path, "task=retrieval", f"task.path={tmp_path / 'release'}")
    train = data.splits["train"]
    expected_first = [b + 1 for b in (b'a "quoted" doc' + b"z" * 5000)[:4000]]
    assert ids(train, 0, 0) == expected_first  # quotes kept, truncated to 4000 bytes
    assert ids(train, 0, 1) == [b + 1 for b in b"second"]
    assert train.labels.tolist()[:2] == [1, 0]
    assert data.manifest["counts"] == {"train": 6, "val": 6, "test": 6}


def test_malformed_aan_line_is_named_by_file_and_line(tmp_path):
    folder = write_aan(tmp_path / "release")
    path = folder / "new_aan_pairs.eval.tsv"
    path.write_bytes(path.read_bytes() + AAN_LINE + b"\n")
    with pytest.raises(UserError, match=r"new_aan_pairs\.eval\.tsv:7: expected 5 tab-separated fields"):
        prepare(tmp_path, "task=retrieval", f"task.path={tmp_path / 'release'}")
    assert not list((tmp_path / "data").rglob("manifest.json")), "a failed conversion leaves no cache"


# ----------------------------------------------------------------------------- Image
def test_tensorflow_grayscale_arithmetic():
    pixels = np.array([[100, 100, 100], [255, 255, 255], [200, 100, 50], [0, 0, 0], [1, 0, 0]], dtype=np.uint8)
    # float32(x/255) · weights, × 255.5, truncated: 100 → 100.18 (the naive 0.9999·100 would give 99)
    assert tf_grayscale(pixels).tolist() == [100, 255, 124, 0, 0]


def test_cifar_pickles_give_row_major_tensorflow_grayscale_and_the_tfds_split(tmp_path):
    """The pickles' training images split as tfds' train[:90%] / train[90%:]: ordered by the MD5 of
    the split name and each image's index (tfds' own hasher agrees), cut at 90%."""
    folder = write_cifar_python(tmp_path / "raw")
    data = prepare(tmp_path, "task=image", "task.source=cifar_python", f"task.path={folder.parent}")
    assert data.manifest["counts"] == {"train": 45, "val": 5, "test": 10}
    assert "tensorflow-datasets" in data.manifest["split_order"]
    labels, pixels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)]:
        with open(folder / name, "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        labels += batch[b"labels"]
        pixels += [tf_grayscale(row.reshape(3, 32, 32).transpose(1, 2, 0)).reshape(-1).tolist() for row in batch[b"data"]]
    from tensorflow_datasets.core import hashing

    hasher = hashing.Hasher("train")
    tfds_order = sorted(range(50), key=hasher.hash_key)
    assert tfds_order != list(range(50))
    assert data.splits["val"].labels.tolist() == [labels[i] for i in tfds_order[45:]]
    assert [ids(data.splits["val"], i) for i in range(5)] == [pixels[i] for i in tfds_order[45:]]
    first = ids(data.splits["train"], tfds_order.index(0))  # data_batch_1's first image
    assert len(first) == 1024 and first[3 * 32 + 5] == 100 and first[0] == 124


def test_unreadable_pickle_is_named(tmp_path):
    folder = write_cifar_python(tmp_path / "raw")
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    with pytest.raises(UserError, match=r"data_batch_3 is not a readable CIFAR-10 python batch"):
        prepare(tmp_path, "task=image", "task.source=cifar_python", f"task.path={folder}")


def test_tfds_cifar10_through_mock_data(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    image = np.zeros((32, 32, 3), dtype=np.uint8)
    image[31, 31] = (200, 100, 50)
    seen = []

    def as_data_source(builder, split, *args, **kwargs):
        seen.append(str(split))
        return [{"image": image, "label": 7, "id": "x"}]

    with tfds.testing.mock_data(as_data_source_fn=as_data_source):
        data = prepare(tmp_path, "task=image")
    assert seen == ["train[:90%]", "train[90%:]", "test"]
    assert data.manifest["tfds"]["dataset"].startswith("cifar10/") and data.manifest["tfds"]["tensorflow_datasets"]
    tokens = ids(data.splits["val"], 0)
    assert tokens[-1] == 124 and sum(tokens) == 124 and data.splits["val"].labels.tolist() == [7]


# ----------------------------------------------------------------------------- Pathfinder
def test_generated_pathfinder_has_the_original_statistics_and_contour_labels():
    """120 images of pathfinder32/curv_contour_length_14 against what the original generator gives
    (300 of its images measured: ink 0.343, grey levels 64.4, label-0 markers joined by ink 0.67,
    marker-distance AUC 0.46): every label agrees with the contour check, both markers sit on ends
    of target snakes, and the image statistics fall in bands around the original's."""
    from lra.benchmarks.pathfinder_statistics import image_statistics, markers_at_target_ends

    g = generator.geometry_for(32, "contour_length_14")
    scenes = [generator.generate_scene(g, seed=11, index=index) for index in range(120)]
    assert all(s.image.shape == (32, 32) and s.image.dtype == np.uint8 for s in scenes)
    assert all(generator.contour_connected(s, g) == bool(s.label) for s in scenes)
    assert all(markers_at_target_ends(s) for s in scenes)
    stats = image_statistics(np.stack([s.image for s in scenes]), np.array([s.label for s in scenes]),
                             np.stack([s.markers for s in scenes]))
    assert 0.30 <= stats["ink fraction"] <= 0.39, stats
    assert 55 <= stats["grey levels per image"] <= 75, stats
    assert 0.5 <= stats["label 0 joined by ink"] <= 0.9, stats  # snakes touch and cross, as in the original
    assert 0.36 <= stats["label 1 share"] <= 0.64 and 0.3 <= stats["marker distance AUC"] <= 0.7, stats
    assert all(s.image.max() == 255 and s.image.min() == 0 for s in scenes)  # stretched per image
    # Labels balanced by construction: each image's label is its generator's first draw, kept through
    # the redraws its contour check forces (a fresh label per redraw tilts labels towards 1).
    assert sum(s.redraws > 0 for s in scenes) >= 1
    assert all(s.label == int(np.random.default_rng([11, index]).integers(2)) for index, s in enumerate(scenes))


def test_pathfinder_dilation_keeps_the_original_border_rule():
    """Grey dilation as OpenCV's: the maximum under the kernel, −∞ where every offset leaves the image
    (the original then finds no free pixel, which limits the orientations a snake can start in)."""
    from lra.data import pathfinder_drawing as drawing

    image = np.zeros((4, 4))
    image[1, 2] = 0.7
    kernel = np.zeros((3, 3), dtype=np.uint8)
    kernel[2, 2] = 1  # offset (+1, +1) from the centre
    out = drawing.dilate(image, kernel)
    assert out[0, 1] == 0.7 and out[1, 2] == 0.0
    assert np.isneginf(out[3]).all() and np.isneginf(out[:, 3]).all()
    g = generator.geometry_for(32, "contour_length_14")
    feasible = [d for d in range(-180, 180) if seed_kernel(2, 0.5, 1, 2, 32, math.radians(d)) is not None]
    assert 0 < len(feasible) < 360 and g.num_distractors == 5


def test_generator_is_seeded_and_independent_of_workers(tmp_path):
    g = generator.geometry_for(32, "baseline")
    one = writer.GeneratorSettings(num_images=12, images_per_folder=4, workers=1, seed=3)
    two = writer.GeneratorSettings(num_images=12, images_per_folder=4, workers=2, seed=3)
    writer.write_release(g, one, tmp_path / "a")
    writer.write_release(g, two, tmp_path / "b")
    for path in sorted((tmp_path / "a").rglob("*.*")):
        assert path.read_bytes() == (tmp_path / "b" / path.relative_to(tmp_path / "a")).read_bytes()
    line = (tmp_path / "a" / "metadata" / "2.npy").read_text().splitlines()[0].split()
    assert line[:3] == ["imgs/2", "sample_8.png", "8"] and line[3] in ("0", "1")


@pytest.mark.parametrize("nesting", ["pathfinder32/curv_contour_length_14", "lra_release/pathfinder32/curv_contour_length_14"])
def test_pathfinder_release_split_pixels_and_empty_images(tmp_path, nesting):
    folder = write_pathfinder(tmp_path / "release", count=50, nesting=nesting)
    (folder / "imgs" / "1" / "sample_30.png").write_bytes(b"")  # the release has such empty files
    data = prepare(tmp_path, "task=pathfinder", "task.source=lra_release", f"task.path={tmp_path / 'release'}")
    counts = data.manifest["counts"]
    assert sum(counts.values()) == 49 and sum(data.manifest["skipped_empty_images"].values()) == 1
    assert (counts["train"], counts["val"], counts["test"]) in {(40, 5, 4), (40, 4, 5), (39, 5, 5)}
    from PIL import Image

    # Find one image's tokens in the cache: the pixels row-major, unchanged.
    pixels = np.asarray(Image.open(folder / "imgs" / "0" / "sample_0.png")).reshape(-1).tolist()
    found = [s for s, split in data.splits.items() for i in range(len(split)) if ids(split, i) == pixels]
    assert len(found) == 1


def test_metadata_naming_a_missing_image_is_reported_with_its_line(tmp_path):
    folder = write_pathfinder(tmp_path / "release", count=30)
    (folder / "imgs" / "1" / "sample_27.png").unlink()
    with pytest.raises(UserError, match=r"metadata/1\.npy:3: the image .*sample_27\.png does not exist"):
        prepare(tmp_path, "task=pathfinder", "task.source=lra_release", f"task.path={tmp_path / 'release'}")


# ----------------------------------------------------------------------------- end to end
def test_text_without_prepared_data_names_the_command_and_a_damaged_cache_is_rebuilt_by_it(tmp_path):
    raw = write_aclimdb(tmp_path / "raw")
    data = tmp_path / "data"
    args = ["lra-train", "task=text", "trainer=smoke", "trainer.max_steps=2", "task.source=aclimdb", f"task.path={raw}"]
    missing = run_command(args, tmp_path, data, check=False)
    expected = f"lra-prepare text --source aclimdb --path {raw} --data-dir {data}"
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1].endswith(expected)
    run_command(expected.split(), tmp_path, data)
    (tokens,) = data.rglob("train.tokens0.npy")
    tokens.write_bytes(tokens.read_bytes()[:-3])
    damaged = run_command(args, tmp_path, data, check=False)
    assert damaged.returncode == 1 and damaged.stderr.strip().splitlines()[-1].endswith(f"{expected} --force")
    run_command([*expected.split(), "--force"], tmp_path, data)
    run_command(args, tmp_path, data)


def test_all_five_tasks_train_on_prepared_fixtures_and_retrieval_uses_the_dual_encoder(tmp_path):
    """After lra-prepare, lra-train with no source or path (task.source=auto) trains on the prepared
    data, the release's included, and records which."""
    raw, data = tmp_path / "raw", tmp_path / "data"
    listops.write_tsv_files(listops.GeneratorSettings(seed=4, num_train=40, num_val=8, num_test=8,
                                                      min_length=20, max_length=200), raw / "lra_release" / "listops-1000")
    write_pathfinder(raw, count=60)
    sources = {
        "text": ["--source", "aclimdb", "--path", str(write_aclimdb(raw, per_folder=40))],
        "retrieval": ["--source", "lra_release", "--path", str(write_aan(raw).parent.parent)],
        "image": ["--source", "cifar_python", "--path", str(write_cifar_python(raw, per_batch=20))],
        "listops": ["--source", "lra_release", "--path", str(raw / "lra_release")],
        "pathfinder": ["--source", "lra_release", "--path", str(raw / "lra_release")],
    }
    for task, args in sources.items():
        run_command(["lra-prepare", task, *args], tmp_path, data)
    trained = run_command(["lra-train", "-m", f"task={','.join(sources)}", "attention=softmax", "trainer=smoke",
                           "trainer.max_steps=4", "trainer.eval_every=2", "trainer.eval_subset=8",
                           "trainer.train_subset=16", "trainer.max_length=256", "model.num_layers=1",
                           "hydra.sweep.dir=runs/sweep"], tmp_path, data)
    records = {r["task"]: r for r in (read_json(run / "metrics.json") for run in run_dirs(tmp_path))}
    parameters = {}
    for task, args in sources.items():
        assert f"task.source=auto: the prepared {args[1]} data from {raw}" in trained.stdout + trained.stderr
        record = records[task]
        assert record["status"] == "completed"
        assert record["data_source"] == args[1] and record["data_raw_folder"].startswith(str(raw)), record
        parameters[task] = record["num_parameters"]
    assert len(run_dirs(tmp_path)) == 5
    # Same vocabulary and length: the dual encoder differs only in its head's input, 4·dim instead of dim.
    assert parameters["retrieval"] - parameters["text"] == 3 * 64 * 128


def test_auto_source_lists_several_candidates_narrows_by_path_and_generates_only_without_a_cache(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for seed, folder in enumerate((first, second)):
        listops.write_tsv_files(listops.GeneratorSettings(seed=seed, num_train=8, num_val=4, num_test=4), folder)
        prepare(tmp_path, "task=listops", "task.source=lra_release", f"task.path={folder}")
    data = tmp_path / "data"
    with pytest.raises(UserError, match=f"task.source=auto found 2 prepared listops caches .*choose one: task.source="
                                        f"lra_release task.path={first}, task.source=lra_release task.path={second}$"):
        load_task_data(task_config("task=listops"), data, announce=lambda m: None)
    chosen = load_task_data(task_config("task=listops", f"task.path={second}"), data, announce=lambda m: None)
    assert chosen.source == "lra_release" and chosen.raw_folder == str(second)
    with pytest.raises(UserError, match="no prepared retrieval data in .*sources: lra_release.*prepare it once with: "
                                        "lra-prepare retrieval --source lra_release --path /path/to/lra_release "
                                        "--data-dir "):  # the release's folder named: the command runs as given
        load_task_data(task_config("task=retrieval"), data, announce=lambda m: None)
    generated = load_task_data(task_config("task=listops", *SMALL_LISTOPS), tmp_path / "empty", announce=lambda m: None)
    assert generated.source == "generate"
    # a task.path with no cache of it names the release's command (it was an InvalidOption 'bug': generate + path)
    with pytest.raises(UserError, match=f"no prepared listops data from {tmp_path / 'c'} in .*prepare it once with: "
                                        f"lra-prepare listops --source lra_release --path {tmp_path / 'c'} --data-dir "):
        load_task_data(task_config("task=listops", f"task.path={tmp_path / 'c'}"), tmp_path / "empty",
                       announce=lambda m: None)
