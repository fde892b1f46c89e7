"""The "no attention" baseline of the YOSO paper's Table 3: the output is V, no token mixing."""

from __future__ import annotations

from dataclasses import dataclass

from attention_zoo.registry import Attention, register


@dataclass
class NoneOptions:
    pass


@register("none", NoneOptions)
class NoAttention(Attention):
    """Returns V unchanged: each token sees only itself (so it is causal as it stands)."""

    supports_causal = True

    @classmethod
    def label(cls, options: NoneOptions) -> str:
        return "None"

    @classmethod
    def unread_inputs(cls, options: NoneOptions) -> frozenset:
        return frozenset({"q", "k"})

    def forward(self, q, k, v, mask=None):
        return v
