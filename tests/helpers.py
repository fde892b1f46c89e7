"""Helpers the test modules share: composing configs and models, and raw-data fixtures in the
official layouts (tests make their own data; nothing is downloaded)."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data import pathfinder_generator as generator, pathfinder_writer as writer
from lra.model import Classifier
from lra.validation import attention_spec

register_configs()
register_resolvers()

needs_kernels = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None,
                                   reason="no C++ compiler: the compiled kernels cannot be built here")


def main_in_process(main, args, capsys) -> tuple:
    """A command's ``main(args)`` in this process, as its console script runs it: (exit status, standard output,
    standard error)."""
    try:
        status = main(list(args)) or 0
    except SystemExit as stopped:
        status = stopped.code
    printed = capsys.readouterr()
    return status, printed.out, printed.err


# ----------------------------------------------------------------------------- configs and models
def compose_config(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train_in_process(run_dir, *overrides) -> dict:
    """One lra-train run in this process through the same API the command calls (validate, own the
    run folder, save the resolved config, :func:`lra.pipeline.train`): its metrics.json as a dict.
    For training semantics; exit codes, kills and the command line stay with the process-level tests."""
    from omegaconf import OmegaConf

    from lra.pipeline import train
    from lra.run import RunDirectory
    from lra.validation import validate

    cfg = compose_config(*overrides)
    run_config = validate(cfg)
    folder = RunDirectory(run_dir)
    folder.claim(fresh=True)
    try:
        folder.save_resolved(cfg)
        return train(run_config, folder, OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), group=None,
                     announce=lambda message: None)
    finally:
        folder.release()


def compose_model(name: str, length: int, layers: int = 2) -> torch.nn.Module:
    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["task=listops", f"attention={name}", f"task.max_length={length}",
                                                       f"model.num_layers={layers}"])
    torch.manual_seed(0)
    return Classifier(cfg.model, cfg.task, attention_spec(cfg), length)


def forward_backward(model, ids, mask):
    model.zero_grad(set_to_none=True)
    logits = model([ids], [mask])
    logits.square().sum().backward()
    return logits.detach(), {n.removeprefix("_orig_mod."): p.grad.clone() for n, p in model.named_parameters()
                             if p.grad is not None}


# ----------------------------------------------------------------------------- raw data in official layouts
KNOWN_REVIEW = "Café ok!".encode()  # a two-byte UTF-8 character: ids are bytes + 1


def write_aclimdb(root, per_folder=3):
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            folder = root / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(per_folder):
                text = KNOWN_REVIEW if (split, label, i) == ("train", "pos", 0) else f"{split} {label} review {i}".encode()
                text = b" \n" + text + b"\r\n \t" if i == 0 else text  # tfds strips surrounding whitespace
                (folder / f"{i}_{7 if label == 'pos' else 3}.txt").write_bytes(text)  # ratings as aclImdb's
    return root / "aclImdb"


AAN_LINE = b'1.0\taan/P01\taan/P02\tsays "hi"\tx\ty'  # 6 fields: malformed
AAN_ROWS = [(b"1.0", b'a "quoted" doc', b"second"), (b"0.0", b"other", b"text two")]


def write_aan(root, nesting="lra_release/tsv_data", long_bytes=0):
    folder = root / nesting
    folder.mkdir(parents=True)
    for name in ("train", "eval", "test"):
        lines = [b"\t".join([label, b"id1", b"id2", t1 + b"z" * long_bytes, t2]) for label, t1, t2 in AAN_ROWS * 3]
        (folder / f"new_aan_pairs.{name}.tsv").write_bytes(b"\n".join(lines) + b"\n")
    return folder


def write_cifar_python(root, per_batch=10):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        images = rng.integers(0, 256, size=(per_batch, 32, 32, 3), dtype=np.uint8)
        if index == 0:
            images[0, 3, 5] = (100, 100, 100)  # row 3, column 5 → token 3·32 + 5
            images[0, 0, 0] = (200, 100, 50)
        data = images.transpose(0, 3, 1, 2).reshape(per_batch, 3072)  # the pickles' R, G, B planes
        batch = {b"data": data, b"labels": [int(x) for x in rng.integers(0, 10, per_batch)], b"batch_label": b"x"}
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


def write_pathfinder(root, count=60, nesting="lra_release/pathfinder32/curv_contour_length_14"):
    folder = root / nesting
    g = generator.geometry_for(32, "contour_length_14")
    writer.write_release(g, writer.GeneratorSettings(num_images=count, images_per_folder=25, workers=1), folder)
    return folder
