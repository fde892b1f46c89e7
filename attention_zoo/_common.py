"""Small pieces shared by several backends (and the resource lookup shared with ``lra``)."""

from __future__ import annotations

import functools
import importlib.resources
import math
from collections import OrderedDict
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

def package_folder(package: str) -> Path:
    """The folder of a resource package shipped inside the installed packages (``lra.conf`` is
    ``conf/`` in a checkout, mapped by pyproject.toml), found through importlib.resources so that
    a wheel install and an editable checkout look the same."""
    folder = importlib.resources.files(package)
    if not isinstance(folder, Path) or not folder.is_dir():
        raise RuntimeError(
            f"the resource package {package} is not a folder on disk ({folder!r}); "
            "install lra-harness unzipped (pip install) rather than importing it from an archive"
        )
    return folder


NEG_INF = -1e9  # finite "minus infinity": a row with no valid key stays finite (its output is ignored)


def real_mask(mask: Optional[torch.Tensor], q: torch.Tensor) -> torch.Tensor:
    """The key-padding mask as bool [batch, n] (all True when None)."""
    if mask is None:
        return torch.ones(q.shape[0], q.shape[2], dtype=torch.bool, device=q.device)
    return mask.to(torch.bool)


def no_tokens(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention over an empty sequence (n = 0): the empty output [batch, heads, 0, d_v], in the
    autograd graph of q, k and v, so that a backward pass gives each an (empty) gradient."""
    return v + 0 * (q.sum() + k.sum())


def computation_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype the backends compute in for inputs ``tensors``: float64 when any of them is float64,
    else float32 (float16 and bfloat16 are widened)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def at_least_float32(forward):
    """Run ``forward(self, q, k, v, mask)`` in :func:`computation_dtype` (float64 for float64 inputs, so
    that a float64 reference can check a backend to float64 rounding; float32 for float32, float16 and
    bfloat16 inputs), autocast off (its matrix products would be bf16 or fp16 again inside an autocast
    region: ``model.attention_fp32=false`` leaves these backends in float32), and return the inputs'
    dtype. The backend casts its parameters, buffers and random draws to q's dtype where it uses them:
    a module in float32 computes float64 inputs in float64, one after ``module.double()`` computes
    float32 inputs in float32. An empty sequence (n = 0) returns :func:`no_tokens` without calling
    ``forward``: the block, chunk, bucket and landmark sizes that backends derive from n would be 0
    (divisions by zero, empty reductions)."""

    @functools.wraps(forward)
    def wrapper(self, q, k, v, mask=None):
        if q.shape[2] == 0:
            return no_tokens(q, k, v)
        dtype, computed = v.dtype, computation_dtype(q, k, v)
        with torch.autocast(q.device.type, enabled=False):
            out = forward(self, q.to(computed), k.to(computed), v.to(computed), real_mask(mask, q))
        return out.to(dtype) if isinstance(out, torch.Tensor) else out  # anything else: the registry's error

    return wrapper


class DepthwiseSequenceConv(torch.nn.Conv2d):
    """One filter of ``window`` taps per head along the sequence of [B, heads, n, d], no bias, same
    length out, computed in the input's dtype (its weight cast to it)."""

    def __init__(self, num_heads: int, window: int):
        super().__init__(num_heads, num_heads, (window, 1), padding=(window // 2, 0), groups=num_heads, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight.to(x.dtype), None)


def depthwise_sequence_conv(num_heads: int, window: int) -> Optional[DepthwiseSequenceConv]:
    """The convolution skip on V of Nyströmformer and YOSO-C (:class:`DepthwiseSequenceConv`); None for
    ``window`` 0."""
    if window == 0:
        return None
    return DepthwiseSequenceConv(num_heads, window)


UNIT_ROWS_EPS = 1e-12  # F.normalize's: a row shorter than this is divided by it


def unit_rows_with_norms(x: torch.Tensor, eps: float = UNIT_ROWS_EPS) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x / max(‖x‖, eps), ‖x‖ [..., 1]) along the last dimension, without autograd."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / norm.clamp_min(eps), norm


def through_unit_rows(grad: torch.Tensor, y: torch.Tensor, norm: torch.Tensor,
                      eps: float = UNIT_ROWS_EPS) -> torch.Tensor:
    """The gradient of x from ``grad``, that of y = x / max(‖x‖, eps) (``norm`` = ‖x‖):
    (g − y (g·y)) / max(‖x‖, eps), with g·y taken as 0 where ‖x‖ < eps (y is then x / eps). Two
    element-wise passes and a row reduction (a product and a sum: as an einsum, a batched cuBLAS gemv
    took 75 µs for 16 × 4096 × 32 on an H100, ~10x its bandwidth time)."""
    along = (grad * y).sum(-1, keepdim=True).masked_fill_(norm < eps, 0.0)
    return torch.addcmul(grad, y, along, value=-1).div_(norm.clamp_min(eps))


def gradients_through_unit_rows(q: torch.Tensor, k: torch.Tensor,
                                unit_row_gradients: Callable[[torch.Tensor, torch.Tensor], tuple]) -> tuple:
    """(∇q, ∇k, *rest) for rows q, k of any length, from ``unit_row_gradients(q̂, k̂)`` → (∇q̂, ∇k̂, *rest)
    taken on their unit rows: ∇q̂ and ∇k̂ pulled back through x ↦ x / max(‖x‖, eps) (:func:`through_unit_rows`),
    the rest as they come."""
    (unit_q, norm_q), (unit_k, norm_k) = unit_rows_with_norms(q), unit_rows_with_norms(k)
    grad_q, grad_k, *rest = unit_row_gradients(unit_q, unit_k)
    return (through_unit_rows(grad_q, unit_q, norm_q), through_unit_rows(grad_k, unit_k, norm_k), *rest)


def scaled(q: torch.Tensor) -> torch.Tensor:
    return q / math.sqrt(q.shape[-1])


def pad_to_multiple(x: torch.Tensor, multiple: int, dim: int, value=0) -> torch.Tensor:
    remainder = (-x.shape[dim]) % multiple
    if remainder == 0:
        return x
    shape = list(x.shape)
    shape[dim] = remainder
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x`` [B, H, n, d] gathered along n by ``index`` [B, H, m] → [B, H, m, d]."""
    return x.gather(2, index.unsqueeze(-1).expand(*index.shape, x.shape[-1]))


def random_rotation_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH (Andoni et al. 2015, as in Reformer): bucket = argmax([xR; −xR]).

    ``x`` [B, H, n, d] (normalized inside), ``rotations`` [rounds, d, buckets // 2] →
    buckets [B, H, rounds, n]. With one bucket every vector lands in bucket 0. Computed in float32
    whatever x's dtype, so that a float64 computation puts every token in the bucket its float32 twin
    does (a hash is a discrete choice: float64 rounding could flip a near tie).
    """
    if rotations.shape[-1] == 0:
        return torch.zeros(*x.shape[:2], rotations.shape[0], x.shape[2], dtype=torch.long, device=x.device)
    x = torch.nn.functional.normalize(x.float(), dim=-1)
    rotated = torch.einsum("bhnd,rdk->bhrnk", x, rotations.float())
    return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)


def draw_rotations(module, rounds: int, dim: int, buckets: int, device) -> torch.Tensor:
    """Random rotations [rounds, dim, buckets // 2] (see :func:`draw_normal`)."""
    return draw_normal(module, (rounds, dim, buckets // 2 if buckets > 1 else 0), device)


def register_rotation_seed(module: torch.nn.Module) -> None:
    """Give ``module`` the seed of its evaluation-time random draws: a buffer ``rotation_seed`` (saved
    with the weights) and its value as a Python int, kept equal on load, so that a compiled graph
    reads a constant instead of the tensor (no device-to-host copy, no graph break)."""
    module.register_buffer("rotation_seed", torch.randint(0, 2**62, ()))
    module.rotation_seed_value = int(module.rotation_seed)
    module.register_load_state_dict_post_hook(_refresh_rotation_seed)


def _refresh_rotation_seed(module: torch.nn.Module, incompatible_keys) -> None:
    module.rotation_seed_value = int(module.rotation_seed)


KEPT_LIMIT = 256  # keys kept by kept_draws, the least recently used forgotten first
_KEPT_DRAWS: "OrderedDict[tuple, tuple]" = OrderedDict()  # (what, its parameters, device) → tensors on that device
_HELD_BY_CAPTURE: list = []  # cached tensors read by a CUDA graph being captured (lra.capture keeps them)


def shared_by_streams(tensors: tuple, made: bool) -> tuple:
    """``tensors``, a process-wide cache's own, safe to read from any CUDA stream (a packed run's each):
    ``made`` just now on this stream, they are waited for once, so that no other stream reads them unfinished;
    each read marks them used by this stream, so that after an eviction the allocator gives their memory
    to no other stream's work before these reads are done. When a CUDA graph is being captured they are
    noted instead: the graph reads them by address at every replay, so its owner keeps them
    (:func:`take_held_by_capture`)."""
    if not tensors or not tensors[0].is_cuda:
        return tensors
    if torch.cuda.is_current_stream_capturing():
        _HELD_BY_CAPTURE.extend(tensors)
        return tensors
    stream = torch.cuda.current_stream(tensors[0].device)
    if made:
        stream.synchronize()
    for tensor in tensors:
        tensor.record_stream(stream)
    return tensors


def take_held_by_capture() -> list:
    """The cached tensors the captures since the last call read (the caller keeps them with its graph)."""
    held = list(_HELD_BY_CAPTURE)
    _HELD_BY_CAPTURE.clear()
    return held


def kept_draws(key: tuple, make) -> tuple:
    """Fresh copies of the tensors ``make()`` returns for ``key`` (seeded draws, made on the host and
    copied, or what is built from them, such as a sparse pattern's block tables), made the first time
    only: later calls copy on the device, so nothing crosses from the host or waits for it inside what a
    CUDA graph captures (its warm-up makes them). At most :data:`KEPT_LIMIT` keys are kept, the least
    recently used forgotten first (tools that evaluate many shapes)."""
    made = key not in _KEPT_DRAWS
    if made:
        _KEPT_DRAWS[key] = tuple(make())
        if len(_KEPT_DRAWS) > KEPT_LIMIT:
            _KEPT_DRAWS.popitem(last=False)
    else:
        _KEPT_DRAWS.move_to_end(key)
    return tuple(t.clone() for t in shared_by_streams(_KEPT_DRAWS[key], made))


def forget_kept() -> None:
    """Forget every kept tensor (:func:`kept_draws`): each key is made again at its next call."""
    _KEPT_DRAWS.clear()


@torch.library.custom_op("attention_zoo::seeded_normal", mutates_args=())
def seeded_normal(seed: int, shape: List[int], device: torch.device) -> torch.Tensor:
    """Standard normal draws of ``shape`` from a CPU generator seeded with ``seed``, on ``device`` (made
    once, :func:`kept_draws`): an operator, so that torch.compile keeps it whole (a Generator object
    cannot be traced). float32 whatever the caller computes in: a float64 computation casts these
    numbers, so it uses the draws its float32 twin does."""
    def make():
        return (torch.randn(shape, generator=torch.Generator(device="cpu").manual_seed(seed)).to(device),)

    return kept_draws(("normal", seed, tuple(shape), str(device)), make)[0]


@seeded_normal.register_fake
def _(seed, shape, device):
    return torch.empty(shape, device=device)


def draw_normal(module, shape, device) -> torch.Tensor:
    """Standard normal draws, float32 (see :func:`seeded_normal`): fresh from the global (seeded)
    generator in training, fixed per module in evaluation (from the ``rotation_seed`` the module drew
    at construction)."""
    if module.training:
        return torch.randn(shape, device=device)
    return seeded_normal(module.rotation_seed_value, list(shape), torch.device(device))


def sort_by_bucket(buckets: torch.Tensor, real: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Permutation [..., n] ordering positions by (bucket, position), padded positions last."""
    n = buckets.shape[-1]
    keys = torch.where(real, buckets, num_buckets) * n + torch.arange(n, device=buckets.device)
    return keys.argsort(dim=-1)


def hash_code_length(hash_code_len: Optional[int], max_seq_len: int) -> int:
    """YOSO's τ (YOSO-m and YOSO-E alike): ``hash_code_len`` when set, else ⌈log2⌉ of the padded
    length, as the paper's LRA runs (τ = 11 at 2,048)."""
    if hash_code_len is not None:
        return hash_code_len
    return max(1, math.ceil(math.log2(max(2, max_seq_len))))
