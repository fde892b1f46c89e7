"""A registry of attention backends, keyed by name, each with a dataclass of options.

A backend is one module in this package: a subclass of :class:`Attention` decorated with
:func:`register`. ``build(name, num_heads=..., head_dim=..., max_seq_len=..., **options)`` turns
the keyword options into the backend's options dataclass, so a misspelled option is an error that
lists the valid ones.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Callable, Dict, Optional, Type

import torch
from torch import nn


class Attention(nn.Module):
    """Base class of every backend.

    ``forward(q, k, v, mask)`` takes q, k, v of shape [batch, heads, n, head_dim] and a key-padding
    mask [batch, n] (bool, True = real token, or None for no padding) and returns [batch, heads, n,
    head_dim]. Rows of padded queries may hold anything finite; callers ignore them. n = 0 gives an
    empty output (most backends through ``_common.at_least_float32``, which returns it before their own code runs).
    ``aux_loss`` is a scalar tensor the trainer adds to its loss, or None.
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
    def flex_exact_on_every_row(cls, options: Any) -> bool:
        """Whether this backend's Flex path (``has_flex_path``) equals its eager path on rows without a
        real key too (their masks a bias in both), so a model may read those rows. Default: no."""
        return False

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


def register(name: str, options: Type[Any]) -> Callable[[Type[Attention]], Type[Attention]]:
    """Class decorator: register an :class:`Attention` subclass under ``name``."""
    if not dataclasses.is_dataclass(options):
        raise TypeError(f"options of backend '{name}' must be a dataclass, got {options!r}")

    def decorate(cls: Type[Attention]) -> Type[Attention]:
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"attention backend '{name}' is registered twice")
        cls.name = name
        cls.Options = options
        _REGISTRY[name] = Backend(name, cls, options)
        return cls

    return decorate


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
    """Build the options dataclass of ``name``; unknown keys raise with the valid ones listed."""
    backend = get(name)
    valid = [f.name for f in dataclasses.fields(backend.options)]
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
    return backend.options(**options)


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
        get(self.name).cls.check_shape(self.options, num_heads, head_dim, max_seq_len)

    @property
    def supports_causal(self) -> bool:
        return get(self.name).cls.supports_causal

    def build(self, num_heads: int, head_dim: int, max_seq_len: int, causal: bool = False) -> Attention:
        """A module of this backend (its options checked against the shape first); ``causal``: query
        i attends to keys 0…i only (a backend without :attr:`Attention.supports_causal` refuses)."""
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
