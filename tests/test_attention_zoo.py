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


def test_only_yoso_names_an_engine_and_it_is_the_one_its_impl_takes():
    """attention_zoo.engines: what a run records as attention_engine and resumes only under (the machine
    chooses it for impl=auto); None for a backend with one implementation, or whose choice the options,
    device type and torch build make."""
    from attention_zoo import _yoso_ops as ops

    cpu = torch.device("cpu")
    kernels = ops.resolve_engine("auto", cpu)  # 'kernel' where they build (the set-up builds them), else 'torch'
    engines = {name: attention_zoo.engines(torch.nn.Sequential(build(name)), cpu) for name in BACKENDS}
    assert {name: engine for name, engine in engines.items() if engine} == {
        name: kernels for name in ("yoso", "yoso_c") if name in BACKENDS}
    assert attention_zoo.engines(torch.nn.Sequential(build("yoso", impl="torch"), build("softmax")), cpu) == "torch"
    if kernels == "kernel":
        both = torch.nn.Sequential(build("yoso", impl="torch"), build("yoso", impl="cpu"))
        assert attention_zoo.engines(both, cpu) == "kernel,torch"


def test_unknown_backend_lists_the_registered_ones():
    with pytest.raises(KeyError, match="registered: .*softmax"):
        attention_zoo.build("sofmax", num_heads=2, head_dim=32, max_seq_len=64)


# ----------------------------------------------------------------------------- empty and one-token inputs
# One real key: each backend's output in closed form, out = c · v (c from its definition, below), but the
# YOSO family, whose rows are normalized: out = v / ‖v‖ (yoso_c plus its convolution's centre tap · v).
UNIT_WEIGHT = {"softmax", "none", "local", "sparse_transformer", "bigbird", "longformer", "lsh", "learned_hash",
               "reformer", "synthesizer", "performer"}  # weights normalized over the keys a query sees: the one key's is 1
UNIT_ROWS = {"yoso", "yoso_e", "yoso_c"}
ONE_TOKEN_MASKS = {"no mask": None, "all real": [True, True], "second sequence padded": [True, False]}


def centre_tap(conv):
    """The weight a depthwise sequence convolution gives a token's own value: [heads, 1, 1]."""
    return conv.weight[:, 0, conv.padding[0], :1].double()[:, None]


def one_token_factor(name, attn, q, k):
    """c [batch or 1, heads, 1, 1] in out = c · v for one real token, in float64 (not for UNIT_ROWS)."""
    q, k = q.double(), k.double()
    if name in UNIT_WEIGHT:
        return torch.ones(1, 1, 1, 1, dtype=torch.float64)
    if name == "sinkhorn":  # its own block and its 1 × 1 sorted block, two softmaxes added
        return torch.full((1, 1, 1, 1), 2.0, dtype=torch.float64)
    if name == "nystrom":  # landmark = the token, F = A = B = 1, pinv(1) = 1; plus the V convolution
        return 1 + centre_tap(attn.conv)[None]
    if name == "linformer":  # E's column 0 projects the one key (and V, shared) to proj_dim rows
        e, f = attn.key_projection[:, 0].double(), attn.value_projection[:, 0].double()
        score = (q * k).sum(-1, keepdim=True) / q.shape[-1] ** 0.5
        return (torch.softmax(score * e, dim=-1) * f).sum(-1, keepdim=True)
    if name == "linear_transformer":  # φ(q)·φ(k) / (φ(q)·φ(k) + ε), φ = elu + 1
        phi = lambda x: torch.where(x > 0, x + 1, x.exp())  # noqa: E731
        s = (phi(q) * phi(k)).sum(-1, keepdim=True)
        return s / (s + attn.options.epsilon)
    if name == "rfa":  # φ(x̂)·φ(ŷ) = mean_i cos(w_i·(x̂ − ŷ)) (sin a sin b + cos a cos b), floored at floor / D
        unit = lambda x: x / (x.norm(dim=-1, keepdim=True) + 1e-3)  # noqa: E731
        w = attn.sigma.detach().double()[:, None, :] * attn.random_directions("cpu").double() / attn.options.temperature
        kernel = torch.cos(torch.einsum("bhnd,hfd->bhnf", unit(q) - unit(k), w)).mean(-1, keepdim=True)
        return kernel / kernel.clamp_min(attn.options.normalizer_floor / attn.options.num_features)
    raise AssertionError(f"{name}: no closed form for one token; add the new backend's here")


def one_token_output(name, attn, q, k, v):
    if name in UNIT_ROWS:
        out = v.double() / v.double().norm(dim=-1, keepdim=True)
        return out + centre_tap(attn.conv)[None] * v.double() if name == "yoso_c" else out
    return one_token_factor(name, attn, q, k) * v.double()


def test_every_backend_has_a_one_token_closed_form():
    assert UNIT_WEIGHT | UNIT_ROWS | {"sinkhorn", "nystrom", "linformer", "linear_transformer", "rfa"} == set(BACKENDS)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("masked", [False, True], ids=["no mask", "empty mask"])
def test_an_empty_sequence_gives_an_empty_output_and_gradients(name, mode, masked):
    attn = build(name).train(mode == "train")
    q, k, v = (t.requires_grad_() for t in random_qkv(n=0))
    out = attn(q, k, v, torch.ones(2, 0, dtype=torch.bool) if masked else None)
    assert out.shape == (2, 2, 0, 32) and out.dtype == torch.float32
    out.sum().backward()
    assert all(t.grad is None or t.grad.shape == t.shape for t in (q, k, v))
    assert attn.aux_loss is None or float(attn.aux_loss) == 0.0  # a mean over no real token


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("mask", ONE_TOKEN_MASKS, ids=list(ONE_TOKEN_MASKS))
def test_one_token_equals_its_closed_form_forward_and_backward(name, mask):
    """Real sequences equal their closed form; a padded one's row is finite. Gradients of Σ out · w:
    c · w for v where out = c · v; 0 for q and k where c = 1 (nothing to weigh against)."""
    attn = build(name)
    q, k, v = random_qkv(n=1)
    if name in ("yoso", "yoso_c"):
        k = q.clone()  # a key equal to the query shares its code in every hash: a collision for sure
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    padding = None if ONE_TOKEN_MASKS[mask] is None else torch.tensor(ONE_TOKEN_MASKS[mask])[:, None]
    out = attn(q, k, v, padding)
    real = torch.ones(2, dtype=torch.bool) if padding is None else padding[:, 0]
    assert out.shape == v.shape and torch.isfinite(out).all()
    expected = one_token_output(name, attn, q.detach(), k.detach(), v.detach())
    torch.testing.assert_close(out[real].double(), expected.expand_as(out)[real], rtol=1e-5, atol=1e-6)

    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * w).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v) if t.grad is not None)
    if name in UNIT_ROWS:
        return
    c = one_token_factor(name, attn, q.detach(), k.detach()).expand_as(out)
    torch.testing.assert_close(v.grad[real].double(), (c * w)[real], rtol=1e-5, atol=1e-6)
    if name in UNIT_WEIGHT | {"sinkhorn", "nystrom"}:
        for t in (q, k):
            assert t.grad is None or t.grad[real].abs().max() <= 1e-5


def test_yoso_one_token_rows_are_the_unit_value_or_zero_when_no_hash_collides():
    """With a key unlike the query, each row is v / ‖v‖ (some hash collides) or 0 (none does)."""
    q, k, v = random_qkv(n=1)
    out = build("yoso")(q, k, v, None).double()
    unit = v.double() / v.double().norm(dim=-1, keepdim=True)
    hit = (out - unit).abs().amax(-1) <= 1e-6
    assert (hit | (out.abs().amax(-1) == 0)).all() and hit.any() and not hit.all()


@pytest.mark.parametrize("name", BACKENDS)
def test_a_fully_padded_sequence_is_finite_and_leaves_the_others_alone(name):
    attn = build(name)
    q, k, v = (t.requires_grad_() for t in random_qkv())
    mask = padding_mask()
    mask[1] = False
    out = attn(q, k, v, mask)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[0], attn(q, k, v, padding_mask())[0], rtol=1e-5, atol=1e-6)
    out.square().sum().backward()
    assert all(t.grad is None or torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("attention_fp32", [True, False])
def test_under_autocast_the_backend_runs_in_fp32_unless_told_otherwise(name, attention_fp32):
    """model.attention_fp32 (the default, as the reference): inside bf16 autocast the model's attention
    block hands every backend float32 q, k, v with autocast off, and gets float32 back; off, the
    backend sees autocast's bf16 projections (those of ``_common.at_least_float32`` still compute in float32,
    autocast off: learned_hash and yoso_e failed under autocast before). Forward and backward stay
    finite either way."""
    from lra.model import MultiHeadAttention

    torch.manual_seed(0)
    block = MultiHeadAttention(64, 2, 32, 64, attention_zoo.spec(name), attention_fp32=attention_fp32).eval()
    seen = []
    block.backend.register_forward_hook(lambda module, inputs, output: seen.append(
        ([t.dtype for t in inputs[:3]], output.dtype, torch.is_autocast_enabled("cpu"))))
    x = torch.randn(2, 37, 64, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block(x, padding_mask())
    expected = torch.float32 if attention_fp32 else torch.bfloat16
    assert seen == [([expected] * 3, expected, not attention_fp32)]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    out.float().square().sum().backward()
    assert torch.isfinite(x.grad).all()


UNREAD_VARIANTS = [(name, {}) for name in BACKENDS] + [
    ("synthesizer", {"dot_product": False}), ("synthesizer", {"dot_product": False, "mode": "dense"}),
    ("synthesizer", {"dot_product": False, "mode": "dense+factorized_random"})]


@pytest.mark.parametrize("name, options", UNREAD_VARIANTS)
def test_a_backend_declares_exactly_the_inputs_it_never_reads(name, options):
    """Training under torchrun asks DDP to look for parameters without a gradient only where a backend says it
    leaves q or k unread (their projections): a declaration too short fails the second DDP step, one too long
    costs every step a walk over the graph."""
    attn = build(name, **options).train()
    q, k, v = (t.requires_grad_() for t in random_qkv())
    out = attn(q, k, v, padding_mask())
    loss = out.square().sum() + (attn.aux_loss if attn.aux_loss is not None else 0)
    loss.backward()
    unread = {label for label, t in (("q", q), ("k", k)) if t.grad is None or not t.grad.any()}
    assert unread == set(type(attn).unread_inputs(attn.options)), (unread, options)
