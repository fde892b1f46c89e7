"""On a CUDA device (``pytest -m cuda``, lra-gpu-check; skipped elsewhere): every backend trains a step
under fp16 and bf16 autocast, compiles with Inductor, and the YOSO kernels agree with the CPU kernels."""

from __future__ import annotations

import pytest
import torch

import attention_zoo
from helpers import compose_model, forward_backward

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


def padded_batch(length: int, second_length: int, seed: int):
    """Two sequences of random ids on the GPU, the second padded after ``second_length`` tokens."""
    ids = torch.randint(1, 16, (2, length), device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    mask = torch.ones(2, length, dtype=torch.bool, device="cuda")
    mask[1, second_length:] = False
    return ids, mask


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", attention_zoo.names())
def test_every_backend_trains_a_step_under_autocast(name, dtype):
    length = 320
    model = compose_model(name, length).cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    ids = torch.randint(1, 16, (4, length), device="cuda")
    mask = torch.ones(4, length, dtype=torch.bool, device="cuda")
    mask[1, 200:] = False
    with torch.autocast("cuda", dtype=dtype):
        logits = model([ids], [mask])
    loss = torch.nn.functional.cross_entropy(logits.float(), torch.zeros(4, dtype=torch.long, device="cuda"))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("name", attention_zoo.names())
def test_every_backend_compiles_with_inductor_on_cuda_and_matches_eager(name):
    torch._dynamo.reset()
    length = 160
    model = compose_model(name, length).cuda().eval()
    ids, mask = padded_batch(length, second_length=101, seed=1)
    eager_logits, _ = forward_backward(model, ids, mask)
    logits, grads = forward_backward(torch.compile(model, fullgraph=True), ids, mask)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-3, atol=1e-4)
    assert all(torch.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("name", ["yoso", "yoso_c", "lsh", "reformer"])
def test_sampling_backends_replay_under_cuda_graphs(name):
    """compile_mode=reduce-overhead captures the forward in a CUDA graph: no host synchronisation and no
    host-to-device copy may sit inside (training draws on the device; evaluation draws made once per
    shape and kept there). Evaluation replays equal eager; a captured training step replays finite,
    with fresh draws each replay."""
    torch._dynamo.reset()
    length = 256
    model = compose_model(name, length).cuda().eval()
    ids, mask = padded_batch(length, second_length=150, seed=2)
    with torch.no_grad():
        eager = model([ids], [mask])
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):  # warm-up, record, replay
            replayed = compiled([ids], [mask]).clone()
    torch.testing.assert_close(replayed, eager, rtol=1e-3, atol=1e-4)

    model.train()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graphs require
        model([ids], [mask]).float().logsumexp(-1).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = model([ids], [mask]).float().logsumexp(-1).sum()
        loss.backward()
    losses = []
    for _ in range(2):
        graph.replay()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[0] != losses[1]  # fresh hashes per replay
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
