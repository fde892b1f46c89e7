"""One check of a composed config, before anything is built or written: unknown keys (Hydra's
``+key`` appends included), then each group's own rules (the ``__post_init__`` of the dataclass
the ConfigStore holds for it, run on the resolved values), the backend's options (its options
dataclass), and the few rules that span groups. Every problem is one :class:`ConfigError` line
naming the field, the value, the rule and the fix; no default is ever substituted."""

from __future__ import annotations

import dataclasses
import difflib
import os
from types import SimpleNamespace

from omegaconf import DictConfig, OmegaConf

import attention_zoo
from attention_zoo import user_modules
from attention_zoo.options import InvalidOption
from lra import distributed
from lra.errors import ConfigError, InvalidValue
from lra.adamw_limits import check_adamw_steps
from lra.config import TrainRunConfig, pools_by_cls, typed

GROUPS = ("task", "model", "trainer", "pretrain", "logger")


def invalid(path: str, error: InvalidOption) -> InvalidValue:
    value = error.value if not isinstance(error.value, str) else f"'{error.value}'"
    names_a_fix = "leave it out" in error.rule or "pass " in error.rule
    return InvalidValue(f"invalid value for {path}: {value}; it must be {error.rule}"
                       + ("" if names_a_fix else f": pass {path}=<such a value>"))


def unknown_keys(node: DictConfig, path: str = "") -> None:
    """Every key of a structured node must be a field of its dataclass."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        fields = [f.name for f in dataclasses.fields(schema)]
        for key in node.keys():
            if key not in fields:
                full = f"{path}{key}"
                close = difflib.get_close_matches(str(key), fields, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                where = f"under {path[:-1]}" if path else "at the top level"
                raise ConfigError(f"unknown key '{full}'{hint}; valid keys {where}: {', '.join(sorted(fields))}")
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            unknown_keys(child, f"{path}{key}.")


def check_group(node: DictConfig, path: str) -> None:
    """Run the group's dataclass rules on its resolved values (nested dataclasses too)."""
    try:
        OmegaConf.to_object(node)
    except InvalidOption as error:
        # A nested settings dataclass (e.g. task.generator) reports its own field: find which holds it.
        prefix = path
        for key in node.keys():
            child = node._get_node(key)
            if isinstance(child, DictConfig) and error.field in child and key != error.field:
                try:
                    OmegaConf.to_object(child)
                except InvalidOption:
                    prefix = f"{path}.{key}"
                    break
        raise invalid(f"{prefix}.{error.field}", error) from None


def attention_spec(cfg) -> attention_zoo.AttentionSpec:
    """The run's attention (name, validated options, label), made from ``cfg.attention`` (a config node or
    its dataclass) in this one place."""
    node = cfg.attention
    values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dataclasses.asdict(node)
    return attention_zoo.spec(node.name, **{k: v for k, v in values.items() if k != "name"})


def run_label(cfg) -> str:
    """The run's row label ("YOSO-32", "YOSO-32 +SPT"), decided here for every run and record: the
    attention's paper label (:attr:`attention_zoo.AttentionSpec.label`) and self-pretraining's suffix.
    A config refused for its attention options still gets one: the backend's name, suffixed."""
    from lra import pretraining

    try:
        attention = attention_spec(cfg).label
    except (InvalidOption, TypeError, KeyError):  # the refused options themselves, or an unknown backend
        attention = str(cfg.attention.name)
    return pretraining.spt_label(attention, cfg)


def check_user_backends() -> None:
    """The modules of ``LRA_ATTENTION_MODULES`` imported (else Hydra would call their backend an unknown choice)."""
    try:
        attention_zoo.check_user_modules()
    except attention_zoo.UserModuleError as exc:
        raise ConfigError(str(exc)) from None


def check_attention(cfg: DictConfig) -> None:
    name = cfg.attention.name
    if name not in attention_zoo.names():
        variable = user_modules.VARIABLE
        raise ConfigError(f"attention '{name}' is registered by no module imported here ({variable}: "
                          f"{os.environ.get(variable) or 'unset'}): a backend of your own needs its module named "
                          f"there; registered: {', '.join(attention_zoo.names())}")
    try:
        options = attention_spec(cfg).options
    except InvalidOption as error:
        raise invalid(f"attention.{error.field}", error) from None
    impl = getattr(options, "impl", None)
    if impl == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("attention.impl=cuda but this machine has no CUDA device; use attention.impl=auto "
                              "(the compiled kernels for the tensors' device) or attention.impl=cpu")


def pooling_of(cfg: DictConfig) -> str:
    return getattr(cfg.model.pooling, "value", cfg.model.pooling)


def check_flex_path(cfg: DictConfig) -> None:
    """``attention.impl=flex`` where the Flex path cannot train this run (a CPU, attention dropout, torch's
    deterministic algorithms, a head dimension Flex's kernels do not take, a pooling that reads the padded
    rows Flex computes differently): refused before anything runs,
    by the rules the backend applies per call (``attention_zoo._flex.refusal``)."""
    import torch

    from attention_zoo import _flex

    spec = attention_spec(cfg)
    backend = attention_zoo.get(spec.name).cls
    if not backend.has_flex_path or spec.options.impl != "flex":
        return
    reason = _flex.refusal(backend, spec.options, training=True, device_type="cuda" if runs_on_cuda(cfg) else "cpu",
                           dtype=torch.float32, head_dim=cfg.model.head_dim, deterministic=cfg.trainer.deterministic,
                           backward=True, padded_rows_read=pooling_of(cfg) == "mean_unmasked")
    if reason:
        raise InvalidValue(f"invalid value for attention.impl: 'flex'; {reason}")


def check_cls_position(cfg: DictConfig) -> None:
    """A backend that treats position 0 as the CLS token (``cls_token``, Sparse Transformer) does so
    exactly when the model prepends one, as the LRA code sets it from its pooling: otherwise a real
    token would attend and be attended densely, or the CLS token would sit inside the pattern."""
    claimed = getattr(attention_spec(cfg).options, "cls_token", None)
    prepended = pools_by_cls(cfg.model.pooling)
    if claimed is not None and claimed != prepended:
        raise InvalidValue(f"invalid value for attention.cls_token: {str(claimed).lower()}; it must be "
                          f"{str(prepended).lower()} with model.pooling={pooling_of(cfg)} "
                          f"(position 0 is a CLS token only under model.pooling=cls): leave attention.cls_token "
                          f"unset, it follows model.pooling")


def check_shape(cfg: DictConfig) -> None:
    """The backend's options against the shape the model gives it (e.g. no more Nyström landmarks
    than positions), before anything is built."""
    from lra.model import attention_length, input_length

    positions = attention_length(cfg.model.pooling, input_length(cfg.task.max_length, cfg.trainer.max_length))
    try:
        attention_spec(cfg).check_shape(cfg.model.num_heads, cfg.model.head_dim, positions)
    except InvalidOption as error:
        raise invalid(f"attention.{error.field}", error) from None


IMAGE_PIXELS = 32 * 32  # CIFAR-10's images, one token a pixel


def check_whole_images(cfg: DictConfig) -> None:
    """An image task's padded length holds every pixel (Pathfinder's own rule checks resolution²; CIFAR's
    task.max_length had none and cut each image to its top rows). trainer.max_length may still cap it, as
    a plumbing run's speed knob, with the training's truncation warning."""
    task = cfg.task
    if task.name == "image" and task.max_length < IMAGE_PIXELS:
        raise InvalidValue(f"invalid value for task.max_length: {task.max_length}; it must be at least the "
                          f"{IMAGE_PIXELS} pixels of each image of task=image: pass task.max_length={IMAGE_PIXELS}")


def check_preset_choices(choices) -> None:
    """A paper's presets chosen together as their files can merge them (Hydra's ``runtime.choices``):
    a setup trains its own task (``setup=<paper>/<task>``), a row is chosen whole (its per-task files,
    ``row=<paper>/<row>/<task>``, are what a setup merges), and a row with such per-task files runs under
    a setup, the only place they are merged. Anything else trains silently without the preset's settings."""
    from lra.config import CONF_DIR

    setup, row, task = choices.get("setup"), choices.get("row"), choices.get("task")
    if setup:
        setup_task = setup.rsplit("/", 1)[-1]
        if task != setup_task:
            raise ConfigError(f"setup={setup} is its paper's {setup_task} setup, but task={task}: pass "
                              f"setup={setup.rsplit('/', 1)[0]}/{task} for {task} at that paper's setup, or leave "
                              f"setup= out for {task} at the reference setup")
    if not row:
        return
    paper, *name = row.split("/")
    if len(name) > 1:
        whole, part = f"{paper}/{name[0]}", name[-1]
        setup_of_part = f" with setup={paper}/{part}" if (CONF_DIR / "setup" / paper / f"{part}.yaml").is_file() else ""
        raise ConfigError(f"row={row} is a part of row {whole} (its {part} settings, merged by a setup): pass "
                          f"row={whole}{setup_of_part}")
    per_task = CONF_DIR / "row" / row
    if per_task.is_dir() and not setup:
        setups = sorted(p.parent.name for p in (CONF_DIR / "setup").glob(f"*/{task}.yaml"))
        fix = (f"pass setup=<{'|'.join(f'{paper}/{task}' for paper in setups)}>" if setups
               else f"no setup trains task={task}")
        raise ConfigError(f"row={row} keeps its per-task settings in {per_task.relative_to(CONF_DIR)}/, which only "
                          f"a setup merges, and this run has none: {fix} (or attention=<backend> for the backend "
                          f"alone at the reference setup)")


def keys_given(overrides) -> list:
    """The keys Hydra's ``key=value`` overrides set (``+key``, ``~key`` as ``key``), in their order."""
    return [str(override).split("=", 1)[0].lstrip("+~") for override in overrides]


def check_group_names(cfg: DictConfig, choices, overrides) -> None:
    """``task.name``, ``attention.name`` and ``logger.name`` set on the command line (``overrides``, Hydra's
    ``key=value`` strings) to another than their group's choice (Hydra's ``runtime.choices``): the run
    would train one task, backend or logger with another's settings, recorded under that name
    (``logger.name`` is not the W&B run's name). A preset file may name another backend (a variant of
    it); only the command line is judged."""
    from lra.config import CONF_DIR

    overridden = set(keys_given(overrides))
    for group in ("task", "attention", "logger"):
        chosen, name = choices.get(group), OmegaConf.select(cfg, f"{group}.name")
        if f"{group}.name" not in overridden or chosen is None or name == chosen:
            continue
        files = sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
        fix = f"pass {group}={name}" if name in files else f"pass {group}=<{'|'.join(files)}>"
        run_name = " (W&B names each run by its backend's label; logger.group and logger.tags mark runs)" \
            if group == "logger" else ""
        raise ConfigError(f"{group}.name={name} differs from {group}={chosen}, and a run takes its {group}'s settings "
                          f"from {group}=: {fix} instead of setting {group}.name{run_name}")


def check_unused_pretrain_keys(cfg: DictConfig, overrides) -> None:
    """``pretrain.<key>`` set on the command line (``overrides``) beside ``pretrain.from``: the stage 1 ran in
    that run, as set there. It changed nothing, and the run's saved config said it had. (Without
    self-pretraining such a key is let be: a sweep over pretrain=none,masked shares its keys.)"""
    from lra import pretraining

    unused = [key for key in keys_given(overrides)
              if key.startswith("pretrain.") and key not in ("pretrain.from", "pretrain.objective")]
    if not unused:
        return
    if pretraining.source_run(cfg) is not None:
        raise ConfigError(f"{unused[0]} changes nothing beside pretrain.from, whose stage 1 ran as it was set there "
                          f"(its run's .hydra/resolved.yaml): leave {unused[0]} out")


def check_schedule_factors(cfg: DictConfig) -> None:
    """trainer.lr_start_factor and lr_end_factor shape only a linear schedule (the fine-tuning one, or
    stage 1's under pretraining): set under another, they would change nothing."""
    from lra import pretraining
    from lra.config import TrainerConfig

    schedules = [cfg.trainer.lr_schedule, *([cfg.pretrain.lr_schedule] if pretraining.pretrains(cfg) else [])]
    if any(getattr(s, "value", s) == "linear" for s in schedules):
        return
    for name in ("lr_start_factor", "lr_end_factor"):
        default = next(f.default for f in dataclasses.fields(TrainerConfig) if f.name == name)
        if cfg.trainer[name] != default:
            raise invalid(f"trainer.{name}", InvalidOption(name, cfg.trainer[name], (
                f"left out: it shapes only trainer.lr_schedule=linear, and this run's is "
                f"{getattr(schedules[0], 'value', schedules[0])}; pass trainer.lr_schedule=linear as well, or leave it out")))


def check_pretraining(cfg: DictConfig) -> None:
    """Self-pretraining's cross-group rules: its batch against gradient accumulation and the training
    subset, a causal objective against the backend, and ``pretrain.from`` against this run."""
    from lra import pretraining

    if not pretraining.pretrains(cfg):
        return
    batch, trainer = cfg.pretrain.batch_size, cfg.trainer
    if batch % trainer.grad_accumulation:
        raise InvalidValue(f"invalid value for pretrain.batch_size: {batch}; it must be a multiple of "
                          f"trainer.grad_accumulation={trainer.grad_accumulation}: pass pretrain.batch_size=<such a value>")
    if trainer.train_subset is not None and trainer.train_subset < batch:
        raise InvalidValue(f"invalid value for pretrain.batch_size: {batch}; it must be at most trainer.train_subset="
                          f"{trainer.train_subset}: pass pretrain.batch_size=<such a value>")
    try:
        check_adamw_steps(OmegaConf.to_object(cfg.trainer), cfg.pretrain.lr, "pretrain.lr")
    except InvalidOption as error:
        raise invalid(error.field if error.field == "pretrain.lr" else f"trainer.{error.field}", error) from None
    pretraining.check_objective(cfg)
    pretraining.check_source(cfg)


def runs_on_cuda(cfg: DictConfig) -> bool:
    """Whether the run's trainer.device puts it on a CUDA device (``auto``: where there is one)."""
    import torch

    device = cfg.trainer.device
    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def check_device_and_precision(cfg: DictConfig) -> None:
    """CUDA asked for where there is none, YOSO's kernels for another device than the run's, and mixed precision
    where it cannot run (CPU)."""
    check_device(cfg.trainer.device, "trainer.device")
    impl, kind = cfg.attention.get("impl"), "cuda" if runs_on_cuda(cfg) else "cpu"
    if impl in ("cpu", "cuda") and impl != kind:  # YOSO's kernels for one device, the run on the other
        raise InvalidValue(f"invalid value for attention.impl: '{impl}'; this run is on {kind} (trainer.device="
                          f"{cfg.trainer.device}) and these kernels are for {impl}: pass attention.impl={kind} (or auto)")
    precision = cfg.trainer.precision.value
    if precision in ("bf16", "fp16") and not runs_on_cuda(cfg):
        raise InvalidValue(f"invalid value for trainer.precision: '{precision}'; it needs a CUDA device and this run "
                          "is on the CPU: pass trainer.precision=fp32 (or auto)")


def check_process_split(cfg: DictConfig) -> None:
    """Each step's batch splits evenly over the micro-batches of every process (torchrun's ranks): the
    fine-tuning batch, and self-pretraining's."""
    from lra import pretraining

    processes, pieces = distributed.world_size(), cfg.trainer.grad_accumulation
    batches = [("trainer.batch_size", cfg.trainer.batch_size)]
    if pretraining.pretrains(cfg):
        batches.append(("pretrain.batch_size", cfg.pretrain.batch_size))
    for key, batch in batches:
        if processes > 1 and batch % (pieces * processes):
            raise InvalidValue(f"invalid value for {key}: {batch}; under torchrun it must be a multiple of "
                               f"trainer.grad_accumulation={pieces} × {processes} processes = {pieces * processes}: "
                               f"pass {key}=<such a value>, or another --nproc_per_node")


def check_capture(cfg: DictConfig) -> None:
    """trainer.capture=true where the step cannot be captured (:func:`lra.capture.refusal`)."""
    if not cfg.trainer.capture:
        return
    from lra.capture import refusal

    why = refusal(cfg.trainer, runs_on_cuda(cfg), distributed.world_size())
    if why:
        raise InvalidValue(f"invalid value for trainer.capture: true; {why}")


def deleted_key(path: str) -> str:
    """The line for ``~<path>`` on a key (not a group): every run needs each key of the schema."""
    return (f"~{path} deletes a key every run needs; set it instead ({path}=<value>), or leave it out for its "
            "default")


def check_groups_present(cfg: DictConfig) -> None:
    """Every config group has a choice (``~model`` deletes one) and every top-level key a value (``~seed``)."""
    from lra.config import CONF_DIR

    for field in dataclasses.fields(TrainRunConfig):
        if field.name not in (*GROUPS, "attention") and field.name not in cfg:
            raise ConfigError(deleted_key(field.name))
    for group in (*GROUPS, "attention"):
        if OmegaConf.is_missing(cfg, group) or OmegaConf.select(cfg, group) is None:
            choices = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
            raise ConfigError(f"the config has no {group} (was it deleted with ~{group}?); every run needs one: "
                              f"pass {group}=<{'|'.join(choices)}>")


def check_device(name: str, path: str) -> None:
    if name.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{path}={name} but this machine has no CUDA device; use {path}=cpu (or auto)")


WANDB_MODES = ("online", "offline", "disabled", "shared", "dryrun", "run")  # W&B's settings accept these


def check_wandb_mode(logger: str) -> None:
    """``WANDB_MODE`` is one of W&B's modes when W&B logs the run: another made ``wandb.init`` fail, and the
    run trained unlogged behind a warning."""
    mode = os.environ.get("WANDB_MODE")
    if logger == "wandb" and mode and mode not in WANDB_MODES:
        raise ConfigError(f"WANDB_MODE={mode} is not a W&B mode: set it to one of {', '.join(WANDB_MODES[:3])}, or "
                          "unset it (online when logged in to W&B, else offline)")


def validate_tool(cfg: DictConfig) -> None:
    """The same checks for lra-profile and lra-fidelity: unknown keys, the dataclass rules, each
    backend's options (lra-fidelity's ``options.<backend>``), and CUDA asked for where there is none;
    first, every field of the tool's schema present (``~key`` deletes one)."""
    check_user_backends()
    schema = OmegaConf.get_type(cfg)
    if dataclasses.is_dataclass(schema):
        present = set(cfg.keys())
        for field in dataclasses.fields(schema):
            if field.name not in present:
                raise ConfigError(deleted_key(field.name))
    unknown_keys(cfg)
    try:
        OmegaConf.to_object(cfg)
    except InvalidOption as error:
        raise invalid(error.field, error) from None
    check_device(cfg.device, "device")
    if "options" in cfg:
        for name in attention_zoo.names():
            try:
                attention_zoo.make_options(name, **OmegaConf.to_container(cfg.options[name], resolve=True))
            except InvalidOption as error:
                raise invalid(f"options.{name}.{error.field}", error) from None
    if cfg.get("yoso_impl") == "cuda":
        check_device("cuda", "yoso_impl")


def validate(cfg: DictConfig) -> TrainRunConfig:
    """Raise :class:`ConfigError` for the first unknown key or invalid value of an lra-train config;
    return it as its dataclasses (:func:`lra.config.typed`), what the training code takes."""
    check_groups_present(cfg)
    unknown_keys(cfg)
    for group in GROUPS:
        check_group(cfg[group], group)
    top_level = SimpleNamespace(**{f.name: cfg[f.name] for f in dataclasses.fields(TrainRunConfig)
                                   if f.name not in (*GROUPS, "attention")})
    try:  # the schema's own rules for its top-level scalars (the groups were checked above)
        TrainRunConfig.__post_init__(top_level)
    except InvalidOption as error:
        raise invalid(error.field, error) from None
    check_attention(cfg)
    check_flex_path(cfg)
    check_cls_position(cfg)
    check_shape(cfg)
    check_whole_images(cfg)
    check_schedule_factors(cfg)
    check_pretraining(cfg)
    check_process_split(cfg)
    check_device_and_precision(cfg)
    check_wandb_mode(cfg.logger.name)
    check_capture(cfg)
    return typed(cfg)
