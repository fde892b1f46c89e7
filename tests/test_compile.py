"""torch.compile end to end: the YOSO operators pass torch.library.opcheck, every registered backend
compiles as one graph (fullgraph) and matches eager, and a compiled run resumes exactly."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

import attention_zoo
from attention_zoo import _yoso_ops as ops
from attention_zoo._common import seeded_normal
from attention_zoo._yoso_build import KernelUnavailable
from attention_zoo.yoso import draw, sample_op, seeded_draws_op
from conftest import SMALL_LISTOPS
from helpers import compose_model, forward_backward, main_in_process
from lra.benchmarks import compile_speed
from lra.config import CONF_DIR, register_configs, register_resolvers
from lra.loggers import NullLogger


def kernel_engines() -> list:
    try:
        ops.resolve_engine("cpu", torch.device("cpu"))
        return ["torch", "kernel"]
    except KernelUnavailable:
        return ["torch"]


def yoso_inputs(engine: str, n: int = 37, d: int = 32, dv: int = 24, batch: int = 3, m: int = 8, tau: int = 5):
    g = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(batch, n, d, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(batch, n, dv, generator=g)
    mask = (torch.rand(batch, n, generator=g) > 0.3).float()
    draws = draw(batch, d, dv, m, tau, "hadamard", 4, g, "cpu")
    codes_q, codes_k = (ops.fast_hash(x, draws.diagonals, m, tau, engine) for x in (q, k))
    return q, k, v, mask, draws, codes_q, codes_k, m, tau


@pytest.mark.parametrize("engine", kernel_engines())
def test_every_yoso_operator_passes_opcheck(engine):
    q, k, v, mask, draws, codes_q, codes_k, m, tau = yoso_inputs(engine)
    weights = torch.rand(q.shape[0], 1, 3, q.shape[1])
    cases = [
        (ops.fast_hash_op, (q, draws.diagonals, m, tau, engine)),
        *((ops.cumulation_op, (codes_q, codes_k, weights, weights.clone(), v, tau, 2**20, engine, bf16_rows))
          for bf16_rows in (False, True)),
        (ops.pair_gradient_op, (codes_q, codes_k, q, k, torch.randn_like(v), v, mask, tau, 0.99, engine)),
        *((ops.exact_weight_backward_op, (codes_q, codes_k, q * 3, k, v, mask, torch.randn_like(v), tau, 2**20, engine,
                                          normalize, bf16_rows))
          for normalize, bf16_rows in itertools.product((False, True), (False, True))),
        (seeded_draws_op, (7, 3, 32, 24, 8, 5, "hadamard", 4, torch.device("cpu"))),
        (seeded_draws_op, (7, 3, 32, 24, 8, 5, "gaussian", 32, torch.device("cpu"))),
        (seeded_normal, (7, [2, 3, 4], torch.device("cpu"))),
    ]
    if torch.cuda.is_available() and engine == "kernel":  # the output's backward kernel: CUDA tensors only
        cases.append((ops.through_unit_rows_op, (torch.randn_like(v).cuda(), *ops.unit_rows(v.cuda() * 2, engine))))
    for (backward, projections), normalize in itertools.product(
            (("lower_bound", draws.projections), ("lower_bound", torch.empty(0)), ("exact", draws.projections),
             ("expectation", draws.projections)), (False, True)):
        leaves = [t.clone().requires_grad_() for t in (q * 3 if normalize else q, k, v)]
        cases.append((sample_op, (*leaves, mask, codes_q, codes_k, projections.contiguous(), tau, backward, engine, 0.99,
                                  2**20, normalize, backward == "lower_bound" and normalize, normalize)))
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_the_kernel_choice_is_marked_constant_for_compile_without_importing_dynamo_at_start_up():
    """_yoso_ops marks _resolve_engine as torch.compiler.assume_constant_result does, without its import of
    torch._dynamo; the public decorator must still mark a function that way, and a command must start
    without torch._dynamo (the backends' fullgraph compile below checks the mark works)."""
    assert torch.compiler.assume_constant_result(lambda: 0)._dynamo_marked_constant
    assert ops._resolve_engine._dynamo_marked_constant
    probe = "import sys, lra.commands.train; print('torch._dynamo' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"


@pytest.mark.parametrize("name", attention_zoo.names())
def test_every_backend_compiles_as_one_graph_and_matches_eager(name):
    """fullgraph=True: any graph break fails. AOTAutograd traces forward and backward (the custom
    operators through their fake implementations) and replays the random draws (dropout, hashes,
    rotations) in eager's order, so from the same seed a training step matches eager to float32
    rounding."""
    torch._dynamo.reset()
    length = 160  # above Reformer's and LSH's chunk sizes, so that they hash
    model = compose_model(name, length, layers=1).train()  # (the suite's time: tracing grows with the layers)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 16, (2, length), generator=g)
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[1, 101:] = False
    torch.manual_seed(5)
    eager_logits, eager_grads = forward_backward(model, ids, mask)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.manual_seed(5)
    logits, grads = forward_backward(compiled, ids, mask)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-5)
    for key, grad in grads.items():  # AOTAutograd gives zeros where eager leaves None (no differentiable path)
        expected = eager_grads.get(key, torch.zeros_like(grad))
        torch.testing.assert_close(grad, expected, rtol=1e-3, atol=1e-5, msg=key)
    assert eager_grads.keys() <= grads.keys()


def test_a_compiled_run_killed_and_resumed_ends_identical_to_the_uninterrupted_compiled_run(tmp_path, data_dir,
                                                                                          monkeypatch):
    """Inductor (the default backend) with dropout: the compiled graph's random draws come from the
    checkpointed generators, so a run that dies after an unsaved step and resumes from its checkpoint
    replays them. (SIGKILLs anywhere are tested on the eager loop in test_training.py; compiling
    changes nothing the checkpoint holds.)"""
    from lra.training import Trainer

    register_configs()
    register_resolvers()
    overrides = ["trainer=smoke", "trainer.compile=true", "trainer.max_steps=6", "trainer.eval_every=3",
                 "trainer.checkpoint_every=2", "attention=none", "model.num_layers=1", "seed=3",
                 f"data_dir={data_dir}", *SMALL_LISTOPS]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
        resumed_cfg = compose(config_name="config", overrides=[*overrides, f"resume={tmp_path / 'stopped'}"])
    whole = Trainer(cfg, tmp_path / "whole", announce=lambda m: None)
    expected = whole.run(NullLogger())
    stopped = Trainer(cfg, tmp_path / "stopped", announce=lambda m: None)
    calls = []

    def stop_after_step_five(point):
        calls.append(point)
        if calls.count("step") == 5:  # after step 5 (checkpoint at step 4): the process dies here
            raise KeyboardInterrupt

    monkeypatch.setattr("lra.training.checkpoint.fault_point", stop_after_step_five)
    with pytest.raises(KeyboardInterrupt):
        stopped.run(NullLogger())
    monkeypatch.undo()
    del stopped
    resumed = Trainer(resumed_cfg, tmp_path / "stopped", announce=lambda m: None)
    assert resumed.try_resume() and resumed.state.step == 4 and resumed.train_model is not resumed.model  # compiled
    result = resumed.run(NullLogger())
    for key in ("best_step", "best_val_accuracy", "test_accuracy", "test_loss"):
        assert result[key] == expected[key], key
    assert resumed.state.history == whole.state.history
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name


@pytest.mark.parametrize("args, line", [
    (["--steps", "0", "--attention", "none"], "--steps 0: it must be >= 1"),
    (["--steps", "1", "--batch", "-2"], "--batch -2: it must be >= 1"),
    (["--attention", "nosuch"], "argument --attention: invalid choice: 'nosuch' (choose from "
                                + ", ".join(f"'{p.stem}'" for p in sorted((CONF_DIR / "attention").glob("*.yaml"))) + ")"),
])
def test_the_compile_benchmark_refuses_bad_arguments_in_one_line_before_building(args, line, monkeypatch, capsys):
    monkeypatch.setattr(compile_speed, "measure", lambda *a: pytest.fail("measured despite bad arguments"))
    status, printed, errors = main_in_process(compile_speed.main, args, capsys)
    assert status == 2 and errors.strip().splitlines()[-1].endswith(f": error: {line}"), errors
    assert "Traceback" not in errors and not printed.strip()
