"""When a run is stuck at chance: the rule is decided here and recorded with the run
(``chance_accuracy``, ``stuck_at_chance`` in metrics.json), and lra-table counts it.

Chance is the best constant prediction: the share of the validation set's most frequent class (50 %
on balanced Pathfinder, above 1/classes on ListOps). A run is stuck when its best validation accuracy
stays within ``Z`` binomial standard errors of chance: best ≤ chance + Z·√(p(1 − p)/N), with p the
chance share and N the validation examples. A run that learned anything clears that bound; a seed
that never left chance (Pathfinder's known failure) does not."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z = 3.0


@dataclass(frozen=True)
class ChanceLevel:
    accuracy: float  # percent: the most frequent class's share
    threshold: float  # percent: a best validation accuracy at or below it is stuck

    @classmethod
    def of(cls, labels: np.ndarray) -> "ChanceLevel":
        labels = np.asarray(labels)
        if labels.size == 0:
            return cls(math.nan, math.nan)
        share = np.bincount(labels).max() / labels.size
        return cls(100.0 * share, 100.0 * (share + Z * math.sqrt(share * (1 - share) / labels.size)))

    def stuck(self, best_val_accuracy) -> bool | None:
        """None until there is a validation accuracy."""
        if best_val_accuracy is None or math.isnan(self.threshold):
            return None
        return bool(best_val_accuracy <= self.threshold)
