"""Every registered backend, through the public API: shapes, dtypes, masking, determinism."""

import dataclasses

import pytest
import torch

import attention_zoo

BACKENDS = attention_zoo.names()


def random_qkv(batch=2, heads=2, n=37, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, d, generator=g).to(dtype) for _ in range(3)]


def padding_mask(batch=2, n=37):
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[1, n - 11 :] = False
    return mask


def build(name, **options):
    torch.manual_seed(0)
    return attention_zoo.build(name, num_heads=2, head_dim=32, max_seq_len=64, **options).eval()


def test_registry_has_the_baselines_and_lists_names_sorted():
    assert {"softmax", "none"} <= set(BACKENDS)
    assert BACKENDS == sorted(BACKENDS)  # registration order depends on which module imported first


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shapes_finite_outputs_and_gradients(name, dtype):
    attn = build(name)
    q, k, v = (t.requires_grad_() for t in random_qkv(dtype=dtype))
    out = attn(q, k, v, padding_mask())
    assert out.shape == v.shape and out.dtype == dtype
    assert torch.isfinite(out.float()).all()
    out.float().square().sum().backward()
    for t in (q, k, v):
        assert t.grad is None or torch.isfinite(t.grad.float()).all()


@pytest.mark.parametrize("name", BACKENDS)
def test_padded_keys_have_no_influence(name):
    attn = build(name)
    q, k, v = random_qkv()
    mask = padding_mask()
    reference = attn(q, k, v, mask)
    k2, v2 = k.clone(), v.clone()
    k2[1, :, ~mask[1]] = 1e3 * torch.randn_like(k2[1, :, ~mask[1]])
    v2[1, :, ~mask[1]] = -1e3
    changed = attn(q, k2, v2, mask)
    real = mask[:, None, :, None].expand_as(reference)
    torch.testing.assert_close(changed[real], reference[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", BACKENDS)
def test_deterministic_under_a_fixed_seed(name):
    q, k, v = random_qkv()
    first = build(name)(q, k, v, padding_mask())
    second = build(name)(q, k, v, padding_mask())
    assert torch.equal(first, second)


@pytest.mark.parametrize("name", BACKENDS)
def test_options_are_a_dataclass_and_typos_are_rejected(name):
    backend = attention_zoo.get(name)
    assert dataclasses.is_dataclass(backend.options)
    with pytest.raises(TypeError, match="valid options"):
        attention_zoo.build(name, num_heads=2, head_dim=32, max_seq_len=64, not_an_option=1)
    assert attention_zoo.label(name)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_spec_is_the_one_object_a_model_builds_its_layers_from(name):
    """attention_zoo.spec validates the options once; its label is the registry's and each layer it
    builds is the registered class with those very options."""
    spec = attention_zoo.spec(name)
    assert spec.label == attention_zoo.label(name) and spec.options == attention_zoo.make_options(name)
    layer = spec.build(num_heads=2, head_dim=32, max_seq_len=64)
    assert isinstance(layer, attention_zoo.get(name).cls) and layer.options is spec.options
    with pytest.raises(TypeError, match="valid options"):
        attention_zoo.spec(name, not_an_option=1)


def test_softmax_equals_a_float64_reference_with_padding():
    q, k, v = random_qkv()
    mask = padding_mask()
    out = build("softmax")(q, k, v, mask)
    scores = (q.double() @ k.double().transpose(-1, -2)) / 32**0.5
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_softmax_query_with_no_real_key_gives_zeros_not_nan():
    q, k, v = random_qkv()
    mask = torch.zeros(2, 37, dtype=torch.bool)
    mask[0] = True
    out = build("softmax")(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros_like(out[1]))


def test_none_returns_the_values_and_labels_follow_the_papers():
    q, k, v = random_qkv()
    assert torch.equal(build("none")(q, k, v, padding_mask()), v)
    assert attention_zoo.label("softmax") == "Softmax" and attention_zoo.label("none") == "None"


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(KeyError, match="registered: .*softmax"):
        attention_zoo.build("sofmax", num_heads=2, head_dim=32, max_seq_len=64)
