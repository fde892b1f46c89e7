"""A registry of attention backends, keyed by name, each with a dataclass of options.

A backend is one module in this package: a subclass of :class:`Attention` decorated with :func:`register`.
``build(name, num_heads=..., head_dim=..., max_seq_len=..., **options)`` turns the keyword options into the
backend's options dataclass, so a misspelled option is an error that lists the valid ones."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import inspect
import re
import types
import typing
from types import SimpleNamespace
from typing import Any, Callable, Dict, Optional, Type

import torch
from torch import nn

from attention_zoo import user_modules
from attention_zoo.options import InvalidOption, whole


class Attention(nn.Module):
    """Base class of every backend.

    ``forward(q, k, v, mask)`` takes q, k, v of shape [batch, heads, n, head_dim] and a key-padding
    mask [batch, n] (bool, True = real token, or None for no padding) and returns [batch, heads, n,
    head_dim]. Rows of padded queries may hold anything finite; callers ignore them. n = 0 gives an
    empty output (most backends through ``_common.at_least_float32``, which returns it before their own code runs).
    ``aux_loss`` is a scalar tensor the trainer adds to its loss, or None. :func:`register` wraps
    ``forward`` in the checks of this contract (:func:`checked_forward`).
    """

    name: str = ""
    Options: Type[Any]
    subquadratic: bool = False  # promises less than O(n²) memory (checked by the test suite)
    supports_causal: bool = False  # has a causal mode: a query sees only keys at its position or before
    causal: bool = False  # this module's mode, set by :meth:`AttentionSpec.build` (tested over the registry)
    has_flex_path: bool = False  # a FlexAttention path chosen by its ``impl`` option (auto | eager | flex; ``_flex``)
    # Set by a model whose pooling reads every position's output, padded ones too (mean_unmasked): rows that
    # attend no real key are then read, and a path that computes them differently must not be taken.
    padded_rows_read: bool = False

    def __init__(self, num_heads: int, head_dim: int, max_seq_len: int, options: Any):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.options = options
        self.aux_loss: Optional[torch.Tensor] = None

    @classmethod
    def label(cls, options: Any) -> str:
        """The display name as the papers write it (e.g. "Softmax", "YOSO-32")."""
        return cls.name

    @classmethod
    def check_shape(cls, options: Any, num_heads: int, head_dim: int, max_seq_len: int) -> None:
        """Raise :class:`~attention_zoo.options.InvalidOption` if ``options`` cannot serve inputs of
        this shape (e.g. more Nyström landmarks than tokens), so a harness can refuse the config
        before anything is built. Default: every shape is served."""

    @classmethod
    def unread_inputs(cls, options: Any) -> frozenset:  # of q, k: their projections get no gradient (DDP is told)
        return frozenset()

    @classmethod
    def causal_leak(cls, options: Any) -> Optional[str]:  # why a causal LM cannot use these options (e.g. it reads
        return None  # the padding of later positions), or None

    @classmethod
    def flex_exact_on_every_row(cls, options: Any) -> bool:
        """Whether this backend's Flex path (``has_flex_path``) equals its eager path on rows without a
        real key too (their masks a bias in both), so a model may read those rows. Default: no."""
        return False

    def engine(self, device: torch.device) -> Optional[str]:
        """The implementation that computes this module on ``device`` where the machine chooses it, not the
        options, the device type or the torch build (YOSO's ``impl=auto``: its compiled kernels, or the
        PyTorch path where they cannot be built): a run records it and resumes only under it. Default: None."""
        return None

    def pin_engine(self, engine: str) -> None:
        """Compute on ``engine`` (one that :meth:`engine` names) from now on, whatever the machine would choose: a
        run resumed elsewhere goes on as it began. Called only on a module whose :meth:`engine` names one."""
        raise NotImplementedError(f"{type(self).__name__} names an engine but cannot be pinned to one")

    def share_parameters_with(self, first: "Attention") -> None:
        """Called on layers 2… of a model with layer 1's backend; a backend whose options ask for
        cross-layer sharing adopts ``first``'s parameters here. Default: share nothing."""

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, head_dim={self.head_dim}, {self.options}"


@dataclasses.dataclass(frozen=True)
class Backend:
    name: str
    cls: Type[Attention]
    options: Type[Any]


_REGISTRY: Dict[str, Backend] = {}
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # attention=<name>, conf/attention/<name>.yaml, schema_attention_<name>
NOT_NAMES = ("null", "true", "false", "nan", "inf")  # Hydra's override grammar reads these as values, in any case
RESERVED_OPTIONS = ("name", "defaults")  # the config's attention.name, and Hydra's defaults list


class BackendError(RuntimeError):
    """A backend broke the contract of :class:`Attention` (its output, its ``aux_loss``, or its inputs
    changed in place): a bug in that backend's code, named with its class."""


def register(name: str, options: Type[Any]) -> Callable[[Type[Attention]], Type[Attention]]:
    """Class decorator: register an :class:`Attention` subclass under ``name`` with its options
    dataclass. Every option needs a default and a plain type (a config file and the command line set
    it); the class's ``forward`` is wrapped in the contract checks (:func:`checked_forward`). Registering
    a class again under its name (a re-run notebook cell, a reloaded module) replaces it; another
    class under a taken name is refused."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"attention backend name {name!r} is not usable: use letters, digits and underscores, "
                         "starting with a letter (it becomes attention=<name> and conf/attention/<name>.yaml)")
    if name.lower() in NOT_NAMES:
        raise ValueError(f"attention backend name {name!r} is not usable: the command line reads attention={name} as "
                         f"the value {name.lower()}, not a name; choose another")
    _check_options_class(name, options)

    def decorate(cls: Type[Attention]) -> Type[Attention]:
        if not (isinstance(cls, type) and issubclass(cls, Attention)):
            raise TypeError(f"@register('{name}', ...) decorates a subclass of attention_zoo.Attention, got {cls!r}")
        _check_forward_signature(name, cls)
        taken = _REGISTRY.get(name)
        if taken is not None and taken.cls is not cls and _qualified(taken.cls) != _qualified(cls):
            raise ValueError(f"attention backend name '{name}' is taken by {_qualified(taken.cls)}; register "
                             f"{_qualified(cls)} under another name (taken: {', '.join(names())})")
        other = [b.name for b in _REGISTRY.values() if b.cls is cls and b.name != name]
        if other:
            raise ValueError(f"{_qualified(cls)} is registered as '{other[0]}' already; one class has one name "
                             f"(subclass it to register a variant as '{name}')")
        cls.forward = checked_forward(cls.forward)  # as it is if already wrapped (a registered parent's)
        cls.name = name
        cls.Options = options
        _REGISTRY[name] = Backend(name, cls, options)
        return cls

    return decorate


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _check_options_class(name: str, options: Any) -> None:
    """The options of backend ``name``: a dataclass (the class, not an instance) whose every field has a
    default and a plain type (:func:`_plain`), so that ``build(name)`` and a YAML preset can make it."""
    if not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        got = f"an instance of {type(options).__name__}: pass the class itself" if dataclasses.is_dataclass(options) \
            else repr(options)
        raise TypeError(f"options of backend '{name}' must be a dataclass class (@dataclasses.dataclass), got {got}")
    hints = typing.get_type_hints(options)
    for option in dataclasses.fields(options):
        if not option.init:
            continue
        if option.name in RESERVED_OPTIONS or option.name.startswith("_"):
            raise TypeError(f"option '{option.name}' of backend '{name}' has a name the config keeps for itself "
                            f"(attention.name, Hydra's defaults and _keys_): rename it")
        if option.default is dataclasses.MISSING and option.default_factory is dataclasses.MISSING:
            raise TypeError(f"option '{option.name}' of backend '{name}' has no default: give it one "
                            f"(build('{name}', ...) and attention={name} start from every option's default)")
        hint = hints.get(option.name, Any)
        if not _plain(hint):
            raise TypeError(f"option '{option.name}' of backend '{name}' has type {hint!r}, which a "
                            "config file cannot hold: use int, float, bool, str, an Enum, or Optional/List/Dict/Tuple "
                            "of them (a choice of behaviours: a str checked by attention_zoo.options.choice)")
        default = option.default if option.default_factory is dataclasses.MISSING else option.default_factory()
        if not _fits(default, hint):
            raise TypeError(f"option '{option.name}' of backend '{name}' defaults to {default!r}, which is not "
                            f"{_type_rule(hint)}: give it a default of its type"
                            + (f" or declare it Optional[{getattr(hint, '__name__', hint)}]" if default is None else ""))
        if typing.get_origin(hint) is not None or hint in (list, tuple, dict):  # a container: what OmegaConf holds
            _check_config_holds(name, option.name, hint, default)
        if default is None and any(typing.get_origin(arg) is dict or arg is dict for arg in typing.get_args(hint)):
            raise TypeError(f"option '{option.name}' of backend '{name}' is a dict that defaults to None, which the "
                            "command line cannot give keys to: declare it a Dict with default_factory=dict")


def _check_config_holds(name: str, option: str, hint: Any, default: Any) -> None:
    """What OmegaConf, which holds every config, cannot (a tuple of mixed types, a list of tuples): one line."""
    from omegaconf import OmegaConf

    probe = dataclasses.make_dataclass("Probe", [(option, hint, dataclasses.field(default_factory=lambda: default))])
    try:
        OmegaConf.structured(probe)
    except Exception as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TypeError(f"option '{option}' of backend '{name}' has type {hint!r}, which a config file cannot hold "
                        f"({said}): use int, float, bool, str, an Enum, or Optional/List/Dict/Tuple of one of them") \
            from None


def _plain(hint: Any) -> bool:
    """Whether an option's type is one a YAML preset and Hydra's structured configs can hold."""
    if hint is Any or hint in (int, float, bool, str) or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return all(arg is type(None) or _plain(arg) for arg in args)
    if origin in (list, tuple, dict) or hint in (list, tuple, dict):
        return all(arg is Ellipsis or _plain(arg) for arg in args)
    return False


def _check_forward_signature(name: str, cls: type) -> None:
    if cls.forward is nn.Module.forward:
        raise TypeError(f"backend '{name}' ({_qualified(cls)}) has no forward(self, q, k, v, mask=None)")
    try:
        inspect.signature(cls.forward).bind(None, "q", "k", "v", "mask")
    except TypeError:
        raise TypeError(f"{_qualified(cls)}.forward{inspect.signature(cls.forward)} cannot be called as "
                        "forward(q, k, v, mask): take (self, q, k, v, mask=None), mask [batch, n] bool, "
                        "True = real token (None: no padding)") from None
    except ValueError:  # no signature to inspect (a builtin): nothing to check
        pass


def checked_forward(forward: Callable) -> Callable:
    """``forward`` wrapped in the checks of the :class:`Attention` contract, each failure one error naming
    the fix: q, k, v [batch, num_heads, n, head_dim] floating tensors on one device and the mask bool
    [batch, n] (else ValueError or TypeError: the caller's mistake, such as a [batch, n, heads, d] layout
    or an additive float mask, which every backend would read silently wrong); then (:class:`BackendError`:
    the backend's) a tensor of v's shape, device and dtype (any floating dtype under autocast) in the
    autograd graph when v is, q, k, v and the mask not changed in place, ``aux_loss`` None or a 0-dim
    floating tensor. Shapes and flags only: nothing is read back from the device. Under torch.compile the
    in-place check is left out (it reads version counters, which a graph cannot), and on tensors made under
    torch.inference_mode, which have none. A call that passes costs one condition per side (a few µs of host
    time); the named checks run only to say what failed."""
    if getattr(forward, "checks_contract", False):
        return forward

    @functools.wraps(forward)
    def checked(self, q, k, v, mask=None):
        if not _inputs_fit(self, q, k, v, mask):
            _check_inputs(self, q, k, v, mask)  # raises, naming what is wrong
        inputs = (q, k, v) if mask is None else (q, k, v, mask)
        versions = None if torch.compiler.is_compiling() else _versions(inputs)
        out = forward(self, q, k, v, mask)
        try:
            if not _output_fits(self, out, v):
                _check_output(self, out, v)  # raises, unless autocast allows out's dtype
            if versions is not None and versions != _versions(inputs):
                changed = [label for label, seen, now in zip("q k v mask".split(), versions, _versions(inputs))
                           if seen != now]
                raise BackendError(f"{_qualified(type(self))}.forward changed {', '.join(changed)} in place (the "
                                   "caller's tensors): compute into new tensors (x = x * 2, not x.mul_(2))")
        except BackendError as error:
            error.backend = type(self)  # whose code to fix (lra's error line names a backend of yours so)
            raise
        return out

    checked.checks_contract = True
    return checked


def _versions(inputs) -> list:
    """The tensors' version counters (bumped by each in-place change); None for an inference tensor, which has none."""
    try:
        return [t._version for t in inputs]
    except RuntimeError:  # made under torch.inference_mode
        return [None if t.is_inference() else t._version for t in inputs]


_Tensor, _bool = torch.Tensor, torch.bool


def _inputs_fit(module: "Attention", q, k, v, mask) -> bool:
    """:func:`_check_inputs`'s rules as one condition, the cheap test of every call."""
    if not (isinstance(q, _Tensor) and isinstance(k, _Tensor) and isinstance(v, _Tensor)):
        return False
    shape, device = q.shape, q.device
    return (len(shape) == 4 and shape[1] == module.num_heads and shape[3] == module.head_dim and k.shape == shape
            and v.shape == shape and q.is_floating_point() and k.is_floating_point() and v.is_floating_point()
            and k.device == device and v.device == device
            and (mask is None or (isinstance(mask, _Tensor) and mask.dtype == _bool and mask.device == device
                                  and mask.shape == (shape[0], shape[2]))))


def _output_fits(module: "Attention", out, v) -> bool:
    """:func:`_check_output`'s rules as one condition for out of v's dtype (else autocast may allow it)."""
    aux = module.aux_loss
    return (isinstance(out, _Tensor) and out.shape == v.shape and out.dtype == v.dtype and out.device == v.device
            and (out.requires_grad or not v.requires_grad or not torch.is_grad_enabled())
            and (aux is None or (isinstance(aux, _Tensor) and aux.dim() == 0 and aux.is_floating_point())))


def _check_inputs(module: "Attention", q, k, v, mask) -> None:
    expected = f"[batch, heads={module.num_heads}, n, head_dim={module.head_dim}]"
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"attention '{module.name}': {label} is a {type(t).__name__}; pass tensors {expected}")
        if t.dim() != 4 or t.shape[1] != module.num_heads or t.shape[3] != module.head_dim or t.shape != q.shape:
            hint = (f" ({label}.transpose(1, 2) if yours is [batch, n, heads, head_dim])"
                    if t.dim() == 4 and t.shape[2] == module.num_heads and t.shape[3] == module.head_dim else "")
            raise ValueError(f"attention '{module.name}': {label} has shape {tuple(t.shape)}; q, k and v must all be "
                             f"{expected}, the sizes it was built with{hint}")
        if not t.is_floating_point() or t.device != q.device:
            raise ValueError(f"attention '{module.name}': {label} is {t.dtype} on {t.device}; q, k and v must be "
                             f"floating-point tensors on one device (q: {q.dtype} on {q.device})")
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = f"{mask.dtype}" if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"attention '{module.name}': the mask is {got}; it must be bool [batch, n], True = real token "
                         "(a 0/1 mask: mask.bool(); an additive mask of 0 and -inf: mask == 0), or None")
    if mask.shape != (q.shape[0], q.shape[2]) or mask.device != q.device:
        raise ValueError(f"attention '{module.name}': the mask has shape {tuple(mask.shape)} on {mask.device}; it "
                         f"must be [batch, n] = {(q.shape[0], q.shape[2])} on {q.device}, True = real token")


def _check_output(module: "Attention", out, v) -> None:
    where = f"{_qualified(type(module))}.forward"
    if not isinstance(out, torch.Tensor):
        raise BackendError(f"{where} returned a {type(out).__name__}; it must return one tensor of v's shape "
                           "[batch, heads, n, head_dim] (an auxiliary loss goes to self.aux_loss)")
    if out.shape != v.shape or out.device != v.device:
        raise BackendError(f"{where} returned shape {tuple(out.shape)} on {out.device}; it must return v's "
                           f"shape {tuple(v.shape)} [batch, heads, n, head_dim] on {v.device}")
    if not out.is_floating_point() or (out.dtype != v.dtype and not torch.is_autocast_enabled(v.device.type)):
        raise BackendError(f"{where} returned {out.dtype} for {v.dtype} inputs; return the inputs' dtype "
                           "(out.to(v.dtype), or decorate forward with attention_zoo._common.at_least_float32)")
    if torch.is_grad_enabled() and v.requires_grad and not out.requires_grad:
        raise BackendError(f"{where} returned a tensor outside the autograd graph of q, k, v (detached, or computed "
                           "under torch.no_grad): the model could not learn through it")
    aux = module.aux_loss
    if aux is not None and not (isinstance(aux, torch.Tensor) and aux.dim() == 0 and aux.is_floating_point()):
        got = f"a {aux.dtype} tensor of shape {tuple(aux.shape)}" if isinstance(aux, torch.Tensor) else \
            f"a {type(aux).__name__}"
        raise BackendError(f"{where} set aux_loss to {got}; it must be None or a 0-dim floating tensor in the "
                           "autograd graph (e.g. loss.mean(), not loss.item()), which the trainer adds to its loss")


def engines(model: nn.Module, device: torch.device) -> Optional[str]:
    """The engines (:meth:`Attention.engine`) of ``model``'s attention modules on ``device``, comma-separated, or
    None where no module has one."""
    found = {module.engine(device) for module in model.modules() if isinstance(module, Attention)}
    return ",".join(sorted(found - {None})) or None


def pin_engines(model: nn.Module, engine: str) -> None:
    """:meth:`Attention.pin_engine` on each attention module of ``model`` that names an engine."""
    for module in model.modules():
        if isinstance(module, Attention) and type(module).engine is not Attention.engine:
            module.pin_engine(engine)


def names() -> list[str]:
    """Every registered backend name, sorted (registration order depends on import order)."""
    return sorted(_REGISTRY)


def causal_names() -> list[str]:
    """The registered backends that have a causal mode."""
    return [name for name in names() if _REGISTRY[name].cls.supports_causal]


def get(name: str) -> Backend:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown attention backend '{name}'; registered: {', '.join(names())}"
        ) from None


def make_options(name: str, **options: Any) -> Any:
    """Build the options dataclass of ``name``; unknown keys raise with the valid ones listed, a value of
    the wrong type (a string for an int, "false" for a bool) :class:`InvalidOption`, as the options' own
    rules do (their ``__post_init__``, which speaks first)."""
    user_modules.check()  # build and spec come through here: a backend of yours that failed is not "unknown"
    backend = get(name)
    valid = [f.name for f in dataclasses.fields(backend.options) if f.init]
    unknown = [key for key in options if key not in valid]
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, valid, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        raise TypeError(
            f"unknown option {', '.join(hints)} for attention '{name}'; "
            f"valid options: {', '.join(valid) or '(none)'}"
        )
    try:
        made = backend.options(**options)
    except InvalidOption:
        raise
    except Exception:  # e.g. a rule comparing a string with a number: the type is the problem, if one is wrong
        _check_types(backend.options, options)
        raise
    _check_types(backend.options, options)
    return made


def _check_types(options_class: type, values: Dict[str, Any]) -> None:
    hints = typing.get_type_hints(options_class)
    for key, value in values.items():
        if key in hints and not _fits(value, hints[key]):
            raise InvalidOption(key, value, _type_rule(hints[key]))


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the option type ``hint`` (an int is a float; a bool is neither; a list and a
    tuple stand for each other, as a config file has only lists)."""
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(value is None if arg is type(None) else _fits(value, arg) for arg in args)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        if origin is tuple and args and Ellipsis not in args:  # Tuple[int, str]: a type per place
            return len(args) == len(value) and all(_fits(item, arg) for item, arg in zip(value, args))
        return not args or all(_fits(item, args[0]) for item in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict) and (not args or all(_fits(item, args[1]) for item in value.values()))
    return isinstance(value, hint) if isinstance(hint, type) else True


def _type_rule(hint: Any) -> str:
    words = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    if hint in words:
        return words[hint]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rules = [_type_rule(arg) for arg in args if arg is not type(None)]
        return " or ".join(rules) + (" (or null)" if type(None) in args else "")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {', '.join(member.name for member in hint)}"
    return f"of type {getattr(hint, '__name__', None) or hint}"


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
    """One attention as a model uses it, made once from a name and options (:func:`spec`): the
    backend's name, its validated options, its paper label, and ``build`` for each layer."""

    name: str
    options: Any  # the backend's options dataclass, validated

    @property
    def label(self) -> str:
        return get(self.name).cls.label(self.options)

    def check_shape(self, num_heads: int, head_dim: int, max_seq_len: int) -> None:
        """:class:`InvalidOption` for sizes that are not whole numbers ≥ 1, then the backend's own rules."""
        whole(SimpleNamespace(num_heads=num_heads, head_dim=head_dim, max_seq_len=max_seq_len), 1,
              "num_heads", "head_dim", "max_seq_len")
        get(self.name).cls.check_shape(self.options, num_heads, head_dim, max_seq_len)

    @property
    def supports_causal(self) -> bool:
        return get(self.name).cls.supports_causal

    def build(self, num_heads: int, head_dim: int, max_seq_len: int, causal: bool = False) -> Attention:
        """A module of this backend (its options checked against the shape first); ``causal``: query
        i attends to keys 0…i only (a backend without :attr:`Attention.supports_causal` refuses)."""
        if not isinstance(causal, bool):
            raise InvalidOption("causal", causal, "true or false")
        if causal and not self.supports_causal:
            raise ValueError(f"attention '{self.name}' has no causal mode; causal backends: {', '.join(causal_names())}")
        self.check_shape(num_heads, head_dim, max_seq_len)
        module = get(self.name).cls(num_heads, head_dim, max_seq_len, self.options)
        module.causal = causal
        return module


def spec(name: str, **options: Any) -> AttentionSpec:
    """The :class:`AttentionSpec` of backend ``name`` with these options (validated here)."""
    return AttentionSpec(name, make_options(name, **options))


def build(name: str, *, num_heads: int, head_dim: int, max_seq_len: int, causal: bool = False,
          **options: Any) -> Attention:
    """Instantiate backend ``name`` with its options given as keywords (checked against the shape)."""
    return spec(name, **options).build(num_heads, head_dim, max_seq_len, causal)


def label(name: str, **options: Any) -> str:
    """The display label of backend ``name`` with these options."""
    return spec(name, **options).label
