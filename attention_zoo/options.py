"""Validation of options dataclasses: each checks its own fields in ``__post_init__`` with these
helpers, which raise :class:`InvalidOption` naming the field, the value and the rule. No default is
ever substituted for an invalid value."""

from __future__ import annotations

import math
from typing import Any, Iterable


class InvalidOption(ValueError):
    """An option outside its rule. ``field`` is the option's name (callers prefix their path)."""

    def __init__(self, field: str, value: Any, rule: str):
        self.field, self.value, self.rule = field, value, rule
        super().__init__(f"{field}={value!r} is invalid: it must be {rule}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def whole(options: Any, minimum: int, *names: str, optional: bool = False, maximum: int | None = None) -> None:
    """Each of ``names`` is an integer in [minimum, maximum] (or None when ``optional``)."""
    for name in names:
        value = getattr(options, name)
        if value is None and optional:
            continue
        bounds = f"≥ {minimum}" if maximum is None else f"between {minimum} and {_readable(maximum)}"
        rule = f"a whole number {bounds}" + (" (or null)" if optional else "")
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum or (maximum is not None and value > maximum):
            raise InvalidOption(name, value, rule)


def _readable(bound: int) -> str:
    """2^32 − 1 rather than 4294967295."""
    return f"2^{(bound + 1).bit_length() - 1} − 1" if bound > 2**16 and (bound + 1) & bound == 0 else str(bound)


def number(options: Any, name: str, low: float = -math.inf, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = False, optional: bool = False) -> None:
    """``name`` is a finite number in the interval (open ends as asked), or None when ``optional``."""
    value = getattr(options, name)
    if value is None and optional:
        return
    left = ("(" if low_open else "[") + ("−∞" if low == -math.inf else f"{low:g}")
    right = "∞)" if high == math.inf else f"{high:g}" + (")" if high_open else "]")
    rule = f"a finite number in {left}, {right}" + (" (or null)" if optional else "")
    if not _is_number(value) or not math.isfinite(value):
        raise InvalidOption(name, value, rule)
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        raise InvalidOption(name, value, rule)


def choice(options: Any, name: str, choices: Iterable[str]) -> None:
    choices = list(choices)
    value = getattr(options, name)
    if value not in choices:
        raise InvalidOption(name, value, f"one of {', '.join(map(str, choices))}")


def odd_window(options: Any, name: str) -> None:
    """A convolution window: odd (same-length output) or 0 (no convolution)."""
    value = getattr(options, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or (value and value % 2 == 0):
        raise InvalidOption(name, value, "odd (same-length output) or 0 (no convolution)")


def at_most_length(options: Any, name: str, length: int, meaning: str) -> None:
    """``name`` is at most the input length N (``length``); ``meaning`` says what N itself gives."""
    value = getattr(options, name)
    if value > length:
        raise InvalidOption(name, value, f"at most the input length N = {length} (N: {meaning})")


def window_within(options: Any, name: str, length: int) -> None:
    """A convolution window along the sequence (:func:`odd_window`) whose taps all can reach a token of N."""
    value = getattr(options, name)
    if value and value > 2 * length - 1:
        raise InvalidOption(name, value, f"at most 2N − 1 = {2 * length - 1} for the input length N = "
                                         f"{length} (a tap further than N − 1 positions from its token never "
                                         "reaches one), or 0")
