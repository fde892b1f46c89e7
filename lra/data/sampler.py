"""A resumable, seeded training-batch order: each epoch is a permutation drawn from a generator
seeded by (seed, epoch), so the loader's whole state is two integers."""

from __future__ import annotations

import numpy as np

from lra.errors import UserError


class EpochSampler:
    """Yields index batches of ``batch_size``; the last partial batch of an epoch is dropped."""

    def __init__(self, num_examples: int, batch_size: int, seed: int):
        if num_examples < batch_size:
            raise UserError(f"the training split has {num_examples} examples, fewer than one batch of {batch_size}: "
                            f"pass trainer.batch_size={num_examples} or less (or use more training data)")
        self.num_examples, self.batch_size, self.seed = num_examples, batch_size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_examples)

    def next_batch(self) -> np.ndarray:
        if self.position + self.batch_size > self.num_examples:
            self.epoch, self.position = self.epoch + 1, 0
            self._order = self._permutation(self.epoch)
        batch = self._order[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed,
                "num_examples": self.num_examples, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        for key in ("seed", "num_examples", "batch_size"):
            if state[key] != getattr(self, key):
                raise ValueError(f"checkpoint sampler {key}={state[key]} differs from this run's {getattr(self, key)}")
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
