"""What the structured configs of every command share: ``lra-train``'s (:mod:`lra.config`) and
``lra-profile``'s and ``lra-fidelity``'s (:mod:`lra.tool_configs`). An attention schema is generated
from a backend's options dataclass in the ``attention_zoo`` registry, the single source of its keys;
the rules check a list of backends and a device name."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import field

import attention_zoo
from attention_zoo.options import InvalidOption
from omegaconf import DictConfig, OmegaConf


def attention_schema(backend: attention_zoo.Backend, with_name: bool = True) -> type:
    """A dataclass with ``name`` (unless not ``with_name``) plus the backend's own options (its ``init`` fields)."""
    fields = [("name", str, field(default=backend.name))] if with_name else []
    types = typing.get_type_hints(backend.options)  # resolves string annotations
    for option in dataclasses.fields(backend.options):
        if not option.init:  # the options' own state (set in __post_init__), no setting
            continue
        default = (
            field(default_factory=option.default_factory)
            if option.default_factory is not dataclasses.MISSING
            else field(default=option.default)
        )
        fields.append((option.name, types[option.name], default))
    return dataclasses.make_dataclass(f"{backend.cls.__name__}Config", fields)


def attention_node(backend: attention_zoo.Backend, with_name: bool = True) -> DictConfig:
    """:func:`attention_schema` as the config node Hydra stores (:func:`open_plain_dicts`)."""
    return open_plain_dicts(OmegaConf.structured(attention_schema(backend, with_name)))


def open_plain_dicts(node: DictConfig) -> DictConfig:
    """``node`` with every option typed as a dict (not a dataclass) open to keys of the user's choosing
    (``attention.weights={a:1,b:2}``, lra-fidelity's ``options.<backend>.weights.b=2``): only the schemas' own
    keys stay closed."""
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none():
            if dataclasses.is_dataclass(OmegaConf.get_type(node, key)):
                open_plain_dicts(child)
            else:
                OmegaConf.set_struct(child, False)
    return node


def known_backends(options, name: str) -> None:
    values = getattr(options, name)
    unknown = [b for b in values if b not in attention_zoo.names()]
    if unknown or not values:
        raise InvalidOption(name, list(values), f"a non-empty list of registered backends: {', '.join(attention_zoo.names())}")


def device_name(options, name: str) -> None:
    value = getattr(options, name)
    if not (value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and value[5:].isdigit())):
        raise InvalidOption(name, value, "auto, cpu, cuda or cuda:N")
