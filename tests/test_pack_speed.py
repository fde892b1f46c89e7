"""python -m lra.benchmarks.pack_speed (a GPU benchmark) at a tiny size on the CPU: it prints its table
row by row, one run alone and two packed; and a run that fails ends the measurement with its error instead
of leaving the other runs waiting for it."""

from __future__ import annotations

import pytest

from lra.benchmarks import pack_speed

TINY = ["trainer.max_length=64", "trainer.batch_size=2", "model.num_layers=1", "task.generator.num_train=64",
        "task.generator.num_val=16", "task.generator.num_test=16", "task.generator.min_length=20",
        "task.generator.max_length=120"]  # after the benchmark's own splits: a small generated set


def test_the_benchmark_prints_one_run_and_two_packed(tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setenv("LRA_DATA_DIR", str(data_dir))
    pack_speed.main(["--device", "cpu", "--runs", "1,2", "--capture", "false", "--steps", "2", "--warmup", "4",
                     "--out", str(tmp_path / "pack.md"), *TINY])
    rows = [line for line in (tmp_path / "pack.md").read_text().splitlines() if line.startswith("| 1 |")
            or line.startswith("| 2 |")]
    assert [row.split("|")[1:3] for row in rows] == [[" 1 ", " no "], [" 2 ", " no "]], capsys.readouterr().out
    assert rows[0].rstrip().endswith("| 1.00x |") and rows == capsys.readouterr().out.splitlines()[-2:]


@pytest.mark.timeout(300)
def test_a_run_that_fails_ends_the_measurement_with_its_error(tmp_path, data_dir, monkeypatch):
    from lra.training import Trainer

    monkeypatch.setenv("LRA_DATA_DIR", str(data_dir))
    step = Trainer.train_step
    calls = []

    def failing_second_run(trainer):
        calls.append(trainer)
        if trainer.cfg.seed == 1 and calls.count(trainer) == 6:  # in the timed steps, the other run waiting
            raise RuntimeError("a run that fails")
        return step(trainer)

    monkeypatch.setattr(Trainer, "train_step", failing_second_run)
    job = ["experiment=yoso_table3", "task=listops", "row=yoso_table3/softmax", "trainer.device=cpu", "logger=none",
           "trainer.progress_bar=false", *pack_speed.SMALL_SPLITS, f"data_dir={data_dir}", *TINY]
    pack_speed.register_configs()
    pack_speed.register_resolvers()
    with pytest.raises(RuntimeError, match="a run that fails"):
        pack_speed.measure(job, runs=2, capture=False, warmup=4, steps=4)
