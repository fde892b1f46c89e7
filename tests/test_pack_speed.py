"""python -m lra.benchmarks.pack_speed (a GPU benchmark) at a tiny size on the CPU: it prints its table
row by row, one run alone and two packed; and a run that fails ends the measurement with its error instead
of leaving the other runs waiting for it."""

from __future__ import annotations

import pytest

from conftest import run_command
from lra.benchmarks import pack_speed

TINY = ["trainer.max_length=64", "trainer.batch_size=2", "model.num_layers=1"]


def test_the_benchmark_prints_one_run_and_two_packed(tmp_path, data_dir):
    result = run_command(["python", "-m", "lra.benchmarks.pack_speed", "--device", "cpu", "--runs", "1,2",
                          "--capture", "false", "--steps", "2", "--warmup", "4", "--out", str(tmp_path / "pack.md"),
                          *TINY], tmp_path, data_dir)
    rows = [line for line in (tmp_path / "pack.md").read_text().splitlines() if line.startswith("| 1 |")
            or line.startswith("| 2 |")]
    assert [row.split("|")[1:3] for row in rows] == [[" 1 ", " no "], [" 2 ", " no "]], result.stdout
    assert rows[0].rstrip().endswith("| 1.00x |")


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
