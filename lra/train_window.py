"""The training metrics of the steps since the last read, summed on the device."""

from __future__ import annotations

import torch

from lra import distributed
from lra.errors import TrainingDiverged


class TrainWindow:
    """Training metrics since the last read, summed on the device: reading them is the loop's only
    device-to-host transfer between evaluations (every ``log_every`` steps and at each evaluation
    or checkpoint, so that a resumed run reads the same windows as an uninterrupted one)."""

    def __init__(self):
        self.steps, self.examples, self.sums, self.has_aux, self.counts_predictions = 0, 0, None, False, False

    def add(self, metrics: dict) -> None:
        """``correct`` counts right predictions out of ``predictions`` (a device count: predicted tokens
        in pretraining) or, without it, out of ``examples``."""
        aux, predictions = metrics.get("aux_loss"), metrics.get("predictions")
        self.has_aux = self.has_aux or aux is not None
        self.counts_predictions = predictions is not None
        loss = metrics["loss"]
        zero = torch.zeros_like(loss)  # not loss * 0, NaN where the loss is: it was read as that step's aux_loss
        # a non-finite aux_loss at a step whose loss is finite: the backend's own divergence (once the loss is
        # NaN, the weights are, and the next steps' aux_loss follows: the loss's)
        aux_first = (~torch.isfinite(aux) & torch.isfinite(loss)) if aux is not None else zero
        values = torch.stack([loss.double(), metrics["correct"].double(), metrics["nonfinite"].double(),
                              (aux if aux is not None else zero).double(),
                              (predictions if predictions is not None else zero).double(), aux_first.double()])
        self.sums = values if self.sums is None else self.sums + values
        self.steps += 1
        self.examples += metrics["examples"]

    def read(self, ranks: distributed.Ranks, step: int, lr_setting: str = "trainer.lr") -> dict:
        """The window's metrics; :class:`TrainingDiverged` (one line naming ``lr_setting``, this stage's
        learning rate, and trainer.grad_clip) if the loss was not finite at one of its steps."""
        loss, correct, nonfinite, aux, predictions, aux_first = distributed.sum_across(self.sums, ranks).tolist()
        if nonfinite and aux_first:
            raise TrainingDiverged(
                f"the attention backend's auxiliary loss (aux_loss) was not finite at a step between "
                f"{step - self.steps + 1} and {step} (read every trainer.log_every steps); no checkpoint was written "
                f"after it: the backend's own loss diverged (a lower {lr_setting} or trainer.grad_clip may hold it)")
        if nonfinite and step - self.steps + 1 == 1 and nonfinite == self.steps * ranks.world:
            raise TrainingDiverged(
                "the training loss was not finite at step 1, before any update, so neither the learning rate nor "
                "gradient clipping caused it: the model's forward gave non-finite values on its first batch (an "
                "attention backend's output, say: lra-fidelity measures each on random inputs); no checkpoint was "
                "written")
        if nonfinite:
            raise TrainingDiverged(
                f"the training loss was not finite at a step between {step - self.steps + 1} and {step} (read every "
                f"trainer.log_every steps); no checkpoint was written after it: start a new run with a lower "
                f"{lr_setting} or with trainer.grad_clip set")
        predicted = predictions if self.counts_predictions else self.examples * ranks.world
        metrics = {"train/loss": loss / (self.steps * ranks.world), "train/accuracy": 100.0 * correct / max(predicted, 1)}
        if self.has_aux:
            metrics["train/aux_loss"] = aux / (self.steps * ranks.world)
        return metrics
