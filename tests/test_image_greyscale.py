"""LRA Image's greyscale equals ``tf.image.rgb_to_grayscale`` for every one of the 2^24 colours: checked
against an exact replica of its float32 arithmetic in integers (no floating point at all), so
neither the oracle nor a BLAS can round differently on another machine.

A float32 value is an integer mantissa M < 2^24 times 2^E. Every step is done exactly in int64
(products of mantissas, sums aligned to the smaller exponent) and then rounded to 24 significant
bits, to nearest, ties to even, as IEEE 754 float32 arithmetic rounds."""

from fractions import Fraction

import numpy as np

from lra.data.image import tf_grayscale

MANTISSA_BITS = 24


def bit_length(m: np.ndarray) -> np.ndarray:
    """Bits of each non-negative int64, by binary search (no floating point)."""
    length, rest = np.zeros_like(m), m.copy()
    for step in (32, 16, 8, 4, 2, 1):
        high = rest >= (np.int64(1) << step)
        length += step * high
        rest = np.where(high, rest >> step, rest)
    return length + (rest > 0)


def round_float32(m: np.ndarray, e: np.ndarray) -> tuple:
    """(M, E) of the float32 nearest to m·2^e (m ≥ 0 exact), ties to even."""
    shift = np.maximum(bit_length(m) - MANTISSA_BITS, 0)
    kept = m >> shift
    dropped = m - (kept << shift)
    half = np.where(shift > 0, np.int64(1) << np.maximum(shift - 1, 0), 0)
    up = (shift > 0) & ((dropped > half) | ((dropped == half) & (kept % 2 == 1)))
    kept = kept + up
    carry = kept >> MANTISSA_BITS  # rounding up to 2^24
    return kept >> carry, e + shift + carry


def exact_float32(value: Fraction) -> tuple:
    """(M, E) of the float32 nearest to a positive rational, ties to even, in Python integers."""
    e = value.numerator.bit_length() - value.denominator.bit_length() - MANTISSA_BITS - 1
    while value / Fraction(2) ** e >= 2**MANTISSA_BITS:
        e += 1
    scaled = value / Fraction(2) ** e  # in [2^23, 2^24)
    m, rest = divmod(scaled.numerator, scaled.denominator)
    if 2 * rest > scaled.denominator or (2 * rest == scaled.denominator and m % 2):
        m += 1
    return (m >> 1, e + 1) if m == 2**MANTISSA_BITS else (m, e)


def to_fraction(m: int, e: int) -> Fraction:
    return Fraction(m) * Fraction(2) ** e


def add(a: tuple, b: tuple) -> tuple:
    """Exact a + b of non-negative (M, E) arrays, rounded to float32."""
    e = np.minimum(a[1], b[1])
    return round_float32((a[0] << (a[1] - e)) + (b[0] << (b[1] - e)), e)


def channel_products() -> list:
    """For each channel, the 256 float32 (M, E) of round(round(c · float32(1/255)) · float32(w))."""
    scale = exact_float32(Fraction(1, 255))
    out = []
    for weight in ("0.2989", "0.5870", "0.1140"):
        w = exact_float32(Fraction(weight))
        values = [(0, 0)]
        for c in range(1, 256):
            scaled = exact_float32(c * to_fraction(*scale))
            values.append(exact_float32(to_fraction(*scaled) * to_fraction(*w)))
        out.append((np.array([m for m, _ in values], dtype=np.int64), np.array([e for _, e in values], dtype=np.int64)))
    return out


PRODUCTS = channel_products()


def red_plus_green() -> tuple:
    """(M, E) [65,536] of the float32 sum r·w_r + g·w_g for every (r, g), r-major."""
    (rm, re), (gm, ge), _ = PRODUCTS
    r, g = np.repeat(np.arange(256), 256), np.tile(np.arange(256), 256)
    return add((rm[r], re[r]), (gm[g], ge[g]))


def replica_grey_levels(red_green: np.ndarray, blue: np.ndarray, partial: tuple) -> np.ndarray:
    """TensorFlow's grey level of each colour (index 256·r + g into ``partial``, b): the float32 sum
    (r·w_r + g·w_g) + b·w_b, × float32(255.5), truncated — exactly, in integers."""
    bm, be = PRODUCTS[2]
    total = add((partial[0][red_green], partial[1][red_green]), (bm[blue], be[blue]))
    m, e = round_float32(total[0] * 511, total[1] - 1)  # 255.5 = 511 · 2^-1, exact in float32
    return np.where(e >= 0, m << np.maximum(e, 0), m >> np.maximum(-e, 0))


def test_the_replica_rounds_as_float32_does_on_a_sample():
    """The integer replica itself against numpy's float32 on 4,096 sums (numpy's float32 addition is
    one correctly rounded IEEE operation, whatever the machine)."""
    (rm, re), (gm, ge), _ = PRODUCTS
    rng = np.random.default_rng(0)
    r, g = rng.integers(0, 256, 4096), rng.integers(0, 256, 4096)
    m, e = add((rm[r], re[r]), (gm[g], ge[g]))
    as_float = (rm[r] * 2.0 ** re[r]).astype(np.float32) + (gm[g] * 2.0 ** ge[g]).astype(np.float32)
    assert np.array_equal(m * 2.0 ** e, as_float.astype(np.float64))


def test_tensorflow_grayscale_equals_the_exact_replica_for_every_colour():
    partial = red_plus_green()
    blue = np.tile(np.arange(256), 8 * 256)
    for first in range(0, 65536, 8 * 256):  # 8 reds at a time: every green and blue
        red_green = np.repeat(np.arange(first, first + 8 * 256), 256)
        colours = np.stack([red_green // 256, red_green % 256, blue], axis=-1).astype(np.uint8)
        ours = tf_grayscale(colours).astype(np.int64)
        differ = np.flatnonzero(ours != replica_grey_levels(red_green, blue, partial))
        assert not len(differ), f"{len(differ)} colours differ, e.g. {colours[differ[:3]].tolist()}"
