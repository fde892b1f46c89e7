"""What AdamW's float32 arithmetic can take of a run's trainer settings: checked by the trainer's schema
(:class:`lra.config.TrainerConfig`) for trainer.lr and by :func:`lra.validation.check_pretraining` for stage 1's
pretrain.lr."""

from __future__ import annotations

from attention_zoo.options import InvalidOption

FLOAT32_MAX, FLOAT32_TINY = 3.4028234663852886e38, 1.1754943508222875e-38


def check_adamw_steps(trainer, lr: float, lr_field: str) -> None:
    """AdamW's float32 arithmetic at the learning rate ``lr`` (trainer.lr, or stage 1's pretrain.lr): ε stays
    nonzero (below float32's smallest normal it rounds to 0, and a zero gradient's 0/0 is NaN), the largest step,
    the schedule's peak rate over the first bias correction 1 − β1, fits float32 (beyond it the step is an
    overflow error), and the decoupled decay, each weight × (1 − rate × weight_decay) a step, never flips a sign.
    Every schedule's factor is at most max(1, lr_start_factor, lr_end_factor) (lra/schedules.py)."""
    if trainer.eps < FLOAT32_TINY:
        raise InvalidOption("eps", trainer.eps, f"at least {FLOAT32_TINY:.3g}, float32's smallest normal number (a "
                            "smaller one rounds to 0 in the optimizer, where a zero gradient is then 0/0 = NaN)")
    factor = max(1.0, trainer.lr_start_factor, trainer.lr_end_factor)
    if lr * factor / (1.0 - trainer.beta1) > FLOAT32_MAX:
        field = lr_field if lr / (1.0 - trainer.beta1) > FLOAT32_MAX else (
            "lr_start_factor" if trainer.lr_start_factor >= trainer.lr_end_factor else "lr_end_factor")
        raise InvalidOption(field, getattr(trainer, field) if field != lr_field else lr,
                            f"small enough that AdamW's largest step, {lr_field} × max(1, lr_start_factor, "
                            f"lr_end_factor) / (1 − beta1), is a float32 number (≤ {FLOAT32_MAX:.3g})")
    if lr * factor * trainer.weight_decay > 1.0:
        raise InvalidOption("weight_decay", trainer.weight_decay, f"at most 1 / ({lr_field} × max(1, lr_start_factor, "
                            f"lr_end_factor)) = {1.0 / (lr * factor):.3g}: AdamW multiplies each weight by 1 − rate × "
                            "weight_decay every step, which beyond that flips its sign")
