"""``python -m lra.benchmarks.throughput --profile``: a reference row profiled end to end at a tiny size
(its table's rows non-negative and adding up to the wall time), the attribution of profiler events to
parts (CUDA-shaped events made by hand: no GPU here), and the refusals."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from conftest import SMALL_LISTOPS
from lra.benchmarks import step_profile
from lra.benchmarks.step_profile import (ATTENTION_BACKWARD, ATTENTION_FORWARD, DATA, HOST_GAPS, MODEL_BACKWARD,
                                         MODEL_FORWARD, OPTIMIZER, OTHER, Window, attribute)
from lra.benchmarks.throughput import main

TINY = ["--length", "64", "--batch", "4", "--steps", "2", "--warmup", "1", "--device", "cpu"]
ROWS = [ATTENTION_FORWARD, ATTENTION_BACKWARD, MODEL_FORWARD, MODEL_BACKWARD, OPTIMIZER, DATA, OTHER]


def step_table(printed: str) -> dict:
    """{part: (training step ms, evaluation pass ms, training step operators)} from the profile's first
    table, wall included."""
    rows = {}
    for line in printed.splitlines():
        name, *cells = [cell.strip().strip("*") for cell in line.strip("|").split("|")]
        cells = [cell.replace(",", "") for cell in cells]
        if len(cells) == 6 and re.fullmatch(r"\d+\.\d", cells[0]):
            rows[name] = (float(cells[0]), float(cells[3]), int(cells[2]) if cells[2] else 0)
    return rows


def test_profile_of_a_reference_row_adds_up(tmp_path, capsys):
    result = main(["--profile", "--row", "softmax", *TINY, f"data_dir={tmp_path}", *SMALL_LISTOPS,
                   "trainer.eval_subset=8"])
    printed = capsys.readouterr().out
    table = step_table(printed)
    assert list(table) == [*ROWS, "wall"]
    for column in (0, 1):
        parts = [table[row][column] for row in ROWS]
        assert min(parts) >= 0
        assert sum(parts) == pytest.approx(table["wall"][column], abs=0.1 * len(ROWS))  # each cell rounded to 0.1 ms
    assert table[ATTENTION_FORWARD][0] > 0 and table[ATTENTION_BACKWARD][0] > 0 and table[OPTIMIZER][0] > 0
    operators = {row: table[row][2] for row in ROWS}
    assert min(operators[row] for row in ROWS[:-1]) > 0  # every part calls operators
    assert sum(operators.values()) == table["wall"][2]
    assert table[ATTENTION_BACKWARD][1] == table[MODEL_BACKWARD][1] == table[OPTIMIZER][1] == 0  # no autograd
    assert "batch 4, length 64" in printed and "load average" in printed and "| **a run's step** |" in printed

    # The remainder is what the profiler saw outside the parts: nothing counted twice, nothing lost (but
    # for the moments between the clock and the profiler's scope, which a loaded machine stretches).
    assert result.step.count == 2 and result.evaluation.count == 2  # 8 validation examples in batches of 4
    for window in (result.step, result.evaluation):
        assert window.measured_other() >= 0 and window.parts()[OTHER] >= window.measured_other() - 1e-4
        assert window.parts()[OTHER] - window.measured_other() <= 0.05 * window.wall + 0.02
    assert result.tokens_per_step == 4 * 64
    assert result.run_step() == pytest.approx(result.step.wall / 2 + result.evaluation.wall / 50
                                              + result.checkpoint / 50)


class Events(list):
    """Profiler events made by hand, with the fields :func:`attribute` reads (µs)."""

    def add(self, name, start, end, parent=None, sequence_nr=-1, kernels=(), device=False):
        made = SimpleNamespace(name=name, cpu_parent=parent, cpu_children=[], sequence_nr=sequence_nr,
                               is_async=False, is_user_annotation=False, self_cpu_time_total=end - start,
                               time_range=SimpleNamespace(start=start, end=end),
                               kernels=[SimpleNamespace(duration=d) for d in kernels],
                               device_type=torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU)
        if parent is not None:
            parent.cpu_children.append(made)
            parent.self_cpu_time_total -= end - start
        self.append(made)
        return made


def test_attribution_of_cuda_events():
    """A step as the CUDA profiler shows it: the forward on the main thread, the backward nodes on the
    autograd thread (no parent), each kernel linked to the operator that launched it."""
    events = Events()
    step = events.add("lra.profile/train_step", 0, 1000)
    forward = events.add("lra.profile/forward", 10, 400, step)
    copy = events.add("lra.profile/data", 10, 60, forward)
    events.add("aten::copy_", 20, 50, copy, kernels=[5])
    backend = events.add("lra.profile/attention_backend", 100, 300, forward)
    events.add("aten::mm", 110, 150, backend, sequence_nr=7, kernels=[40])
    events.add("aten::softmax", 150, 200, backend, sequence_nr=9, kernels=[30])
    events.add("aten::linear", 320, 380, forward, sequence_nr=10, kernels=[20])
    events.add("autograd::engine::evaluate_function: SoftmaxBackward0", 420, 460, sequence_nr=9, kernels=[60])
    events.add("autograd::engine::evaluate_function: CloneBackward0", 460, 480, sequence_nr=8)  # in the backend's range
    addmm = events.add("autograd::engine::evaluate_function: AddmmBackward0", 480, 500, sequence_nr=10)
    events.add("aten::mm", 482, 498, addmm, kernels=[25])
    events.add("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 500, 505)
    events.add("Optimizer.step#AdamW.step", 600, 700, step, kernels=[15])
    events.add("aten::isfinite", 800, 810, step, kernels=[2])
    events.add("stray::launch", 990, 995, kernels=[1])  # outside every scope: its kernel counts as other
    for start, duration in ((0, 5), (100, 40), (130, 30), (320, 20), (420, 60), (480, 25), (600, 15), (800, 2),
                            (990, 1)):
        events.add("kernel", start, start + duration, device=True)

    measured = attribute(events)
    assert measured.device == pytest.approx({DATA: 5e-6, ATTENTION_FORWARD: 70e-6, MODEL_FORWARD: 20e-6,
                                             ATTENTION_BACKWARD: 60e-6, MODEL_BACKWARD: 25e-6, OPTIMIZER: 15e-6,
                                             OTHER: 3e-6})
    assert measured.busy == pytest.approx((5 + 60 + 20 + 60 + 25 + 15 + 2 + 1) * 1e-6)  # (100, 140), (130, 160) overlap
    assert measured.host == pytest.approx({DATA: 50e-6, ATTENTION_FORWARD: 200e-6, MODEL_FORWARD: 140e-6,
                                           ATTENTION_BACKWARD: 60e-6, MODEL_BACKWARD: 25e-6, OPTIMIZER: 100e-6,
                                           OTHER: 1000e-6 - 390e-6 - 100e-6})
    assert measured.operators == {DATA: 1, ATTENTION_FORWARD: 2, MODEL_FORWARD: 1, MODEL_BACKWARD: 1, OTHER: 1}

    window = Window(1, 1200e-6, measured, cuda=True)
    rows = window.parts()
    assert rows[HOST_GAPS] == pytest.approx(1200e-6 - measured.busy)
    assert sum(rows.values()) == pytest.approx(1200e-6)
    assert rows[OTHER] == pytest.approx(measured.busy - sum(measured.device[part] for part in step_profile.PARTS))
    assert window.measured_other() == pytest.approx(3e-6)


@pytest.mark.parametrize("arguments, status, line", [
    (["--profile", "--row", "nope"], 2, "--row nope: not a row of experiment=yoso_table3; choose one of linformer,"),
    (["--profile", "--attention", "softmax"], 2, "--attention is throughput's; --profile profiles a YOSO Table 3 row"),
    (["--length", "64"], 2, "--length only go with --profile"),
    (["--profile", "--steps", "0"], 2, "--steps 0: it must be >= 1"),
    (["--profile", "trainer.max_step=3"], 2, "error: unknown key 'trainer.max_step' (did you mean 'max_steps'?)"),
    (["--profile", "trainer.compile=true"], 1, "error: the profile names the attention backend's time through module "
                                               "hooks, which a compiled model does not run: profile with trainer.compile=false"),
    pytest.param(["--profile", "--device", "cuda"], 2, "error: trainer.device=cuda but this machine has no CUDA device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")),
])
def test_refusals_are_one_line(arguments, status, line, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main([*arguments, f"data_dir={tmp_path}"])
    printed = capsys.readouterr()
    assert stopped.value.code == status
    errors = [text for text in printed.err.splitlines() if "error:" in text]
    assert len(errors) == 1 and line in errors[0], printed.err
    assert "Traceback" not in printed.err and not printed.out and not any(tmp_path.iterdir())
