"""Several runs in one process, their steps interleaved, so that one GPU runs their kernels at once.

:func:`run_packed` runs K jobs (``hydra/launcher=packed`` gives it a sweep's jobs, K at a time). Each job
runs in a thread of its own through exactly the code it runs alone (its folder, record, checkpoints,
resume, signal handling and failure handling), and a turn passes between the threads so that one runs
at a time: a job hands the turn on after each training step and each evaluation batch
(:func:`take_turn`), and with it the process's global state (:class:`ProcessState`: the Python, NumPy,
torch and CUDA random generators, torch's deterministic-algorithms setting, the warning hook a run's
:class:`lra.determinism.NondeterminismLog` installs; on CUDA each job has a generator state object of its
own, which its captured graphs read at replay). Every job therefore draws the same random numbers
and computes the same values as alone: on CPU a packed run equals the run alone bit for bit (deterministic
mode). On CUDA each job queues its kernels on a stream of its own, so the GPU runs one job's step while the
host queues the next job's; one job's kernels alone fill a fraction of a GPU at the LRA reference sizes.

A job that fails (a diverged loss, an out-of-memory error, a bug) fails alone: its record says so, as it
would in a sweep, and the other jobs go on. A signal to the process stops every job at its next turn,
each recording ``interrupted``; the pack then raises the interruption. What a run measures of its own time
in a pack: ``wall_time_seconds`` is the pack's wall time while it trained, ``gpu_seconds`` its share of the
GPU (:mod:`lra.gpus` counts each packed run), ``train_tokens_per_second`` its tokens over the time its own
steps took (including waits for the device), ``peak_memory_mb`` the process's peak, all its runs together.
A job that ends the sweep (its folder another run's: a SystemExit) lets the started jobs finish and
keeps the others from starting; a signal stops the started jobs at their next turn and starts no other
(the main thread takes a signal within milliseconds: one in the pack's first round may still see a
job start, which then stops at its first turn, its record interrupted).
The working directory is the process's, so the packed launcher refuses ``hydra.job.chdir=true``.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from lra import signals

_here = threading.local()  # .pack, .index: the pack and job this thread runs, where it runs one


def in_pack() -> bool:
    """Whether this thread runs a job of a pack."""
    return getattr(_here, "pack", None) is not None


def take_turn() -> None:
    """Let the pack's next job run a step (nothing outside a pack). Raises :class:`lra.signals.Interrupted`
    once the process was signalled, so that the job stops as it would alone."""
    pack = getattr(_here, "pack", None)
    if pack is not None:
        pack.pass_turn(_here.index)


@dataclass
class ProcessState:
    """What a job changes of the process besides its own objects: restored whenever it takes its turn."""

    rng: dict
    deterministic: tuple  # (enabled, warn_only)
    showwarning: Callable

    @classmethod
    def capture(cls) -> "ProcessState":
        import torch

        from lra.checkpoint import rng_states

        return cls(rng_states(), (torch.are_deterministic_algorithms_enabled(),
                                  torch.is_deterministic_algorithms_warn_only_enabled()), warnings.showwarning)

    def restore(self) -> None:
        import torch

        from lra.checkpoint import restore_rng_states

        restore_rng_states(self.rng)
        torch.use_deterministic_algorithms(self.deterministic[0], warn_only=self.deterministic[1])
        warnings.showwarning = self.showwarning


@dataclass
class Outcome:
    """A job's return value, or what it raised."""

    value: Any = None
    error: Optional[BaseException] = None
    started: bool = False  # False: left out, as the pack was stopped or ended before its turn came


class Pack:
    def __init__(self, jobs: Sequence[Callable[[], Any]], cuda_device: Optional[int] = None):
        self.jobs = list(jobs)
        self.cuda_device = cuda_device  # the GPU the jobs train on: each job queues on a stream of its own there
        self.outcomes = [Outcome() for _ in self.jobs]
        self.stopping: Optional[int] = None  # the signal that stops the pack
        self.closed = False  # a job ended the sweep: the jobs not yet started are left out
        self._turn = threading.Condition()
        self._holder: Optional[int] = None
        self._live: List[int] = []
        self._states: List[Optional[ProcessState]] = []
        self._generator = None  # on CUDA, the device's default generator, and each job's own state of it
        self._generators: list = []  # (torch's graph-safe states)

    def run(self) -> List[Outcome]:
        """Every job to its end; then the process's state as it was before. Raises the signal's
        :class:`lra.signals.Interrupted` after every job has stopped, if one came."""
        base = ProcessState.capture()
        self._states = [base] * len(self.jobs)
        original = None
        if self.cuda_device is not None:
            # A generator state of its own for each job's CUDA draws: a captured graph reads the state it was
            # captured with at every replay (torch 2.11 shares one across graphs and fills it at each replay),
            # so jobs sharing one would draw each other's numbers while their graphs overlap on the GPU.
            import torch

            self._generator = torch.cuda.default_generators[self.cuda_device]
            original = self._generator.graphsafe_get_state()
            self._generators = [self._generator.clone_state() for _ in self.jobs]
        self._live, self._holder = list(range(len(self.jobs))), 0
        threads = [threading.Thread(target=self._job, args=(index,), name=f"lra-pack-{index}", daemon=True)
                   for index in range(len(self.jobs))]
        with signals.on_interruption(self.stop):
            try:
                with signals.deferred():  # every thread started: the turn must be able to reach each
                    for thread in threads:
                        thread.start()
            except KeyboardInterrupt as exc:
                self.stop(signals.as_interrupted(exc).signal_number)
            # Until every job has ended (its record written): not Thread.join, which a signal's exception raised
            # inside it leaves reporting a running thread as stopped (Python 3.11).
            while True:
                try:
                    with self._turn:
                        self._turn.wait_for(lambda: not self._live)
                    break
                except KeyboardInterrupt as exc:  # the jobs stop at their next turn (stop, the hook above)
                    self.stop(signals.as_interrupted(exc).signal_number)
        if self._generator is not None:
            self._generator.graphsafe_set_state(original)
        base.restore()
        if self.stopping is not None:
            raise signals.Interrupted(self.stopping)
        return self.outcomes

    def stop(self, signal_number: int) -> None:
        if self.stopping is None:
            self.stopping = signal_number

    def pass_turn(self, index: int) -> None:
        self._stop_here()
        self._states[index] = ProcessState.capture()
        with self._turn:
            self._holder = self._after(index)
            self._turn.notify_all()
        self._wait_for_turn(index)
        self._stop_here()

    # ------------------------------------------------------------------ the turn
    def _job(self, index: int) -> None:
        _here.pack, _here.index = self, index
        try:
            self._wait_for_turn(index)
            if self.stopping is not None or self.closed:  # a signal, or the sweep ended by a job: no new job starts
                return
            self.outcomes[index].started = True
            if self.cuda_device is not None:
                import torch

                torch.cuda.set_device(self.cuda_device)
                torch.cuda.set_stream(torch.cuda.Stream(self.cuda_device))
            self.outcomes[index].value = self.jobs[index]()
        except BaseException as exc:  # kept for the launcher: the job's own handling has recorded it
            self.outcomes[index].error = exc
            # Not an error a job of a sweep records and the sweep goes on from (SystemExit: a folder that is
            # another run's, which ends the sweep at that job): the jobs that have not started never do.
            self.closed = self.closed or not isinstance(exc, Exception)
        finally:
            with self._turn:
                self._live.remove(index)
                self._holder = self._after(index) if self._live else None
                self._turn.notify_all()

    def _after(self, index: int) -> int:
        """The live job after ``index`` in turn order (``index`` itself when it is the only one)."""
        later = [i for i in self._live if i > index]
        return later[0] if later else self._live[0]

    def _wait_for_turn(self, index: int) -> None:
        with self._turn:
            self._turn.wait_for(lambda: self._holder == index)
        if self._generators:  # the job's own CUDA generator state first: restore() writes its seed and offset
            self._generator.graphsafe_set_state(self._generators[index])
        self._states[index].restore()

    def _stop_here(self) -> None:
        if self.stopping is not None:
            raise signals.Interrupted(self.stopping)


def run_packed(jobs: Sequence[Callable[[], Any]], cuda_device: Optional[int] = None) -> List[Outcome]:
    """Run ``jobs`` packed in this process (module docstring); their outcomes in order."""
    return Pack(jobs, cuda_device).run()


def gpu_index(device) -> Optional[int]:
    """The GPU a pack's jobs train on, from their torch.device (``cuda`` without an index: the current one);
    None for the CPU."""
    if device.type != "cuda":
        return None
    import torch

    return device.index if device.index is not None else torch.cuda.current_device()


def pack_size(setting: Any, jobs: int, device: Optional[int] = None) -> int:
    """Jobs per pack: ``setting`` (a whole number ≥ 1), or for ``auto`` what the GPU ``device`` holds: a
    job per 16 SMs and per 8 GiB of GPU memory (8 on an H100 80GB; an LRA reference run needs under 2 GiB),
    1 for jobs on the CPU (``device`` None: a CPU gains nothing from packing); never more than ``jobs``."""
    if setting == "auto":
        if device is None:
            return 1
        import torch

        props = torch.cuda.get_device_properties(device)
        setting = max(1, min(props.multi_processor_count // 16, props.total_memory // (8 << 30)))
    return max(1, min(int(setting), jobs))
