"""``local`` with ``grouping=strided`` equals the LRA code's ``LocalAttention`` (google-research/
long-range-arena, models/local/local_attention.py), ported here in float64 numpy step by step from its
reshapes: inputs padded by b − (n mod b), q/k/v reshaped [bs, b, G, h, d], the padding mask padded with
True and reshaped [bs·G, b], pairs biased by −1e10, softmax over the block axis, output sliced to n."""

import numpy as np
import pytest
import torch

import attention_zoo


def lra_local_attention(q, k, v, mask, block_size, causal=False):
    """q, k, v [bs, n, h, d] float64 (the projected inputs, padded positions zero as the LRA code's bias-free
    projections of zero-padded inputs give), mask [bs, n] bool; returns [bs, n, h, d]."""
    bs, n, heads, depth = q.shape
    extra = block_size - n % block_size
    pad = lambda x: np.pad(x, [(0, 0), (0, extra), (0, 0), (0, 0)])
    q, k, v = pad(q), pad(k), pad(v)
    padding_mask = np.pad(mask[..., None], [(0, 0), (0, extra), (0, 0)], constant_values=-1e9).astype(bool)
    length = n + extra
    blocks = length // block_size
    block_q, block_k, block_v = (x.reshape(bs, block_size, blocks, heads, depth) for x in (q, k, v))
    pm = padding_mask.reshape(bs * blocks, block_size, 1).astype(np.float64)
    pair = (pm[:, :, None, :] * np.transpose(pm[:, :, None, :], (0, 3, 2, 1)))  # [bs·G, b, 1, b]
    pair = pair.reshape(bs, blocks, block_size, block_size)
    if causal:
        pair = pair * np.tril(np.ones((block_size, block_size)))
    bias = np.where(pair > 0, 0.0, -1e10).astype(np.float32)
    # attention over axis 1 (the slot a), batch dims (bs, G, heads)
    qt = np.transpose(block_q, (0, 2, 3, 1, 4)) / np.sqrt(depth)  # [bs, G, h, b, d]
    kt = np.transpose(block_k, (0, 2, 3, 1, 4))
    vt = np.transpose(block_v, (0, 2, 3, 1, 4))
    scores = qt @ np.swapaxes(kt, -1, -2)
    # The LRA code adds the bias in float32: a masked pair's logit is then −1e10 exactly (its score lost).
    logits = np.where(bias[:, :, None] < 0, (scores.astype(np.float32) + bias[:, :, None]).astype(np.float64), scores)
    logits = logits - logits.max(-1, keepdims=True)
    weights = np.exp(logits)
    weights /= weights.sum(-1, keepdims=True)
    y = weights @ vt  # [bs, G, h, b, d]
    y = np.transpose(y, (0, 3, 1, 2, 4)).reshape(bs, length, heads, depth)
    return y[:, :n]


@pytest.mark.parametrize("n, block_size, causal, scale", [(103, 10, False, 1), (100, 10, False, 1), (37, 8, True, 1),
                                                        (5, 8, False, 1), (37, 8, False, 40)])
def test_strided_local_equals_the_lra_codes_local_attention(n, block_size, causal, scale):
    """Scale 40: scores in the thousands, where the LRA code's float32 s − 1e10 keeps multiples of 1,024 of s."""
    torch.manual_seed(0)
    heads, depth = 2, 4
    q, k, v = (torch.randn(2, heads, n, depth, dtype=torch.float64) for _ in range(3))
    q, k = q * scale, k * scale
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, n * 2 // 3:] = False  # padding at the end, as a shorter document
    mask[0, 1] = False  # a token id 0 inside (the nonzero_ids quirk)
    attention = attention_zoo.build("local", num_heads=heads, head_dim=depth, max_seq_len=n, block_size=block_size,
                                    grouping="strided", causal=causal)
    ours = attention(q, k, v, mask).transpose(1, 2).numpy()
    theirs = lra_local_attention(*(x.transpose(1, 2).numpy() for x in (q, k, v)), mask.numpy(), block_size, causal)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_strided_groups_are_residues_and_differ_from_contiguous_blocks():
    """At ListOps' 2,001 positions (CLS + 2,000) and b = 50: P = 2,050, G = 41 groups of positions ≡ t mod 41."""
    n, size = 2001, 50
    strided = attention_zoo.build("local", num_heads=1, head_dim=2, max_seq_len=n, block_size=size, grouping="strided")
    contiguous = attention_zoo.build("local", num_heads=1, head_dim=2, max_seq_len=n, block_size=size)
    q = torch.zeros(1, 1, n, 2)
    keys = strided.attended_keys(q, q, torch.ones(1, n, dtype=torch.bool))[0, 0]
    t = torch.arange(n)
    assert torch.equal(keys, (t[:, None] % 41) == (t[None, :] % 41))
    blocks = contiguous.attended_keys(q, q, torch.ones(1, n, dtype=torch.bool))[0, 0]
    jaccard = (keys & blocks).sum() / (keys | blocks).sum()
    assert jaccard < 0.02
