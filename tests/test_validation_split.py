"""Honest validation: ``task.validation=heldout`` validates on a seeded split of the
training examples, never on the test split; the record says what a run validated on, and lra-table
says it per task."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from conftest import SMALL_LISTOPS
from helpers import train_in_process
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.data.cache import TokenSplit
from lra.data.prepare import load_task_data
from lra.errors import UserError
from lra.results.listing import validation_notes
from lra.results.table import collect

register_configs()
register_resolvers()


def listops(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        task = compose(config_name="config", overrides=["task=listops", *SMALL_LISTOPS, *overrides]).task
    return load_task_data(task, tmp_path / "data", announce=lambda message: None)


def examples(split: TokenSplit) -> list:
    ids, masks, labels = split.gather(range(len(split)), 256)
    return [(tuple(row[mask]), int(label)) for row, mask, label in zip(ids[0], masks[0], labels)]


def test_a_selection_reads_the_stored_examples_it_names():
    split = TokenSplit([np.arange(1, 11)], [np.array([0, 2, 5, 6, 10])], np.array([0, 1, 2, 3]))
    chosen = split.select([3, 1])
    assert examples(chosen) == [((7, 8, 9, 10), 3), ((3, 4, 5), 1)]
    assert chosen.lengths().tolist() == [4, 3] and len(chosen.subset(1)) == 1
    assert examples(chosen.subset(1)) == [((7, 8, 9, 10), 3)] and examples(chosen.select([1])) == [((3, 4, 5), 1)]


def test_heldout_validation_is_a_seeded_part_of_train_and_leaves_test_alone(tmp_path):
    reference = listops(tmp_path)
    held = listops(tmp_path, "task.validation=heldout", "task.heldout_size=30")
    train, val = examples(held.splits["train"]), examples(held.splits["val"])
    assert len(val) == 30 and len(train) == 96 - 30
    assert sorted(train + val) == sorted(examples(reference.splits["train"]))  # a partition of the training split
    assert examples(held.splits["test"]) == examples(reference.splits["test"])
    assert examples(listops(tmp_path, "task.validation=heldout", "task.heldout_size=30").splits["val"]) == val
    other_seed = listops(tmp_path, "task.validation=heldout", "task.heldout_size=30", "task.heldout_seed=1")
    assert examples(other_seed.splits["val"]) != val
    assert held.validation == "held out: 30 training examples (seed 0)"
    assert reference.validation == "the validation split"
    with pytest.raises(UserError, match="task.heldout_size=96 leaves no training examples"):
        listops(tmp_path, "task.validation=heldout", "task.heldout_size=96")


def test_the_record_and_the_table_say_what_each_run_validated_on(tmp_path, data_dir):
    record = train_in_process(tmp_path / "run", "trainer=smoke", "trainer.max_steps=2", "trainer.eval_every=2",
                              "trainer.progress_bar=false", f"data_dir={data_dir}", *SMALL_LISTOPS,
                              "task.validation=heldout", "task.heldout_size=16")
    assert record["validation"] == "held out: 16 training examples (seed 0)" and record["validation_examples"] == 16
    text = tmp_path / "text-run"
    text.mkdir()
    (text / "metrics.json").write_text(json.dumps({
        "label": "Softmax", "task": "text", "seed": 0, "status": "completed", "test_accuracy": 60.0,
        "validation": "the test split (the reference's protocol)"}))
    notes = validation_notes(collect([tmp_path]))
    assert "- listops: validated on held out: 16 training examples (seed 0) (1 run)" in notes
    assert "- text: validated on the test split (the reference's protocol) (1 run)" in notes
