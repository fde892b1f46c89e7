"""Whether a row's runs were trained as the paper's preset trains that row, for ``lra-table --reference``.

A delta against a paper's number is drawn only for a cell whose setup (:mod:`lra.results.setups`) is the
preset's for that row and task: the preset (``experiment=yoso_table3`` for ``--reference yoso``,
``lra_table1`` for ``lra``, ``lha_table3`` for ``lha``) is composed for the row that trains the run's label
on the run's task, as ``lra-train`` composes it, and the two setups must agree on every key. The row is the
run's own ``row=`` override where it names one of the preset's rows, else the preset's row whose label is
the run's. Otherwise the cell says why it has no delta: the keys that differ (``trainer.max_steps 300 ≠
5000``), or that no row of the preset trains the label. A record without a config cannot be checked: its
delta is drawn as before, and a note says so. A reference CSV of the user's own has no preset to check
against.
"""

from __future__ import annotations

import itertools
import re
from typing import Dict, List, Optional, Tuple

from lra.results.setups import Setups, as_preset_sources, compact, differences

PRESETS = {"yoso": "yoso_table3", "lra": "lra_table1", "lha": "lha_table3"}  # --reference NAME → its experiment
ROW = "row"
TASK_PARAMS = ("task", "setup")  # a preset's sweep parameter that picks the task (setup=<paper>/<task>)
PAPER, NOT_PAPER, UNCHECKED = "the paper's setup", "not the paper's setup", "not checked"


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower().replace("*", "star_")).strip("_")


class PaperSetups:
    """The preset of one ``--reference``: its rows and tasks, each (row, task) composed once when needed."""

    def __init__(self, reference: str, aliases: Dict[str, List[str]]):
        from omegaconf import OmegaConf

        from lra.config import CONF_DIR

        self.preset = PRESETS[reference]
        params = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "experiment" / f"{self.preset}.yaml"))
        sweep = {str(k): [v.strip() for v in str(value).split(",")]
                 for k, value in params.get("hydra", {}).get("sweeper", {}).get("params", {}).items()}
        self.rows = sweep.pop(ROW, [])
        self.others = sweep  # the task (or setup) and any other parameter the preset sweeps
        self.aliases = aliases  # our label → the paper's names for it
        self._made = Setups()
        self._composed: Dict[tuple, Tuple[Optional[str], Optional[dict]]] = {}

    def _combos(self, task: str) -> List[List[str]]:
        """The overrides of the preset's jobs on ``task``, the row left out."""
        names = list(self.others)
        combos = []
        for values in itertools.product(*(self.others[n] for n in names)):
            picked = dict(zip(names, values))
            chosen = [picked[p].rsplit("/", 1)[-1] for p in TASK_PARAMS if p in picked]
            if chosen and chosen[0] == task:
                combos.append([f"{n}={v}" for n, v in picked.items()])
        return combos

    def _compose(self, overrides: Tuple[str, ...]) -> Tuple[Optional[str], Optional[dict]]:
        """(the label, the flat setup) of the preset's job with ``overrides``; (None, None) if it cannot be
        composed (a row the preset has no such task for)."""
        if overrides not in self._composed:
            from omegaconf import OmegaConf

            from lra.commands.reference_slice import _compose
            from lra.validation import run_label

            try:
                cfg = _compose([f"experiment={self.preset}", *overrides])
                label = run_label(cfg)
                setup, _ = self._made.setup_of(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
                self._composed[overrides] = (label, setup)
            except Exception:  # a job the preset never runs: no setup to compare with
                self._composed[overrides] = (None, None)
        return self._composed[overrides]

    def _candidate_rows(self, label: str, given: Optional[str]) -> List[str]:
        """The preset's rows, the run's own row first, then those named like the label (or its paper names)."""
        names = [_slug(name) for name in [label, *self.aliases.get(label, [])]]

        def likeness(row: str) -> int:
            stem = _slug(row.rsplit("/", 1)[-1])
            if row == given:
                return 0
            if stem in names:
                return 1
            return 2 if any(name.startswith(stem) or stem.startswith(name) for name in names) else 3

        return sorted(self.rows, key=likeness)

    def check(self, label: str, task: str, setup: Optional[dict], given_row: Optional[str]) -> Tuple[str, str]:
        """(:data:`PAPER`, "") when ``setup`` is the preset's for ``label`` on ``task``; else (:data:`NOT_PAPER`,
        why) or, without a setup, (:data:`UNCHECKED`, why)."""
        if setup is None:
            return UNCHECKED, "setup not checked: no config recorded"
        closest = None
        for combo in self._combos(task):
            for row in self._candidate_rows(label, given_row):
                composed_label, preset = self._compose((*combo, f"{ROW}={row}"))
                if composed_label != label or preset is None:
                    continue
                found = differences(as_preset_sources(setup, preset), preset)
                if not found:
                    return PAPER, ""
                if closest is None or len(found) < len(closest):
                    closest = found
                break  # the row of this label: a later one would be another label's
        if closest is None:
            return NOT_PAPER, f"no job of experiment={self.preset} trains {label} on {task}"
        return NOT_PAPER, f"not the paper's setup: {compact(closest)}"

