"""Jobs on local GPUs, and the GPU time a run used.

k jobs per GPU on a local machine (k = 1 by default): a job claims a free slot of a GPU through an
exclusive lock file, held until the process exits, so parallel sweep jobs (``hydra/launcher=local_gpus``,
``hydra.launcher.jobs_per_gpu=k``) never put more than k jobs on a GPU, fill every GPU's first slot
before any second one, and a waiting job starts the moment a slot is released.

How a run's GPU time is measured is decided here, once (:class:`GpuClock`; :mod:`lra.training` writes it
to the record as ``gpu_seconds``, beside ``gpu_name``): its wall time on a CUDA device, each stretch of it
weighted by the run's share of that GPU, 1/k while k runs train on the GPU at once, so that the
GPU-seconds of the runs that shared a GPU add up to the time the GPU spent on them. k is counted, not
configured: every run that trains on a GPU registers on it while it trains (a file under
``lock_dir()/occupancy/<the GPU's UUID>/``, held under an exclusive lock, so a run killed outright stops
counting the moment its process ends), and k is the number of registrations held when the record is
written (every ``trainer.log_every`` steps and at each evaluation), the stretch since the last write
charged at that share. Counting sees what ran, where ``hydra.launcher.jobs_per_gpu`` only caps it: a
sweep's last jobs alone on the GPU, fewer jobs than slots, runs started by hand, runs packed in one
process (each registers). It counts the runs of this user on this machine (the lock folder's reach), not
other programs on the GPU. A run of several processes (DDP, a GPU each) counts its own process's GPU time
times the number of processes. ``gpu_seconds`` is null on CPU, and for a run resumed from a checkpoint
written before the field existed (its earlier GPU time is unknown)."""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator, Optional, Tuple

_HELD: list = []  # lock files held for the life of the process


def lock_dir() -> Path:
    return Path(os.environ.get("LRA_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / f"lra-gpu-locks-{os.getuid()}"))


def slots_per_gpu() -> int:
    """Jobs that may share one GPU: ``LRA_JOBS_PER_GPU``, set by the local_gpus launcher."""
    value = os.environ.get("LRA_JOBS_PER_GPU", "1")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"LRA_JOBS_PER_GPU={value!r}: it must be a whole number >= 1 (hydra.launcher.jobs_per_gpu)")
    return int(value)


def try_claim(count: int, folder: Optional[Path] = None, slots: int = 1) -> Optional[Tuple[int, IO]]:
    """The GPU of the first free slot, with its open lock file; None if all ``count`` × ``slots`` are
    taken. Slot 0 of every GPU comes before slot 1 of any, so the jobs spread over the GPUs."""
    folder = Path(folder or lock_dir())
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(slots):
        for index in range(count):
            handle = open(folder / (f"gpu{index}.lock" if slot == 0 else f"gpu{index}.slot{slot}.lock"), "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            return index, handle
    return None


def claim(count: int, announce: Callable[[str], None] = print, poll_seconds: float = 5.0) -> int:
    """Block until one of ``count`` GPUs is free; keep its lock until this process exits. A process
    that already holds one (a launcher's worker running its next job) keeps using it."""
    if _HELD:
        return _HELD[0][0]
    waited, slots = False, slots_per_gpu()
    while True:
        claimed = try_claim(count, slots=slots)
        if claimed is not None:
            index, handle = claimed
            _HELD.append((index, handle))
            if waited:
                announce(f"GPU {index} became free")
            return index
        if not waited:
            announce(f"all {count} GPUs are busy with other jobs ({slots} per GPU); waiting for one to be released")
            waited = True
        time.sleep(poll_seconds)


# ----------------------------------------------------------------------------- the GPU time of a run
OCCUPANCY = "occupancy"  # lock_dir()/occupancy/<GPU UUID>/<a run>.run: the runs training on that GPU now
REGISTRATION = ".run"


class Occupancy:
    """The runs registered on one GPU (``key``: its UUID, the same whatever ``CUDA_VISIBLE_DEVICES`` calls it),
    and this run's own registration while it is held (:meth:`registered`)."""

    def __init__(self, key: str, folder: Optional[Path] = None):
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key).lstrip(".") or "gpu"
        self.folder = Path(folder or lock_dir()) / OCCUPANCY / safe

    @contextmanager
    def registered(self) -> Iterator[None]:
        """Count this run on the GPU until the block ends (or the process does)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        # locked under a temporary name first: a count never finds the registration unlocked and removes it
        descriptor, temporary = tempfile.mkstemp(dir=self.folder, prefix=".", suffix=".tmp")
        handle = os.fdopen(descriptor, "rb")
        path = self.folder / (Path(temporary).name.removeprefix(".").removesuffix(".tmp") + REGISTRATION)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            os.replace(temporary, path)
            yield
        finally:
            for name in (temporary, path):
                Path(name).unlink(missing_ok=True)
            handle.close()

    def runs(self) -> int:
        """How many runs hold a registration on the GPU now; a registration nobody holds (its run was killed
        outright) is removed."""
        count = 0
        for path in self.folder.glob("*" + REGISTRATION):
            try:
                handle = open(path, "rb")
            except OSError:  # removed meanwhile: its run ended
                continue
            with handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    count += 1
                    continue
                path.unlink(missing_ok=True)
        return count


class GpuClock:
    """A stage's GPU-seconds (see the module's note): :meth:`running` around its training, :meth:`advance`
    at each write of its record. ``key``: the GPU's UUID, None off a GPU; ``name``: the GPU's name for the
    record (``gpu_name``); ``processes``: the run's processes, a GPU each."""

    def __init__(self, key: Optional[str], name: Optional[str], processes: int = 1, folder: Optional[Path] = None):
        self.name, self.processes = name, processes
        self.occupancy = Occupancy(key, folder) if key is not None else None
        self._last_wall: Optional[float] = None  # the stage's wall time at the last advance (None: not training)
        self._known = True  # whether the stage's GPU time before this session is known

    @classmethod
    def of(cls, device, processes: int = 1) -> "GpuClock":
        """The clock of a run training on ``device`` (a torch.device)."""
        if device.type != "cuda":
            return cls(None, None, processes)
        import torch

        return cls(str(torch.cuda.get_device_properties(device).uuid), torch.cuda.get_device_name(device), processes)

    @contextmanager
    def running(self, wall_seconds: float, gpu_seconds: Optional[float]) -> Iterator["GpuClock"]:
        """While the stage trains, from its wall time and GPU-seconds so far (a resume's checkpoint: a GPU
        time of None after wall time is unknown, and stays so)."""
        self._last_wall, self._known = wall_seconds, gpu_seconds is not None or wall_seconds == 0
        try:
            if self.occupancy is None:
                yield self
            else:
                with self.occupancy.registered():
                    yield self
        finally:
            self._last_wall = None

    def share(self) -> float:
        """This run's share of its GPU now: 1 / the runs training on it."""
        return 1.0 / max(1, self.occupancy.runs()) if self.occupancy is not None else 0.0

    def advance(self, gpu_seconds: Optional[float], wall_seconds: float) -> Optional[float]:
        """The stage's GPU-seconds once its wall time is ``wall_seconds``, from ``gpu_seconds`` at the last
        advance: the wall time since then, at the current share, times the processes. None off a GPU or
        when unknown; unchanged outside :meth:`running`."""
        if self.occupancy is None or not self._known:
            return None
        if self._last_wall is None:
            return gpu_seconds
        elapsed, self._last_wall = max(0.0, wall_seconds - self._last_wall), wall_seconds
        return (gpu_seconds or 0.0) + elapsed * self.share() * self.processes
