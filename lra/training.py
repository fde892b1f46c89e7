"""The training loop: optimizer steps with optional mixed precision and gradient accumulation, full
validation every ``eval_every`` steps, best-checkpoint selection, a final test of the best
checkpoint, atomic checkpoints and an exact resume. What it trains is built by :mod:`lra.build`."""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import attention_zoo
from attention_zoo import user_modules
from lra import capture, checkpoint, distributed, gpus, packing
from lra.train_window import TrainWindow
from lra.build import build
from lra.chance import ChanceLevel
from lra.config import typed
from lra.data.cache import TokenSplit
from lra.determinism import NondeterminismLog
from lra.errors import UserError
from lra.io import Unreadable, atomic_write_json, read_bytes
from lra.profiling.measure import process_peak_mb
from lra.records import HISTORY, RunRecord, describe_device, git_commit, source_fields
from lra.run import RunDirectory
from lra.validation import attention_spec, run_label


@dataclass
class TrainState:
    """Everything about progress that a checkpoint must carry besides weights and RNGs."""

    step: int = 0
    best_step: Optional[int] = None
    best_val_accuracy: Optional[float] = None
    history: List[dict] = field(default_factory=list)
    train_seconds: float = 0.0
    train_tokens: int = 0
    wall_seconds: float = 0.0
    gpu_seconds: Optional[float] = None  # lra.gpus.GpuClock: None on CPU, or unknown (an older checkpoint)
    resumed_at_steps: List[int] = field(default_factory=list)  # one entry per resume (kill, preemption)


def earlier_commits(previous: dict) -> dict:
    """``earlier_git_commits``: the commits the earlier processes of a resumed run ran, where they differ from
    this one's (``git_commit``, the last), in order, from its previous record; {} where every process ran this."""
    held = previous.get("earlier_git_commits")
    earlier = [commit for commit in held if isinstance(commit, str)] if isinstance(held, list) else []
    before = previous.get("git_commit")
    if isinstance(before, str) and before != git_commit() and earlier[-1:] != [before]:
        earlier.append(before)
    return {"earlier_git_commits": earlier} if earlier else {}


def to_device(arrays, device: torch.device) -> list:
    """Host arrays as tensors on ``device``; on CUDA through pinned memory, so that the copy is
    asynchronous and the host runs ahead."""
    if device.type == "cuda":
        return [torch.from_numpy(a).pin_memory().to(device, non_blocking=True) for a in arrays]
    return [torch.from_numpy(a) for a in arrays]


def gradient_sync(ddp, last_micro_batch: bool):
    """Under DDP, gradients are all-reduced once per step: on the last micro-batch, the earlier ones
    accumulate locally (``no_sync``)."""
    if ddp is None or last_micro_batch:
        return contextlib.nullcontext()
    return ddp.no_sync()


def progress_line(step: int, total: int, loss: float, accuracy: float, throughput: float, elapsed: float,
                  pace: float) -> str:
    """``step 40/300 (13%) loss 2.251 acc 18.8 tok/s 25,676 elapsed 0:00:31 eta 0:03:22``: ``elapsed``
    is the run's (over resumes), the ETA extrapolates this session's ``pace`` (seconds per step)."""

    def clock(seconds: float) -> str:
        if not math.isfinite(seconds):
            return "?"
        if seconds >= 100 * 365.25 * 86400:  # beyond timedelta's range too, e.g. trainer.max_steps=10**20
            return f"{seconds / (365.25 * 86400):.3g} years"
        return str(datetime.timedelta(seconds=round(seconds)))

    return (f"step {step}/{total} ({100 * step // total}%) loss {loss:.3f} acc {accuracy:.1f} "
            f"tok/s {throughput:,.0f} elapsed {clock(elapsed)} eta {clock(pace * (total - step))}")


class Trainer:
    def __init__(self, cfg, run: RunDirectory | Path, announce=print, ranks: distributed.Ranks = distributed.Ranks(),
                 record: Optional[RunRecord] = None, attention: Optional[attention_zoo.AttentionSpec] = None):
        """``run``: the run's folder (a path: one no process claimed, for benchmarks and tests), which
        reads its checkpoints; ``record``: the run's record (``RunDirectory.new_record``), without one a
        record that never writes. ``attention``: the run's spec (made from ``cfg`` if not given)."""
        self.folder = run if isinstance(run, RunDirectory) else RunDirectory(run)
        self.cfg, self.announce, self.ranks = typed(cfg), announce, ranks
        cfg = self.cfg
        self.nondeterminism = NondeterminismLog()  # ops that alert under deterministic algorithms: recorded
        self.attention = attention if attention is not None else attention_spec(cfg)
        self.attention_name, self.label = self.attention.name, run_label(cfg)
        parts = self.build_components(cfg, announce, ranks)
        self.device, self.amp_dtype, self.data = parts.device, parts.amp_dtype, parts.data
        self.max_length, self.model, self.ddp = parts.max_length, parts.model, parts.ddp
        self.train_model, self.eval_model = parts.train_model, parts.eval_model
        self.optimizer, self.scheduler = parts.optimizer, parts.scheduler
        self.scaler, self.sampler = parts.scaler, parts.sampler
        self.captured = capture.CapturedStep(self) if cfg.trainer.capture else None
        self.attention_source = user_modules.source_of(attention_zoo.get(self.attention_name).cls)  # a backend of yours
        self.build = checkpoint.build_identity(self.device, self.amp_dtype, parts.attention_engine,  # checked at a resume
                                               (self.attention_source or {}).get("sha256"), ranks.world)
        self.num_parameters = sum(p.numel() for p in self.model.parameters())
        self.gpu_clock = gpus.GpuClock.of(self.device, ranks.world)
        self.chance = ChanceLevel.of(self.data.splits["val"].labels)
        self.state = TrainState()
        self.best_weights: Optional[Dict[str, torch.Tensor]] = None
        self.checkpoint_dir = self.stage_dir / "checkpoints"
        self.record = record if record is not None else RunRecord(
            self.run_dir, write=False, task=cfg.task.name, attention=self.attention_name, label=self.label,
            seed=cfg.seed, status="running", git_commit=git_commit())
        self.record.update(device=describe_device(self.device), processes=ranks.world,
                           data_fingerprint=self.data.fingerprint, data_content=self.data.content,
                           data_cache=str(self.data.cache_dir),
                           data_source=self.data.source, data_raw_folder=self.data.raw_folder,
                           run_dir=str(self.run_dir), **{self.engine_field: self.build.get("attention_engine")},
                           **self.describe_stage(), **source_fields(self.attention_source))

    stage_name = ""  # the progress line's prefix
    lr_setting = "trainer.lr"  # the setting of this stage's learning rate, named when the loss diverges
    resumes_field = "resumed_at_steps"  # the record's list of the steps this stage was resumed at
    engine_field = "attention_engine"  # the record's engine of this stage (attention_zoo.engines)
    steps_field = "steps"  # the record's last step of this stage
    clock_fields = {"wall_seconds": "wall_time_seconds", "gpu_seconds": "gpu_seconds"}  # state → record

    @property
    def run_dir(self) -> Path:
        return self.folder.path

    @property
    def stage_dir(self) -> Path:
        """Where this stage keeps its checkpoints and history: the run folder itself."""
        return self.run_dir

    def build_components(self, cfg, announce, ranks):
        return build(cfg, self.attention, announce, ranks)

    def describe_stage(self) -> dict:
        return {"num_parameters": self.num_parameters, "validation": self.data.validation,
                "validation_examples": len(self.data.splits["val"])}

    def follow_engine(self, began_on: Optional[str], source: str) -> None:
        """Go on on the engine ``source`` (the checkpoint, or stage 1) began on: checkpoint.engine_to_follow."""
        engine = checkpoint.engine_to_follow(began_on, self.build, source)
        if engine:
            attention_zoo.pin_engines(self.model, engine)
            self.build = {**self.build, "attention_engine": engine}
            self.record.update(**{self.engine_field: engine})
            self.announce(f"YOSO goes on on its PyTorch path, as {source} computed it (attention_engine={engine})")

    def start_from_encoder(self, weights: Dict[str, torch.Tensor]) -> None:
        """Fine-tuning: the encoder takes a pretrained encoder's weights, bit for bit; the head stays fresh."""
        self.model.encoder.load_state_dict(weights)

    # ---------------------------------------------------------------- state
    def save_checkpoint(self) -> None:
        if not self.ranks.main:
            return
        checkpoint.save(self.checkpoint_dir / checkpoint.LAST, {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
            "sampler": self.sampler.state_dict(), "rng": checkpoint.rng_states(),
            "state": asdict(self.state), "best_weights": self.best_weights,
            "config_sha256": self.folder.config_sha256,  # the config it was trained with (try_resume checks it)
            "data_content": self.data.content,  # and the data (check_same_data), should the record be lost
            "build": self.build,  # and what computed it (check_build)
        })

    def save_best(self) -> None:
        """``best.pt``: the best validation weights and their step. Written when validation improves, and at a
        resume from the training checkpoint's copy of them, which the run's test evaluates: a best.pt written
        after that checkpoint by the process that was killed (a step the resume may not validate alike, where
        computing is not bitwise repeatable), damaged or replaced since, would otherwise outlive the resume
        beside a record naming another best step."""
        if self.ranks.main and self.best_weights is not None:
            checkpoint.save(self.checkpoint_dir / checkpoint.BEST, {"model": self.best_weights,
                                                                     "step": self.state.best_step,
                                                                     "config_sha256": self.folder.config_sha256})

    def try_resume(self, continuing: bool = False) -> bool:
        """Load this stage's checkpoint, if it has one. ``continuing``: the stage began in an earlier process
        (a resume that reached it); without a checkpoint it starts again from step 0, a resume the record
        lists too."""
        found = self.folder.training_checkpoint(self.checkpoint_dir)
        previous = self.folder.read_record()  # before this process's record replaces it
        if found is None:
            recorded = self.steps_reached(previous) if continuing else None
            if recorded is not None and recorded > self.cfg.trainer.checkpoint_every:  # one was saved since
                raise UserError(f"cannot resume {self.folder.path}: it reached step {recorded}, but its "
                                f"checkpoint {self.checkpoint_dir / checkpoint.LAST} is missing; put it back, or start "
                                f"a new run with the same overrides (its metrics.json is left as it was)")
            self.record.confirm()
            if continuing:
                self.note_resume(0, previous)
            return False
        path, payload = found
        checkpoint.check_config(path, payload, self.folder.config_sha256)
        self.follow_engine(checkpoint.recorded_engine(payload), str(path))
        checkpoint.check_attention_code(path, payload, self.build, (self.attention_source or {}).get("file"))
        checkpoint.check_processes(path, payload, self.build, self.folder.path)
        checkpoint.check_threads(path, payload, self.build)
        checkpoint.check_build(path, payload, self.build)
        self.check_same_data(previous, payload)
        try:
            self.model.load_state_dict(payload["model"])
            self.optimizer.load_state_dict(payload["optimizer"])
            self.scheduler.load_state_dict(payload["scheduler"])
            self.scaler.load_state_dict(payload["scaler"])
            self.sampler.load_state_dict(payload["sampler"])
            self.state = TrainState(**payload["state"])
            self.best_weights = payload["best_weights"]
            checkpoint.restore_rng_states(payload["rng"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            reason = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise UserError(f"cannot resume from {path}: it is not this run's checkpoint ({reason}); "
                            f"{checkpoint.KEPT}") from None
        self.record.confirm()
        self.save_best()  # the best checkpoint as this one holds it: a kill or a hand may have left another
        self.note_resume(self.state.step, previous)
        self.announce(f"resumed from {path} at step {self.state.step}")
        return True

    def steps_reached(self, record: dict) -> Optional[int]:
        """The last step this stage is known to have reached: its record's, else (a record cut or lost) the last
        its history logged; None where neither says."""
        steps = record.get(self.steps_field)
        if isinstance(steps, int) and not isinstance(steps, bool):
            return steps
        try:
            logged = [entry.get("step") for entry in json.loads(read_bytes(self.stage_dir / HISTORY))]
        except (Unreadable, ValueError, TypeError, AttributeError, RecursionError):  # none, or not a list of entries
            return None
        logged = [step for step in logged if isinstance(step, int) and not isinstance(step, bool)]
        return max(logged) if logged else None

    def note_resume(self, step: int, previous: dict) -> None:
        """Add ``step`` to the steps this stage was resumed at, in its state and its record. The checkpoint's
        list misses a resume killed before its next checkpoint; the previous record's (``previous``, written at
        each resume) has it, and is taken where it extends the checkpoint's. Its clocks count the steps after
        the checkpoint, which this resume trains again: the time they took was spent all the same, and is kept."""
        for state_field, record_field in self.clock_fields.items():
            spent, held_time = previous.get(record_field), getattr(self.state, state_field)
            if (isinstance(spent, (int, float)) and not isinstance(spent, bool) and math.isfinite(spent)
                    and held_time is not None and spent > held_time):
                setattr(self.state, state_field, float(spent))
        recorded = previous.get(self.resumes_field)
        held = self.state.resumed_at_steps
        if (isinstance(recorded, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in recorded)
                and recorded[:len(held)] == held):
            held = list(recorded)
        self.state.resumed_at_steps = [*held, step]
        clocks = {record_field: getattr(self.state, state_field) for state_field, record_field in self.clock_fields.items()
                  if getattr(self.state, state_field) is not None}
        self.record.update(**{self.resumes_field: self.state.resumed_at_steps}, **clocks, **earlier_commits(previous))

    def check_same_data(self, record: dict, payload: dict) -> None:
        """A resume trains on the data its record and its checkpoint say the run trained on (the digest of the
        cache's arrays: the same data prepared again under another name passes), or is refused: the raw files
        were changed and prepared again, or another folder's. Without either digest (older runs, a record
        lost) the other judges; without both, nothing does."""
        held = [digest for digest in (record.get("data_content"), payload.get("data_content")) if isinstance(digest, str)]
        if all(digest == self.data.content for digest in held):
            return
        recorded = record.get("data_fingerprint")
        was = record.get("data_raw_folder") or record.get("data_source") or "its data"
        now = self.data.raw_folder or self.data.source
        raise UserError(f"cannot resume {self.folder.path}: it trained on other data (fingerprint {recorded}, from "
                        f"{was}) than it would now ({self.data.fingerprint}, from {now}, in {self.data.cache_dir}); "
                        "put the data it trained on back (prepared from the same files), or start a new run with the "
                        "same overrides (its metrics.json and checkpoints are left as they were)")

    # ---------------------------------------------------------------- steps
    def _to_device(self, arrays):
        return to_device(arrays, self.device)

    def _forward(self, split: TokenSplit, indices):
        """(mean loss, number correct — both device tensors, nothing read back —, padded tokens) of the
        examples ``indices`` through the evaluation model (a full evaluation batch is a replayed CUDA graph
        under trainer.capture)."""
        ids, masks, labels = split.gather(indices, self.max_length)
        arrays = [*ids, *masks, labels]
        if self.captured is not None and len(indices) == self.cfg.trainer.evaluation_batch_size:
            loss, correct = self.captured.evaluation(arrays)
        else:
            loss, correct = self.loss_on(self._to_device(arrays), self.eval_model)
        return loss, correct, sum(m.size for m in masks)

    def loss_on(self, arrays: list, model):
        """(mean loss, number correct) of a batch on the device (ids and masks per document, then labels)."""
        documents = (len(arrays) - 1) // 2
        ids, masks, labels = arrays[:documents], arrays[documents:2 * documents], arrays[-1]
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
            logits = model(ids, masks)
        return F.cross_entropy(logits.float(), labels), (logits.argmax(-1) == labels).sum()

    def train_step(self) -> dict:
        """One optimizer step. Its metrics stay on the device (``loss``, ``correct``, ``aux_loss`` sums
        of this process, ``nonfinite`` a flag): :meth:`run` reads them every ``log_every`` steps, so
        the host never waits for the device within a step. The host prepares every micro-batch first
        (:meth:`training_batch`), then the device computes the step (:meth:`device_step`, replayed as
        one CUDA graph under trainer.capture: :mod:`lra.capture`)."""
        self.model.train()
        indices = self.ranks.shard(self.sampler.next_batch())  # this process's share of the global batch
        micro_batches = np.array_split(indices, self.cfg.trainer.grad_accumulation)
        prepared = [self.training_batch(micro) for micro in micro_batches]
        batches, weights = [arrays for arrays, _ in prepared], [len(micro) / len(indices) for micro in micro_batches]
        if self.captured is not None:
            metrics = self.captured.step(batches, weights)
        else:
            self.optimizer.zero_grad(set_to_none=True)
            metrics = self.device_step([self._to_device(arrays) for arrays in batches], weights)
        self.scheduler.step()
        metrics.update(examples=len(indices), tokens=sum(tokens for _, tokens in prepared) * self.ranks.world)
        return metrics

    def device_step(self, batches: List[list], weights: List[float]) -> dict:
        """Forward and backward of each micro-batch (``batches``: :meth:`training_batch`'s arrays on the
        device; ``weights``: each one's share of the batch), gradient clipping and the optimizer's step,
        into gradients set to None before: device work only, nothing read back."""
        total_loss = total_correct = torch.zeros((), device=self.device)
        aux_total, predictions = None, None
        for position, (arrays, weight) in enumerate(zip(batches, weights)):
            with gradient_sync(self.ddp, last_micro_batch=position == len(batches) - 1):
                loss, correct, predicted = self.training_loss_on(arrays)
                objective = loss * weight
                aux = self.model.aux_loss()
                if aux is not None:
                    objective = objective + aux * weight
                    aux_total = aux.detach() * weight + (0 if aux_total is None else aux_total)
                self.scaler.scale(objective).backward()
            total_loss = total_loss + loss.detach() * weight
            total_correct = total_correct + correct
            if predicted is not None:
                predictions = predicted if predictions is None else predictions + predicted
        if self.cfg.trainer.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.trainer.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        checked = total_loss if aux_total is None else total_loss + aux_total  # an aux_loss is in the objective too
        metrics = {"loss": total_loss, "correct": total_correct, "nonfinite": ~torch.isfinite(checked)}
        if aux_total is not None:
            metrics["aux_loss"] = aux_total
        if predictions is not None:
            metrics["predictions"] = predictions
        return metrics

    def training_batch(self, indices) -> Tuple[List[np.ndarray], int]:
        """The training examples ``indices`` as host arrays (ids and masks per document, labels) and their
        padded tokens: everything :meth:`training_loss_on` reads."""
        ids, masks, labels = self.data.splits["train"].gather(indices, self.max_length)
        return [*ids, *masks, labels], sum(m.size for m in masks)

    def training_loss_on(self, arrays: list):
        """(mean loss, number correct, number of predictions — None: one per example) of a training batch
        on the device (:meth:`training_batch`'s arrays) through the training model."""
        return (*self.loss_on(arrays, self.train_model), None)

    @torch.no_grad()
    def evaluate(self, split_name: str) -> dict:
        self.model.eval()
        split = self.data.splits[split_name]
        batch_size = self.cfg.trainer.evaluation_batch_size
        loss_sum = correct = torch.zeros((), dtype=torch.float64, device=self.device)
        for start in range(0, len(split), batch_size):
            indices = self.ranks.shard(np.arange(start, min(start + batch_size, len(split))))
            if len(indices):
                loss, batch_correct, _ = self._forward(split, indices)
                loss_sum = loss_sum + loss * len(indices)
                correct = correct + batch_correct
            checkpoint.fault_point("eval_batch")
            packing.take_turn()
        loss_sum, correct = distributed.sum_across(torch.stack([loss_sum, correct]), self.ranks).tolist()
        return {"loss": loss_sum / len(split), "accuracy": 100.0 * correct / len(split)}

    # ---------------------------------------------------------------- loop
    def _record_progress(self, status: str, **extra) -> None:
        s = self.state
        s.gpu_seconds = self.gpu_clock.advance(s.gpu_seconds, s.wall_seconds)
        self.record.update(
            status=status, steps=s.step, best_step=s.best_step, best_val_accuracy=s.best_val_accuracy,
            train_tokens_per_second=s.train_tokens / s.train_seconds if s.train_seconds else None,
            wall_time_seconds=s.wall_seconds, peak_memory_mb=process_peak_mb(self.device),
            gpu_seconds=s.gpu_seconds, gpu_name=self.gpu_clock.name, train_tokens=s.train_tokens,
            resumed_at_steps=s.resumed_at_steps, nondeterministic_ops=list(self.nondeterminism.ops),
            chance_accuracy=self.chance.accuracy, stuck_at_chance=self.chance.stuck(s.best_val_accuracy),
            deterministic=self.nondeterminism.repeatable(self.cfg.trainer.deterministic), **extra,
        )

    def run(self, logger) -> dict:
        with self.nondeterminism, self.gpu_clock.running(self.state.wall_seconds, self.state.gpu_seconds):
            return self._train_and_test(logger)

    def _train_and_test(self, logger) -> dict:
        trainer = self.cfg.trainer
        session_start = time.perf_counter()
        wall_before = self.state.wall_seconds
        bar = tqdm(total=trainer.max_steps, initial=self.state.step, desc=f"{self.cfg.task.name}/{self.label}",
                   unit="step", disable=None if trainer.progress_bar and self.ranks.main else True, dynamic_ncols=True)
        window = TrainWindow()
        first_step = self.state.step
        while self.state.step < trainer.max_steps:
            started = time.perf_counter()
            metrics = self.train_step()
            self.state.step += 1
            self.state.train_seconds += time.perf_counter() - started
            self.state.train_tokens += metrics.pop("tokens")
            self.state.wall_seconds = wall_before + time.perf_counter() - session_start
            step = self.state.step
            window.add(metrics)
            bar.update(1)
            evaluate_now = step % trainer.eval_every == 0 or step == trainer.max_steps
            checkpoint_now = step % trainer.checkpoint_every == 0 or step == trainer.max_steps
            if step % trainer.log_every == 0 or evaluate_now or checkpoint_now:
                read_started = time.perf_counter()
                train_metrics = window.read(self.ranks, step, self.lr_setting)  # the one wait for the device here
                self.state.train_seconds += time.perf_counter() - read_started
                train_metrics["train/lr"] = float(self.scheduler.get_last_lr()[0])  # a tensor under trainer.capture
                throughput = self.state.train_tokens / self.state.train_seconds
                loss, accuracy = train_metrics["train/loss"], train_metrics["train/accuracy"]
                bar.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.1f}", tok_s=f"{throughput:,.0f}")
                if bar.disable and self.ranks.main:  # no terminal (a log file, SLURM, nohup): one line instead
                    pace = (time.perf_counter() - session_start) / max(step - first_step, 1)
                    self.announce(self.stage_name + progress_line(step, trainer.max_steps, loss, accuracy, throughput,
                                                                  self.state.wall_seconds, pace))
                logger.log(train_metrics | {"train/tokens_per_second": throughput}, step=step)
                window = TrainWindow()
                self._record_progress("running")  # metrics.json shows the current step between evaluations
            checkpoint.fault_point("step")
            if evaluate_now:
                self._validate(logger, train_metrics)
            if checkpoint_now:
                self.save_checkpoint()
            packing.take_turn()  # in a pack, the next run's step (lra.packing); nothing otherwise
        bar.close()
        return self._test(logger)

    def _validate(self, logger, train_metrics: dict) -> None:
        result = self.evaluate("val")
        step = self.state.step
        if self.state.best_val_accuracy is None or result["accuracy"] > self.state.best_val_accuracy:
            self.state.best_val_accuracy, self.state.best_step = result["accuracy"], step
            self.best_weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.save_best()
        entry = {"step": step, "val_loss": result["loss"], "val_accuracy": result["accuracy"],
                 "train_loss": train_metrics["train/loss"], "lr": train_metrics["train/lr"]}
        if "train/aux_loss" in train_metrics:
            entry["train_aux_loss"] = train_metrics["train/aux_loss"]
        self.state.history.append(entry)
        if self.ranks.main:
            atomic_write_json(self.stage_dir / HISTORY, self.state.history)
        logger.log({"val/loss": result["loss"], "val/accuracy": result["accuracy"],
                    "val/best_accuracy": self.state.best_val_accuracy}, step=step)
        self._record_progress("running")

    def _test(self, logger) -> dict:
        final_weights = copy.deepcopy(self.model.state_dict())
        self.model.load_state_dict(self.best_weights)
        result = self.evaluate("test")
        self.model.load_state_dict(final_weights)
        self._record_progress("completed", test_accuracy=result["accuracy"], test_loss=result["loss"], error=None)
        record = self.record.data
        logger.summary({"test/accuracy": result["accuracy"], "test/loss": result["loss"],
                        "best_val_accuracy": self.state.best_val_accuracy, "best_step": self.state.best_step,
                        **{key: record.get(key) for key in ("train_tokens_per_second", "peak_memory_mb", "device",
                                                            "wall_time_seconds", "num_parameters", "status",
                                                            "attention_engine")}})
        return self.record.data
