"""One YOSO call as the host issues it: the PyTorch ops in order, each with its host cost (in ops: one
PyTorch op dispatched from Python is 1, see :mod:`.host`) and the kernels it queues on the GPU.

The ops follow attention_zoo/yoso.py, attention_zoo/_common.py and csrc/yoso/yoso_cuda.cpp for one
``YosoAttention`` call on CUDA as ``lra.benchmarks.yoso_speed`` times it (q, k, v [1, B, n, d] with
gradients, the loss ``y.square().sum()``): the key mask cast and repeated per head, the hash draws, the
two hashes and the cumulation (torch.library custom ops; their kernels launched from C++), the output's
unit rows; backward the loss's gradient, the unit rows' backward, the operator's backward (q and k to
unit rows, the exact-weight kernels, the gradients back through the unit rows) and the three gradients
accumulated into q, k, v. A kernel that a YOSO operator launches itself (not through an ATen op) is
``raw``: the profiler books it to the operator (``Self CUDA``), ATen's to their own ops.

Under torch's deterministic algorithms every tensor ATen allocates uninitialised inside the operators (torch's
sorts' outputs; in the measured kernels the codes and the scan) is filled first
(torch.utils.deterministic.fill_uninitialized_memory); the kernels' own outputs (codes, unit rows, the scan,
the deterministic backward's gradients) are not.
An op's kernels are queued when its host work ends; an operator's own host time (its Python between its
ATen ops, which the profiler gives in total, not where it falls) is spread evenly over the ops it encloses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import List, Tuple

from lra.benchmarks.yoso_cost import kernels as yoso
from lra.benchmarks.yoso_cost.call import Call
from lra.benchmarks.yoso_cost.gpu import (H100, WARP, Kernel, Machine, l2_resident, memory_latency, streaming,
                                          structural)
from lra.benchmarks.yoso_cost.hashing import fast_hash

# Host cost of an op in PyTorch ops (1: an ATen op from Python). Read from the calibration trace's
# profiler columns (docs/gpu/2026-11-27b/trace.md, CPU total per call over aten::mul's 32.6 µs;
# :func:`.fit.host_weights` reads them again): a custom op's own Python (yoso_fast_hash's 105.6 µs less its
# at::empty), the training forward's autograd wrapper of yoso_sample (485 µs less the cumulation and
# new_ones), the backward node of yoso_sample (1,639 − 1,539 µs), the exact-weight operator's own Python and
# launches (its 430 µs of Self CPU), an autograd.Function's apply or backward around its ops (_UnitRows
# 157 µs less its 3 ops, _UnitRowsBackward 314 µs less its 7, averaged), at::sort (150 µs).
CUSTOM_OP, AUTOGRAD_WRAPPER, BACKWARD_NODE, EXACT_BACKWARD_OP, FUNCTION, SORT_OP = 2.2, 9.9, 3.1, 13.2, 2.2, 4.6


@dataclass(frozen=True)
class Op:
    name: str
    host: float  # PyTorch ops' worth of host time
    kernels: Tuple[Kernel, ...] = ()
    raw: Tuple[Kernel, ...] = ()  # launched by a YOSO operator from C++ (host: a launch each, :mod:`.host`)
    phase: str = "forward"


@dataclass(frozen=True)
class Step:
    """The ops of one call: ``forward`` (the module), ``loss`` and ``backward`` (a training step only)."""

    ops: Tuple[Op, ...]

    def kernels(self, *phases: str) -> List[Kernel]:
        return [k for op in self.ops if not phases or op.phase in phases for k in (*op.kernels, *op.raw)]


def elementwise(name: str, bytes_moved: float, machine: Machine, loads: int = 1, broadcast: bool = False) -> Kernel:
    """A PyTorch elementwise kernel over ``bytes_moved`` (read from ``loads`` tensors and written); with a
    broadcast operand ATen takes its generic path (elementwise_kernel<128, 2>: 2 elements a thread, the
    offsets computed per operand, no vector loads)."""
    kernel = streaming(name, bytes_moved, machine, loads=loads)
    if broadcast:
        elements = bytes_moved / (4 * (loads + 1))
        kernel = Kernel(name, blocks=max(1.0, elements / (2 * 128)), threads=128,
                        instructions=elements / WARP * 12 * (loads + 1), dram_bytes=kernel.dram_bytes,
                        l2_bytes=bytes_moved, chain=kernel.chain)
    return kernel


def row_reduction(name: str, rows: float, width: int, machine: Machine) -> Kernel:
    """ATen's reduce_kernel<512, 1> along a contiguous last dim of ``width`` floats (a norm or a sum per
    row): 512 threads, a row per 32 lanes (width ≤ 32: a lane's element, a warp's shuffle tree), 16 rows a
    block; a chain of the row's load, log2(32) shuffles, a shared-memory pass and the store."""
    bytes_read = rows * width * 4
    chain = 2 * memory_latency(l2_resident(bytes_read, machine), machine) + 7 * machine.shared_latency
    return Kernel(name, blocks=max(1.0, rows / 16), threads=512, registers=32, instructions=rows * 40,
                  dram_bytes=bytes_read * (1 - l2_resident(bytes_read, machine)), l2_bytes=bytes_read + rows * 4,
                  chain=chain)


def full_reduction(name: str, bytes_read: float, machine: Machine) -> Kernel:
    """A sum of a whole tensor to one value: bytes read once at streaming rate, then one block's tree."""
    kernel = streaming(name, bytes_read, machine)
    return Kernel(name, blocks=kernel.blocks, threads=256, instructions=kernel.instructions * 2,
                  dram_bytes=kernel.dram_bytes, l2_bytes=bytes_read, chain=4 * machine.dram_latency)


def filled(name: str, bytes_written: float, machine: Machine) -> Kernel:
    return streaming(name, bytes_written, machine, loads=0)


def torch_sort(c: Call, sides: int, machine: Machine) -> List[Kernel]:
    """``sort_rows`` (yoso_cuda.cpp): at::sort(stable) of [B·m, n] int32 codes along n, then the int64
    order to int32. Up to n = 4,096 ATen (Sort.cu, MediumRadixSort) sorts a row in one block: cub's block
    radix sort of 32-bit keys with int64 values, 4 bits a pass (8 passes), 16 keys a thread up to 2,048 and
    32 at 4,096 (the trace's radixSortKVInPlace<2, -1, 128, 32, …>: 128 threads × 32 keys); a key, its
    64-bit value and its rank in registers (4 a key, plus 64: an estimate), its exchange through shared
    memory. Per pass and warp of 32 keys, shared-memory wavefronts: the digit counted (a load and a
    store), ranked (a load), the key scattered (the most lanes on one bank: ~3.5 of 32 random positions)
    and gathered (1), the value scattered (8 bytes: ~5) and gathered (2): 14.5; its chain per pass: the
    counters of a thread's keys one after another (2 shared latencies a key) and the block's scan (16).
    Around it, per side: the codes copied into the output, the indices filled, the order converted (28
    bytes a key). Above 4,096: cub's segmented device radix sort, 5 passes of 24 bytes through DRAM per key."""
    keys = sides * c.pairs * c.n
    name = f"sort codes ({'q, k' if sides == 2 else 'k'})"
    sizes = 2 * keys * 4 + keys * 8 * 2  # the sort's keys and values in and out
    aux = [elementwise(f"{name}: codes copied", keys * 8, machine),
           filled(f"{name}: indices filled", keys * 8, machine),
           elementwise(f"{name}: order to int32", keys * 12, machine)]
    if c.n <= 4096:
        items = 32 if c.n > 2048 else 16
        threads = max(WARP, 2 ** math.ceil(math.log2(c.n)) // items)
        sort = Kernel(name, blocks=c.pairs, threads=threads, launches=sides, registers=min(255, 4 * items + 64),
                      shared_bytes=threads * items * 8, instructions=keys * 8 * 30 / WARP,
                      shared_wavefronts=keys * 8 * 14.5 / WARP,
                      dram_bytes=sizes * (1 - l2_resident(sizes, machine)), l2_bytes=sizes,
                      chain=2 * machine.dram_latency + 8 * (items * 2 + 16) * machine.shared_latency,
                      loaded=sizes / 2, stored=sizes / 2)
    else:
        per_key = 5 * 24
        sort = Kernel(name, blocks=keys / 2048, threads=256, launches=sides * 5, registers=64,
                      instructions=keys * 5 * 20 / WARP, dram_bytes=keys * per_key, l2_bytes=keys * per_key,
                      chain=8 * 40 * machine.shared_latency + 2 * machine.dram_latency,
                      loaded=keys * per_key / 2, stored=keys * per_key / 2)
    return [sort, *aux]


def _unit_rows(c: Call, what: str, dim: int, machine: Machine, phase: str, host_extra: float = 0.0) -> Op:
    """x / max(‖x‖, eps) of [B, n, dim]: the norm, its clamp, the broadcast division."""
    floats = c.B * c.n * dim
    return Op(f"{what}: unit rows", 3 + host_extra,
              (row_reduction(f"{what}: norm", c.B * c.n, dim, machine),
               elementwise(f"{what}: clamp", c.B * c.n * 8, machine),
               elementwise(f"{what}: divided", floats * 8, machine, broadcast=True)), phase=phase)


def _through_unit_rows(c: Call, what: str, dim: int, machine: Machine, host_extra: float = 0.0) -> Op:
    """through_unit_rows: (g − y (g·y)) / max(‖x‖, eps): a product, a row sum, a mask, addcmul, a clamp and
    the broadcast division in place."""
    floats, rows = c.B * c.n * dim, c.B * c.n
    return Op(f"{what}: gradient through the unit rows", 7 + host_extra,
              (elementwise(f"{what}: g·y products", floats * 12, machine, loads=2),
               row_reduction(f"{what}: g·y", rows, dim, machine),
               elementwise(f"{what}: small norms", rows * 5, machine),
               elementwise(f"{what}: masked", rows * 9, machine),
               elementwise(f"{what}: addcmul", floats * 12 + rows * 4, machine, loads=2, broadcast=True),
               elementwise(f"{what}: clamp", rows * 8, machine),
               elementwise(f"{what}: divided", floats * 8, machine, broadcast=True)), phase="backward")


def _bf16_casts(c: Call, rows: Tuple[str, ...], machine: Machine) -> Tuple[Kernel, ...]:
    """With bf16 rows, each of ``rows`` ([B, n, dv]) rounded to bfloat16 before the kernels read it (rows_read)."""
    return tuple(elementwise(f"{x} rounded to bf16", c.B * c.n * c.dv * 6, machine) for x in rows) if c.bf16_rows else ()


def _empties(name: str, bytes_each: List[float], deterministic: bool, machine: Machine) -> Tuple[Kernel, ...]:
    return tuple(filled(f"{name}: filled (deterministic)", b, machine) for b in bytes_each) if deterministic else ()


def sorted_codes(c: Call, sides: int, starts_sides: int, deterministic: bool,
                 machine: Machine) -> Tuple[float, Tuple[Kernel, ...], Tuple[Kernel, ...]]:
    """yoso_cuda_host.cpp's sorted_by_code for ``sides`` sides, the run starts of ``starts_sides`` of them:
    (host ops, ATen's kernels, the operator's own). The counting sort: one launch a side. Else torch's sort
    (its outputs filled first under deterministic algorithms), then the run starts."""
    if yoso.counted(c, machine):
        return 0.0, (), (yoso.counting_sort(c, sides, starts_sides, machine),)
    codes = c.pairs * c.n * 4
    fills = _empties("sort outputs", [codes, 2 * codes, codes] * sides, deterministic, machine)
    return sides * (SORT_OP + 1), (*torch_sort(c, sides, machine), *fills), tuple(yoso.run_starts(c, starts_sides,
                                                                                                   machine))


def forward_ops(c: Call, atomic: bool, machine: Machine = H100, grad: bool = True) -> List[Op]:
    """The module's forward: under autograd (a training step) or without (``grad=False``)."""
    deterministic = not atomic
    codes = c.pairs * c.n * 4
    wrapper = CUSTOM_OP + (AUTOGRAD_WRAPPER if grad else 0)  # yoso_sample's own: half before the cumulation, half after
    draws = c.B * c.products * 3 * c.padded
    ops = [Op("key mask cast and repeated per head", 2, (elementwise("mask cast", c.n * 5, machine),
                                                           elementwise("mask repeated", c.B * c.n * 8, machine))),
           Op("hash draws (randint, ×2, −1, float)", 4, tuple(elementwise(f"draws {i}", draws * 16, machine)
                                                            for i in range(4))),
           Op("hash q, k (2 custom ops)", 2 * (CUSTOM_OP + 1),  # (codes unfilled since the measured kernels)
              _empties("codes", [codes, codes], deterministic and c.measured_kernels, machine),
              raw=(fast_hash(c, machine),)),
           Op("yoso_sample (custom op)", wrapper / 2 + 1,
              (filled("ones", c.B * c.n * 4, machine),))]
    zeros = filled("cumulation output zeroed", c.B * c.n * c.dv * 4, machine)
    casts = _bf16_casts(c, ("v",), machine)
    if atomic and yoso.table_rows(c.bits, most_slices=c.most_slices):
        ops.append(Op("yoso_cumulation (custom op)", CUSTOM_OP + 1 + len(casts), (*casts, zeros),
                      raw=(yoso.slice_lists(c, machine), yoso.table_cumulation(c, machine))))
    else:
        direct, _, _ = yoso.cumulation_plan(c, atomic)
        host, sort, sort_raw = (0.0, (), ()) if direct else sorted_codes(c, 1, 1, deterministic, machine)
        cumulate = ((yoso.rows_cleared(c, machine), yoso.scatter_rows(c, machine)) if atomic
                    else (yoso.bucket_rows(c, machine),))
        ops.append(Op("yoso_cumulation (custom op)", CUSTOM_OP + 1 + host + len(casts), (*casts, zeros, *sort),
                      raw=(*sort_raw, *cumulate, yoso.gather_rows(c, atomic, machine))))
    if c.measured_kernels:  # the output normalized by _UnitRows, an autograd.Function of PyTorch's passes
        ops.append(_unit_rows(c, "output", c.dv, machine, "forward", wrapper / 2 + FUNCTION))
    else:  # by the operator's kernel, one launch
        ops.append(Op("output: unit rows (in yoso_sample)", wrapper / 2 + 1,
                      raw=(yoso.unit_rows(c, False, machine, output=True),)))
    return ops


def loss_ops(c: Call, machine: Machine = H100) -> List[Op]:
    floats = c.B * c.n * c.dv
    return [Op("loss: square, sum", 2, (elementwise("square", floats * 8, machine),
                                        full_reduction("sum", floats * 4, machine)), phase="loss")]


def backward_ops(c: Call, atomic: bool, machine: Machine = H100) -> List[Op]:
    """The autograd engine's nodes in order (each its node's host cost with its ops)."""
    deterministic = not atomic
    floats, codes = c.B * c.n * c.dv, c.pairs * c.n * 4
    share = (BACKWARD_NODE + EXACT_BACKWARD_OP) / 5  # the operator's own host time, spread over its 5 parts
    # The kernels normalize q, k and the output themselves (yoso_cuda_rows.cu); the measured kernels took
    # PyTorch's passes (the output's in an autograd.Function).
    normalized_by_torch = c.measured_kernels
    ops = [Op("loss gradient: ones, square's backward", 4, (filled("ones", 4, machine),
                                                            elementwise("pow", floats * 8, machine),
                                                            elementwise("×2", floats * 8, machine),
                                                            elementwise("× grad", floats * 12, machine, loads=2)),
              phase="backward"),
           _through_unit_rows(c, "output", c.dv, machine, FUNCTION) if normalized_by_torch else
           Op("output: gradient through the unit rows (custom op)", CUSTOM_OP + 1,
              raw=(yoso.unit_rows(c, True, machine, output=True),), phase="backward")]
    if normalized_by_torch:
        ops += [_unit_rows(c, "q", c.d, machine, "backward", share), _unit_rows(c, "k", c.d, machine, "backward", share)]
    sides = (("q", c.d), ("k", c.d), ("v", c.dv))
    # The gradients: zeroed by at::zeros in the measured kernels; now unfilled, the deterministic kernels writing
    # every row, the atomic ones adding into rows the host logic zeroes (cudaMemsetAsync, launched from C++).
    zeroed = tuple(filled(f"∇{x} zeroed", c.B * c.n * dim * 4, machine) for x, dim in sides)
    grads = zeroed if c.measured_kernels else ()
    sort_host, sorts, sort_raw = sorted_codes(c, 2, 1 if atomic else 2, deterministic, machine)
    sorts = (*_bf16_casts(c, ("v", "∇Y"), machine), *sorts)
    raw: List[Kernel] = [*sort_raw] if normalized_by_torch else [yoso.unit_rows(c, False, machine), *sort_raw]
    if atomic and not c.measured_kernels:
        raw = [*zeroed, *raw]
    host = 3 * c.measured_kernels + sort_host + (share if normalized_by_torch else 5 * share) + 2 * c.bf16_rows
    if yoso.heavy_capacity(c) > 0:
        raw += [yoso.find_heavy(c, machine), yoso.number_heavy(c, machine),
                yoso.heavy_grid(c, "heavy tables (none with uniform codes)", machine)]
        sorts += (streaming("heavy runs counted (torch.cumsum)", c.pairs * c.n * 8, machine, launches=2),
                  *_empties("scan", [codes], deterministic and c.measured_kernels, machine))
        host += 1
    if atomic:
        raw.append(yoso.scatter_pairs(c, machine))
        if yoso.heavy_capacity(c) > 0:
            raw.append(yoso.heavy_grid(c, "atomic: heavy tables applied (none)", machine, 42))
    else:
        raw += [yoso.token_gradients(c, "query", machine), yoso.token_gradients(c, "key", machine)]
    if not normalized_by_torch:
        raw.append(yoso.unit_rows(c, True, machine))
    ops.append(Op("exact-weight kernels", host, (*grads, *sorts), raw=tuple(raw), phase="backward"))
    if normalized_by_torch:
        ops += [_through_unit_rows(c, "q", c.d, machine, share), _through_unit_rows(c, "k", c.d, machine, share)]
    ops += [Op("gradients accumulated into q, k, v", 3,
               tuple(elementwise(f"{x}.grad +=", c.B * c.n * dim * 12, machine, loads=2) for x, dim in sides),
               phase="backward")]
    return ops


def step(c: Call, atomic: bool, machine: Machine = H100, training: bool = True) -> Step:
    """A training step's ops (forward under autograd, loss, backward), or a forward without autograd (built
    once per shape and machine: the fitted constants do not enter a kernel's description)."""
    return _step(c, atomic, structural(machine), training)


@lru_cache(maxsize=512)
def _step(c: Call, atomic: bool, machine: Machine, training: bool) -> Step:
    if not training:
        return Step(tuple(forward_ops(c, atomic, machine, grad=False)))
    return Step(tuple(forward_ops(c, atomic, machine) + loss_ops(c, machine) + backward_ops(c, atomic, machine)))


