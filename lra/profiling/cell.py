"""One ``lra-profile`` cell — a backend at one sequence length — measured in its own process, so that
its peak memory is its own and an out-of-memory failure is a recorded cell, not a crash.

    python -m lra.profiling.cell '<json spec>'      (prints one JSON row)

Per instance (times and memory divided by the batch): forward time in training mode, backward time,
the training step (forward + backward), the backward cache (memory held between forward and
backward), the training peak (one forward + backward) and the inference peak (one forward under
``torch.no_grad``), peaks and times as :mod:`lra.profiling.measure` defines them. Each time is the
median of ``repeats`` calls after a warm-up, with the spread of the training step's and inference's
calls (slowest ÷ fastest; none for one call). Memory is what torch's tensors hold, on a CPU too (its
allocator's events), not the process. The backward cache: CUDA, the allocation held after the forward;
CPU, the bytes of the tensors autograd saves (``saved_tensors_hooks``, each storage once, inputs excluded).
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from typing import Dict

from lra.benchmarks import peaks
from lra.profiling.measure import MB, Timing, repeated, step_peak_bytes, synchronize


def measure(spec: Dict) -> Dict:
    """Time and memory of ``spec['backend']`` at ``spec['n']`` with ``spec['batch']`` instances."""
    import torch

    import attention_zoo

    device, n, batch = torch.device(spec["device"]), spec["n"], spec["batch"]
    heads, head_dim, repeats = spec["num_heads"], spec["head_dim"], spec["repeats"]
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    attend = attention_zoo.build(spec["backend"], num_heads=heads, head_dim=head_dim, max_seq_len=n,
                                 **spec.get("options", {})).to(device)
    q, k, v = (torch.randn(batch, heads, n, head_dim, device=device, requires_grad=True) for _ in range(3))
    mask = torch.ones(batch, n, dtype=torch.bool, device=device)

    def sync() -> None:
        synchronize(device)

    def loss_of(out):
        loss = out.float().square().mean()
        return loss + attend.aux_loss if getattr(attend, "aux_loss", None) is not None else loss

    attend.eval()
    with torch.no_grad():  # one warm-up: kernels built, caches filled, before anything is measured
        inference = Timing(repeated(lambda: attend(q, k, v, mask), device, repeats))
        inference_peak = step_peak_bytes(lambda: attend(q, k, v, mask), device)

    attend.train()
    loss_of(attend(q, k, v, mask)).backward()  # warm-up of the training path
    q.grad = k.grad = v.grad = None
    forward_times, backward_times, caches = [], [], []
    for _ in range(repeats):  # forward and backward timed apart, as repeated() would time each
        before = torch.cuda.memory_allocated(device) if cuda else 0
        saved: Dict[int, int] = {}

        def pack(tensor):  # CPU: the backward cache is what autograd saves (each storage once)
            if not cuda and tensor.device.type == "cpu":
                storage = tensor.untyped_storage()
                saved[storage.data_ptr()] = storage.nbytes()
            return tensor

        sync()
        started = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = loss_of(attend(q, k, v, mask))
        sync()
        middle = time.perf_counter()
        inputs = {t.untyped_storage().data_ptr() for t in (q, k, v, mask)}
        held = sum(size for pointer, size in saved.items() if pointer not in inputs)
        caches.append(torch.cuda.memory_allocated(device) - before if cuda else held)
        loss.backward()
        sync()
        forward_times.append(middle - started)
        backward_times.append(time.perf_counter() - middle)
        del loss
        q.grad = k.grad = v.grad = None
    training_peak = step_peak_bytes(lambda: loss_of(attend(q, k, v, mask)).backward(), device)
    q.grad = k.grad = v.grad = None
    per = 1.0 / batch
    step = Timing([f + b for f, b in zip(forward_times, backward_times)])

    def spread(timing: Timing):
        return None if len(timing.seconds) < 2 else timing.spread

    # The sanity gate: q, k, v and the output read or written, their gradients in the backward, at least.
    achieved = peaks.rates(torch.cuda.get_device_name(device) if cuda else None, step.median,
                           bytes_moved=peaks.io_bytes(8, batch * heads * n * head_dim))
    return {
        "backend": spec["backend"], "label": attention_zoo.label(spec["backend"], **spec.get("options", {})),
        "n": n, "batch": batch, "device": str(device),
        "forward_ms": Timing(forward_times).median * 1e3 * per,
        "backward_ms": Timing(backward_times).median * 1e3 * per,
        "step_ms": step.median * 1e3 * per, "inference_ms": inference.median * 1e3 * per,
        "backward_cache_mb": max(min(caches), 0) / MB * per, "training_peak_mb": max(training_peak, 0) / MB * per,
        "inference_peak_mb": max(inference_peak, 0) / MB * per, "repeats": repeats, "step_spread": spread(step),
        "inference_spread": spread(inference), "step_gbps": achieved["gbps"], "error": None,
    }


def _failure(spec: Dict, exc: BaseException) -> Dict:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = message.lower()
    oom = isinstance(exc, MemoryError) or "out of memory" in lowered or (
        "memory" in lowered and ("allocate" in lowered or "not enough" in lowered))
    return {"backend": spec["backend"], "n": spec["n"], "batch": spec["batch"],
            "error": "out of memory" if oom else message}


def kernels_unavailable(spec: Dict, fallback: Warning) -> str:
    """The recorded error of a cell whose backend would have fallen back from the compiled kernels."""
    from attention_zoo import _yoso_build

    kind = spec["device"].split(":")[0]
    reason = str(fallback)
    if kind in ("cpu", "cuda"):
        try:
            _yoso_build.load(kind)
        except _yoso_build.KernelUnavailable as error:
            reason = str(error)
    return (f"the compiled YOSO kernels are unavailable, so this cell would time the PyTorch fallback, not them: "
            f"{reason} (build them first: lra-build-kernels {kind})")


def main() -> None:
    """Measure ``spec['lengths']`` in ascending order, one JSON row per line as each finishes; after an
    out-of-memory failure the longer lengths are recorded as out of memory without trying them. A
    backend that would fall back from its compiled kernels (a :class:`KernelFallbackWarning`) is a
    failed cell at every length: its time would be the fallback's, under the kernels' label."""
    from attention_zoo._yoso_ops import KernelFallbackWarning
    from lra.faults import fault_point

    fault_point("profile_cell")  # test hook: a cell process that dies
    spec = json.loads(sys.argv[1])
    lengths = sorted(spec.pop("lengths", [spec.get("n")]))
    failed = None
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFallbackWarning)
        for n in lengths:
            cell = spec | {"n": n}
            if failed is not None:
                row = failed | {"n": n}
            else:
                try:
                    row = measure(cell)
                except KernelFallbackWarning as fallback:  # warned once a process: the later lengths too
                    failed = row = {"backend": cell["backend"], "n": n, "batch": cell["batch"],
                                    "error": kernels_unavailable(cell, fallback)}
                except (RuntimeError, MemoryError) as exc:  # torch's out-of-memory errors are RuntimeErrors
                    row = _failure(cell, exc)
                    failed = row if row["error"] == "out of memory" else None
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
