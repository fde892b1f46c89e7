"""A table's row is one setup: the runs a cell averages were trained alike, but for their seed.

A run's setup is its resolved config (lra-train saves it as ``.hydra/resolved.yaml``; a record packed by
``lra-gpu-check --reference`` carries it as ``resolved.yaml`` beside ``metrics.json``; a sweep job refused
before it trained keeps only its composed ``.hydra/config.yaml``), made whole against today's schemas
(:func:`lra.config.saved_run_config`: a field added since takes the default the run had), less the keys
that say how or where a run ran rather than what it trained (:data:`RUN_KEYS`). Its fingerprint is a
short hash of what is left.

Runs of one label and task in different setups are different rows: the setup with the most runs keeps
the label, each other is named by its values where it differs (``Softmax (trainer.max_steps=40)``); a
note under the table lists every difference. A run whose folder holds no config (a record written before
configs were saved) joins the one setup its label has on its task, or else is a row of its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pandas as pd

from lra.results.formats import visible
from lra.results.reading import Unreadable, read_text
from lra.results.rows import label_key
from lra.run import OVERRIDES, RESOLVED, run_file_candidates

# Keys that do not change what a run computes: its seed (a row's seeds are its repeats), where it reads and
# writes, the device and how kernels are chosen and compiled on it, logging and checkpoint cadence.
RUN_KEYS = ("seed", "data_dir", "resume", "optimized_metric", "task.path", "trainer.device", "trainer.compile",
            "trainer.compile_mode", "trainer.deterministic", "trainer.progress_bar", "trainer.log_every",
            "trainer.checkpoint_every", "pretrain.checkpoint_every", "pretrain.history_every")
RUN_GROUPS = ("logger",)
# The task's reference schedule counts only through trainer.* (its defaults interpolate these): compared there.
SCHEDULE_KEYS = ("task.batch_size", "task.max_steps", "task.warmup_steps", "task.eval_every")
# A stage-1 run to fine-tune from is a path (one per seed): the setup keeps only that there is one.
STAGE_ONE, STAGE_ONE_MARK = ("pretrain", "from"), "a stage-1 run"
# Which config a run folder holds, in the order they are trusted.
CONFIG_FILES = (*run_file_candidates(Path(), RESOLVED), Path(".hydra") / "config.yaml")
OVERRIDE_FILES = run_file_candidates(Path(), OVERRIDES)
# Keys named first when setups differ, as a reader sizes a run by them; the rest in the config's order.
PRIORITY = ("attention.name", "trainer.max_steps", "task.max_length", "model.num_layers", "model.dim", "trainer.lr",
            "trainer.batch_size", "trainer.max_length")
ABSENT = "absent"  # a key one config has and another has not
NO_CONFIG = "no config recorded"
SHOWN = 2  # differing keys a row's name shows before "+N more"
NOTED = 12  # and the note under the table


def fingerprint(setup: Dict[str, object]) -> str:
    """8 hex digits of the SHA-256 of ``setup`` (a flat config)."""
    return hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:8]


def _stripped(raw: dict) -> dict:
    """``raw`` (a nested config) without :data:`RUN_KEYS` and :data:`RUN_GROUPS`, a stage-1 path marked."""
    out = json.loads(json.dumps(raw, default=str))
    for key in (*RUN_KEYS, *RUN_GROUPS, *SCHEDULE_KEYS):
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    stage = out.get(STAGE_ONE[0])
    if isinstance(stage, dict) and stage.get(STAGE_ONE[1]) is not None:  # its stage 1 ran there, as set there:
        out[STAGE_ONE[0]] = {STAGE_ONE[1]: STAGE_ONE_MARK}  # this run's own pretrain.* never applied
    if isinstance(stage, dict) and stage.get("objective") in (None, "none") and stage.get(STAGE_ONE[1]) is None:
        out[STAGE_ONE[0]] = {"objective": "none"}  # no self-pretraining: its settings never ran
    return out


def flatten(node, prefix: str = "") -> Dict[str, object]:
    """A nested config as dotted keys in its own order; lists stay values."""
    if not isinstance(node, dict):
        return {prefix.rstrip("."): node}
    out: Dict[str, object] = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) and value else
                   {f"{prefix}{key}": value})
    return out


class Setups:
    """Configs made whole once per distinct config (a sweep's seeds share one)."""

    def __init__(self):
        self._made: Dict[str, Tuple[Optional[dict], Optional[str]]] = {}

    def setup_of(self, raw: dict) -> Tuple[Optional[Dict[str, object]], Optional[str]]:
        """(the flat setup of the resolved or composed config ``raw``, None) or (None, why it has none)."""
        from omegaconf import OmegaConf

        from lra.config import register_resolvers, saved_run_config

        stripped = _stripped(raw)
        key = json.dumps(stripped, sort_keys=True)
        if key not in self._made:
            register_resolvers()
            try:
                whole = saved_run_config(OmegaConf.create(raw))  # whole: the schemas want every group
                container = OmegaConf.to_container(whole, resolve=True, enum_to_str=True)
                self._made[key] = (flatten(_stripped(container)), None)
            except Exception as exc:  # a config today's schemas cannot read: what is wrong, in its words
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self._made[key] = (None, why)
        return self._made[key]


def _read_yaml(path: Path):
    import yaml

    try:
        return yaml.safe_load(read_text(path))
    except yaml.YAMLError as exc:
        raise Unreadable(f"not YAML ({str(exc).splitlines()[0]})") from None


def saved_config(folder: Path, warn: Callable[[str], None]) -> Optional[dict]:
    """The config a run folder holds (:data:`CONFIG_FILES`, the first readable one), or None."""
    for name in CONFIG_FILES:
        path = folder / name
        if not (path.exists() or path.is_symlink()):
            continue
        try:
            raw = _read_yaml(path)
        except Unreadable as exc:
            warn(f"{path}: not a readable config ({exc}); the run's setup is taken from its other files, if any")
            continue
        if isinstance(raw, dict) and raw:
            return raw
        warn(f"{path}: not a config (no keys); the run's setup is taken from its other files, if any")
    return None


def preset_row(folder: Path) -> Optional[str]:
    """The ``row=`` override the run was started with (``yoso_table3/softmax``), or None."""
    for name in OVERRIDE_FILES:
        try:
            overrides = _read_yaml(folder / name)
        except (Unreadable, OSError):
            continue
        for override in overrides if isinstance(overrides, list) else []:
            found = re.fullmatch(r"\+{0,2}row=(\S+)", str(override))
            if found:
                return found.group(1)
    return None


ATTENTION = "attention."


@lru_cache(maxsize=None)
def row_keys(row: Optional[str], task: str) -> frozenset:
    """The keys a paper preset's row files set (``conf/row/<row>.yaml`` and ``conf/row/<row>/<task>.yaml``)."""
    if not isinstance(row, str) or not re.fullmatch(r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*", row):
        return frozenset()
    from omegaconf import OmegaConf

    from lra.config import CONF_DIR

    keys = set()
    for path in (CONF_DIR / "row" / f"{row}.yaml", CONF_DIR / "row" / row / f"{task}.yaml"):
        if path.is_file():
            content = OmegaConf.to_container(OmegaConf.load(path))
            content.pop("defaults", None)
            keys |= set(flatten(content))
    return frozenset(keys)


def same_but_attention(a: dict, b: dict, ignored: frozenset) -> bool:
    """Whether two setups agree on every key but the attention's and ``ignored``."""
    keys = (set(a) | set(b)) - ignored
    return all(a.get(k) == b.get(k) for k in keys if not k.startswith(ATTENTION))


def describe(records: List[dict], warn: Callable[[str], None] = lambda message: None,
             made: Optional[Setups] = None) -> None:
    """Give each record its setup, in place: ``setup_config`` (flat), ``setup`` (its fingerprint), both None
    without a usable config, and ``preset_row``. A record given them already keeps them."""
    made = made or Setups()
    for record in records:
        if "setup" in record:
            continue
        folder = Path(record["run_dir"])
        raw = saved_config(folder, warn) if folder.is_dir() else record.pop("config", None)
        config, why = made.setup_of(raw) if isinstance(raw, dict) else (None, None)
        if why:
            warn(f"{record['run_dir']}: its config cannot be read against today's schemas ({visible(why)}); the run "
                 "is placed by its label and task alone")
        config = with_data_source(config, record)
        record["setup_config"], record["setup"] = config, (fingerprint(config) if config else None)
        record["preset_row"] = preset_row(folder) if folder.is_dir() else None
    for record in records:
        if record.get("stand_in"):
            _join_source(record, records)
    _split_by_data(records)


DATA_KEY = "data_content"  # a record's digest of the prepared arrays it trained on (lra.data.prepare)


def _split_by_data(records: List[dict]) -> None:
    """Runs of one setup that trained on different data (their records' :data:`DATA_KEY` differ: the config
    pointed at another copy of a release, an edited one) are different rows: where a setup's runs disagree, each
    run's setup names its data by the digest's first 8 digits (null for a record without one)."""
    groups: Dict[tuple, List[dict]] = {}
    for record in records:
        if record.get("setup_config"):
            groups.setdefault((record["label"], record["task"], record["setup"]), []).append(record)
    for group in groups.values():
        if len({r[DATA_KEY] for r in group if isinstance(r.get(DATA_KEY), str)}) < 2:
            continue
        for record in group:
            content = record.get(DATA_KEY)
            config = {**record["setup_config"], DATA_KEY: content[:8] if isinstance(content, str) else None}
            record["setup_config"], record["setup"] = config, fingerprint(config)


def _join_source(stand_in: dict, records: List[dict]) -> None:
    """A run without a record (:mod:`lra.results.recordless`) of ``task.source=auto`` cannot say which data
    it trained on: it joins the one setup of its label and task that is its config with a source chosen."""
    config = stand_in.get("setup_config")
    if not config or config.get(SOURCE_KEY) != "auto":
        return
    found = {r["setup"]: r["setup_config"] for r in records
             if not r.get("stand_in") and r.get("setup") and r["label"] == stand_in["label"]
             and r["task"] == stand_in["task"] and {**r["setup_config"], SOURCE_KEY: "auto"} == config}
    if len(found) == 1:
        ((setup, joined),) = found.items()
        stand_in.update(setup=setup, setup_config=joined)


SOURCE_KEY = "task.source"


def with_data_source(config: Optional[Dict[str, object]], record: dict) -> Optional[Dict[str, object]]:
    """``config`` with ``task.source=auto`` replaced by the source the run's record says it trained on: auto
    chooses at each start (a release prepared since is chosen over the generator), so two runs of one config
    may have trained on different data, and are then different rows."""
    source = record.get("data_source")
    if config is None or config.get(SOURCE_KEY) != "auto" or not isinstance(source, str) or not source.strip():
        return config
    return {**config, SOURCE_KEY: source}


def as_preset_sources(setup: Dict[str, object], preset: Dict[str, object]) -> Dict[str, object]:
    """``setup`` with the data source the preset leaves to ``task.source=auto`` as auto, and without the data's
    digest, for comparing the two: a preset's setup is its settings, whichever data a run trained on."""
    setup = {key: value for key, value in setup.items() if key != DATA_KEY}  # a preset names no data
    if preset.get(SOURCE_KEY) == "auto" and SOURCE_KEY in setup:
        return {**setup, SOURCE_KEY: "auto"}
    return setup


def place(records: List[dict]) -> None:
    """A record without a setup joins the one setup its label has on its task (``setup_assumed``), if it
    has exactly one; otherwise it stays without (a row of its own where its label has several setups)."""
    known: Dict[tuple, Dict[str, dict]] = {}
    for record in records:
        if record.get("setup"):
            known.setdefault((record["label"], record["task"]), {})[record["setup"]] = record["setup_config"]
    for record in records:
        if record.get("setup") is None:
            setups = known.get((record["label"], record["task"]), {})
            if len(setups) == 1:
                ((setup, config),) = setups.items()
                record.update(setup=setup, setup_config=config, setup_assumed=True)


def value_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return visible(value)


def ordered_keys(configs: List[Dict[str, object]]) -> List[str]:
    """The keys on which ``configs`` differ: :data:`PRIORITY` first, then in the configs' order."""
    keys = list(dict.fromkeys(k for config in configs for k in config))
    differ = [k for k in keys if len({json.dumps(c.get(k, ABSENT), default=str) for c in configs}) > 1]
    return sorted(differ, key=lambda k: (PRIORITY.index(k) if k in PRIORITY else len(PRIORITY), keys.index(k)))


def differences(config: Dict[str, object], other: Dict[str, object]) -> List[str]:
    """``key value ≠ other's value`` for each key where ``config`` differs from ``other``, in :func:`ordered_keys`'s
    order."""
    return [f"{k} {value_text(config.get(k, ABSENT))} ≠ {value_text(other.get(k, ABSENT))}"
            for k in ordered_keys([config, other])]


def compact(items: List[str], shown: int = SHOWN) -> str:
    return ", ".join(items[:shown] + ([f"+{len(items) - shown} more"] if len(items) > shown else []))


def name_rows(runs: pd.DataFrame) -> Tuple[pd.Series, pd.Series, List[str]]:
    """Each run's row (its label, or the label and what sets its setup apart), each row's rank among its
    label's rows (its main setup first), and one note line per (label, task) with several setups."""
    if "setup" not in runs:
        return runs["label"].copy(), pd.Series(0, index=runs.index), []
    setups = runs["setup"].where(runs["setup"].notna(), NO_CONFIG)
    rows, ranks, notes = runs["label"].copy(), pd.Series(0, index=runs.index), []
    for (label, task), group in runs.groupby(["label", "task"], sort=False):
        counts = setups[group.index].value_counts()
        if len(counts) == 1:
            continue
        configs = {s: group.loc[setups[group.index] == s, "setup_config"].iloc[0]
                   for s in counts.index if s != NO_CONFIG}
        configured = counts.drop(NO_CONFIG, errors="ignore")
        leaders = configured[configured == configured.max()]
        main = leaders.index[0] if len(leaders) == 1 else None
        keys = ordered_keys(list(configs.values()))
        names = {}
        for setup in counts.index:
            if setup == NO_CONFIG:
                names[setup] = f"{label} ({NO_CONFIG})"
            elif setup == main:
                names[setup] = label
            else:
                config = configs[setup]
                shown = [k for k in keys if main is None or config.get(k, ABSENT) != configs[main].get(k, ABSENT)]
                names[setup] = f"{label} ({compact([f'{k}={value_text(config.get(k, ABSENT))}' for k in shown])})"
        for setup, name in names.items():
            if list(names.values()).count(name) > 1:
                names[setup] = f"{name} #{setup}"
        order = sorted(counts.index, key=lambda s: (s == NO_CONFIG, s != main, names[s]))
        for setup in counts.index:
            members = group.index[setups[group.index] == setup]
            rows[members], ranks[members] = names[setup], order.index(setup)
        lines = []
        for setup in order:
            runs_text = f"{counts[setup]} run{'s' if counts[setup] != 1 else ''}"
            if setup == NO_CONFIG:
                lines.append(f"  - {names[setup]}: {runs_text}, setup unknown")
                continue
            against = main if main is not None and setup != main else None
            detail = f": {compact(differences(configs[setup], configs[against]), NOTED)}" if against else ""
            lines.append(f"  - {names[setup]}: {runs_text}, setup {setup}{detail}")
        notes.append(f"- {visible(label)} on {visible(task)}, {len(counts)} setups"
                     + ("" if main is None else f" (against {visible(label)}'s, the most runs)") + ":\n"
                     + "\n".join(lines))
    return rows, ranks, notes


def setup_notes(lines: List[str], runs: pd.DataFrame) -> List[str]:
    """The notes under a table on its setups: the labels with several, and the runs without a config."""
    notes = []
    if lines:
        notes.append("setups (a row is one setup: the resolved config less its seed, paths, device, compilation and "
                     "logging; a label with several setups on a task has a row for each, named by what differs):\n"
                     + "\n".join(lines))
    if "setup" in runs:
        bare = runs["setup"].isna() | runs.get("setup_assumed", pd.Series(False, index=runs.index)).map(
            lambda value: value is True)
        if bare.any():
            count = int(bare.sum())
            notes.append(f"no config recorded: {count} of the runs hold{'s' if count == 1 else ''} no config beside "
                         "the record (written before configs were saved, or refused before training): each is tabled "
                         "by its label and task alone (with the one setup its label has there, if any), so its setup "
                         "is not checked")
    return notes


def column_notes(summary: pd.DataFrame, configs: Dict[str, dict]) -> List[str]:
    """A note per task whose rows ran different setups besides their attention (and what a paper preset's row
    files set): the rows of each, and how each differs from the first (the one with the most rows), so that
    rows of different setups are not read as peers."""
    lines = []
    for task, group in summary.groupby("task", sort=False):
        clusters: List[list] = []  # [config, preset row, [row names]]
        for _, row in group.iterrows():
            config = configs.get(row["setup"]) if isinstance(row["setup"], str) else None
            if config is None:
                continue
            for cluster in clusters:
                ignored = row_keys(row["preset_row"], task) | row_keys(cluster[1], task)
                if same_but_attention(config, cluster[0], ignored):
                    cluster[2].append(row["backend"])
                    break
            else:
                clusters.append([config, row["preset_row"], [row["backend"]]])
        if len(clusters) < 2:
            continue
        order = {name: (label_key(label), name) for name, label in zip(group["backend"], group["label"])}
        for cluster in clusters:  # each in the table's row order
            cluster[2].sort(key=order.get)
        clusters.sort(key=lambda cluster: (-len(cluster[2]), order[cluster[2][0]]))
        first = clusters[0]
        parts = [f"  - {', '.join(first[2])}"]
        for config, row, names in clusters[1:]:
            ignored = row_keys(row, task) | row_keys(first[1], task)
            found = [d for d in differences(config, first[0]) if not d.startswith(ATTENTION) and
                     d.split(" ", 1)[0] not in ignored]
            parts.append(f"  - {', '.join(names)}: {compact(found, NOTED)}")
        lines.append(f"- {task}: {len(clusters)} setups besides the attention:\n" + "\n".join(parts))
    if not lines:
        return []
    return [visible_lines("rows of different setups (their numbers compare within a setup, not across):\n"
                          + "\n".join(lines))]


def visible_lines(text: str) -> str:
    """``text`` with each line made visible (:func:`lra.results.formats.visible`), the line breaks kept."""
    return "\n".join(visible(line) for line in text.split("\n"))
