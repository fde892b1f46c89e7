"""Every efficient backend end to end through lra-train, and its memory against eager softmax."""

import pytest

import attention_zoo
from conftest import SMALL_LISTOPS, read_json, run_dirs
from helpers import main_in_process, train_in_process
from lra.benchmarks import attention_memory
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


@pytest.mark.parametrize("args, line", [
    (["--n", "-5"], "--n -5: it must be >= 1"),
    (["--n", "0"], "--n 0: it must be >= 1"),
    (["--heads", "0", "--backends", "softmax"], "--heads 0: it must be >= 1"),
    (["--head-dim", "0"], "--head-dim 0: it must be >= 1"),
    (["--device", "cuda"], "--device cuda: no CUDA device here"),
    (["--device", "bogus"], "argument --device: invalid choice: 'bogus' (choose from 'cpu', 'cuda')"),
    (["--backends", "nosuch"], "argument --backends: invalid choice: 'nosuch' (choose from "
                               + ", ".join(f"'{name}'" for name in attention_zoo.names()) + ")"),
])
def test_the_memory_benchmark_refuses_bad_arguments_in_one_line_before_measuring(args, line, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(attention_memory, "run_cell", lambda *a: pytest.fail("measured despite bad arguments"))
    status, printed, errors = main_in_process(attention_memory.main, args, capsys)
    assert status == 2 and errors.strip().splitlines()[-1].endswith(f": error: {line}"), errors
    assert "Traceback" not in errors and not printed.strip()


def test_a_backend_that_fails_is_its_row_and_the_memory_benchmark_exits_1(monkeypatch, capsys):
    rows = [{"backend": EAGER, "n": 64, "peak_mb": 2.0}, {"backend": "softmax", "n": 64, "peak_mb": 1.0},
            {"backend": "yoso", "n": 64, "peak_mb": None, "error": "RuntimeError: broken"}]
    monkeypatch.setattr(attention_memory, "measure_cells", lambda names, *a: [r for r in rows if r["backend"] in names])
    status, printed, errors = main_in_process(attention_memory.main, ["--n", "64", "--backends", "softmax", "yoso"],
                                              capsys)
    assert status == 1 and errors.strip() == "error: 1 backends failed: yoso: RuntimeError: broken", errors
    assert "| softmax " in printed and "0.5" in printed
