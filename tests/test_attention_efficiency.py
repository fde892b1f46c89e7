"""Every efficient backend end to end through lra-train, and its memory against eager softmax."""

import pytest

import attention_zoo
from conftest import SMALL_LISTOPS, read_json, run_dirs
from helpers import train_in_process
from lra.benchmarks.attention_memory import EAGER, table

SUBQUADRATIC = [n for n in attention_zoo.names() if attention_zoo.get(n).cls.subquadratic]


def test_every_registered_backend_trains_under_smoke(tmp_path, data_dir):
    for name in attention_zoo.names():  # in this process: the training is the point, not the command line
        train_in_process(tmp_path / "runs" / name, "task=listops", f"attention={name}", "trainer=smoke",
                         "trainer.max_steps=4", "trainer.eval_every=2", "trainer.progress_bar=false",
                         f"data_dir={data_dir}", *SMALL_LISTOPS)
    runs = {read_json(r / "metrics.json")["attention"]: r for r in run_dirs(tmp_path)}
    assert set(runs) == set(attention_zoo.names())
    records = {name: read_json(run / "metrics.json") for name, run in runs.items()}
    assert all(r["status"] == "completed" for r in records.values()), {n: r["error"] for n, r in records.items()}
    if "learned_hash" in runs:  # the trainer adds a backend's aux_loss and records it
        history = read_json(runs["learned_hash"] / "history.json")
        assert all(entry["train_aux_loss"] > 0 for entry in history)
        assert "train_aux_loss" not in read_json(runs["softmax"] / "history.json")[0]


@pytest.mark.skipif(not SUBQUADRATIC, reason="no efficient backend registered")
def test_subquadratic_backends_use_under_a_quarter_of_eager_softmax_memory_at_8192():
    frame = table(SUBQUADRATIC, n=8192)
    one_score_matrix_mb = 2 * 8192**2 * 4 / 2**20  # 2 heads of n x n float32: 512 MB
    assert frame.loc[EAGER, "peak_mb"] > 1.5 * one_score_matrix_mb  # the scores, their softmax and gradients
    ratios = frame.drop(index=EAGER)["vs_eager_softmax"]
    assert (ratios < 0.25).all(), frame.to_string()
