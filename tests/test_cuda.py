"""On a CUDA device (``pytest -m cuda``, lra-gpu-check; skipped elsewhere): every backend trains a step
under fp16 and bf16 autocast, compiles with Inductor, and the YOSO kernels agree with the PyTorch path on
both of their CUDA paths (sorted under deterministic algorithms, atomic otherwise)."""

from __future__ import annotations

import pytest
import torch

import attention_zoo
from helpers import compose_model, forward_backward
from lra.determinism import deterministic_algorithms

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


@pytest.mark.parametrize("tau", [2, 8, 12, 14], ids=["heavy-buckets", "light-buckets", "sliced-tables",
                                                   "many-slices"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["sorted", "atomic"])
def test_yoso_cuda_paths_equal_the_pytorch_path_and_the_sorted_one_repeats_bitwise(deterministic, tau):
    """The CUDA cumulation and default backward take the sorted single-writer path under torch's
    deterministic algorithms (the trainer's default) and the atomicAdd path otherwise: both equal the
    PyTorch path to float32 rounding (τ = 2: buckets of ~75 tokens, through their tables; τ = 8: pairs,
    runs found from their starts; τ = 12: the atomic forward's shared-memory tables in 16 slices of the
    codes, runs found by binary search; τ = 14: in 64 slices), and the sorted path gives the same bits twice."""
    import torch.nn.functional as F

    from attention_zoo import _yoso_ops as ops
    from attention_zoo.yoso import draw, hash_codes

    batch, n, d, dv, m = 4, 300, 32, 32, 8
    g = torch.Generator().manual_seed(tau)
    q = F.normalize(torch.randn(batch, n, d, generator=g), dim=-1)
    k = F.normalize(q + F.normalize(torch.randn(batch, n, d, generator=g), dim=-1), dim=-1)
    v, grad = torch.randn(batch, n, dv, generator=g), torch.randn(batch, n, dv, generator=g)
    mask = (torch.rand(batch, n, generator=g) > 0.2).float()
    q, k, v, grad, mask = (t.cuda() for t in (q, k, v, grad, mask))
    torch.manual_seed(tau)
    draws = draw(batch, d, dv, m, tau, "hadamard", dv, None, "cuda")
    codes_q, codes_k = (hash_codes(x, draws, m, tau, "kernel") for x in (q, k))
    assert torch.equal(codes_q, hash_codes(q, draws, m, tau, "torch"))
    ones = torch.ones(batch, 1, 1, n, device="cuda")

    def call(engine):
        return (ops.cumulation(codes_q, codes_k, ones, mask[:, None, None], v, tau, engine),
                *ops.exact_weight_backward(codes_q, codes_k, q, k, v, mask, grad, tau, engine))

    reference = call("torch")
    with deterministic_algorithms(deterministic):
        runs = [call("kernel") for _ in range(2)]
    for got, want in zip(runs[0], reference):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * max(1.0, want.abs().max().item()))
    if deterministic:
        assert all(torch.equal(a, b) for a, b in zip(*runs))


@pytest.mark.parametrize("n, tau", [(8200, 14), (16400, 15)])
@pytest.mark.parametrize("deterministic", [True, False], ids=["sorted", "atomic"])
def test_the_counting_sort_past_48_kb_gives_the_cpu_kernels_results(n, tau, deterministic):
    """From τ = 14 a pair's counters outgrow the 48 KB every block has: the counting sort opts into more where
    the GPU allows (an H100: 227 KB, τ ≤ 15), else torch's sort takes over (the profiler tells which ran).
    Either way the cumulation and the default backward equal the CPU kernels' on the same codes."""
    import torch.nn.functional as F

    from attention_zoo import _yoso_ops as ops

    batch, d, m = 2, 32, 4
    g = torch.Generator().manual_seed(tau)
    q, k = (F.normalize(torch.randn(batch, n, d, generator=g), dim=-1) for _ in range(2))
    v, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    codes_q, codes_k = (torch.randint(0, 2**tau, (batch, m, n), generator=g, dtype=torch.int32) for _ in range(2))
    mask, ones = torch.ones(batch, n), torch.ones(batch, 1, 1, n)

    def call(*tensors):
        cq, ck, q_, k_, v_, g_, mask_, ones_ = tensors
        return (ops.cumulation(cq, ck, ones_, mask_[:, None, None], v_, tau, "kernel"),
                *ops.exact_weight_backward(cq, ck, q_, k_, v_, mask_, g_, tau, "kernel"))

    tensors = (codes_q, codes_k, q, k, v, grad, mask, ones)
    on_cpu = call(*tensors)
    with deterministic_algorithms(deterministic), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        on_gpu = call(*(t.cuda() for t in tensors))
        torch.cuda.synchronize()
    for got, want in zip(on_gpu, on_cpu):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5 * max(1.0, want.abs().max().item()))
    opted_in = torch.cuda.get_device_properties(0).shared_memory_per_block_optin >= (2**tau + 4) * 4
    counted = any("counting_sort_kernel" in event.name for event in profile.events())
    assert counted == opted_in, (counted, opted_in)
    if deterministic:  # the opt-in (cudaFuncSetAttribute) inside a CUDA graph's capture, replayed: the same bits
        on_device = tuple(t.cuda() for t in tensors)
        graph = torch.cuda.CUDAGraph()
        with deterministic_algorithms(True):
            with torch.cuda.graph(graph):
                captured = call(*on_device)
            graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(captured, on_gpu))
