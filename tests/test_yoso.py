"""YOSO: the collision probability of sign hashes, and YOSO-E against independent computations."""

import math

import pytest
import torch

import attention_zoo
from attention_zoo.yoso_e import collision_probability


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
