"""A researcher's own backend through the public API (``attention_zoo.register``, ``build``, ``spec``)
and through the harness (a preset of its own, the model, the trainer's auxiliary loss): what is
refused, with which line, and what is never computed silently wrong."""

import dataclasses
import typing

import pytest
import torch
from hydra.core.config_store import ConfigStore

import attention_zoo
from attention_zoo import Attention, BackendError, register
from attention_zoo import registry
from attention_zoo._common import at_least_float32
from attention_zoo.options import InvalidOption, number
from helpers import compose_config
from lra.config import register_configs
from lra.model import Classifier
from lra.validation import attention_spec, validate

HEADS, DIM, N = 2, 8, 5


@pytest.fixture(autouse=True)
def registry_restored():
    """Each test's backends leave the registry (and Hydra's store) as they found them: the other test
    modules parametrize over ``attention_zoo.names()``."""
    before = dict(registry._REGISTRY)
    yield
    added = set(registry._REGISTRY) - set(before)
    registry._REGISTRY.clear()
    registry._REGISTRY.update(before)
    for name in added:
        ConfigStore.instance().repo.pop(f"schema_attention_{name}.yaml", None)
        ConfigStore.instance().repo.get("attention", {}).pop(f"{name}.yaml", None)  # a preset-less backend's defaults


@dataclasses.dataclass
class ScaleOptions:
    scale: float = 1.0

    def __post_init__(self):
        number(self, "scale", 0.0)


def scaled_values(name, forward=None, options=ScaleOptions):
    """Register (under ``name``) a backend returning v · scale, or what ``forward`` returns."""

    class UserAttention(Attention):
        def forward(self, q, k, v, mask=None):
            return forward(self, q, k, v, mask) if forward else v * self.options.scale

    return register(name, options)(UserAttention)


def qkv(n=N, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, HEADS, n, DIM, generator=g).requires_grad_(requires_grad) for _ in range(3)]


def build(name, **options):
    return attention_zoo.build(name, num_heads=HEADS, head_dim=DIM, max_seq_len=16, **options)


# ----------------------------------------------------------------------------- register()
@pytest.mark.parametrize("name", ["my attn", "conf/attention", "", "1st", "dotted.name", 3, "nan", "Inf", "TRUE",
                                  "false", "null"])
def test_a_name_no_config_can_hold_is_refused_and_the_registry_still_lists(name):
    """attention=nan was read as a float by the command line, so a backend so named could never be chosen."""
    with pytest.raises(ValueError, match="letters, digits and underscores|reads attention=.* as the value"):
        scaled_values(name)
    assert attention_zoo.names() == sorted(attention_zoo.names())  # an int name made this raise for every caller
    with pytest.raises(KeyError, match="registered: .*softmax"):
        attention_zoo.get("sofmax")


@dataclasses.dataclass
class NoDefault:
    window: int


@dataclasses.dataclass
class CallableOption:
    feature_map: typing.Callable = torch.relu


@dataclasses.dataclass
class LiteralOption:
    mode: typing.Literal["a", "b"] = "a"


def options_with(annotation, default):
    return dataclasses.make_dataclass("Options", [("knob", annotation, dataclasses.field(default_factory=lambda: default))])


@pytest.mark.parametrize("options, words", [
    (ScaleOptions(), "an instance of ScaleOptions: pass the class itself"),
    (NoDefault, "option 'window' of backend 'picky' has no default: give it one"),
    (CallableOption, "option 'feature_map' of backend 'picky' has type .*Callable.*which a config file cannot hold"),
    (LiteralOption, "option 'mode' .*Literal.*attention_zoo.options.choice"),
    # Each was registered, then every command (lra-train attention=softmax too) was a Hydra traceback:
    (options_with(int, None), r"option 'knob' of backend 'picky' defaults to None, which is not a whole number: give "
                              r"it a default of its type or declare it Optional\[int\]"),
    (options_with(int, 1.5), "defaults to 1.5, which is not a whole number"),
    (options_with(bool, 1), "defaults to 1, which is not true or false"),
    (options_with(typing.Tuple[int, str], (1, "a")), r"option 'knob' .*Tuple\[int, str\], which a config file cannot "
                                                     r"hold \(Value 'a' of type 'str' could not be converted"),
    (options_with(typing.List[typing.Tuple[int, int]], [(1, 2)]), "which a config file cannot hold"),
    (dataclasses.make_dataclass("Named", [("name", str, "mine")]), "option 'name' .* a name the config keeps for itself"),
    (dataclasses.make_dataclass("Defaults", [("defaults", int, 1)]), "option 'defaults' .* keeps for itself"),
    (options_with(typing.Optional[typing.Dict[str, float]], None), "option 'knob' of backend 'picky' is a dict that "
                                                                 "defaults to None, which the command line cannot give "
                                                                 "keys to"),  # attention.knob={b:2} was a "bug" line
])
def test_options_no_preset_could_make_are_refused_at_registration(options, words):
    """Each was accepted, then failed later: build('picky') with a raw __init__ TypeError, and lra-train
    for every backend (Hydra cannot store a Callable or Literal schema)."""
    with pytest.raises(TypeError, match=words):
        scaled_values("picky", options=options)
    assert "picky" not in attention_zoo.names()


@dataclasses.dataclass
class CountingOptions:
    scale: float = 1.0
    calls: int = dataclasses.field(default=0, init=False)  # the options' own state, no setting
    seen: int = dataclasses.field(init=False)

    def __post_init__(self):
        self.seen = 0


def test_options_own_fields_outside_init_are_no_settings_of_the_config():
    """A field with init=False is state the options keep: it was a config key, which the options refused as
    an unknown keyword (or, without a default, a Hydra traceback) in every lra-train."""
    from omegaconf import OmegaConf

    from lra.config import register_configs
    from lra.config_fields import attention_schema

    scaled_values("counting", options=CountingOptions)
    register_configs()
    assert list(OmegaConf.structured(attention_schema(attention_zoo.get("counting")))) == ["name", "scale"]
    assert build("counting", scale=2.0).options.calls == 0


def test_what_is_not_a_backend_class_is_refused_at_registration():
    with pytest.raises(TypeError, match="decorates a subclass of attention_zoo.Attention"):
        register("fn", ScaleOptions)(lambda q, k, v, mask: v)
    with pytest.raises(TypeError, match="decorates a subclass of attention_zoo.Attention"):
        register("module", ScaleOptions)(torch.nn.Identity)
    with pytest.raises(TypeError, match=r"has no forward\(self, q, k, v, mask=None\)"):
        register("empty", ScaleOptions)(type("Empty", (Attention,), {}))

    class NoMask(Attention):
        def forward(self, q, k, v):
            return v

    with pytest.raises(TypeError, match=r"cannot be called as forward\(q, k, v, mask\)"):
        register("no_mask", ScaleOptions)(NoMask)
    assert not {"fn", "module", "empty", "no_mask"} & set(attention_zoo.names())


def test_a_taken_name_is_refused_and_a_redefinition_replaces_the_old_class():
    with pytest.raises(ValueError, match="'softmax' is taken by attention_zoo.softmax.SoftmaxAttention; register"):
        scaled_values("softmax")
    assert attention_zoo.get("softmax").cls.__name__ == "SoftmaxAttention"
    first = scaled_values("mine")
    second = scaled_values("mine", forward=lambda self, q, k, v, mask: 3 * v)  # the same class, defined again
    assert first is not second and attention_zoo.get("mine").cls is second
    q, k, v = qkv()
    assert torch.equal(build("mine")(q, k, v), 3 * v)
    with pytest.raises(ValueError, match="is registered as 'mine' already; one class has one name"):
        register("mine_too", ScaleOptions)(second)


# ----------------------------------------------------------------------------- build() and spec()
@pytest.mark.parametrize("sizes, field", [
    (dict(num_heads=0, head_dim=DIM, max_seq_len=16), "num_heads"),
    (dict(num_heads=HEADS, head_dim=0, max_seq_len=16), "head_dim"),
    (dict(num_heads=HEADS, head_dim=DIM, max_seq_len=-4), "max_seq_len"),
    (dict(num_heads=2.0, head_dim=DIM, max_seq_len=16), "num_heads"),
    (dict(num_heads="2", head_dim=DIM, max_seq_len=16), "num_heads"),
])
def test_sizes_that_are_not_whole_positive_numbers_are_refused(sizes, field):
    """softmax built 0 heads and a negative length without a word; Nyströmformer said 'groups must be a
    positive integer'."""
    for name in ("softmax", "nystrom"):
        with pytest.raises(InvalidOption, match=f"{field}=.* is invalid: it must be a whole number ≥ 1"):
            attention_zoo.build(name, **sizes)


def test_causal_must_be_a_bool():
    """causal='false' was truthy: a causal module where a bidirectional one was asked for."""
    with pytest.raises(InvalidOption, match="causal='false' is invalid: it must be true or false"):
        build("softmax", causal="false")


@dataclasses.dataclass
class TypedOptions:
    window: int = 4
    gated: bool = False
    floor: typing.Optional[float] = None
    pair: typing.Tuple[int, int] = (1, 2)

    def __post_init__(self):
        if self.window < 1:  # a user's own rule, which a string would crash
            raise InvalidOption("window", self.window, "≥ 1")


@pytest.mark.parametrize("options, words", [
    (dict(window="4"), "window='4' is invalid: it must be a whole number"),
    (dict(window=4.0), "window=4.0 is invalid: it must be a whole number"),
    (dict(gated="false"), "gated='false' is invalid: it must be true or false"),
    (dict(gated=0), "gated=0 is invalid: it must be true or false"),
    (dict(floor="1e-3"), "floor='1e-3' is invalid: it must be a number \\(or null\\)"),
    (dict(pair=(1, "2")), "pair=\\(1, '2'\\) is invalid"),
])
def test_an_option_of_the_wrong_type_is_refused_by_its_annotation(options, words):
    """Each was kept as given ("false" a truthy string) or crashed the options' own rule with a TypeError."""
    scaled_values("typed", options=TypedOptions)
    with pytest.raises(InvalidOption, match=words):
        attention_zoo.spec("typed", **options)
    made = attention_zoo.spec("typed", window=2, gated=True, floor=1, pair=[3, 4]).options  # int for float, list for tuple
    assert (made.window, made.gated, made.floor, made.pair) == (2, True, 1, [3, 4])


def test_a_string_for_a_bool_option_of_a_built_in_backend_is_refused():
    """share_kv='false' was kept as the string: a truthy value, so K and V shared their projection."""
    with pytest.raises(InvalidOption, match="share_kv='false' is invalid: it must be true or false"):
        attention_zoo.spec("linformer", share_kv="false")


# ----------------------------------------------------------------------------- the forward contract
@pytest.mark.parametrize("change, error, words", [
    (lambda q, k, v, mask: (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask), ValueError,
     r"q has shape \(2, 5, 2, 8\); .*\[batch, heads=2, n, head_dim=8\].*q.transpose\(1, 2\) if yours is"),
    (lambda q, k, v, mask: (q, k, v, torch.where(mask, 0.0, float("-inf"))), ValueError,
     "the mask is torch.float32; it must be bool .*an additive mask of 0 and -inf: mask == 0"),
    (lambda q, k, v, mask: (q, k, v, mask.long()), ValueError, "the mask is torch.int64; .*a 0/1 mask: mask.bool()"),
    (lambda q, k, v, mask: (q, k, v, mask[:, None, None, :]), ValueError, r"the mask has shape \(2, 1, 1, 5\)"),
    (lambda q, k, v, mask: (q, k[:, :, :3], v[:, :, :3], mask), ValueError, r"k has shape \(2, 2, 3, 8\)"),
    (lambda q, k, v, mask: (q, k, v.long(), mask), ValueError, "v is torch.int64 on cpu; .*floating-point"),
    (lambda q, k, v, mask: (q, k, v.numpy(), mask), TypeError, "v is a ndarray; pass tensors"),
])
@pytest.mark.parametrize("name", ["softmax", "performer", "yoso_e"])
def test_inputs_a_backend_would_read_silently_wrong_are_refused(name, change, error, words):
    """Before, each backend computed something for most of these: attention across the heads axis for a
    [batch, n, heads, d] layout, and every real key masked and every padded one kept for an additive mask."""
    q, k, v = qkv()
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 3:] = False
    attention = build(name).eval()
    with pytest.raises(error, match=words):
        attention(*change(q, k, v, mask))


def shape(self, q, k, v, mask):
    return v[..., :3]


def pair(self, q, k, v, mask):
    return v, None


def half_precision(self, q, k, v, mask):
    return v.half()


def detached(self, q, k, v, mask):
    return v.detach() * 2


def in_place(self, q, k, v, mask):
    return q.mul_(0.5) + v


def vector_aux(self, q, k, v, mask):
    self.aux_loss = (q * k).sum(dim=(1, 2, 3))
    return v


def float_aux(self, q, k, v, mask):
    self.aux_loss = float((q * k).detach().sum())
    return v


@pytest.mark.parametrize("forward, words", [
    (shape, r"returned shape \(2, 2, 5, 3\) on cpu; it must return v's shape \(2, 2, 5, 8\)"),
    (pair, "returned a tuple; it must return one tensor of v's shape .*self.aux_loss"),
    (at_least_float32(pair), "returned a tuple"),  # was AttributeError: 'tuple' object has no attribute 'to'
    (half_precision, "returned torch.float16 for torch.float32 inputs; return the inputs' dtype"),
    (detached, "returned a tensor outside the autograd graph of q, k, v"),
    (in_place, "changed q in place"),
    (vector_aux, r"set aux_loss to a torch.float32 tensor of shape \(2,\); it must be None or a 0-dim"),
    (float_aux, "set aux_loss to a float; it must be None or a 0-dim floating tensor"),
])
def test_a_backend_breaking_the_contract_is_named_with_its_class(forward, words):
    """Each came back to the caller as it was: a model failing later in a reshape or a matrix product, or
    training on (a detached output, a summed vector loss, changed inputs)."""
    scaled_values("broken", forward)
    q, k, v = (t.clone() for t in qkv(requires_grad=True))  # non-leaf: in place is allowed by autograd
    mask = torch.ones(2, N, dtype=torch.bool)
    with pytest.raises(BackendError, match=f"test_user_backends.scaled_values.<locals>.UserAttention.forward {words}"):
        build("broken")(q, k, v, mask)

    scaled_values("kept")  # one that keeps it passes, its output and gradients as computed
    q, k, v = qkv(requires_grad=True)
    out = build("kept", scale=2.0)(q, k, v, mask)
    out.sum().backward()
    assert torch.equal(out, 2 * v) and torch.equal(v.grad, torch.full_like(v, 2.0))
    scaled_values("autocast", lambda self, q, k, v, mask: (q @ k.transpose(-1, -2)) @ v)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast any floating dtype may come back
        assert build("autocast")(*qkv()).dtype == torch.bfloat16


@pytest.mark.parametrize("name", ["softmax", "learned_hash"])
def test_a_backend_runs_on_inference_mode_tensors(name):
    """Their version counter, which the in-place check read, does not exist: every call under
    torch.inference_mode raised, as did a call on its tensors afterwards (learned_hash: its local heads,
    a backend of their own, too)."""
    q, k, v = qkv()
    mask = torch.ones(2, N, dtype=torch.bool)
    mask[1, 3:] = False
    attention = build(name, **({"local_heads": 1, "local_pattern": "sliding", "local_window": 2,
                                "num_buckets": 2} if name == "learned_hash" else {})).eval()
    with torch.no_grad():
        expected = attention(q, k, v, mask)
    with torch.inference_mode():
        tensors = [t.clone() for t in (q, k, v, mask)]
        assert torch.equal(attention(*tensors), expected)
    assert all(t.is_inference() for t in tensors) and torch.equal(attention(*tensors), expected)


# ----------------------------------------------------------------------------- through the harness
PRESET = "defaults:\n  - /schema_attention_{name}@_here_\nscale: 2.0\n"


def harness_model(tmp_path, name, *overrides):
    """``attention=<name>`` from a preset in a folder of the user's (hydra.searchpath), validated as
    lra-train validates, and the classifier it builds."""
    register_configs()
    (tmp_path / "attention").mkdir(exist_ok=True)
    (tmp_path / "attention" / f"{name}.yaml").write_text(PRESET.format(name=name))
    cfg = compose_config(f"hydra.searchpath=[file://{tmp_path}]", f"attention={name}", "task.max_length=16",
                         "model.num_layers=1", *overrides)
    validate(cfg)
    torch.manual_seed(0)
    return Classifier(cfg.model, cfg.task, attention_spec(cfg), 16), attention_spec(cfg)


def batch():
    ids = torch.randint(1, 10, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.bool)
    mask[1, 9:] = False
    return [ids], [mask]


def test_through_its_own_preset_a_backend_trains_and_one_outside_the_autograd_graph_is_refused(tmp_path):
    """A user's backend and preset as lra-train takes them: its options from the preset and the command
    line, its aux_loss in the loss (the only path from the loss to the Q projection here). A detached
    aux_loss was added to the loss and trained nothing, without a word; a detached output trained no Q,
    K or V projection."""
    def with_aux(self, q, k, v, mask):
        self.aux_loss = (q.float().square().mean() - 1).abs()
        return v * self.options.scale

    scaled_values("user_aux", with_aux)
    model, spec = harness_model(tmp_path, "user_aux", "attention.scale=3")
    assert spec.options == ScaleOptions(scale=3.0)
    (model(*batch()).square().mean() + model.aux_loss()).backward()
    assert model.encoder.blocks[0].attention.query.weight.grad.abs().sum() > 0

    def detached_aux(self, q, k, v, mask):
        self.aux_loss = (q.float().square().mean() - 1).abs().detach()
        return v * self.options.scale

    scaled_values("user_detached_aux", detached_aux)
    model, _ = harness_model(tmp_path, "user_detached_aux")
    model(*batch())
    with pytest.raises(BackendError, match="set aux_loss outside the autograd graph .* trains nothing"):
        model.aux_loss()
    with torch.no_grad():  # evaluation: nothing to train, nothing refused
        model(*batch())
        model.aux_loss()

    scaled_values("user_detached", detached)
    model, _ = harness_model(tmp_path, "user_detached")
    with pytest.raises(BackendError, match="outside the autograd graph of q, k, v"):
        model(*batch())


def test_the_dual_encoders_aux_loss_is_the_mean_over_both_documents(tmp_path):
    """Retrieval runs the one encoder over each document: the second pass replaced every backend's aux_loss, so
    a learned hash learned its buckets from the second documents alone."""
    from lra.model import attention_aux_loss

    def with_aux(self, q, k, v, mask):
        self.aux_loss = q.float().square().mean()
        return v * self.options.scale

    scaled_values("user_dual", with_aux)
    register_configs()
    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "user_dual.yaml").write_text(PRESET.format(name="user_dual"))
    cfg = compose_config(f"hydra.searchpath=[file://{tmp_path}]", "attention=user_dual", "task=retrieval",
                         "task.max_length=16", "model.num_layers=1")
    torch.manual_seed(0)
    model = Classifier(cfg.model, cfg.task, attention_spec(cfg), 16).eval()  # no dropout: the passes repeat exactly
    (ids1, ids2), (mask1, mask2) = [torch.randint(1, 200, (2, 16)) for _ in range(2)], [torch.ones(2, 16, dtype=torch.bool)] * 2
    model([ids1, ids2], [mask1, mask2])
    both = model.aux_loss()
    model.encoder(ids1, mask1)
    first = attention_aux_loss(model.encoder)
    model.encoder(ids2, mask2)
    second = attention_aux_loss(model.encoder)
    assert not torch.allclose(first, second) and torch.allclose(both, (first + second) / 2)
    assert both.requires_grad


def test_an_option_typed_as_a_dict_takes_keys_of_the_users_choosing_and_only_its_backend_keys_are_closed():
    """``weights: Dict[str, float]``: ``attention.weights={b:2}`` merges as Hydra merges a dict (it was
    refused as "unknown key 'attention.weights.b'"), its values keep their type, and a key the options
    do not have is still refused."""
    from hydra.errors import ConfigCompositionException

    from lra.errors import ConfigError

    @dataclasses.dataclass
    class WeightOptions:
        weights: typing.Dict[str, float] = dataclasses.field(default_factory=lambda: {"a": 1.0})

    scaled_values("weighted", options=WeightOptions, forward=lambda self, q, k, v, mask: v)
    register_configs()
    cfg = compose_config("attention=weighted", "attention.weights={b:2}", "attention.weights.c=3")
    validate(cfg)
    assert attention_spec(cfg).options.weights == {"a": 1.0, "b": 2.0, "c": 3.0}
    assert compose_config("attention=weighted").attention.weights == {"a": 1.0}  # no change reached the store
    with pytest.raises(ConfigCompositionException) as refused:
        compose_config("attention=weighted", "attention.weights={b:heavy}")
    assert "could not be converted to Float" in str(refused.value.__cause__)
    with pytest.raises(ConfigError, match="unknown key 'attention.weight' .did you mean 'weights'"):
        validate(compose_config("attention=weighted", "+attention.weight=2"))
    # lra-fidelity holds each backend's options one level down (options.<backend>.weights): open there too
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigAttributeError

    from lra.config_fields import open_plain_dicts

    nested = dataclasses.make_dataclass("Nested", [("weighted", WeightOptions, dataclasses.field(
        default_factory=WeightOptions))])
    node = open_plain_dicts(OmegaConf.structured(nested))
    OmegaConf.set_struct(node, True)
    node.weighted.weights.b = 2.0
    assert node.weighted.weights == {"a": 1.0, "b": 2.0}
    with pytest.raises(ConfigAttributeError):
        node.weighted.weight = 2.0
