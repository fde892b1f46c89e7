"""Structured configs of ``lra-train``: every config group is backed by a dataclass registered in
Hydra's ConfigStore, so a misspelled key or a value of the wrong type fails at composition.

Files in ``conf/<group>/`` extend these schemas (``defaults: [/schema_<group>_<name>@_here_]``:
plain names, not groups, so that ``--help`` lists only the groups a user picks from) and hold only
what differs from them. Attention schemas are generated from the ``attention_zoo``
registry, so a backend's options dataclass is the single source of its keys.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING, DictConfig, OmegaConf

import attention_zoo
from attention_zoo._common import package_folder
from attention_zoo.options import InvalidOption, choice, number, whole
from lra.adamw_limits import check_adamw_steps
from lra.config_fields import attention_node, attention_schema, device_name, open_plain_dicts
from lra.data.listops import GeneratorSettings
from lra.data.sources import AUTO, SOURCES
from lra.data.pathfinder_writer import GeneratorSettings as PathfinderGeneratorSettings
from lra.tool_configs import FidelityConfig, ProfileConfig

CONF_DIR = package_folder("lra.conf")  # lra-train (conf/ in the repository)
PROFILE_CONF_DIR = package_folder("lra.conf_profile")  # lra-profile's own presets
FIDELITY_CONF_DIR = package_folder("lra.conf_fidelity")  # lra-fidelity
RUNS_DIR = "runs"


class Pooling(enum.Enum):
    mean = "mean"  # mean over real tokens (default)
    mean_unmasked = "mean_unmasked"  # every position's own state averaged over the padded length (the LRA code)
    mean_zeroed_padding = "mean_zeroed_padding"  # padded states zeroed, then averaged over the padded length (mlpen code)
    cls = "cls"  # a learned CLS token prepended to the sequence


class PaddingMask(enum.Enum):
    lengths = "lengths"  # real tokens by sequence length (default)
    nonzero_ids = "nonzero_ids"  # the reference models' quirk: every token id 0 is padding (black pixels too)


class PositionEmbedding(enum.Enum):
    learned = "learned"  # a learned table, N(0, 0.02) at initialization (the YOSO/Nyströmformer reference)
    sinusoidal = "sinusoidal"  # fixed sines and cosines (the LRA models' default)


class Initialization(enum.Enum):
    torch = "torch"  # PyTorch's defaults for the model's linear layers (the YOSO/Nyströmformer reference)
    lra = "lra"  # the LRA code's Flax initialisers: blocks xavier_uniform with N(0, 1e-6) biases; heads lecun_normal


class LRSchedule(enum.Enum):
    linear = "linear"  # linear warm-up from lr·lr_start_factor, then linear decay to lr·lr_end_factor (OneCycle-like)
    rsqrt = "rsqrt"  # LRA "constant * linear_warmup * rsqrt_decay": lr · min(1, t/w) / √max(t, w)
    cosine = "cosine"  # LRA "constant * linear_warmup * cosine_decay": lr · min(1, t/w) · ½(1 + cos(π (t − w)/T))


class PretrainObjective(enum.Enum):
    none = "none"  # train from scratch (default)
    masked = "masked"  # masked-token denoising with the bidirectional encoder
    causal = "causal"  # next-token prediction with a causal attention mask


class Precision(enum.Enum):
    auto = "auto"  # bf16 autocast on CUDA when supported, else fp16; fp32 on CPU
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


# The embedding table must hold every token id of a task's vocabulary (pad and out-of-vocabulary ids included).
MIN_VOCABULARY = {"listops": 17, "text": 257, "retrieval": 257, "image": 256, "pathfinder": 256}
# The classes of each task's labels: the classifier's outputs, neither more (classes no example has) nor fewer.
NUM_CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2}


VALIDATIONS = ("test", "heldout")


@dataclass
class TaskConfig:
    """One LRA task: its data, the model's input shape, and the reference schedule."""

    name: str = MISSING
    # auto: the prepared cache when exactly one matches these settings, else the generator (ListOps,
    # Pathfinder); or one of lra.data.prepare.SOURCES[name]
    source: str = AUTO
    path: Optional[str] = None  # a user's raw data folder (e.g. an extracted LRA release)
    num_classes: int = MISSING
    vocab_size: int = MISSING  # embedding rows (the reference allocates more than the real vocabulary)
    max_length: int = MISSING  # padded tokens per document
    dual_encoder: bool = False  # retrieval: two documents through one shared encoder
    # test: the reference's protocol, the split it validates on (Text: the test split, as the original and
    # every descendant; the other tasks: their validation split); heldout: a seeded split of heldout_size
    # training examples (the same for every run and seed), so that model selection never sees the test split
    validation: str = "test"
    heldout_size: int = 2500
    heldout_seed: int = 0
    # The reference schedule (docs/reference-setup.md); trainer.* defaults to these.
    batch_size: int = MISSING
    max_steps: int = MISSING
    warmup_steps: int = MISSING
    eval_every: int = MISSING

    def __post_init__(self):
        choice(self, "name", MIN_VOCABULARY)
        choice(self, "source", (*SOURCES[self.name], AUTO))
        if self.num_classes != NUM_CLASSES[self.name]:
            raise InvalidOption("num_classes", self.num_classes, f"{NUM_CLASSES[self.name]}, the classes of "
                                f"{self.name}'s labels: leave it out")
        whole(self, MIN_VOCABULARY[self.name], "vocab_size")  # every token id needs an embedding row
        whole(self, 1, "max_length", "batch_size", "max_steps", "eval_every", "heldout_size")
        whole(self, 0, "warmup_steps", "heldout_seed")
        choice(self, "validation", VALIDATIONS)
        if self.source == "generate" and self.path is not None:
            raise InvalidOption("path", self.path, "null with source=generate (the generator reads no files): leave "
                                f"it out, or pass task.source=<{'|'.join(s for s in SOURCES[self.name] if s != 'generate')}> "
                                "to train on the files there")
        paired = self.name in PAIRED_TASKS  # its examples are two documents; the others' one
        if self.dual_encoder is not paired:
            raise InvalidOption("dual_encoder", self.dual_encoder, f"{str(paired).lower()} for {self.name} (its "
                                f"examples are {'two documents' if paired else 'one sequence'}; false dropped "
                                "Retrieval's second document): leave it out")


PAIRED_TASKS = ("retrieval",)  # tasks whose examples are two documents, one encoder for both


@dataclass
class ListOpsTaskConfig(TaskConfig):
    generator: GeneratorSettings = field(default_factory=GeneratorSettings)

    def __post_init__(self):
        super().__post_init__()
        if self.source in ("generate", AUTO):  # a run evaluates on both
            for name in ("num_val", "num_test"):
                if getattr(self.generator, name) < 1:
                    raise InvalidOption(f"generator.{name}", getattr(self.generator, name), "a whole number ≥ 1")


@dataclass
class ByteTaskConfig(TaskConfig):
    """Text and Retrieval: documents as UTF-8 bytes."""

    document_bytes: Optional[int] = None  # bytes kept per document when preparing (None: all)

    def __post_init__(self):
        super().__post_init__()
        whole(self, 1, "document_bytes", optional=True)


@dataclass
class PathfinderTaskConfig(TaskConfig):
    resolution: int = 32  # 32 | 64 | 128 (Path-X); task.max_length must be resolution²
    difficulty: str = "contour_length_14"  # baseline | contour_length_9 | contour_length_14
    split_seed: int = 0  # the seeded 80/10/10 split of the metadata lines
    generator: PathfinderGeneratorSettings = field(default_factory=PathfinderGeneratorSettings)

    def __post_init__(self):
        super().__post_init__()
        choice(self, "resolution", (32, 64, 128))
        choice(self, "difficulty", ("baseline", "contour_length_9", "contour_length_14"))
        whole(self, 0, "split_seed")
        if self.max_length < self.resolution**2:
            raise InvalidOption("max_length", self.max_length, f"at least resolution² = {self.resolution**2} pixels")


@dataclass
class ModelConfig:
    """The reference LRA encoder (docs/reference-setup.md, "Model")."""

    dim: int = 64
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 32
    ff_dim: int = 128
    dropout: float = 0.1
    pooling: Pooling = Pooling.mean
    padding_mask: PaddingMask = PaddingMask.lengths
    position_embedding: PositionEmbedding = PositionEmbedding.learned
    classifier_dim: int = 128
    embedding_init_std: float = 0.02  # N(0, σ) of the learned position table (and the token table unless below)
    token_embedding_init_std: Optional[float] = None  # N(0, σ) of the token table; None: embedding_init_std
    initialization: Initialization = Initialization.torch  # the linear layers' initialisers
    attention_bias: bool = True  # the Q, K, V and output projections carry a bias (the LRA code's have none)
    layer_norm_eps: float = 1e-5  # ε of every LayerNorm (PyTorch's default; Flax's, the LRA code's, is 1e-6)
    attention_fp32: bool = True  # compute attention in fp32 under mixed precision, as the reference

    def __post_init__(self):
        whole(self, 1, "dim", "num_layers", "num_heads", "head_dim", "ff_dim", "classifier_dim")
        number(self, "dropout", 0.0, 1.0, high_open=True)
        number(self, "embedding_init_std", 0.0)
        number(self, "layer_norm_eps", 0.0, low_open=True)
        number(self, "token_embedding_init_std", 0.0, optional=True)


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class TrainerConfig:
    batch_size: int = II("task.batch_size")  # examples per optimizer step
    grad_accumulation: int = 1  # micro-batches per step (batch_size must divide evenly)
    eval_batch_size: Optional[int] = None  # default: batch_size
    max_steps: int = II("task.max_steps")
    warmup_steps: int = II("task.warmup_steps")
    eval_every: int = II("task.eval_every")
    checkpoint_every: int = II(".eval_every")
    log_every: int = 10
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    lr_schedule: LRSchedule = LRSchedule.linear
    lr_start_factor: float = 0.04  # linear: warm-up starts at lr/25, as the reference's OneCycleLR
    lr_end_factor: float = 0.0  # linear: the factor at max_steps
    grad_clip: Optional[float] = None
    precision: Precision = Precision.auto
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    train_subset: Optional[int] = None  # use only the first N training examples
    eval_subset: Optional[int] = None  # evaluate on the first N validation / test examples
    max_length: Optional[int] = None  # cap on task.max_length (smoke runs)
    progress_bar: bool = True
    deterministic: bool = True  # torch.use_deterministic_algorithms: bitwise-repeatable runs and resumes (compiled too)
    compile: bool = False  # torch.compile the model (one graph; the first steps compile)
    compile_mode: str = "default"  # default | reduce-overhead (CUDA graphs) | max-autotune | max-autotune-no-cudagraphs
    capture: bool = False  # CUDA: the training step, and an evaluation batch, each one CUDA graph replayed (lra/capture.py)

    @property
    def evaluation_batch_size(self) -> int:
        """The batch evaluation runs in: eval_batch_size, or the training batch."""
        return self.batch_size if self.eval_batch_size is None else self.eval_batch_size

    def __post_init__(self):
        choice(self, "compile_mode", COMPILE_MODES)
        if self.compile_mode != "default" and not self.compile:
            raise InvalidOption("compile_mode", self.compile_mode, "default with compile=false (it is how torch.compile "
                                "compiles): pass trainer.compile=true as well, or leave it out")
        whole(self, 1, "batch_size", "grad_accumulation", "max_steps", "eval_every", "checkpoint_every", "log_every")
        whole(self, 1, "eval_batch_size", "train_subset", "eval_subset", "max_length", optional=True)
        whole(self, 0, "warmup_steps")
        if self.batch_size % self.grad_accumulation:
            raise InvalidOption("batch_size", self.batch_size, f"a multiple of grad_accumulation={self.grad_accumulation}")
        if self.train_subset is not None and self.train_subset < self.batch_size:
            raise InvalidOption("train_subset", self.train_subset, f"at least one batch (batch_size={self.batch_size})")
        schedule = LRSchedule(self.lr_schedule)
        if schedule in (LRSchedule.linear, LRSchedule.cosine) and self.warmup_steps > self.max_steps:
            # the rate would never reach trainer.lr nor decay (rsqrt has no end: LRA's Retrieval warms up
            # for 8,000 of its 5,000 steps, and that is allowed)
            raise InvalidOption("warmup_steps", self.warmup_steps, f"at most max_steps={self.max_steps} with "
                                f"lr_schedule={schedule.value}")
        number(self, "lr", 0.0, low_open=True)
        number(self, "weight_decay", 0.0)
        number(self, "beta1", 0.0, 1.0, high_open=True)
        number(self, "beta2", 0.0, 1.0, high_open=True)
        number(self, "eps", 0.0, low_open=True)
        number(self, "lr_start_factor", 0.0)
        number(self, "lr_end_factor", 0.0)
        number(self, "grad_clip", 0.0, low_open=True, optional=True)  # a negative norm would flip the gradient
        device_name(self, "device")
        check_adamw_steps(self, self.lr, "lr")


def _keyword_field_init(self, **values: Any) -> None:
    for option in dataclasses.fields(self):
        setattr(self, option.name, values.get(option.name, option.default))
    self.__post_init__()


def _pretrain_post_init(self) -> None:
    whole(self, 1, "max_steps", "batch_size", "checkpoint_every", "history_every")
    whole(self, 0, "warmup_steps")
    number(self, "lr", 0.0, low_open=True)
    number(self, "mask_probability", 0.0, 1.0, low_open=True)
    schedule = LRSchedule(self.lr_schedule)
    if schedule in (LRSchedule.linear, LRSchedule.cosine) and self.warmup_steps > self.max_steps:
        raise InvalidOption("warmup_steps", self.warmup_steps, f"at most max_steps={self.max_steps} with "
                            f"lr_schedule={schedule.value}")
    source = getattr(self, "from")
    if source is not None and not str(source).strip():
        raise InvalidOption("from", source, "a finished run directory (or null)")


# Self-pretraining (Amos, Berant & Gupta, ICLR 2024): stage 1 trains the encoder with a token-prediction
# head on the task's training inputs, stage 2 fine-tunes it (lra/pretraining.py). Its schedule defaults to
# the fine-tuning one. ``from`` (a run directory whose stage 1 finished) is a Python keyword, so this schema
# is declared through type() with an __init__ of its own.
PretrainConfig = dataclass(init=False, repr=False, eq=False)(type("PretrainConfig", (), {
    "__module__": __name__,
    "__annotations__": {"objective": PretrainObjective, "max_steps": int, "warmup_steps": int, "lr": float,
                        "lr_schedule": LRSchedule, "batch_size": int, "mask_probability": float,
                        "checkpoint_every": int, "history_every": int, "from": Optional[str]},
    "objective": PretrainObjective.none,
    "max_steps": II("trainer.max_steps"),
    "warmup_steps": II("trainer.warmup_steps"),
    "lr": II("trainer.lr"),
    "lr_schedule": II("trainer.lr_schedule"),
    "batch_size": II("trainer.batch_size"),
    "mask_probability": 0.5,  # masked: the share of real tokens masked (the SPT paper's 50 %)
    "checkpoint_every": II("trainer.checkpoint_every"),
    "history_every": II("trainer.eval_every"),  # a pretraining-loss entry every this many steps
    "from": None,  # a run directory whose pretraining stage finished: fine-tune from it, pretrain nothing
    "__init__": _keyword_field_init,
    "__post_init__": _pretrain_post_init,
}))


@dataclass
class LoggerConfig:
    name: str = "none"


W_AND_B_FORBIDDEN = tuple("/\\#?%:")  # characters no W&B project name may hold


@dataclass
class WandbLoggerConfig(LoggerConfig):
    name: str = "wandb"
    project: str = "lra"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)

    def __post_init__(self):
        """W&B's own limits (its settings' validators), checked before training: past them ``wandb.init``
        fails and the run trains unlogged, with a warning."""
        if not self.project or len(self.project) > 128 or any(c in self.project for c in W_AND_B_FORBIDDEN):
            raise InvalidOption("project", self.project, f"a W&B project name (1 to 128 characters, none of "
                                                         f"{' '.join(W_AND_B_FORBIDDEN)})")
        for key in ("entity", "group"):
            value = getattr(self, key)
            if value is not None and (not value.strip() or len(value) > 128):
                raise InvalidOption(key, value, f"a W&B {key} name of 1 to 128 characters, not blank (or null)")
        for tag in self.tags:
            if not 1 <= len(tag) <= 64:
                raise InvalidOption("tags", tag, "a list of W&B tags, each 1 to 64 characters")


OPTIMIZABLE_METRICS = ("best_val_accuracy", "test_accuracy", "train_tokens_per_second")


@dataclass
class TrainRunConfig:
    task: Any = MISSING
    attention: Any = MISSING
    model: ModelConfig = MISSING
    trainer: TrainerConfig = MISSING
    pretrain: PretrainConfig = MISSING
    logger: Any = MISSING
    seed: int = 0
    data_dir: str = "${lra.env_or:LRA_DATA_DIR,data}"  # an empty LRA_DATA_DIR is unset, not the working folder
    resume: Optional[str] = None  # a run directory to continue
    # The value a run returns to Hydra's sweeper (Optuna maximizes it; a failed job returns NaN).
    optimized_metric: str = "best_val_accuracy"

    def __post_init__(self):
        whole(self, 0, "seed", maximum=2**32 - 1)  # numpy's seed range
        choice(self, "optimized_metric", OPTIMIZABLE_METRICS)


TASK_SCHEMAS = {"schema_task_base": TaskConfig, "schema_task_listops": ListOpsTaskConfig,
                "schema_task_bytes": ByteTaskConfig, "schema_task_pathfinder": PathfinderTaskConfig}


def task_schema(name: str) -> type:
    """The dataclass the task preset ``name`` extends: the schema its ``defaults`` list names."""
    preset = CONF_DIR / "task" / f"{name}.yaml"
    entries = OmegaConf.load(preset).get("defaults", []) if preset.is_file() else []
    for entry in entries:
        schema = str(entry).lstrip("/").split("@")[0]
        if schema in TASK_SCHEMAS:
            return TASK_SCHEMAS[schema]
    return TaskConfig


def typed(cfg) -> "TrainRunConfig":
    """The run's config as its dataclasses (real enums, every rule run): what the training code takes
    once :func:`lra.validation.validate` has accepted the composed config."""
    return cfg if isinstance(cfg, TrainRunConfig) else OmegaConf.to_object(cfg)


def typed_task(task) -> TaskConfig:
    """A task config node as its dataclass (the same object if it is one already)."""
    return task if isinstance(task, TaskConfig) else OmegaConf.to_object(task)


def saved_run_config(saved) -> Any:
    """A run's saved resolved config made whole against today's schemas: fields added since it was
    written take their defaults (the task's, the attention's and the logger's too, whose schemas depend
    on their names)."""
    saved = OmegaConf.create(saved) if not isinstance(saved, DictConfig) else saved
    if saved.get("task", {}).get("validation") == "reference":  # its name before 2026-11-24
        saved.task.validation = "test"
    merged = OmegaConf.merge(OmegaConf.structured(TrainRunConfig), saved)
    merged.task = OmegaConf.merge(OmegaConf.structured(task_schema(merged.task.name)), merged.task)
    if merged.attention.name in attention_zoo.names():  # an unknown one is refused by validation, by name
        schema = attention_schema(attention_zoo.get(merged.attention.name))
        merged.attention = OmegaConf.merge(OmegaConf.structured(schema), merged.attention)
    logger_name = OmegaConf.select(merged, "logger.name", default="none")
    logger_schema = {"wandb": WandbLoggerConfig}.get(logger_name, LoggerConfig)
    merged.logger = OmegaConf.merge(OmegaConf.structured(logger_schema), merged.logger)
    if OmegaConf.is_missing(merged, "pretrain"):  # saved before self-pretraining existed: none
        merged.pretrain = OmegaConf.structured(PretrainConfig)
    return merged


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent)."""
    # Hydra deep-copies this singleton for every compose (30 of its 130 ms here; 193 times for --help), yet only
    # reads the copy, and the store's load() hands out copies of its nodes: the copy may be the store itself.
    ConfigStore.__deepcopy__ = lambda self, memo: self
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainRunConfig)
    cs.store(name="profile_schema", node=ProfileConfig)
    cs.store(name="fidelity_schema", node=open_plain_dicts(OmegaConf.structured(FidelityConfig)))
    for name, node in TASK_SCHEMAS.items():
        cs.store(name=name, node=node)
    cs.store(name="schema_model_base", node=ModelConfig)
    cs.store(name="schema_trainer_base", node=TrainerConfig)
    cs.store(name="schema_pretrain_base", node=PretrainConfig)
    cs.store(name="schema_logger_none", node=LoggerConfig)
    cs.store(name="schema_logger_wandb", node=WandbLoggerConfig)
    for name in attention_zoo.names():
        schema = attention_node(attention_zoo.get(name))
        cs.store(name=f"schema_attention_{name}", node=schema)
        if not (CONF_DIR / "attention" / f"{name}.yaml").is_file():  # a backend of LRA_ATTENTION_MODULES: its defaults
            cs.store(group="attention", name=name, node=schema)
    from hydra.core.plugins import Plugins

    from hydra_plugins.lra_launcher.local_gpus import LocalGpusLauncher, LocalGpusLauncherConf

    from hydra_plugins.lra_launcher.packed import PackedLauncher, PackedLauncherConf

    cs.store(group="hydra/launcher", name="schema_local_gpus", node=LocalGpusLauncherConf)
    cs.store(group="hydra/launcher", name="schema_packed", node=PackedLauncherConf)
    for launcher in (LocalGpusLauncher, PackedLauncher):  # an editable install hides them from Hydra's package scan
        Plugins.instance().register(launcher)


def _if_resume(resume: Optional[str], otherwise: Any) -> Any:
    from lra.run import not_a_run

    problem = not_a_run(resume) if resume else None
    if problem:
        raise ValueError(problem)
    return resume if resume else otherwise


def _gpu_count() -> int:
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def _run_stamp() -> str:
    """The run folder's name: the time, or under torchrun the rendezvous id every rank shares."""
    import os
    from datetime import datetime

    if os.environ.get("WORLD_SIZE", "1") not in ("", "0", "1") and os.environ.get("TORCHELASTIC_RUN_ID"):
        return "ddp-" + os.environ["TORCHELASTIC_RUN_ID"]
    return datetime.now().strftime("%H-%M-%S-%f")


def pools_by_cls(pooling) -> bool:
    """Whether ``model.pooling`` (an enum member or its name) prepends a CLS token."""
    return getattr(pooling, "value", pooling) == Pooling.cls.value


def _env_or(name: str, default: str) -> str:
    import os

    return os.environ.get(name) or default


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("lra.if_resume"):
        OmegaConf.register_new_resolver("lra.if_resume", _if_resume)
    if not OmegaConf.has_resolver("lra.env_or"):  # ${VAR:-default}: set and not empty, else the default
        OmegaConf.register_new_resolver("lra.env_or", _env_or)
    if not OmegaConf.has_resolver("lra.run_stamp"):
        OmegaConf.register_new_resolver("lra.run_stamp", _run_stamp, use_cache=True)
    if not OmegaConf.has_resolver("lra.conf_dir"):
        OmegaConf.register_new_resolver("lra.conf_dir", lambda: str(CONF_DIR))
    if not OmegaConf.has_resolver("lra.gpu_count"):
        OmegaConf.register_new_resolver("lra.gpu_count", _gpu_count)
    if not OmegaConf.has_resolver("lra.pools_by_cls"):  # a backend's CLS position follows the model's pooling
        OmegaConf.register_new_resolver("lra.pools_by_cls", pools_by_cls)
    if not OmegaConf.has_resolver("lra.unless_resume"):
        # Resuming writes into the original run directory and keeps its .hydra/ untouched.
        OmegaConf.register_new_resolver("lra.unless_resume", lambda resume, value: None if resume else value)
