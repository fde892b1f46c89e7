"""YOSO: the collision probability of sign hashes, and YOSO-E against independent computations."""

import math

import pytest
import torch

import attention_zoo
from attention_zoo.yoso_e import collision_probability
from helpers import needs_kernels


def test_sign_hash_collision_probability_matches_the_closed_form():
    """P[τ-bit sign codes of x and y agree] = (1 − θ/π)^τ, by Monte Carlo with 200,000 draws."""
    g = torch.Generator().manual_seed(0)
    d, tau, draws = 16, 3, 200_000
    x = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0)
    for angle in (0.3, 1.0, 2.0):
        # y at a known angle from x: rotate within the plane of x and a random orthogonal direction.
        r = torch.randn(d, generator=g, dtype=torch.float64)
        u = torch.nn.functional.normalize(r - (r @ x) * x, dim=0)
        y = math.cos(angle) * x + math.sin(angle) * u
        planes = torch.randn(draws, tau, d, generator=g, dtype=torch.float64)
        agree = ((planes @ x > 0) == (planes @ y > 0)).all(dim=-1).double().mean().item()
        expected = collision_probability(x[None], y[None], tau).item()
        assert expected == pytest.approx((1 - angle / math.pi) ** tau, rel=1e-6)
        assert abs(agree - expected) < 4 * math.sqrt(expected * (1 - expected) / draws)


def test_yoso_e_matches_a_float64_computation_with_padding():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 37, 24, generator=g) for _ in range(3))
    mask = torch.ones(2, 37, dtype=torch.bool)
    mask[1, 30:] = False
    attn = attention_zoo.build("yoso_e", num_heads=2, head_dim=24, max_seq_len=64)
    assert attn.tau == 6 and attention_zoo.label("yoso_e") == "YOSO-E"
    qd, kd = (torch.nn.functional.normalize(t.double(), dim=-1) for t in (q, k))
    weights = (1 - torch.arccos((qd @ kd.transpose(-1, -2)).clamp(-1, 1)) / math.pi) ** 6
    expected = (weights * mask[:, None, None, :]) @ v.double()
    expected = expected / expected.norm(dim=-1, keepdim=True)
    out = attn(q, k, v, mask)
    rows = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out.double()[rows], expected[rows], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(2, 2, 37))  # N-YOSO: unit rows


def test_yoso_e_gradients_stay_finite_when_a_query_equals_a_key():
    q = torch.randn(1, 1, 8, 16, requires_grad=True)
    k = q.detach().clone().requires_grad_()  # q·k = 1 exactly on the diagonal
    v = torch.randn(1, 1, 8, 16)
    attention_zoo.build("yoso_e", num_heads=1, head_dim=16, max_seq_len=8, backward="exact")(q, k, v, None).sum().backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()


def test_yoso_e_passes_gradcheck_in_float64():
    from attention_zoo.yoso_e import expectation_attention

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 9, 6, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 9, dtype=torch.float64)
    mask[0, 7:] = 0
    assert torch.autograd.gradcheck(lambda q, k, v: expectation_attention(q, k, v, mask, 4), (q, k, v))


def test_yoso_e_lower_bound_backward_equals_the_dense_formula():
    """∇_Q = [(∇_Y Vᵀ) ⊙ (τ/2) E] K, ∇_K = [..]ᵀ Q, ∇_V = Eᵀ ∇_Y (paper eq. 4), all in float64."""
    from attention_zoo.yoso_e import LowerBoundExpectation

    g = torch.Generator().manual_seed(3)
    q, k = (torch.nn.functional.normalize(torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v, grad = (torch.randn(2, 2, 11, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(2, 11, dtype=torch.float64)
    mask[1, 8:] = 0
    tau = 5
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    LowerBoundExpectation.apply(*leaves, mask, tau).backward(grad)
    e = (1 - torch.arccos(q @ k.transpose(-1, -2)) / math.pi) ** tau * mask[:, None, None, :]
    surrogate = (grad @ v.transpose(-1, -2)) * e * tau / 2
    for leaf, expected in zip(leaves, (surrogate @ k, surrogate.transpose(-1, -2) @ q, e.transpose(-1, -2) @ grad)):
        torch.testing.assert_close(leaf.grad, expected, rtol=1e-10, atol=1e-12)


def test_exact_clamp_stops_where_float32_still_resolves_the_derivative():
    """*YOSO evaluates τ/((π − arccos x)·√(1 − x²)) at x clamped to ±exact_clamp: allowed up to
    1 − 1e-6, where a pair of identical unit vectors still gets a finite derivative equal to the
    float64 value at the clamp; nearer 1 the option is refused."""
    import attention_zoo.options
    from attention_zoo import _yoso_ops as ops
    from attention_zoo.yoso import MAX_EXACT_CLAMP, YosoOptions

    with pytest.raises(attention_zoo.options.InvalidOption, match="exact_clamp"):
        YosoOptions(exact_clamp=1 - 1e-7)
    YosoOptions(exact_clamp=MAX_EXACT_CLAMP)
    x = torch.ones(1, 1, 4) / 2  # unit: q·k = 1 exactly
    codes = torch.zeros(1, 1, 1, dtype=torch.int32)
    ones = torch.ones(1, 1, 1)
    gradient = ops.pair_gradient_torch(codes, codes, x, x, ones, ones, ones[0], 8, MAX_EXACT_CLAMP)
    clamp = torch.tensor(MAX_EXACT_CLAMP, dtype=torch.float32).double()
    expected = 8 / ((math.pi - torch.arccos(clamp)) * torch.sqrt(1 - clamp * clamp)) * 0.5
    assert torch.isfinite(gradient).all()
    torch.testing.assert_close(gradient.double(), expected.expand(1, 1, 4), rtol=2e-2, atol=0)


def authors_yoso_v2_gradients(codes_q, codes_k, q, k, v, mask, grad, tau):
    """(∇Q, ∇K, ∇V) of the YOSO authors' released *YOSO backward, in float64 loops, written from
    mlpen/YOSO encoders/backbones/efficient_attentions/yoso/yoso_v2: kernel.py YOSO.backward (∇V by
    lsh_cumulation_query with queries and keys swapped; ∇Q, ∇K by weighted_lsh_cumulation_sorted_key /
    _sorted_query with weights (∇Y, V) and (Q, K)) and weighted_lsh_cumulation/cuda_kernel.cu: per real
    query, the set of real keys that share its code in any hash (n ≤ 1,024: one slot per key), each
    weighted by (∇Y_i·v_j)·τ·pow(s)·INV_PI·inv_sqrt(1 − w²), w = 0.99·q_i·k_j, s = 1 − acos_table(w),
    from 32-entry tables read by linear interpolation."""
    import numpy as np

    codes_q, codes_k, q, k, v, mask, grad = (t.detach().double().numpy() if t.is_floating_point() else t.numpy()
                                             for t in (codes_q, codes_k, q, k, v, mask, grad))
    grid, inv_pi = np.arange(32) / 31, 0.31830989
    acos_table = np.arccos(2 * grid - 1) * inv_pi
    inv_sqrt_table = np.minimum(10, 1 / np.sqrt(grid + 1e-6))
    pow_table = np.minimum(10, (grid + 1e-6) ** (tau - 1))

    def lookup(table, position):
        return np.interp(position, np.arange(32), table)

    batch, m, n = codes_q.shape
    grad_q, grad_k, grad_v = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(batch):
        for i in np.flatnonzero(mask[b]):
            collided = {j for h in range(m) for j in np.flatnonzero(mask[b]) if codes_k[b, h, j] == codes_q[b, h, i]}
            for j in collided:
                w = 0.99 * q[b, i] @ k[b, j]
                s = 1 - lookup(acos_table, (1 + w) * 31 / 2)
                weight = (grad[b, i] @ v[b, j]) * tau * lookup(pow_table, s * 31) * inv_pi * lookup(inv_sqrt_table, (1 - w * w) * 31)
                grad_q[b, i] += weight * k[b, j]
                grad_k[b, j] += weight * q[b, i]
        for j in np.flatnonzero(mask[b]):
            same = (codes_q[b] == codes_k[b, :, j, None]) & (mask[b] > 0)  # [m, n]: real queries in j's bucket
            grad_v[b, j] = (same.sum(0) @ grad[b]) / m
    return [torch.from_numpy(x) for x in (grad_q, grad_k, grad_v)]


@pytest.mark.parametrize("engine", ["torch", pytest.param("kernel", marks=needs_kernels)])
def test_exact_collided_backward_is_the_authors_yoso_v2_kernel(engine):
    """backward=exact_collided (the *YOSO rows) equals the authors' kernel written out in float64, for the
    same codes: float32 through the op on both engines, float64 through authors_pair_gradients. τ = 2 and
    m = 4 make pairs that collide in several hashes (counted once) next to pairs that never collide (left
    out); pairs at q̂·k̂ = ±1 reach the tables' ends. ∇Y is zero at padded queries, as in the model."""
    from attention_zoo import _yoso_ops as ops
    from attention_zoo.yoso import Setup, yoso_cumulation

    g = torch.Generator().manual_seed(4)
    batch, n, d, m, tau = 2, 24, 16, 4, 2
    q, k = (torch.nn.functional.normalize(torch.randn(batch, n, d, generator=g), dim=-1) for _ in range(2))
    k[0, 3], k[0, 5] = q[0, 3], -q[0, 4]
    v, grad = torch.randn(batch, n, d, generator=g), torch.randn(batch, n, d, generator=g)
    codes_q, codes_k = (torch.randint(0, 2**tau, (batch, m, n), generator=g, dtype=torch.int32) for _ in range(2))
    codes_k[0, :, 3] = codes_q[0, :, 3]
    codes_k[0, :, 5] = codes_q[0, :, 4]
    mask = torch.ones(batch, n)
    mask[1, 17:] = 0
    grad[1, 17:] = 0
    hits = (codes_q[:, :, :, None] == codes_k[:, :, None, :]).sum(1)
    assert (hits >= 2).any() and (hits == 0).any()
    expected = authors_yoso_v2_gradients(codes_q, codes_k, q, k, v, mask, grad, tau)

    q64, k64 = q.double(), k.double()
    exact64 = ops.authors_pair_gradients(codes_q, codes_k, q64, k64, v.double(), mask.double(), grad.double(), tau)
    for mine, reference in zip(exact64, expected):
        torch.testing.assert_close(mine, reference, rtol=1e-12, atol=1e-12)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    setup = Setup(tau, "exact_collided", engine, 0.99, 2**20)
    yoso_cumulation(*leaves, mask, codes_q, codes_k, torch.empty(0), setup).backward(grad)
    for name, leaf, reference in zip("qkv", leaves, expected):  # float32: the 1/√ table's first segment is steep
        torch.testing.assert_close(leaf.grad.double(), reference, rtol=1e-4, atol=1e-5,
                                   msg=lambda text: f"grad_{name}: {text}")


def test_exact_collided_labels_the_star_rows():
    assert attention_zoo.label("yoso", backward="exact_collided", num_hashes=16) == "*YOSO-16"
    assert attention_zoo.label("yoso_c", backward="exact_collided", num_hashes=16) == "*YOSO-C-16"


@needs_kernels
def test_exact_collided_trains_the_same_on_the_kernels_and_the_pytorch_path():
    """The compiled forward and ∇V with the dense ∇Q, ∇K (impl=cpu) equal the PyTorch path's, same draws."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(3))
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[1, 30:] = False
    gradients = []
    for impl in ("torch", "cpu"):
        attention = attention_zoo.build("yoso", num_heads=2, head_dim=16, max_seq_len=64, num_hashes=8,
                                        backward="exact_collided", impl=impl).train()
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(6)
        attention(*leaves, mask).pow(2).sum().backward()
        gradients.append([leaf.grad for leaf in leaves])
        assert all(torch.isfinite(x).all() and x.abs().sum() > 0 for x in gradients[-1])
    for mine, torch_path in zip(gradients[-1], gradients[0]):
        torch.testing.assert_close(mine, torch_path, rtol=1e-4, atol=1e-5)
