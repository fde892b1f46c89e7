"""Local attention, Sparse Transformer and BigBird against independent references: a float64 dense
masked softmax whose pattern is built here from each paper's definition (position by position, not
by blocks), lucidrains' ``local-attention`` for Local, and Hugging Face's BigBird block-sparse
attention with the same random plan. Odd lengths, lengths that are not a multiple of the block, and
padding throughout; fp32 against the reference within 1e-5 relative. Causality of the causal modes."""

import math

import numpy as np
import pytest
import torch

import attention_zoo
from attention_zoo.bigbird import draw_random_blocks

TOLERANCE = 1e-5  # max |ours − reference| over real query rows, relative to max |reference|


def qkv(batch=2, heads=3, n=37, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g) for _ in range(3)]


def padding(n, lengths):
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def build(name, n, heads=3, d=8, causal=False, **options):
    torch.manual_seed(0)
    return attention_zoo.build(name, num_heads=heads, head_dim=d, max_seq_len=max(n, 1), causal=causal,
                               **options).eval()


def dense_reference(q, k, v, mask, allowed):
    """float64 softmax(q kᵀ / √d) v over the keys ``allowed`` [n, n] or [H, n, n] and real."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    keep = allowed & mask[:, None, None, :]
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return weights @ v


def relative_error(out, reference, mask):
    rows = mask[:, None, :, None].expand_as(out)
    difference = (out.detach().double() - reference.detach())[rows]
    return float(difference.abs().max() / reference.detach()[rows].abs().max())


# ----------------------------------------------------------------------------- patterns, from the papers
def local_pattern(n, block, causal):
    """Tay et al. 2021's local attention: i sees j when both lie in the same block of ``block``."""
    return torch.tensor([[i // block == j // block and (j <= i or not causal) for j in range(n)] for i in range(n)])


def fixed_pattern(n, l, c, ordered, cls_token, causal):
    """Child et al. 2019 §4.2, merged (§4.3): A(1) = {j : ⌊j/l⌋ = ⌊i/l⌋} ∪ A(2) = {j : j mod l ∈ {t, …, l}},
    t = l − c (l mod l = 0), cut to j ≤ i when ordered; with the LRA code's CLS token first, dense."""
    summary = {(l - c + s) % l for s in range(c + 1)}
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            if cls_token and (i == 0 or j == 0):
                allowed[i, j] = j == 0 or not causal
                continue
            ti, tj = i - cls_token, j - cls_token
            allowed[i, j] = (ti // l == tj // l or tj % l in summary) and (tj <= ti or not (ordered or causal))
    return allowed


def bigbird_pattern(n, b, plan):
    """Zaheer et al. 2020 ITC: blocks of b; the first and last blocks global (both ways), a 3-block
    window, and for each middle query block i the key blocks plan[h, i − 1] (−1: none)."""
    blocks = math.ceil(n / b)
    allowed = torch.zeros(plan.shape[0], n, n, dtype=torch.bool)
    for h in range(plan.shape[0]):
        drawn = [set(row.tolist()) for row in plan[h]]  # drawn[i − 1]: the random key blocks of query block i
        for i in range(n):
            for j in range(n):
                bi, bj = i // b, j // b
                random = 0 < bi < blocks - 1 and bj in drawn[bi - 1]
                allowed[h, i, j] = bi in (0, blocks - 1) or bj in (0, blocks - 1) or abs(bi - bj) <= 1 or random
    return allowed


# ----------------------------------------------------------------------------- Local attention
@pytest.mark.parametrize("n,block", [(37, 5), (37, 50), (64, 8), (1, 50)])
@pytest.mark.parametrize("causal", [False, True])
def test_local_equals_the_dense_block_pattern(n, block, causal):
    q, k, v = qkv(n=n)
    mask = padding(n, [n, max(1, n - 11)])
    attn = build("local", n, causal=causal, block_size=block)
    allowed = local_pattern(n, block, causal)
    assert relative_error(attn(q, k, v, mask), dense_reference(q, k, v, mask, allowed), mask) <= TOLERANCE
    assert torch.equal(attn.attended_keys(q, k, mask)[:, 0], allowed & mask[:, None, :])


@pytest.mark.parametrize("causal", [False, True])
def test_local_equals_lucidrains_local_attention_without_lookaround(causal):
    """``local-attention`` (1.11.2) with no look-back or look-ahead windows is block-local attention."""
    from local_attention import LocalAttention

    n, block = 45, 8
    q, k, v = qkv(n=n)
    mask = padding(n, [n, 31])
    reference = LocalAttention(window_size=block, causal=causal, look_backward=0, look_forward=0, autopad=True,
                               use_rotary_pos_emb=False).eval()
    expected = reference(q.double(), k.double(), v.double(), input_mask=mask)
    out = build("local", n, causal=causal, block_size=block)(q, k, v, mask)
    assert relative_error(out, expected, mask) <= TOLERANCE


# ----------------------------------------------------------------------------- Sparse Transformer
@pytest.mark.parametrize("n", [1, 2, 37])
@pytest.mark.parametrize("unidirectional", [True, False])
@pytest.mark.parametrize("cls_token", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_transformer_equals_the_dense_fixed_pattern(n, unidirectional, cls_token, causal):
    l, c = 6, 2
    q, k, v = qkv(n=n)
    mask = padding(n, [n, max(1, n - 8)])
    attn = build("sparse_transformer", n, causal=causal, block_size=l, summary_size=c,
                 unidirectional=unidirectional, cls_token=cls_token)
    allowed = fixed_pattern(n, l, c, unidirectional, cls_token, causal)
    reference = dense_reference(q, k, v, mask, allowed)
    assert relative_error(attn(q, k, v, mask), reference, mask) <= TOLERANCE
    assert torch.equal(attn.attended_keys(q, k, mask)[:, 0], allowed & mask[:, None, :])


def test_sparse_transformer_at_the_lra_settings():
    """l = 50, c = 10 (the LRA code's ``get_model``), CLS token, keys at or before the query; n = 173."""
    n = 173
    q, k, v = qkv(n=n, heads=2)
    mask = padding(n, [n, 120])
    attn = build("sparse_transformer", n, heads=2)
    assert (attn.options.block_size, attn.options.summary_size) == (50, 10)
    reference = dense_reference(q, k, v, mask, fixed_pattern(n, 50, 10, True, True, False))
    assert relative_error(attn(q, k, v, mask), reference, mask) <= TOLERANCE


# ----------------------------------------------------------------------------- BigBird
@pytest.mark.parametrize("n,block,count,within", [(37, 4, 3, None), (37, 4, 2, 16), (9, 4, 3, None),
                                                  (13, 4, 5, None), (5, 4, 3, None), (1, 64, 3, None)])
def test_bigbird_equals_the_dense_itc_pattern_with_its_random_plan(n, block, count, within):
    q, k, v = qkv(n=n)
    mask = padding(n, [n, max(1, n - 9)])
    attn = build("bigbird", n, block_size=block, num_random_blocks=count, random_blocks_within=within, seed=3)
    blocks = math.ceil(n / block)
    plan = attn.random_plan(n) if blocks > 2 else torch.full((3, max(blocks - 2, 0), count), -1)
    allowed = bigbird_pattern(n, block, plan)
    reference = dense_reference(q, k, v, mask, allowed)
    assert relative_error(attn(q, k, v, mask), reference, mask) <= TOLERANCE
    assert torch.equal(attn.attended_keys(q, k, mask), allowed[None] & mask[:, None, None, :])


def hugging_face_block_sparse(q, k, v, mask, block, count, plan):
    """HF transformers' ``BigBirdBlockSparseAttention.bigbird_block_sparse_attention`` in float64 on
    q, k, v padded to whole blocks, its random plan replaced by ``plan`` [H, nb − 2, r]."""
    from transformers import BigBirdConfig
    from transformers.models.big_bird.modeling_big_bird import BigBirdBlockSparseAttention, BigBirdModel

    batch, heads, n, d = q.shape
    padded = math.ceil(n / block) * block
    assert padded not in (1024, 3072, 4096)  # HF's other plan function, for the lengths of its paper
    config = BigBirdConfig(hidden_size=heads * d, num_attention_heads=heads, block_size=block,
                           num_random_blocks=count, max_position_embeddings=padded, attention_type="block_sparse")
    reference = BigBirdBlockSparseAttention(config).double()
    reference._bigbird_block_rand_mask_with_head = lambda **_: [plan[h].numpy().astype(np.int32) for h in range(heads)]
    grow = lambda x: torch.nn.functional.pad(x.double(), (0, 0, 0, padded - n))  # noqa: E731
    blocked, band, from_mask, to_mask = BigBirdModel.create_masks_for_block_sparse_attn(
        torch.nn.functional.pad(mask, (0, padded - n)).double(), block)
    context, _ = reference.bigbird_block_sparse_attention(
        grow(q), grow(k), grow(v), band, from_mask, to_mask, blocked, blocked, heads, count, d, block, block, batch,
        padded, padded, seed=0, plan_from_length=None, plan_num_rand_blocks=None)
    return context.transpose(1, 2)[:, :, :n]


@pytest.mark.parametrize("n,block,count", [(37, 4, 3), (61, 5, 2)])
def test_bigbird_equals_hugging_face_block_sparse_attention_with_the_same_plan(n, block, count):
    """Outputs and the gradients of q, k, v (through Σ out · w) on real rows, float64 reference."""
    q, k, v = (x.requires_grad_() for x in qkv(n=n))
    mask = padding(n, [n, n - 14])
    attn = build("bigbird", n, block_size=block, num_random_blocks=count, random_blocks_within=None, seed=11)
    plan = attn.random_plan(n)
    assert (plan >= 0).all()  # HF takes exactly r blocks per row: these lengths leave enough candidates
    reference_inputs = [x.detach().double().requires_grad_() for x in (q, k, v)]
    expected = hugging_face_block_sparse(*reference_inputs, mask, block, count, plan)
    out = attn(q, k, v, mask)
    assert relative_error(out, expected, mask) <= TOLERANCE
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)) * mask[:, None, :, None]
    (out * weights).sum().backward()
    (expected * weights.double()).sum().backward()
    for ours, theirs in zip((q, k, v), reference_inputs):
        everywhere = torch.ones(mask.shape, dtype=torch.bool)
        assert relative_error(ours.grad, theirs.grad, everywhere) <= TOLERANCE


def test_bigbird_random_blocks_are_uniform_distinct_and_outside_window_and_globals():
    blocks, count, query = 12, 3, 5  # query block 5: candidates {1, 2, 3, 7, 8, 9, 10}
    plans = torch.stack([draw_random_blocks(seed, 1, blocks, count, blocks - 2)[0] for seed in range(3000)])
    for row, i in zip(plans.unbind(1), range(1, blocks - 1)):
        candidates = {j for j in range(1, blocks - 1) if abs(j - i) > 1}
        assert all(set(r.tolist()) <= candidates and len(set(r.tolist())) == min(count, len(candidates))
                   for r in row[:50])
    chosen = plans[:, query - 1]
    frequency = torch.stack([(chosen == j).any(-1).double().mean() for j in (1, 2, 3, 7, 8, 9, 10)])
    p = count / 7
    assert ((frequency - p).abs() < 4 * math.sqrt(p * (1 - p) / len(plans))).all(), frequency


def test_bigbird_random_blocks_stay_within_the_first_1024_tokens_by_default():
    attn = build("bigbird", 4096, heads=4)
    plan = attn.random_plan(4000)  # 63 blocks of 64: random blocks only among 1 … 15
    assert plan.shape == (4, 61, 3) and plan.min() >= 1 and plan.max() <= 15
    assert (plan[:, 20:] >= 0).all() and (plan[:, 0] >= 0).all()


def test_bigbird_plan_is_fixed_per_layer_saved_with_it_and_set_by_the_seed_option():
    torch.manual_seed(0)
    first, second = (attention_zoo.build("bigbird", num_heads=2, head_dim=8, max_seq_len=512) for _ in range(2))
    assert not torch.equal(first.random_plan(512), second.random_plan(512))  # each layer draws its own
    plan = first.random_plan(512)
    first.train()
    assert torch.equal(first.random_plan(512), plan)  # the same in training and evaluation, call after call
    second.load_state_dict(first.state_dict())
    assert torch.equal(second.random_plan(512), plan)
    seeded = [attention_zoo.build("bigbird", num_heads=2, head_dim=8, max_seq_len=512, seed=9) for _ in range(2)]
    assert torch.equal(seeded[0].random_plan(512), seeded[1].random_plan(512))
    assert torch.equal(seeded[0].random_plan(512), draw_random_blocks(9, 2, 8, 3, 6))


# ----------------------------------------------------------------------------- causality, dropout
@pytest.mark.parametrize("name,options", [("local", {"block_size": 8}),
                                          ("sparse_transformer", {"block_size": 6, "summary_size": 2}),
                                          ("sparse_transformer", {"block_size": 6, "summary_size": 2,
                                                                  "unidirectional": False})])
def test_causal_mode_never_sees_a_later_token(name, options):
    """Outputs at positions ≤ t bitwise unchanged when a later token changes; their gradients reach
    no later q, k or v (exactly 0)."""
    n, cut = 37, 19  # the cut falls inside a block
    attn = build(name, n, causal=True, **options)
    q, k, v = (x.requires_grad_() for x in qkv(n=n))
    mask = padding(n, [n, 30])
    later = [x.detach().clone() for x in (q, k, v)]
    for x in later:
        x[:, :, cut + 1:] = 100 * torch.randn(x[:, :, cut + 1:].shape, generator=torch.Generator().manual_seed(2))
    out = attn(q, k, v, mask)
    assert torch.equal(out[:, :, :cut + 1], attn(*later, mask)[:, :, :cut + 1])
    out[:, :, :cut + 1].square().sum().backward()
    for x in (q, k, v):
        assert torch.count_nonzero(x.grad[:, :, cut + 1:]) == 0 and torch.count_nonzero(x.grad[:, :, :cut + 1]) > 0


@pytest.mark.parametrize("name", ["local", "sparse_transformer", "bigbird"])
def test_dropout_acts_in_training_only(name):
    n = 300
    q, k, v = qkv(n=n)
    mask = padding(n, [n, 200])
    plain = build(name, n)(q, k, v, mask)
    dropped = build(name, n, dropout=0.5)
    assert torch.equal(dropped(q, k, v, mask), plain)
    torch.manual_seed(1)
    trained = dropped.train()(q, k, v, mask)
    assert torch.isfinite(trained).all() and not torch.allclose(trained, plain)


def test_labels_are_the_lra_table_rows():
    assert [attention_zoo.label(name) for name in ("local", "sparse_transformer", "bigbird")] == [
        "Local Attention", "Sparse Transformer", "BigBird"]
    assert set(attention_zoo.causal_names()) >= {"local", "sparse_transformer"}
    assert "bigbird" not in attention_zoo.causal_names()
