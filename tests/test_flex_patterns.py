"""The fixed sparse patterns through FlexAttention (``attention_zoo._flex``) against their eager paths.

On a CPU FlexAttention runs its unfused forward only, so outputs are compared here under no_grad; the
CUDA tests compare outputs and q/k/v gradients (compiled with inductor). A query that attends no real
key is 0 on the Flex path and an average of its candidate keys on the eager one (padded queries, which
callers ignore); every other row must agree to 1e-5 relative."""

import warnings

import pytest
import torch

import attention_zoo
from attention_zoo import _flex
from attention_zoo.options import InvalidOption
from attention_zoo.registry import build

HEADS, DIM = 2, 16
PATTERNS = {
    "local": dict(block_size=50),
    "local_strided": dict(block_size=50, grouping="strided"),
    "longformer": dict(window_size=64, num_global_tokens=2),
    "bigbird": dict(block_size=32, seed=3, random_blocks_within=None),
    "bigbird_lra": dict(block_size=64, seed=5),
    "sparse_transformer": dict(block_size=50, summary_size=10),
    "sparse_transformer_both_ways": dict(block_size=50, summary_size=10, unidirectional=False),
    "sparse_transformer_no_cls": dict(block_size=50, summary_size=10, cls_token=False),
}
CAUSAL = {"local", "local_strided", "longformer", "sparse_transformer", "sparse_transformer_both_ways"}


def backend_name(pattern):
    return next(name for name in ("local", "longformer", "bigbird", "sparse_transformer") if pattern.startswith(name))


def pair(pattern, causal, n, device="cpu"):
    """(eager, flex) modules of one pattern, with the same state (BigBird's plan seed)."""
    options = PATTERNS[pattern]
    eager = build(backend_name(pattern), num_heads=HEADS, head_dim=DIM, max_seq_len=n, impl="eager", **options)
    flex = build(backend_name(pattern), num_heads=HEADS, head_dim=DIM, max_seq_len=n, impl="flex", **options)
    flex.load_state_dict(eager.state_dict())
    eager.causal = flex.causal = causal
    return eager.to(device), flex.to(device)


def inputs(n, device="cpu", seed=0):
    """q, k, v [3, H, n, d] and a mask: element 0 unpadded, 1 padded after 2n/3, 2 all padding."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(3, HEADS, n, DIM, generator=generator).to(device) for _ in range(3))
    mask = torch.ones(3, n, dtype=torch.bool)
    mask[1, 2 * n // 3:] = False
    mask[2] = False
    return q, k, v, mask.to(device)


def rows_with_a_real_key(eager, q, k, mask):
    """[B, H, n, 1] bool: the queries that attend at least one real key (strided local: every row, its
    masked pairs are a finite bias in both paths)."""
    if getattr(eager.options, "grouping", None) == "strided":
        return torch.ones(*q.shape[:3], 1, dtype=torch.bool, device=q.device)
    return eager.attended_keys(q, k, mask).any(dim=-1, keepdim=True)


def relative(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


CASES = [(pattern, causal) for pattern in PATTERNS for causal in ((False, True) if pattern in CAUSAL else (False,))]


@pytest.mark.parametrize("n", [1, 77, 333])
@pytest.mark.parametrize("pattern,causal", CASES)
def test_flex_forward_equals_eager_on_odd_lengths_partial_blocks_and_padding(pattern, causal, n):
    eager, flex = pair(pattern, causal, n)
    q, k, v, mask = inputs(n)
    with torch.no_grad():
        expected, got = eager(q, k, v, mask), flex(q, k, v, mask)
    keep = rows_with_a_real_key(eager, q, k, mask)
    assert relative(got * keep, expected * keep) <= 1e-5
    if getattr(eager.options, "grouping", None) != "strided":
        assert torch.equal(got[2], torch.zeros_like(got[2]))  # the all-padding element: no real key anywhere


@pytest.mark.parametrize("pattern", ["local", "longformer", "bigbird", "sparse_transformer"])
def test_flex_float64_equals_eager_to_float64_rounding(pattern):
    eager, flex = pair(pattern, False, 200)
    q, k, v, mask = (x.double() if x.is_floating_point() else x for x in inputs(200))
    with torch.no_grad():
        expected, got = eager(q, k, v, mask), flex(q, k, v, mask)
    assert got.dtype == torch.float64
    keep = rows_with_a_real_key(eager, q, k, mask)
    assert relative(got * keep, expected * keep) <= 1e-12


def calls_of(monkeypatch, module, name) -> list:
    """The arguments of every call of ``module.name`` from now on (the function still runs)."""
    calls, function = [], getattr(module, name)

    def counted(*args):
        calls.append(args)
        return function(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_flex_block_tables_are_kept_per_shape_and_reused_on_the_second_call(monkeypatch):
    evaluated = calls_of(monkeypatch, _flex, "_evaluate")
    _flex.clear_cache()
    _, flex = pair("longformer", False, 300)
    q, k, v, mask = inputs(300)
    with torch.no_grad():
        flex(q, k, v, mask)
        assert len(evaluated) == 1
        flex(q, k, v, mask)
        assert len(evaluated) == 1
        flex(*inputs(301))  # another length: its own tables
        assert len(evaluated) == 2
        _, other_plan = pair("bigbird", False, 300)
        other_plan.plan_seed_value += 1  # another layer's seeded plan: its own tables
        _, same_plan = pair("bigbird", False, 300)
        same_plan(q, k, v, mask)
        other_plan(q, k, v, mask)
        assert len(evaluated) == 4


def test_flex_bigbird_builds_its_block_plan_once_per_shape(monkeypatch):
    """A repeated Flex call at a length seen before reads the kept plan rather than building it again (its
    host work off the hot path); another length or plan seed builds its own."""
    from attention_zoo import bigbird

    built = calls_of(monkeypatch, bigbird, "block_plan")
    _, flex = pair("bigbird", False, 300)
    _flex.clear_cache()
    q, k, v, mask = inputs(300)
    with torch.no_grad():
        first = flex(q, k, v, mask)
        assert len(built) == 1
        assert torch.equal(flex(q, k, v, mask), first) and len(built) == 1
        flex(*inputs(301))
        assert len(built) == 2
        flex.plan_seed_value += 1
        flex(q, k, v, mask)
        assert len(built) == 3


@_flex.pattern_family("test_every_pair")
def every_pair(params, heads, query_length, key_length, device):
    return lambda head, query, key: key >= 0


def test_flex_skips_key_blocks_without_a_real_key_and_keeps_full_blocks_unmasked():
    n = 4 * _flex.BLOCK
    tables = _flex.block_tables(_flex.Pattern("test_every_pair", (), 1, n, n), torch.device("cpu"))
    assert tables.full.all() and tables.needed.all()
    key_real = torch.ones(2, n, dtype=torch.bool)
    key_real[0, _flex.BLOCK + 5:] = False  # block 1 partly real, blocks 2 and 3 no real key
    mask = _flex.block_mask(tables, key_real)
    assert mask.kv_num_blocks[0, 0].tolist() == [1] * 4 and mask.full_kv_num_blocks[0, 0].tolist() == [1] * 4
    assert mask.kv_indices[0, 0, :, 0].tolist() == [1] * 4 and mask.full_kv_indices[0, 0, :, 0].tolist() == [0] * 4
    assert mask.kv_num_blocks[1, 0].tolist() == [0] * 4 and mask.full_kv_num_blocks[1, 0].tolist() == [4] * 4


def test_flex_block_tables_kept_are_bounded_least_recently_used_first(monkeypatch):
    from attention_zoo import _common

    evaluated = calls_of(monkeypatch, _flex, "_evaluate")
    monkeypatch.setattr(_common, "KEPT_LIMIT", 2)
    _flex.clear_cache()
    for n in (10, 20, 10, 30, 10, 20):  # 30 forgets 20, the least recently used; 10 stays
        _flex.block_tables(_flex.Pattern("test_every_pair", (), 1, n, n), torch.device("cpu"))
    assert [args[3] for args in evaluated] == [10, 20, 30, 20]  # the key lengths


def test_flex_pattern_block_tables_are_as_sparse_as_the_pattern():
    """Longformer's window of ±64 needs the 3 key blocks around each query block (plus the global
    column), not all 32 at n = 4,096."""
    _, flex = pair("longformer", False, 4096)
    tables = _flex.block_tables(flex.flex_pattern(4096), torch.device("cpu"))
    per_row = tables.needed[0].sum(dim=-1)
    assert per_row[0].item() == 32 and per_row[1:-1].max().item() <= 4 and per_row[5].item() == 4


@pytest.mark.parametrize("pattern,causal", CASES)
def test_flex_pattern_attends_as_many_pairs_as_the_dense_definition(pattern, causal):
    """Counted on the Flex path's own axes (Sparse Transformer's n + S keys, strided Local's permuted
    groups): no pair twice, none missing."""
    n = 437
    eager, flex = pair(pattern, causal, n)
    q, k, _, _ = inputs(n)
    dense = int(eager.attended_keys(q[:1], k[:1], torch.ones(1, n, dtype=torch.bool)).sum())
    pairs = _flex.allowed_pairs(flex.flex_pattern(n), torch.device("cpu"))
    heads = flex.flex_pattern(n).heads
    if pattern == "local_strided":  # the groups of the padded sequence, causality in the bias: padding included
        padded = flex.flex_pattern(n).query_length
        assert pairs == padded * eager.options.block_size
    else:
        assert pairs * (HEADS // heads) == dense


def test_flex_refuses_what_it_cannot_compute_in_one_line_naming_the_fix():
    eager, flex = pair("local", False, 100)
    q, k, v, mask = inputs(100)
    q.requires_grad_(True)
    with pytest.raises(_flex.FlexUnavailable, match="no backward on cpu.*attention.impl=auto or eager"):
        flex(q, k, v, mask)
    dropping = build("local", num_heads=HEADS, head_dim=DIM, max_seq_len=100, impl="flex", dropout=0.1)
    with torch.no_grad(), pytest.raises(_flex.FlexUnavailable, match="attention.dropout=0 or attention.impl=eager"):
        dropping.train()(q, k, v, mask)
    with pytest.raises(InvalidOption, match="impl='fast'.*one of auto, eager, flex"):
        build("bigbird", num_heads=HEADS, head_dim=DIM, max_seq_len=100, impl="fast")


def test_flex_auto_on_a_cpu_is_the_eager_path_silently_and_trains():
    auto = build("longformer", num_heads=HEADS, head_dim=DIM, max_seq_len=100, impl="auto", **PATTERNS["longformer"])
    eager, _ = pair("longformer", False, 100)
    q, k, v, mask = inputs(100)
    q.requires_grad_(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = auto(q, k, v, mask)
    assert torch.equal(out, eager(q, k, v, mask))
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("pattern,causal", [("local", False), ("local_strided", True), ("longformer", True),
                                            ("bigbird", False), ("sparse_transformer", True)])
def test_flex_paths_trace_whole_under_torch_compile(pattern, causal):
    """fullgraph=True: the cached block tables are an operator, nothing in the path breaks the graph (so a
    compiled model keeps Flex inside its graph on CUDA); aot_eager, as the CPU has no Inductor Flex kernel."""
    torch._dynamo.reset()
    eager, flex = pair(pattern, causal, 333)
    q, k, v, mask = inputs(333)
    with torch.no_grad():
        got = torch.compile(flex, fullgraph=True, backend="aot_eager")(q, k, v, mask)
        expected = eager(q, k, v, mask)
    keep = rows_with_a_real_key(eager, q, k, mask)
    assert relative(got * keep, expected * keep) <= 1e-5


def test_every_backend_with_a_flex_path_chooses_it_by_impl():
    flexible = [name for name in attention_zoo.names() if attention_zoo.get(name).cls.has_flex_path]
    assert flexible == ["bigbird", "local", "longformer", "sparse_transformer"]
    for name in flexible:
        assert attention_zoo.make_options(name).impl == "auto"


def cuda(test):
    """A CUDA test (``pytest -m cuda``), skipped without a device."""
    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (FlexAttention's compiled kernels)")
    return pytest.mark.cuda(needs_cuda(test))


def forward_backward_of(module, q, k, v, mask, upstream, autocast=None):
    """[output, ∇q, ∇k, ∇v] of ``module`` on fresh leaves, the backward from ``upstream``."""
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    with torch.autocast("cuda", dtype=autocast or torch.float32, enabled=autocast is not None):
        out = module(*leaves, mask)
    out.backward(upstream)
    return [out] + [x.grad for x in leaves]


def assert_flex_equals_eager_on_cuda(pattern, causal, n, autocast=None):
    """Outputs (rows with a real key) and q, k, v gradients within 1e-5 relative; the output float32."""
    eager, flex = pair(pattern, causal, n, "cuda")
    q, k, v, mask = inputs(n, "cuda")
    keep = rows_with_a_real_key(eager, q, k, mask)
    upstream = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).cuda() * keep
    expected, got = (forward_backward_of(module, q, k, v, mask, upstream, autocast) for module in (eager, flex))
    assert got[0].dtype == expected[0].dtype == torch.float32
    for a, b in zip([got[0] * keep, *got[1:]], [expected[0] * keep, *expected[1:]]):
        assert relative(a, b) <= 1e-5


@cuda
@pytest.mark.parametrize("n", [333, 2048])
@pytest.mark.parametrize("pattern,causal", CASES)
def test_flex_cuda_outputs_and_gradients_equal_eager(pattern, causal, n):
    assert_flex_equals_eager_on_cuda(pattern, causal, n)


@cuda
@pytest.mark.parametrize("pattern", ["local", "longformer", "bigbird", "sparse_transformer"])
def test_flex_cuda_trains_under_bf16_autocast_in_float32(pattern):
    assert_flex_equals_eager_on_cuda(pattern, False, 512, torch.bfloat16)


@cuda
@pytest.mark.parametrize("pattern", ["local", "longformer", "bigbird", "sparse_transformer"])
def test_flex_cuda_forward_and_backward_repeat_bitwise(pattern):
    """The evidence for letting deterministic runs take Flex (they take the eager path until it holds)."""
    _, flex = pair(pattern, False, 2048, "cuda")
    q, k, v, mask = inputs(2048, "cuda")
    first, second = (forward_backward_of(flex, q, k, v, mask, torch.ones_like(q)) for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second))


@cuda
def test_flex_auto_takes_flex_on_cuda():
    _, flex = pair("bigbird", False, 512, "cuda")
    flex.options.impl = "auto"
    q = torch.zeros(1, HEADS, 512, DIM, device="cuda")
    assert _flex.use_flex(flex, q)


def test_a_flex_run_that_cannot_train_is_refused_at_config_time_in_one_line():
    from helpers import compose_config
    from lra.errors import ConfigError
    from lra.validation import validate

    with pytest.raises(ConfigError, match="attention.impl: 'flex'; FlexAttention has no backward on cpu"):
        validate(compose_config("task=listops", "attention=local", "attention.impl=flex", "trainer.device=cpu"))
    with pytest.raises(ConfigError, match="dropout=0.1; set attention.dropout=0 or attention.impl=eager"):
        validate(compose_config("task=listops", "attention=bigbird", "attention.impl=flex", "attention.dropout=0.1"))
    validate(compose_config("task=listops", "attention=bigbird", "attention.impl=eager", "trainer.device=cpu"))
    validate(compose_config("task=listops", "attention=yoso", "attention.impl=torch"))  # YOSO's own impl option


def lra_table1_logits(setup, row, impl, pooling=None):
    """Eval-mode logits of an LRA Table 1 model on two mostly black images (black pixels are padding under
    its padding_mask=nonzero_ids), one in [1, 2]: impl as given."""
    from helpers import compose_config
    from lra.model import Classifier
    from lra.validation import attention_spec

    overrides = ["experiment=lra_table1", f"setup=lra_table1/{setup}", f"row=lra_table1/{row}", f"attention.impl={impl}",
                 "model.num_layers=1", "task.max_length=256"]
    cfg = compose_config(*overrides, *([f"model.pooling={pooling}"] if pooling else []))
    if row == "bigbird":
        cfg.attention.seed = 1
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), cfg.task.max_length).eval()
    ids = torch.zeros(2, cfg.task.max_length, dtype=torch.long)
    ids[0, 100:140] = 255
    ids[1, ::7] = 200
    with torch.no_grad():
        return model([ids], [torch.ones_like(ids, dtype=torch.bool)])


def test_flex_is_refused_where_the_model_reads_rows_without_a_real_key_and_equal_where_it_does_not():
    """LRA Table 1's Image setup pools every position (mean_unmasked) of images whose black pixels are padding:
    the rows Flex computes differently are read, so Flex is refused there, naming the pooling; pooled by CLS
    the same model gives the same logits on both paths; strided Local, exact on every row, keeps Flex."""
    with pytest.raises(_flex.FlexUnavailable, match="model.pooling=mean_unmasked"):
        lra_table1_logits("image", "longformer", "flex")
    eager, flex = (lra_table1_logits("image", "longformer", impl, pooling="cls") for impl in ("eager", "flex"))
    assert relative(flex, eager) <= 1e-5
    eager, flex = (lra_table1_logits("image", "local", impl) for impl in ("eager", "flex"))
    assert relative(flex, eager) <= 1e-5
