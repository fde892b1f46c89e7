"""Structured configs of ``lra-profile`` and ``lra-fidelity`` (``lra-train``'s are in :mod:`lra.config`,
whose ``register_configs`` stores these too; what they share is in :mod:`lra.config_fields`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import List, Optional

import attention_zoo
from attention_zoo._flex import IMPLS
from attention_zoo._yoso_ops import MAX_CODE_LENGTH
from attention_zoo.options import InvalidOption, _readable, choice, number, whole
from lra.config_fields import attention_schema, device_name, known_backends


@dataclass
class ProfileConfig:
    """``lra-profile``: time and memory of attention modules against sequence length."""

    backends: List[str] = field(default_factory=lambda: list(attention_zoo.names()))
    lengths: List[int] = field(default_factory=lambda: [512, 1024, 2048, 4096, 8192])
    mode: str = "fixed"  # fixed: batch_size instances | largest: the largest batch that fits memory_budget_mb
    batch_size: int = 1
    max_batch: int = 256  # largest mode: stop doubling here
    memory_budget_mb: Optional[float] = None  # largest mode: default the GPU's memory, or 8192 on CPU
    num_heads: int = 12  # the YOSO paper's attention module: BERT-base, 12 heads of 64
    head_dim: int = 64
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    repeats: int = 3  # the median of this many calls after a warm-up (and their spread: lra-profile warns when large)
    timeout_s: int = 600  # per cell; cells over it are recorded as timed out
    fit_min_length: int = 2048  # scaling exponents are fitted over n >= this
    # auto | eager | flex: the impl option of every backend with a FlexAttention path; null: their own default
    sparse_pattern_impl: Optional[str] = None
    output_dir: str = "${hydra:runtime.output_dir}"

    def __post_init__(self):
        known_backends(self, "backends")
        if self.sparse_pattern_impl is not None and self.sparse_pattern_impl not in IMPLS:
            raise InvalidOption("sparse_pattern_impl", self.sparse_pattern_impl, f"one of {', '.join(IMPLS)} (or null)")
        # a cell's n × n scores and batch × heads × n × head_dim inputs are sized in int64; no device holds 2^31 a side
        sized = "(a cell's tensors are sized in int64 and no device holds more)"
        if not self.lengths or any(not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SIZE
                                   for n in self.lengths):
            raise InvalidOption("lengths", list(self.lengths), f"a non-empty list of whole numbers, each 1 ≤ n ≤ "
                                                               f"2^31 − 1 {sized}")
        choice(self, "mode", ("fixed", "largest"))
        for name in ("batch_size", "max_batch", "num_heads", "head_dim", "fit_min_length"):
            if isinstance(getattr(self, name), int) and getattr(self, name) > MAX_SIZE:
                raise InvalidOption(name, getattr(self, name), f"a whole number ≤ 2^31 − 1 {sized}")
        whole(self, 1, "batch_size", "max_batch", "num_heads", "head_dim", "repeats", "timeout_s", "fit_min_length")
        for name, limit, why in (("repeats", 1000, "calls of one cell; the median is steady long before"),
                                 ("timeout_s", 7 * 24 * 3600, "a week per cell: a longer limit is a typo, not a plan")):
            if getattr(self, name) > limit:
                raise InvalidOption(name, getattr(self, name), f"a whole number ≤ {limit} ({why})")
        for name in ("backends", "lengths"):
            values = list(getattr(self, name))
            twice = sorted({str(value) for value in values if values.count(value) > 1})
            if twice:
                raise InvalidOption(name, values, f"a list naming each once ({', '.join(twice)} more than once: it "
                                                  "would be measured twice and shown once)")
        if not str(self.output_dir).strip():
            raise InvalidOption("output_dir", self.output_dir, "a folder (an unset shell variable gives the current "
                                                               "folder): give output_dir a folder, or leave it out")
        number(self, "memory_budget_mb", 0.0, low_open=True, optional=True)
        device_name(self, "device")


def _backend_options_schema() -> type:
    """One field per registered backend holding its options (lra-fidelity's ``options``)."""
    fields = []
    for name in attention_zoo.names():
        schema = attention_schema(attention_zoo.get(name), with_name=False)
        fields.append((name, schema, field(default_factory=schema)))
    return dataclasses.make_dataclass("BackendOptions", fields)


BackendOptions = _backend_options_schema()


MAX_SIZE = 2**31 - 1  # a tensor size the compiled kernels index with 32-bit integers
MAX_SCORE_STD = 1e6  # see FidelityConfig's rule for score_std


def _power(bound: int) -> str:
    """2^20 rather than 1048576, 2^32 − 1 rather than 4294967295."""
    return f"2^{bound.bit_length() - 1}" if bound > 2**16 and bound & (bound - 1) == 0 else _readable(bound)


LIST_BOUNDS = {  # lra-fidelity's lists: (least, largest, why the largest)
    "lengths": (1, 2**20, "the exact softmax it is measured against holds n × n weights: 2^40 per head at 2^20"),
    "yoso_lengths": (1, 2**MAX_CODE_LENGTH, f"YOSO's hash codes have τ = ⌈log2 n⌉ ≤ {MAX_CODE_LENGTH} bits"),
    "oracle_budgets": (1, 2**20, "no length is longer"),
    "yoso_hashes": (1, MAX_SIZE, "YOSO's CUDA kernels count hashes in 32-bit integers"),
    "seeds": (0, 2**32 - 1, "numpy's seed range, as lra-train's seed"),
}


@dataclass
class FidelityConfig:
    """``lra-fidelity``: how far each backend's output is from exact softmax attention."""

    sections: List[str] = field(default_factory=lambda: ["backends", "oracles", "yoso"])
    backends: List[str] = field(default_factory=lambda: list(attention_zoo.names()))
    options: BackendOptions = field(default_factory=lambda: BackendOptions())  # options.<backend>.<option>
    lengths: List[int] = field(default_factory=lambda: [1024, 4096])  # random inputs of the backend section
    batch_size: int = 1
    num_heads: int = 4
    head_dim: int = 64
    score_std: float = 1.0  # random q, k: the standard deviation of q·k/√d
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2])
    checkpoint: Optional[str] = None  # an lra-train run directory: also measure on its captured Q, K, V
    examples: int = 4  # sequences of the run's split read by the checkpoint
    split: str = "val"
    oracle_budgets: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512])
    oracle_queries: int = 32  # queries per input reduced by Carathéodory (v-aware, r = d + 1)
    yoso_hashes: List[int] = field(default_factory=lambda: [8, 16, 32, 64, 128])
    yoso_lengths: List[int] = field(default_factory=lambda: [64, 128, 256, 512, 1024, 2048, 4096])
    yoso_impl: str = "auto"  # auto | cpu | cuda | torch
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    output_dir: str = "${hydra:runtime.output_dir}"

    def __post_init__(self):
        unknown = sorted(set(self.sections) - {"backends", "oracles", "yoso"})
        if unknown or not self.sections:
            raise InvalidOption("sections", list(self.sections), "a non-empty subset of [backends, oracles, yoso]"
                                + (f" (unknown section {', '.join(unknown)})" if unknown else ""))
        known_backends(self, "backends")
        for name, (low, high, why) in LIST_BOUNDS.items():
            values = getattr(self, name)
            if not values or any(not isinstance(n, int) or isinstance(n, bool) or not low <= n <= high for n in values):
                raise InvalidOption(name, list(values), f"a non-empty list of whole numbers from {low} to "
                                                        f"{_power(high)} ({why})")
        for name in ("sections", "backends", *LIST_BOUNDS):
            values = list(getattr(self, name))
            repeated = next((v for i, v in enumerate(values) if v in values[:i]), None)
            if repeated is not None:
                raise InvalidOption(name, values, f"a list without repeats ({repeated} is given twice: it would be "
                                                  "measured, and counted, twice)")
        whole(self, 1, "batch_size", "num_heads", "head_dim", "examples", "oracle_queries", maximum=MAX_SIZE)
        if not isinstance(self.score_std, (int, float)) or isinstance(self.score_std, bool) \
                or not 0 < self.score_std <= MAX_SCORE_STD:
            raise InvalidOption("score_std", self.score_std, "a number in (0, 1e6] (q and k are float32 draws of std "
                                "√score_std whose products over head_dim must stay far inside float32's range, 3.4e38; "
                                "softmax is one-hot long before 1e6)")
        if self.checkpoint is not None and not self.checkpoint.strip():
            raise InvalidOption("checkpoint", self.checkpoint, "an lra-train run folder, or null (no captured "
                                                               "inputs): leave it out, or give it a folder")
        if not self.output_dir.strip():
            raise InvalidOption("output_dir", self.output_dir, "a folder (an unset shell variable gives the current "
                                                               "folder): give output_dir a folder, or leave it out")
        choice(self, "split", ("train", "val", "test"))
        choice(self, "yoso_impl", ("auto", "cpu", "cuda", "torch"))
        device_name(self, "device")
