"""Everything a training run is made of, built from its config: the one place a run's device,
precision, seed, data, model (DDP and compiled forms), optimizer, schedule, gradient scaler and
sampler are made. :class:`lra.training.Trainer` receives them and only trains; benchmarks that need a
model and its data call :func:`build` directly."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

import attention_zoo
from attention_zoo import user_modules
from lra import distributed, gpus
from lra.data.prepare import PreparedData, load_task_data
from lra.data.sampler import EpochSampler
from lra.errors import UserError
from lra.model import Classifier, LanguageModel, input_length
from lra.schedules import lr_factor


@dataclass
class Components:
    device: torch.device
    amp_dtype: Optional[torch.dtype]  # None: fp32, no autocast
    data: PreparedData
    max_length: int  # padded tokens per document the model sees
    model: torch.nn.Module  # the plain module: checkpoints, evaluation weights
    ddp: Optional[torch.nn.parallel.DistributedDataParallel]  # under torchrun
    train_model: torch.nn.Module  # what training calls: DDP and/or compiled around ``model``
    eval_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    sampler: EpochSampler
    attention_engine: Optional[str]  # where the machine chooses it (attention_zoo.engines), the same on every rank


def build(cfg, attention: attention_zoo.AttentionSpec, announce=print,
          ranks: distributed.Ranks = distributed.Ranks(), language_model: Optional[str] = None) -> Components:
    """The run's components, in the order their random draws must happen (seed, then the model).
    ``language_model`` (``masked`` or ``causal``): self-pretraining's stage 1, whose model is the encoder
    with a token-prediction head (:class:`lra.model.LanguageModel`) and whose ``cfg.trainer`` is
    :func:`lra.pretraining.stage_config`'s."""
    trainer = cfg.trainer  # its batch splits over the processes: lra.validation.check_process_split
    device = resolve_device(trainer.device, announce, ranks)
    if trainer.deterministic and device.type == "cuda":  # cuBLAS needs it for repeatable matmuls
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Bitwise-repeatable runs and resumes (e.g. Inductor's CPU scatter-adds use atomics otherwise).
    torch.use_deterministic_algorithms(trainer.deterministic, warn_only=True)
    amp_dtype = autocast_dtype(trainer.precision.value, device)
    if trainer.capture and amp_dtype == torch.float16:
        raise UserError("trainer.capture=true with trainer.precision=auto: this GPU has no bf16, so auto is fp16, whose "
                        "gradient scaler decides on the host whether to skip a step: pass trainer.precision=fp32, or "
                        "trainer.capture=false")
    seed_everything(cfg.seed)

    data = load_task_data(cfg.task, Path(cfg.data_dir), train_subset=trainer.train_subset,
                          eval_subset=trainer.eval_subset, announce=announce)
    max_length = input_length(cfg.task.max_length, trainer.max_length)
    longer = int((data.splits["train"].lengths() > max_length).sum())
    if longer:
        announce(f"warning: {longer} of {len(data.splits['train'])} training sequences are longer than "
                 f"{max_length} tokens and are truncated")

    if language_model is None:
        model = Classifier(cfg.model, cfg.task, attention, max_length).to(device)
    else:
        model = LanguageModel(cfg.model, cfg.task, attention, max_length, causal=language_model == "causal").to(device)
    engine = attention_zoo.engines(model, device)
    distributed.same_across(engine, ranks, "YOSO's engine (its compiled kernels, or its PyTorch path where they cannot "
                            "be built)", f"build the kernels where each process runs (lra-build-kernels {device.type} "
                            "says why they do not build), or set attention.impl=torch")
    # Training goes through DDP (gradients averaged over ranks); evaluation uses the plain module.
    # A backend that reads not q or not k leaves that projection out of the loss, which DDP refuses at the second
    # step unless it looks for such parameters at each backward (a backend of the user's: it cannot be told).
    backend = attention_zoo.get(attention.name).cls
    unused = bool(backend.unread_inputs(attention.options)) or user_modules.source_of(backend) is not None
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=unused) if ranks.world > 1 else None
    train_model, eval_model = (ddp if ddp is not None else model), model
    if trainer.compile:
        train_model, eval_model = compiled(train_model, trainer), compiled(model, trainer)
    # Under trainer.capture the step is one CUDA graph (lra/capture.py): AdamW keeps its step count on the
    # device and reads its learning rate from a device tensor, which the schedule fills each step.
    lr = torch.tensor(trainer.lr, device=device) if trainer.capture else trainer.lr
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(trainer.beta1, trainer.beta2), eps=trainer.eps,
                                  weight_decay=trainer.weight_decay, capturable=trainer.capture)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, trainer))
    if trainer.capture:  # the schedule's rates as numbers, so that filling the tensor never reads the device
        scheduler.base_lrs = [float(trainer.lr)] * len(optimizer.param_groups)
        optimizer.register_load_state_dict_post_hook(_learning_rates_on(device))
        optimizer._warned_capturable_if_run_uncaptured = True  # torch's warning about the eager steps before capture
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    sampler = EpochSampler(len(data.splits["train"]), trainer.batch_size, cfg.seed)
    return Components(device, amp_dtype, data, max_length, model, ddp, train_model, eval_model, optimizer, scheduler,
                      scaler, sampler, engine)


def _learning_rates_on(device: torch.device):
    """An optimizer's load_state_dict hook: the learning rates a checkpoint gives back as host tensors (it is
    loaded to the CPU) on ``device`` again, where a captured step reads them."""

    def hook(optimizer) -> None:
        for group in optimizer.param_groups:
            group["lr"] = torch.tensor(float(group["lr"]), device=device)

    return hook


def resolve_device(name: str, announce=print, ranks: distributed.Ranks = distributed.Ranks()) -> torch.device:
    """``auto``: CUDA when available — under torchrun the rank's local GPU; otherwise, with several
    GPUs, a free one claimed for this process (one job per GPU)."""
    if ranks.world > 1 and torch.cuda.is_available() and name in ("auto", "cuda"):
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
        return device
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        count = torch.cuda.device_count()
        return torch.device("cuda", gpus.claim(count, announce) if count > 1 else 0)
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"trainer.device={name} but no CUDA device is available; use trainer.device=cpu")
    return device


def autocast_dtype(precision: str, device: torch.device) -> Optional[torch.dtype]:
    """None means fp32 (no autocast)."""
    if device.type != "cuda" or precision == "fp32":
        if precision in ("bf16", "fp16") and device.type != "cuda":
            raise UserError(f"trainer.precision={precision} needs CUDA; use trainer.precision=fp32 on CPU")
        return None
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def compiled(model: torch.nn.Module, trainer) -> torch.nn.Module:
    """``torch.compile`` of ``model`` with ``trainer.compile_mode`` (``reduce-overhead``: CUDA graphs)
    as one graph (``fullgraph``: a graph break is an error, not a silent slowdown); the weights stay
    those of ``model``, so checkpoints and resume are unchanged."""
    mode = None if trainer.compile_mode == "default" else trainer.compile_mode
    return torch.compile(model, mode=mode, fullgraph=True, dynamic=False)
