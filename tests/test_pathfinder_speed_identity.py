"""The Pathfinder generator draws the documented examples: the same PNG bytes, labels, metadata and
cache, whatever its speed-ups and however many worker processes draw them. The digests below were
recorded from the generator as it drew before it was made faster; a change of any image, label or
random draw changes them (and then the generator's REVISION must change too, so no cache is reused)."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import pathfinder_generator as generator, pathfinder_writer as writer
from lra.data.prepare import load_task_data

register_configs()
register_resolvers()

# Every file of a 24-image pathfinder32/curv_contour_length_14 release (seed 5, 8 images a folder).
RELEASE_32 = "c0bb8ad3b198fe8757c45ddb028c3c6194d606519a03ea444c36c193a601e821"
# Images 0 and 1 of seed 5 (their PNG bytes, label and margin) at the larger sizes.
SCENES = {(64, "contour_length_9"): "cddbe229d2d702453da3442f73d9f34fe49375ad40e8d61dedcfef3d06ce78f7",
          (64, "baseline"): "9ce2961b1cf02d10bcea6bb433bcc0a577c7a481de53bca424ab2d9d2d013d85",
          (128, "baseline"): "2dd1308ea485b13a83aca2b328a79b3ba6b9cf712b50c97a5ec4dc72f26c24a3"}
# The SHA-256 of every array of the cache that task=pathfinder prepares from 30 generated images
# (seed 5): the examples themselves, as split into train, val and test.
CACHE_FILES = "d85957a73e591825971c442ac37a3d59cb7355c9662e614709a42b8f144d5ca8"


def release_digest(root) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("workers", [1, 2])
def test_generated_release_is_the_recorded_one_for_any_worker_count(tmp_path, workers):
    settings = writer.GeneratorSettings(num_images=24, seed=5, images_per_folder=8, workers=workers)
    writer.write_release(generator.geometry_for(32, "contour_length_14"), settings, tmp_path / "release")
    assert len(list((tmp_path / "release" / "imgs").rglob("*.png"))) == 24
    assert release_digest(tmp_path / "release") == RELEASE_32


@pytest.mark.parametrize("resolution, difficulty", sorted(SCENES))
def test_generated_images_at_larger_sizes_are_the_recorded_ones(resolution, difficulty):
    g = generator.geometry_for(resolution, difficulty)
    digest = hashlib.sha256()
    for index in range(2):
        scene = generator.generate_scene(g, 5, index)
        png = io.BytesIO()
        Image.fromarray(scene.image).save(png, format="PNG")
        digest.update(png.getvalue())
        digest.update(f"{scene.label} {scene.margin}".encode())
    assert digest.hexdigest() == SCENES[resolution, difficulty]


def test_prepared_generated_pathfinder_holds_the_recorded_examples(tmp_path):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=[
            "task=pathfinder", "task.source=generate", "task.generator.num_images=30", "task.generator.seed=5",
            "task.generator.images_per_folder=10", "task.generator.workers=2"]).task
    data = load_task_data(task, tmp_path, announce=lambda line: None, prepare=True)
    assert data.manifest["counts"] == {"train": 24, "val": 3, "test": 3}
    files = json.dumps(data.manifest["files"], sort_keys=True).encode()
    assert hashlib.sha256(files).hexdigest() == CACHE_FILES


def test_seeded_stream_draws_what_numpy_draws():
    """The generator's draws come from SeededStream; it must give numpy's numbers, in numpy's order,
    for every mix of calls the generator makes (and wide ranges, whose rejection loop runs)."""
    from lra.data.pathfinder_stream import SeededStream

    chooser = np.random.default_rng(0)
    for trial in range(200):
        seed = [int(chooser.integers(1000)), trial]
        reference, stream = np.random.default_rng(seed), SeededStream(seed)
        for kind in chooser.integers(0, 6, size=150).tolist():
            if kind == 0:
                assert stream.random() == reference.random()
            elif kind == 1:
                assert stream.integers(-180, 180) == reference.integers(-180, 180)
            elif kind == 2:
                assert stream.integers(2) == reference.integers(2)
            elif kind == 3:
                assert stream.integers(1) == reference.integers(1) == 0  # a single value draws nothing
            elif kind == 4:
                high = int(chooser.integers(1, 4_000_000_000))
                assert stream.integers(high) == reference.integers(high)
            else:
                assert stream.integers(0, 360) == reference.integers(0, 360)
    with pytest.raises(ValueError, match="range"):
        SeededStream(0).integers(0, 2**33)


def test_numpy_sum_is_numpys_float_sum():
    """The candidate weights are summed in Python in numpy's pairwise order, so their total (which
    every random choice of a paddle divides by) is numpy's to the last bit."""
    from lra.data.pathfinder_canvas import numpy_sum

    rng = np.random.default_rng(1)
    for length in list(range(1, 300)) * 20:
        values = rng.random(length) * 10.0 ** rng.integers(-8, 8, length)
        assert numpy_sum(values.tolist()) == np.add.reduce(values)
    assert numpy_sum([]) == 0.0


def test_generator_benchmark_reports_rates_per_worker_count_and_a_labelled_projection(capsys):
    from lra.benchmarks import data_speed

    data_speed.main(["--generators-only", "--pathfinder-images", "10", "--repeats", "1", "--workers", "1,2",
                     "--cores", "16"])
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split("|")[1:-1] for line in lines if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert [int(row[0]) for row in rows] == [1, 2]
    assert all(float(value) > 0 for row in rows for value in row[1:])
    (projection,) = [line for line in lines if line.startswith("Projection to 16 cores (not measured")]
    assert "200,000 images in" in projection
    with pytest.raises(SystemExit) as stopped:
        data_speed.main(["--generators-only", "--workers", "0,2"])
    assert stopped.value.code == 2 and "error: argument --workers" in capsys.readouterr().err
