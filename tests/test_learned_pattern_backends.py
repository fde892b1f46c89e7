"""Sinkhorn and Synthesizer against independent float64 references written from the papers' definitions
(Tay et al. 2020, "Sparse Sinkhorn Attention" §3; Tay et al. 2021, "Synthesizer" §3), with padding
masks and lengths that are odd and not a multiple of the block size; Sinkhorn's balancing checked
doubly stochastic, its evaluation free of noise and its training noise Gumbel and reproducible."""

from __future__ import annotations

import math

import pytest
import torch

import attention_zoo
from attention_zoo.options import InvalidOption

N, HEAD_DIM, MAX_LEN = 37, 16, 64  # 37: odd, and 4 blocks of 8 plus a partial one of 5


def qkv(n=N, batch=2, heads=2, d=HEAD_DIM, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g) for _ in range(3)]


def padded(n=N, real_in_second=22):
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, real_in_second:] = False
    return mask


def build(name, max_seq_len=MAX_LEN, seed=0, **options):
    torch.manual_seed(seed)
    return attention_zoo.build(name, num_heads=2, head_dim=HEAD_DIM, max_seq_len=max_seq_len, **options).eval()


def assert_relative_error(out, expected, mask, bound=1e-5):
    """max |out − expected| over real query rows ≤ bound · max |expected| (and elementwise close)."""
    rows = mask[:, None, :, None].expand_as(expected)
    error = (out.double() - expected)[rows].abs().max() / expected[rows].abs().max()
    assert error <= bound, f"relative error {error:.2e}"
    torch.testing.assert_close(out.double()[rows], expected[rows], rtol=bound, atol=bound)


# ----------------------------------------------------------------------------------- Sinkhorn
def sinkhorn_reference(attn, q, k, v, mask):
    """float64, one (sequence, head) at a time, dense matrices from §3: blocks of ``block_size``
    consecutive tokens; R_ij = (Σ of block i's real keys) · W_j / τ; P = k rounds of row-then-column
    division of exp(R) over the blocks holding a real token (identity elsewhere); block i's sorted keys
    are M_i K with M_i[s, t] = P[i, block(t)] for each real token t in slot s; output = the block's
    own masked softmax attention + the masked softmax attention over its sorted keys and values."""
    options = attn.options
    size, W = options.block_size, attn.sort_net.detach().double()
    q, k, v = q.double(), k.double(), v.double()
    batch, heads, n, d = q.shape
    blocks = math.ceil(n / size)
    block_of, slot_of = torch.arange(n) // size, torch.arange(n) % size
    out = torch.zeros_like(q)
    for b in range(batch):
        real = mask[b]
        kept = [i for i in range(blocks) if real[block_of == i].any()]
        slot_real = torch.zeros(size, dtype=torch.bool)
        slot_real[slot_of[real]] = True
        same_block = block_of[:, None] == block_of[None, :]
        for h in range(heads):
            sums = torch.stack([(k[b, h] * real[:, None])[block_of == i].sum(0) for i in range(blocks)])
            scores = sums @ W[:, :blocks] / options.temperature
            balanced = scores[kept][:, kept].exp()
            for _ in range(options.sinkhorn_iterations):
                balanced = balanced / balanced.sum(dim=1, keepdim=True)
                balanced = balanced / balanced.sum(dim=0, keepdim=True)
            P = torch.eye(blocks, dtype=torch.float64)
            P[torch.tensor(kept)[:, None], torch.tensor(kept)[None, :]] = balanced
            local_scores = (q[b, h] @ k[b, h].T / math.sqrt(d)).masked_fill(~(same_block & real), -math.inf)
            local = torch.softmax(local_scores, dim=-1) @ v[b, h]
            for i in range(blocks):
                mixing = torch.zeros(size, n, dtype=torch.float64)
                for t in torch.nonzero(real).flatten():
                    mixing[slot_of[t], t] = P[i, block_of[t]]
                queries = block_of == i
                sorted_scores = (q[b, h, queries] @ (mixing @ k[b, h]).T / math.sqrt(d)).masked_fill(~slot_real, -math.inf)
                out[b, h, queries] = local[queries] + torch.softmax(sorted_scores, dim=-1) @ (mixing @ v[b, h])
    return out


@pytest.mark.parametrize("iterations,temperature", [(1, 1.0), (7, 0.5)])
def test_sinkhorn_equals_a_float64_dense_reference(iterations, temperature):
    attn = build("sinkhorn", block_size=8, sinkhorn_iterations=iterations, temperature=temperature)
    q, k, v = qkv()
    mask = padded()
    assert_relative_error(attn(q, k, v, mask), sinkhorn_reference(attn, q, k, v, mask), mask)


def test_sinkhorn_balancing_is_doubly_stochastic_and_converges():
    """Each round ends with a column division, so columns sum to 1 after any number of rounds; the rows'
    L1 distance to 1 never grows from one round to the next and is below 1e-5 after 200. Blocks without a
    real token (the second sequence's last two) keep the identity's row and column."""
    _, k, _ = qkv(n=61)
    mask = padded(n=61, real_in_second=40)  # 8 blocks; the second sequence's blocks 5 to 7 are padding only
    row_errors = []
    for iterations in (1, 2, 3, 5, 10, 20, 50, 200):
        P, block_real = build("sinkhorn", block_size=8, sinkhorn_iterations=iterations).sorting_matrix(k, mask)
        assert (P.sum(dim=-2) - 1).abs().max() <= 1e-6
        row_errors.append((P.sum(dim=-1) - 1).abs().sum(dim=-1).max().item())
        assert torch.equal(P[1, :, 5:, 5:], torch.eye(3).expand(2, 3, 3))
        assert not P[1, :, 5:, :5].any() and not P[1, :, :5, 5:].any()
    assert block_real[1].tolist() == [True] * 5 + [False] * 3
    assert all(later <= earlier + 1e-6 for earlier, later in zip(row_errors, row_errors[1:])), row_errors
    assert row_errors[0] > 0.1 and row_errors[-1] <= 1e-5, row_errors


def test_sinkhorn_on_a_padded_sequence_equals_the_sequence_alone():
    attn = build("sinkhorn", block_size=8, sinkhorn_iterations=3)
    q, k, v = qkv()
    mask = padded(real_in_second=22)
    together = attn(q, k, v, mask)[1, :, :22]
    alone = attn(q[1:, :, :22], k[1:, :, :22], v[1:, :, :22], torch.ones(1, 22, dtype=torch.bool))[0]
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


def test_sinkhorn_evaluation_has_no_noise_and_training_noise_is_reproducible_from_the_seed():
    q, k, v = qkv()
    mask = padded()
    attn = build("sinkhorn", block_size=8)
    first, second = attn(q, k, v, mask), attn(q, k, v, mask)
    assert torch.equal(first, second)
    quiet = build("sinkhorn", block_size=8, gumbel_noise=False).train()
    assert torch.equal(quiet(q, k, v, mask), first)
    attn.train()
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(attn(q, k, v, mask))
    assert torch.equal(runs[0], runs[1])
    assert not torch.allclose(runs[0], runs[2]) and not torch.allclose(runs[0], first)


def test_sinkhorn_training_noise_is_standard_gumbel():
    """The training scores minus the evaluation scores, over 40,000 real block pairs (temperature 1),
    against the Gumbel CDF exp(−exp(−x)): Kolmogorov–Smirnov D below its 1 % critical value 1.63 / √N."""
    attn = build("sinkhorn", block_size=4, max_seq_len=200)
    _, k, _ = qkv(n=200, batch=4, heads=2)
    mask = torch.ones(4, 200, dtype=torch.bool)
    clean, _ = attn.sorting_logits(k, mask)
    torch.manual_seed(3)
    noisy, _ = attn.train().sorting_logits(k, mask)
    noise = (noisy - clean).flatten().double().sort().values
    count = noise.numel()
    assert count == 4 * 2 * 50 * 50
    cdf = torch.exp(-torch.exp(-noise))
    steps = torch.arange(1, count + 1, dtype=torch.float64) / count
    distance = torch.maximum(steps - cdf, cdf - (steps - 1 / count)).max().item()
    assert distance < 1.63 / math.sqrt(count), distance


def test_sinkhorn_sort_net_is_learned_through_the_permutation():
    """The sorting network's weights reach the output (their gradient is non-zero) and changing them
    changes it: the soft permutation is not an inert constant."""
    attn = build("sinkhorn", block_size=8, sinkhorn_iterations=3)
    q, k, v = qkv()
    mask = padded()
    out = attn(q, k, v, mask)
    out[mask[:, None, :, None].expand_as(out)].square().sum().backward()
    assert torch.isfinite(attn.sort_net.grad).all() and attn.sort_net.grad.abs().max() > 1e-4
    with torch.no_grad():
        attn.sort_net.mul_(3.0)
    assert (attn(q, k, v, mask) - out).abs().max() > 1e-3


# -------------------------------------------------------------------------------- Synthesizer
def synthesizer_reference(attn, q, k, v, mask):
    """float64 closed form of §3: B from the module's own parameters, softmax over the real keys."""
    q, k, v = q.double(), k.double(), v.double()
    n, mode = q.shape[2], attn.options.mode
    logits = torch.zeros(q.shape[0], q.shape[1], n, n, dtype=torch.float64)
    if "factorized_random" in mode:
        left, right = attn.random_left.detach().double(), attn.random_right.detach().double()
        logits += torch.einsum("hik,hkj->hij", left[:, :n], right[:, :, :n])
    elif "random" in mode:
        logits += attn.random_logits.detach().double()[:, :n, :n]
    if "dense" in mode:
        hidden = torch.einsum("bhnd,hde->bhne", q, attn.dense_hidden.detach().double()).clamp_min(0)
        logits += torch.einsum("bhne,em->bhnm", hidden, attn.dense_out.detach().double()[:, :n])
    if attn.options.dot_product:
        logits += torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(~mask[:, None, None, :], -math.inf)
    return torch.einsum("bhij,bhjd->bhid", torch.softmax(logits, dim=-1), v)


@pytest.mark.parametrize("dot_product", [True, False])
@pytest.mark.parametrize("mode", ["random", "factorized_random", "dense", "dense+random", "dense+factorized_random"])
def test_synthesizer_equals_its_float64_closed_form(mode, dot_product):
    attn = build("synthesizer", mode=mode, dot_product=dot_product, factorized_rank=5)
    q, k, v = qkv()
    mask = padded()
    assert_relative_error(attn(q, k, v, mask), synthesizer_reference(attn, q, k, v, mask), mask)


def test_synthesizer_defaults_are_the_lra_code_run():
    """The LRA code's encoder runs synthesizer_mode='random' with the dot product (its ignore_dot_product
    defaults to False, and no config reaches those two), k = 32; the random logits start as its JAX
    xavier_uniform, whose fans count the head axis: U(±√(6 / (2 · heads · max_len)))."""
    options = attention_zoo.make_options("synthesizer")
    assert (options.mode, options.dot_product, options.factorized_rank, options.dropout) == ("random", True, 32, 0.0)
    logits = build("synthesizer").random_logits.detach()
    assert logits.shape == (2, MAX_LEN, MAX_LEN)
    bound = math.sqrt(6 / (2 * 2 * MAX_LEN))
    assert 0.99 * bound < logits.abs().max() <= bound


def test_sinkhorn_defaults_are_the_lra_code_settings():
    options = attention_zoo.make_options("sinkhorn")
    assert (options.block_size, options.sinkhorn_iterations, options.temperature) == (50, 1, 1.0)
    assert build("sinkhorn", max_seq_len=2000).sort_net.shape == (HEAD_DIM, 40)


# ------------------------------------------------------------------------------ both backends
@pytest.mark.parametrize("name", ["sinkhorn", "synthesizer"])
def test_empty_and_single_token_inputs(name):
    """No tokens: an empty output. One token: Synthesizer's softmax has one key (out = v); Sinkhorn's
    own block and its 1 × 1 sorted block are that token (out = 2 v)."""
    attn = build(name)
    q, k, v = (t.requires_grad_() for t in qkv(n=0))
    out = attn(q, k, v, torch.ones(2, 0, dtype=torch.bool))
    assert out.shape == (2, 2, 0, HEAD_DIM)
    out.sum().backward()
    q, k, v = qkv(n=1)
    expected = 2 * v if name == "sinkhorn" else v
    torch.testing.assert_close(attn(q, k, v, torch.ones(2, 1, dtype=torch.bool)), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["sinkhorn", "synthesizer"])
def test_a_sequence_with_no_real_token_gives_zeros(name):
    q, k, v = qkv()
    mask = padded()
    mask[1] = False
    out = build(name)(q, k, v, mask)
    assert torch.isfinite(out).all() and not out[1].any()


@pytest.mark.parametrize("name", ["sinkhorn", "synthesizer"])
def test_inputs_longer_than_max_seq_len_are_refused(name):
    q, k, v = qkv(n=MAX_LEN + 1)
    with pytest.raises(ValueError, match=f"max_seq_len={MAX_LEN}, got n={MAX_LEN + 1}"):
        build(name)(q, k, v, None)


@pytest.mark.parametrize("name", ["sinkhorn", "synthesizer"])
def test_dropout_acts_in_training_only(name):
    q, k, v = qkv()
    mask = padded()
    options = {"gumbel_noise": False} if name == "sinkhorn" else {}
    plain = build(name, **options)(q, k, v, mask)
    attn = build(name, dropout=0.5, **options)
    assert torch.equal(attn(q, k, v, mask), plain)
    attn.train()
    torch.manual_seed(1)
    dropped = attn(q, k, v, mask)
    torch.manual_seed(1)
    assert torch.equal(attn(q, k, v, mask), dropped) and (dropped - plain).abs().max() > 0.1


@pytest.mark.parametrize("name,option,value", [
    ("sinkhorn", "block_size", 0), ("sinkhorn", "sinkhorn_iterations", 0), ("sinkhorn", "temperature", 0.0),
    ("sinkhorn", "gumbel_noise", "yes"), ("sinkhorn", "dropout", 1.0), ("synthesizer", "mode", "dense_random"),
    ("synthesizer", "factorized_rank", 0), ("synthesizer", "dot_product", 1), ("synthesizer", "dropout", -0.1)])
def test_invalid_options_name_the_field(name, option, value):
    with pytest.raises(InvalidOption, match=f"^{option}="):
        attention_zoo.make_options(name, **{option: value})
