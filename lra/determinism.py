"""Whether a run was bitwise repeatable, decided here once and recorded with the run.

``trainer.deterministic=true`` sets ``torch.use_deterministic_algorithms(True, warn_only=True)``:
an op without a deterministic implementation (a CUDA scatter-add with float atomics, say) then
warns instead of stopping the run. The warning alone scrolls away; :class:`NondeterminismLog`
collects the ops it names, so that the record says which ops made the run non-repeatable. YOSO's
CUDA kernels read the same setting at each call: with deterministic algorithms on they take the
sorted path (one writer per output, no float atomics), off the authors' atomicAdd cumulation
(csrc/yoso/yoso_cuda.cpp); so they never alert, and the record's ``deterministic`` says which ran."""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Iterator, List

# PyTorch's alert: "<op> does not have a deterministic implementation, but you set
# 'torch.use_deterministic_algorithms(True, warn_only=True)'..."
ALERT = re.compile(r"^(?P<op>\S+) does not have a deterministic implementation")


class NondeterminismLog:
    """Within ``with log:``, PyTorch's non-determinism alerts are shown as usual and their ops kept in
    ``log.ops`` (in order, once each)."""

    def __init__(self) -> None:
        self.ops: List[str] = []
        self._shown = None

    def __enter__(self) -> "NondeterminismLog":
        self._shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            found = ALERT.match(str(message))
            if found and found["op"] not in self.ops:
                self.ops.append(found["op"])
            self._shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        return self

    def __exit__(self, *exc) -> None:
        warnings.showwarning = self._shown

    def repeatable(self, requested: bool) -> bool:
        """Bitwise repeatable: deterministic algorithms were asked for and no op alerted."""
        return requested and not self.ops


@contextlib.contextmanager
def deterministic_algorithms(on: bool) -> Iterator[None]:
    """torch's deterministic algorithms ``on`` or off (warn-only, as the trainer sets them) within the
    block, and as they were after it: how a benchmark measures the path a training run would take."""
    import torch

    previous = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
