"""The encoders the paper presets build, as the code they cite: the LRA code's Flax initialisers and
bias-free attention projections (``model=lra``, every LRA Table 1 and learning-to-hash cell), the
Sparse Transformer's CLS position following the pooling, and YOSO's evaluation hashes drawn afresh at
every call in the YOSO Table 3 rows, as the authors' code draws them."""

import math

import pytest
import torch
from omegaconf import OmegaConf

import attention_zoo
from helpers import compose_config
from lra.errors import ConfigError
from lra.model import Classifier, linear_layers
from lra.validation import attention_spec, validate

LRA_SMALL = ("model=lra", "task=listops", "task.max_length=64", "model.dim=256", "model.ff_dim=512",
             "model.classifier_dim=512", "model.num_heads=4", "model.head_dim=64")


def build(*overrides):
    cfg = compose_config(*overrides)
    validate(cfg)
    torch.manual_seed(0)
    return cfg, Classifier(cfg.model, cfg.task, attention_spec(cfg), cfg.task.max_length)


def test_lra_encoder_starts_tokens_at_unit_variance_and_positions_at_0_02():
    cfg, model = build(*LRA_SMALL, "model.position_embedding=learned")
    tokens, positions = model.encoder.token_embedding.weight, model.encoder.position_embedding.weight
    assert tokens.std().item() == pytest.approx(1.0, rel=0.05)  # 32 × 256 draws: std within ±5 %
    assert positions.std().item() == pytest.approx(0.02, rel=0.05)
    _, default = build("task=listops", "task.max_length=64", "model.dim=256")
    assert default.encoder.token_embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_lra_encoder_blocks_are_xavier_uniform_with_tiny_biases_and_heads_lecun_normal():
    _, model = build(*LRA_SMALL)
    block = model.encoder.blocks[0]
    attention = block.attention
    for layer in (attention.query, attention.key, attention.value, attention.output):
        assert layer.bias is None  # the LRA code's SelfAttention(bias=False)
    for layer in (attention.query, attention.output, *linear_layers(block.mlp)):
        fan_out, fan_in = layer.weight.shape
        bound = math.sqrt(6 / (fan_in + fan_out))
        assert layer.weight.abs().max().item() <= bound
        assert layer.weight.var().item() == pytest.approx(bound**2 / 3, rel=0.06)  # U(−a, a): a² / 3
    for layer in linear_layers(block.mlp):
        assert 0 < layer.bias.abs().max().item() < 1e-5  # N(0, 1e-6)
    for layer in linear_layers(model.head):
        fan_in = layer.weight.shape[1]
        std = math.sqrt(1 / fan_in) / 0.87962566103423978
        assert layer.weight.abs().max().item() <= 2 * std  # truncated at ±2σ
        assert layer.weight.var().item() == pytest.approx(1 / fan_in, rel=0.1)
        assert torch.count_nonzero(layer.bias) == 0
    for norm in (block.norm1, block.norm2, model.encoder.norm):
        assert norm.eps == 1e-6


def test_the_default_encoder_keeps_torch_defaults_and_biases():
    _, model = build("task=listops", "task.max_length=64")
    attention = model.encoder.blocks[0].attention
    assert all(layer.bias is not None for layer in (attention.query, attention.key, attention.value, attention.output))
    layer = model.encoder.blocks[0].mlp[0]
    assert layer.weight.abs().max().item() <= 1 / math.sqrt(layer.weight.shape[1])  # kaiming_uniform(a=√5)
    assert model.encoder.norm.eps == 1e-5


@pytest.mark.parametrize("table, setup, row", [("lra_table1", "listops", "transformer"),
                                               ("lha_table3", "text", "reformer")])
def test_table_cells_build_the_lra_encoder(table, setup, row):
    cfg = compose_config(f"experiment={table}", f"setup={table}/{setup}", f"row=lra_table1/{row}")
    model = OmegaConf.to_container(cfg.model, enum_to_str=True)
    assert (model["token_embedding_init_std"], model["initialization"], model["attention_bias"],
            model["layer_norm_eps"]) == (1.0, "lra", False, 1e-6)


@pytest.mark.parametrize("pooling, expected", [("cls", True), ("mean", False), ("mean_unmasked", False)])
def test_sparse_transformer_cls_position_follows_the_pooling(pooling, expected):
    cfg = compose_config("attention=sparse_transformer", f"model.pooling={pooling}")
    validate(cfg)
    assert attention_spec(cfg).options.cls_token is expected


def test_a_cls_position_against_the_pooling_is_refused_in_one_line():
    cfg = compose_config("attention=sparse_transformer", "model.pooling=mean", "attention.cls_token=true")
    with pytest.raises(ConfigError, match=r"attention.cls_token: true; it must be false with model.pooling=mean"):
        validate(cfg)


def test_lra_sparse_transformer_on_pathfinder_has_no_cls_position():
    cfg = compose_config("experiment=lra_table1", "setup=lra_table1/pathfinder", "row=lra_table1/sparse_transformer")
    validate(cfg)
    assert attention_spec(cfg).options.cls_token is False


def evaluate_twice(eval_hashes: str):
    attention = attention_zoo.build("yoso", num_heads=2, head_dim=8, max_seq_len=64, num_hashes=4, impl="torch",
                                    eval_hashes=eval_hashes).eval()
    q, k, v = (torch.randn(1, 2, 64, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
    torch.manual_seed(5)
    first = attention(q, k, v, None)
    second = attention(q, k, v, None)
    torch.manual_seed(5)
    again = attention(q, k, v, None)
    return first, second, again


def test_fixed_evaluation_hashes_repeat_and_consume_no_global_draws():
    first, second, _ = evaluate_twice("fixed")
    assert torch.equal(first, second)
    state = torch.get_rng_state()
    evaluate_twice("fixed")
    torch.manual_seed(5)
    assert torch.equal(torch.get_rng_state(), state)


def test_fresh_evaluation_hashes_differ_per_call_and_come_from_the_seeded_global_generator():
    first, second, again = evaluate_twice("fresh")
    assert not torch.equal(first, second)
    assert torch.equal(first, again)


@pytest.mark.parametrize("row", ["yoso_32", "yoso_c_16", "star_yoso_16", "star_yoso_c_16"])
def test_yoso_table3_rows_draw_fresh_evaluation_hashes_as_the_authors(row):
    cfg = compose_config("experiment=yoso_table3", f"row=yoso_table3/{row}", "task=listops")
    assert attention_spec(cfg).options.eval_hashes == "fresh"
