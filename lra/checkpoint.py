"""Training checkpoints, written atomically: everything needed to continue bit-for-bit."""

from __future__ import annotations

import hashlib
import io
import os
import random
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from lra import signals
from lra.errors import UserError
from lra.faults import fault_point
from lra.io import atomic_write

LAST = "last.pt"
BEST = "best.pt"
TRAINING_KEYS = ("model", "optimizer", "scheduler", "scaler", "sampler", "rng", "state", "best_weights")


def rng_states() -> Dict[str, Any]:
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: Dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save(path: Path, payload: Dict[str, Any]) -> None:
    """Write ``payload`` with torch.save to a temporary file and rename it over ``path``. A signal meanwhile
    is raised once the checkpoint is whole: raised inside torch.save's zip writer, it was replaced by the
    writer's own error (a run recorded failed, "a bug in the harness", for a ctrl-C)."""

    def write(handle) -> None:
        torch.save(payload, handle)
        fault_point("checkpoint_write")  # the data is in the temporary file, not yet renamed

    with signals.deferred():
        atomic_write(path, write, mode="wb")
    fault_point("after_checkpoint")


def save_bytes(path: Path, data: bytes) -> None:
    """Write a checkpoint's bytes (read and checked elsewhere) atomically, unchanged."""
    with signals.deferred():
        atomic_write(path, lambda handle: handle.write(data), mode="wb")


class Damaged(Exception):
    """A checkpoint whose bytes are not the ones written (its text says where)."""


def verify(source) -> None:
    """Every record of a checkpoint (torch.save's zip archive: ``path`` or a file object) matches the CRC-32
    the writer stored for it; torch.load checks none, so a bit flipped on disk loaded as a slightly other
    weight or optimizer state, and training went on. :class:`Damaged` otherwise."""
    try:
        with zipfile.ZipFile(source) as archive:
            bad = archive.testzip()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as exc:
        raise Damaged(f"not a whole torch.save archive: {exc}") from None
    if bad is not None:
        raise Damaged(f"its part {bad} does not match the checksum written with it: the file changed on disk")


def load(path: Path) -> Dict[str, Any]:
    verify(path)
    return torch.load(path, map_location="cpu", weights_only=False)


def verified_encoder(path: Path, recorded_sha256: Optional[str], setting: str, fix: Optional[str] = None) -> bytes:
    """The bytes of a finished stage 1's encoder (``path``), after checking them against the SHA-256
    its run's record names (``pretrain_encoder_sha256``): an encoder replaced by another run's, or
    damaged, is one :class:`UserError` line naming ``setting`` (e.g. ``pretrain.from=<run>``) — never
    fine-tuned from (``fix``: what to do instead, when not pretrain.from's advice). The bytes returned
    are the ones checked (load them with :func:`load_bytes`)."""
    run = Path(path).parent.parent
    if not recorded_sha256:
        from lra.run import resume_command

        raise UserError(f"{setting}: its record ({run / 'metrics.json'}) names no SHA-256 of {path} "
                        "(pretrain_encoder_sha256), so that encoder cannot be checked; resume that run once "
                        f"({resume_command(run)}) to complete its record, or pretrain again")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"{setting}: cannot read {path} ({exc.strerror}); pass a run whose encoder is readable") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != recorded_sha256:
        raise UserError(f"{setting}: {path} is not the encoder that run's record names (SHA-256 {actual[:12]}…, "
                        f"recorded {str(recorded_sha256)[:12]}…): it was replaced or damaged; " + (fix or "pass the run "
                        "that pretrained this encoder, or pretrain again (a new run with the same pretrain=...)"))
    return data


def load_bytes(data: bytes) -> Dict[str, Any]:
    """:func:`load` of a checkpoint's bytes already read (and checked)."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)  # checked by SHA-256 already


KEPT = "the run's metrics.json is left as it was — start a new run with the same overrides"


def check_config(path: Path, payload: Dict[str, Any], config_sha256: Optional[str], reading: str = "resume from",
                 fix: str = f"a run continues only as it was configured: put the run's own files back, or start a new "
                            f"run with the settings you want; {KEPT.split(' — ')[0]}") -> None:
    """A checkpoint is read only with the config it was trained with: the SHA-256 of the run's saved config
    (``.hydra/resolved.yaml``) must be the one ``path`` was written with. A resume of an edited config (a
    learning rate, more steps) would otherwise train on silently as another run, and another run's
    checkpoint of the same shapes would be taken for this one's; checkpoints written before the digest was
    recorded are not checked. ``reading``: what the refused command was doing; ``fix``: what to do instead."""
    recorded = payload.get("config_sha256") if isinstance(payload, dict) else None
    if recorded is None or config_sha256 is None or recorded == config_sha256:
        return
    raise UserError(f"cannot {reading} {path}: it is not this run's checkpoint, or the run's config was edited since "
                    f"(the checkpoint was trained with a .hydra/resolved.yaml of SHA-256 {recorded[:12]}…, the run's is "
                    f"{config_sha256[:12]}…); {fix}")


def build_identity(device: torch.device, amp_dtype: Optional[torch.dtype],
                   attention_engine: Optional[str] = None, attention_code: Optional[str] = None,
                   processes: int = 1) -> Dict[str, str]:
    """What computed a training checkpoint, besides its config: the torch build (its version names the CUDA or
    CPU build), the device type (on a CPU, its thread count: :func:`check_threads`), the autocast precision
    (``trainer.device=auto`` and ``trainer.precision=auto`` choose them at each start) and the attention's
    engine where the machine chooses it
    (:func:`attention_zoo.engines`: YOSO's compiled kernels or its PyTorch path), and for a backend of the user's
    the SHA-256 of the file that defines it (``attention_code``: :func:`check_attention_code`), and the number of
    torchrun processes (:func:`check_processes`). A resume elsewhere would go on computing otherwise than the run
    began, and its record would name only the last of them."""
    identity = {"torch": torch.__version__, "device": device.type,
                "precision": str(amp_dtype).removeprefix("torch.") if amp_dtype is not None else "float32",
                "processes": str(processes)}
    if device.type == "cpu":  # a CPU run's last digits depend on how many threads split its reductions
        identity["cpu_threads"] = str(torch.get_num_threads())
    return identity | ({"attention_engine": attention_engine} if attention_engine else {}) | (
        {"attention_code": attention_code} if attention_code else {})


def check_attention_code(path: Path, payload: Dict[str, Any], here: Dict[str, str], file: Optional[str]) -> None:
    """A checkpoint of a backend of the user's (``LRA_ATTENTION_MODULES``) is resumed only by the code that
    trained it: the SHA-256 of the file defining the backend (``file`` here) must be its build's
    ``attention_code``. An edited file, or another file registering the name, would train the rest of the
    run as another attention, and the record would not know. One :class:`UserError` line otherwise."""
    recorded = payload.get("build") if isinstance(payload, dict) else None
    code = recorded.get("attention_code") if isinstance(recorded, dict) else None
    if not isinstance(code, str) or code == here.get("attention_code"):
        return
    now = f"{file}, whose SHA-256 is now {here['attention_code'][:12]}…" if here.get("attention_code") else \
        "a built-in backend of that name"
    raise UserError(f"cannot resume from {path}: it was trained by a backend of yours defined in a file of SHA-256 "
                    f"{code[:12]}… and this process computes it with {now}: a run goes on only with the code it "
                    f"began with; restore that file (LRA_ATTENTION_MODULES), or start a new run with the same "
                    f"overrides; the run's metrics.json is left as it was")


def check_build(path: Path, payload: Dict[str, Any], here: Dict[str, str]) -> None:
    """A training checkpoint is resumed only by the build that wrote it (:func:`build_identity`); checkpoints
    written before it was recorded are not checked. One :class:`UserError` line otherwise."""
    recorded = payload.get("build") if isinstance(payload, dict) else None
    if not isinstance(recorded, dict):
        return
    differ = [f"{key} {recorded.get(key)} (this process: {value})" for key, value in here.items()
              if key in recorded and recorded[key] != value]
    if not differ:
        return
    where = ", ".join(f"{key}={value}" for key, value in recorded.items() if key in here)
    raise UserError(f"cannot resume from {path}: it was trained with {'; '.join(differ)}, and a run resumes exactly "
                    f"only as it was computed; resume it where it ran ({where}), or start a new run with the same "
                    f"overrides; the run's metrics.json is left as it was")


def check_run_processes(run_dir: Path, record: Dict[str, Any]) -> None:
    """:func:`check_processes` against the count the run's record holds: checked before its config is (whose
    batch split depends on it), and between self-pretraining's stages, where no training checkpoint holds it yet."""
    from lra import distributed

    _same_processes(run_dir, record.get("processes"), distributed.world_size(), run_dir)


def check_processes(path: Path, payload: Dict[str, Any], here: Dict[str, str], run_dir: Path) -> None:
    """A checkpoint is resumed only by as many torchrun processes as computed it (its build's ``processes``): each
    process draws the dropout of its share of the batch, and sums its gradients in its own order, so another count
    trains the rest of the run otherwise. One :class:`UserError` line naming the command to resume with."""
    recorded = payload.get("build") if isinstance(payload, dict) else None
    _same_processes(path, recorded.get("processes") if isinstance(recorded, dict) else None, here.get("processes"),
                    run_dir)


def _same_processes(where: Path, recorded, here, run_dir: Path) -> None:
    from lra.run import process_count, resume_command

    began, now = process_count(recorded), process_count(here)
    if began is None or now is None or began == now:
        return
    raise UserError(f"cannot resume from {where}: it was computed by {began} process(es) and this is {now}, and each "
                    f"process draws the dropout of its share of the batch: resume it with "
                    f"{resume_command(run_dir, began)}; the run's metrics.json is left as it was")


def check_threads(path: Path, payload: Dict[str, Any], here: Dict[str, str]) -> None:
    """A CPU checkpoint is resumed only on the thread count it was computed on (its build's ``cpu_threads``):
    a CPU run's last digits depend on how its reductions are split, and a process started on another count
    does not compute as one started on that count, whatever it sets later (MKL keeps what it read at start).
    One :class:`UserError` line naming the ``OMP_NUM_THREADS`` to resume with; nothing where either count is
    unknown (a GPU run, a checkpoint from before the field)."""
    recorded = payload.get("build") if isinstance(payload, dict) else None
    threads = recorded.get("cpu_threads") if isinstance(recorded, dict) else None
    if not isinstance(threads, str) or "cpu_threads" not in here or threads == here["cpu_threads"]:
        return
    how = f"OMP_NUM_THREADS={threads} exported before lra-train"
    if os.environ.get("LRA_SWEEP_PARENT"):  # a local_gpus worker: unset, joblib gives it cores ÷ workers
        how += (" (a hydra/launcher=local_gpus worker runs on cores ÷ hydra.launcher.n_jobs threads where it is "
                "not set; hydra.job.env_set comes after torch has started)")
    raise UserError(f"cannot resume from {path}: it was computed on {threads} CPU threads and this process runs on "
                    f"{here['cpu_threads']}, and a CPU run's last digits depend on its thread count: resume it with "
                    f"{how}, as it went on exactly only as it was computed; the run's metrics.json is left as it was")


def recorded_engine(payload: Dict[str, Any]) -> Optional[str]:
    """The attention engine a training checkpoint's build names (:func:`build_identity`), or None."""
    recorded = payload.get("build") if isinstance(payload, dict) else None
    return recorded.get("attention_engine") if isinstance(recorded, dict) else None


def engine_to_follow(began_on: Optional[str], here: Dict[str, str], source: str) -> Optional[str]:
    """The engine a run goes on on after ``began_on`` computed it so far (``source``: the checkpoint, or stage 1
    for stage 2), where this process would choose ``here['attention_engine']``: None where they agree (or one
    is unknown); 'torch' where it began on YOSO's PyTorch path, there wherever the kernels are; one
    :class:`UserError` line where it began on the kernels and they cannot be built here."""
    this = here.get("attention_engine")
    if not began_on or not this or began_on == this:
        return None
    if began_on == "torch":
        return "torch"
    raise UserError(f"cannot go on from {source}: it computed YOSO on its compiled kernels (attention_engine "
                    f"{began_on}), which this process cannot build (this process: {this}), and a run goes on only as "
                    f"it was computed; build them here (lra-build-kernels {here['device']} says why they do not), or "
                    f"resume it where it ran; the run's metrics.json is left as it was")


def load_training(path: Path) -> Dict[str, Any]:
    """A training checkpoint (every one of :data:`TRAINING_KEYS`), or one :class:`UserError` line."""
    try:
        payload = load(path)
    except Damaged as exc:
        raise UserError(f"cannot resume from {path}: the checkpoint is damaged ({exc}); {KEPT}") from None
    except Exception as exc:
        raise UserError(f"cannot resume from {path}: the checkpoint is unreadable ({type(exc).__name__}); {KEPT}") from None
    missing = [k for k in TRAINING_KEYS if k not in payload] if isinstance(payload, dict) else ["all"]
    if missing:
        raise UserError(f"cannot resume from {path}: it is not a training checkpoint (no {', '.join(missing)}; "
                        f"a {BEST} holds only weights); {KEPT}")
    return payload
