"""Raster primitives of the Pathfinder generator, reproducing how the original (Linsley et al. 2018,
``drewlinsley/pathfinder``, run in 2020 with that year's scipy) put pixels on the canvas.

- A paddle is a PIL line ``round(thickness · aa)`` pixels wide drawn at ``aa`` (antialias scale) times
  the resolution from its start, in its orientation, ``length · aa`` long, on a square patch of
  2R·aa + 1 pixels (R = length + ⌈thickness⌉ + margin), then resized with Lanczos to 2R + 1 pixels
  through uint8 (scipy's ``imresize`` converted to 8 bits first, so the resampling's negative lobes
  are clipped). Its occupancy mask is the same line dilated by a disk of radius margin · aa before
  the resize. Both are stamped centred on the start pixel.
- Occupancy tests dilate a float mask by a binary kernel (a grey-level dilation: the maximum under
  the kernel, as OpenCV's ``dilate``, including its border rule: a pixel whose kernel lies wholly
  outside the image gets −∞, which the original's free-pixel search reads as "no free pixel").
- A marker is a disk of radius ``marker_radius · aa`` at ``aa`` times the resolution, resized the same way.
- The finished float image is stretched to 0–255 (scipy's ``bytescale``: min → 0, max → 255).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Tuple

import numpy as np
from PIL import Image, ImageDraw


def translate(point, orientation: float, distance: float) -> Tuple[int, int]:
    """(row, col) moved ``distance`` along ``orientation`` (radians; row grows with sin), rounded up."""
    return (int(math.ceil(point[0] + distance * math.sin(orientation))),
            int(math.ceil(point[1] + distance * math.cos(orientation))))


def flipped(orientation: float) -> float:
    """The opposite direction, kept in (−π, π]."""
    return orientation + math.pi if orientation < 0 else orientation - math.pi


def disk(radius: float) -> np.ndarray:
    """Binary (2⌊r⌋ + 1)² kernel of the pixels within ``radius`` of the centre."""
    half = int(radius)
    y, x = np.ogrid[-half : half + 1, -half : half + 1]
    return (x * x + y * y <= radius * radius).astype(np.uint8)


def dilate(image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """Grey dilation: out[p] = max of image[p + o − anchor] over the kernel's non-zero offsets o
    (anchor = the kernel's centre); pixels outside the image are ignored, and a pixel whose every
    offset falls outside gets −∞ (OpenCV's default border for dilation)."""
    kh, kw = kernel.shape
    ay, ax = kh // 2, kw // 2
    padded = np.full((image.shape[0] + kh - 1, image.shape[1] + kw - 1), -np.inf)
    padded[ay : ay + image.shape[0], ax : ax + image.shape[1]] = image
    out = np.full(image.shape, -np.inf)
    for dy, dx in zip(*np.nonzero(kernel)):
        np.maximum(out, padded[dy : dy + image.shape[0], dx : dx + image.shape[1]], out=out)
    return out


def dilated_at(image: np.ndarray, kernel: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``dilate(image, kernel)`` read at ``points`` [k, 2] (row, col) only."""
    offsets = np.argwhere(kernel) - np.array([kernel.shape[0] // 2, kernel.shape[1] // 2])
    at = points[:, None, :] + offsets[None]
    inside = (at >= 0).all(-1) & (at[..., 0] < image.shape[0]) & (at[..., 1] < image.shape[1])
    values = np.where(inside, image[np.clip(at[..., 0], 0, image.shape[0] - 1), np.clip(at[..., 1], 0, image.shape[1] - 1)],
                      -np.inf)
    return values.max(axis=1)


def lanczos_levels(fine: np.ndarray, size: int) -> np.ndarray:
    """A 0–255 image resized to ``size``² with Lanczos in 8 bits (uint8)."""
    image = Image.fromarray(np.clip(fine, 0, 255).astype(np.uint8), mode="L")
    return np.asarray(image.resize((size, size), resample=Image.LANCZOS))


def lanczos_uint8(fine: np.ndarray, size: int) -> np.ndarray:
    """A 0–255 image resized to ``size``² with Lanczos in 8 bits, returned as floats in [0, 1]."""
    return np.asarray(lanczos_levels(fine, size), dtype=np.float64) / 255.0


@lru_cache(maxsize=4096)
def paddle_patch(length: int, thickness: float, margin: int, scale: int, orientation: float) -> Tuple[np.ndarray, np.ndarray]:
    """(ink, occupancy) patches [2R + 1]² of a unit-contrast paddle starting at the centre."""
    reach = length + int(math.ceil(thickness)) + margin
    fine_size, centre = 2 * reach * scale + 1, reach * scale
    width = int(round(thickness * scale))
    if width != thickness * scale:
        raise ValueError(f"paddle_thickness × antialias_scale must be a whole number of pixels, got {thickness * scale}")
    head = translate((centre, centre), orientation, length * scale)
    canvas = Image.new("F", (fine_size, fine_size), 0.0)
    ImageDraw.Draw(canvas).line([(centre, centre), (head[1], head[0])], fill=255.0, width=width)
    fine = np.asarray(canvas, dtype=np.float64)
    occupancy = dilate(fine, disk(margin * scale))
    return lanczos_uint8(fine, 2 * reach + 1), lanczos_uint8(occupancy, 2 * reach + 1)


def window(shape, centre, half: int):
    """Slices of the image and of a (2·half + 1)² patch centred at ``centre``, clipped to the image."""
    top, left = centre[0] - half, centre[1] - half
    rows = slice(max(top, 0), min(top + 2 * half + 1, shape[0]))
    cols = slice(max(left, 0), min(left + 2 * half + 1, shape[1]))
    patch_rows = slice(rows.start - top, rows.stop - top)
    patch_cols = slice(cols.start - left, cols.stop - left)
    return (rows, cols), (patch_rows, patch_cols)


def stamp(canvas: np.ndarray, patch: np.ndarray, centre) -> None:
    """canvas = max(canvas, patch placed centred at ``centre``), in place."""
    if patch.size == 0:
        return
    (rows, cols), (prows, pcols) = window(canvas.shape, centre, patch.shape[0] // 2)
    if rows.stop > rows.start and cols.stop > cols.start:
        np.maximum(canvas[rows, cols], patch[prows, pcols], out=canvas[rows, cols])


def overlap_peak(canvas: np.ndarray, patch: np.ndarray, centre) -> float:
    """max(canvas + patch placed at ``centre``) under the patch (elsewhere it is the canvas, never
    above 1 for an occupancy mask, so a threshold above 1 only needs the window)."""
    (rows, cols), (prows, pcols) = window(canvas.shape, centre, patch.shape[0] // 2)
    if rows.stop <= rows.start or cols.stop <= cols.start:
        return 0.0
    return float((canvas[rows, cols] + patch[prows, pcols]).max())


def marker(resolution: int, centre, radius: float, scale: int) -> np.ndarray:
    """A marker disk of ``radius`` pixels at ``centre`` (row, col), as the original: drawn at
    ``scale`` × the resolution, resized with Lanczos in 8 bits; floats in [0, 1]."""
    return np.asarray(marker_levels(resolution, tuple(centre), radius, scale), dtype=np.float64) / 255.0


@lru_cache(maxsize=1024)  # every centre of a 32-px image; 16 MB at 128 px
def marker_levels(resolution: int, centre: Tuple[int, int], radius: float, scale: int) -> np.ndarray:
    """:func:`marker`'s 8-bit levels (uint8, read-only)."""
    size = resolution * scale
    y, x = np.ogrid[-centre[0] * scale : size - centre[0] * scale, -centre[1] * scale : size - centre[1] * scale]
    fine = np.where(x * x + y * y <= (radius * scale) ** 2, 255.0, 0.0)
    levels = lanczos_levels(fine, resolution)
    levels.flags.writeable = False
    return levels


def bytescale(image: np.ndarray) -> np.ndarray:
    """uint8 with the minimum at 0 and the maximum at 255 (rounded), as scipy's ``bytescale``."""
    low, high = float(image.min()), float(image.max())
    scale = 255.0 / (high - low) if high > low else 1.0
    return np.clip((image - low) * scale + 0.5, 0, 255).astype(np.uint8)
