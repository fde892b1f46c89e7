"""The drawing state of one Pathfinder image (:class:`Canvas`) and what it reads that depends only on
the geometry (:class:`Tables`): the snake-growing steps of :mod:`lra.data.pathfinder_generator`,
arranged so that an image costs milliseconds. The generator starts a few hundred target pairs per
image (at 32 px most end at their first orientation; some twenty grow about a dozen paddles each)
and keeps one, so the per-paddle work is what counts (about 400 paddles an image):

- every paddle shape, candidate circle, continuity weight and seed kernel is computed once per
  geometry and looked up by orientation (a finite set: whole degrees for seeds, the circle's
  directions after that);
- the occupancy mask is kept beside its dilation by the margin's disk (the neighbourhood a
  candidate pixel must be clear in), updated with a pre-dilated patch at each commit, so a candidate
  reads one value instead of the disk's; the maximum commutes with dilation, and pixels near the
  border already read the padding's 1, the largest value a mask holds, so this is exact;
- a paddle overlaps the mask by 1.8 only where its occupancy exceeds 0.5 (the mask never exceeds
  1), so only those pixels are summed;
- the per-paddle reads are Python floats from memoryviews of the mask, summed in numpy's pairwise
  order (:func:`numpy_sum`): a numpy call on a dozen values costs more than the arithmetic;
- ink is drawn only for target pairs and distractors that are kept, when the image is rendered.

Every value, and every comparison a random choice depends on, is the same float computation as a
straightforward reading of the original process: the images are bit for bit those of the earlier,
slower code (recorded digests in the tests)."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from typing import Dict, List, Optional, Tuple

import numpy as np

from lra.data import pathfinder_drawing as draw

HEAVY = 0.5  # occupancy above which a pixel can take the mask (≤ 1) to the 1.8 a paddle may not reach
OVERLAP_LIMIT = 1.8
FREE_BELOW = 0.3  # a mask value at most this leaves a pixel free


@dataclass
class Paddle:
    snake: int  # 0, 1: the targets; 2…: distractors
    start: Tuple[float, float]  # (row, col), the end facing the snake's origin
    end: Tuple[float, float]
    orientation: float  # direction of travel from start to end


def free_tails(mask: np.ndarray, band: int, kernel: np.ndarray) -> np.ndarray:
    """[k, 2] pixels where a seed paddle (dilation ``kernel``) stays clear (≤ 0.3) of the mask with
    a border ``band`` pixels wide set occupied."""
    lined = mask.copy()
    lined[:band, :] = lined[-band:, :] = lined[:, :band] = lined[:, -band:] = 1.0
    return np.argwhere(draw.dilate(lined, kernel) <= FREE_BELOW)


@lru_cache(maxsize=64)
def circle_offsets(radius: int) -> Tuple[np.ndarray, np.ndarray]:
    """Offsets of the pixels the original samples on a circle around a pivot (a point per pixel of
    arc, truncated to integers; for a pivot at integer coordinates and points inside the image,
    truncation is the floor), sorted and unique, with their directions from the pivot."""
    step = 360.0 / (2 * radius * math.pi)
    angles = np.arange(0, 360, step) * math.pi / 180
    offsets = np.unique(np.floor(np.stack([radius * np.sin(angles), radius * np.cos(angles)], axis=1)).astype(int),
                        axis=0)
    return offsets, np.arctan2(offsets[:, 0], offsets[:, 1])


@lru_cache(maxsize=8192)
def seed_kernel(length: int, thickness: float, margin: int, scale: int, resolution: int,
                orientation: float) -> Optional[np.ndarray]:
    """The dilation kernel of a seed paddle, or None when dilating by it leaves some pixel with every
    offset outside the image: OpenCV then returns −∞ there, and the original's free-pixel search
    gives up on any negative value, so seeds only start in orientations whose kernel reaches back
    over its anchor (the first target paddle and every distractor start this way)."""
    _, occupancy = draw.paddle_patch(length, thickness, margin, scale, orientation)
    reach, half = occupancy.shape[0] // 2, length + margin
    size = 2 * half + 1
    kernel = np.zeros((size, size), dtype=np.uint8)
    (rows, cols), (prows, pcols) = draw.window((size, size), (half + 1, half + 1), reach)
    kernel[rows, cols] = occupancy[prows, pcols] >= 1.0
    if draw.dilate(np.zeros((resolution, resolution)), kernel).min() < 0:
        return None
    return kernel


def numpy_sum(values: List[float]) -> float:
    """The sum numpy's ``add.reduce`` gives for these values as a contiguous float64 array: pairwise
    summation, below 8 values in order, up to 128 in eight interleaved partial sums joined as a tree
    and the rest added in order, beyond that split in halves (a multiple of 8 first)."""
    n = len(values)
    if n < 8:
        total = 0.0
        for value in values:
            total += value
        return total
    if n > 128:
        half = n // 2
        half -= half % 8
        return numpy_sum(values[:half]) + numpy_sum(values[half:])
    r0, r1, r2, r3, r4, r5, r6, r7 = values[:8]
    whole = n - n % 8
    for i in range(8, whole, 8):
        r0 += values[i]
        r1 += values[i + 1]
        r2 += values[i + 2]
        r3 += values[i + 3]
        r4 += values[i + 4]
        r5 += values[i + 5]
        r6 += values[i + 6]
        r7 += values[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(whole, n):
        total += values[i]
    return 0.0 + total


class PaddleShape:
    """A paddle of one orientation: its ink, its occupancy stacked over the occupancy dilated by the
    margin's disk (what a commit adds to the mask and to its dilation, in one call), and the pixels
    that can take the mask to the overlap limit, as (flat offset, occupancy) pairs."""

    def __init__(self, g, margin: int, orientation: float, stride: int):
        self.ink, occupancy = draw.paddle_patch(g.paddle_length, g.paddle_thickness, margin, g.antialias_scale,
                                                orientation)
        framed = np.pad(occupancy, margin)  # zeros: a commit leaves the mask (≥ 0) as it is there
        self.stacked = np.stack([framed, draw.dilate(framed, draw.disk(margin))])
        self.half = self.stacked.shape[1] // 2
        half = occupancy.shape[0] // 2
        rows, cols = np.nonzero(occupancy > HEAVY)
        self.heavy = [(int(r) - half, int(c) - half, int(r - half) * stride + int(c - half), float(occupancy[r, c]))
                      for r, c in zip(rows, cols)]
        self.heavy_flat = [(offset, value) for _, _, offset, value in self.heavy]
        self.heavy_reach = max([max(abs(r), abs(c)) for r, c, _, _ in self.heavy], default=0)
        # Large paddles (64 and 128 px) have too many such pixels for a Python loop: numpy reads them.
        self.heavy_arrays = (np.array([offset for offset, _ in self.heavy_flat], dtype=np.int64),
                             np.array([value for _, value in self.heavy_flat])) if len(self.heavy) > 32 else None
        self._inks: Dict[float, np.ndarray] = {}

    def ink_at(self, contrast: float) -> np.ndarray:
        ink = self._inks.get(contrast)
        if ink is None:
            ink = self._inks[contrast] = self.ink * contrast
        return ink


@dataclass
class Step:
    """A paddle drawn towards pixel ``offset`` of the candidate circle (its end there)."""

    offset: Tuple[int, int]
    orientation: float  # its direction of travel
    shape: PaddleShape  # drawn back from its end, in the opposite direction
    start: Tuple[float, float]  # its start relative to its end


@dataclass
class Seed:
    """A snake's first paddle in one orientation (whole degrees): None kernel where none can start."""

    orientation: float
    kernel: Optional[np.ndarray]
    empty_tails: Dict[int, np.ndarray]  # band → free tails on a canvas with nothing drawn


class Tables:
    """Everything about one geometry and margin that does not depend on what is drawn."""

    def __init__(self, g, margin: int):
        self.g, self.margin, self.resolution = g, margin, g.resolution
        size, p = g.resolution, g.padding
        if p < 1:
            raise ValueError("the dilated occupancy mask relies on a padding of at least one pixel")
        mask = np.zeros((size, size))
        mask[:p, :] = mask[-p:, :] = mask[:, :p] = mask[:, -p:] = 1.0
        self.empty_mask = mask
        # The mask and its dilation, framed wide enough that a commit centred up to a paddle's length
        # outside the image needs no clipping; nothing reads the frame.
        self.frame = g.paddle_length + int(math.ceil(g.paddle_thickness)) + 2 * margin + g.paddle_length
        self.stride = size + 2 * self.frame
        self.empty = np.zeros((2, self.stride, self.stride))
        inner = (slice(None), slice(self.frame, self.frame + size), slice(self.frame, self.frame + size))
        self.empty[inner] = np.stack([mask, draw.dilate(mask, draw.disk(margin))])
        self.pivot_step = g.paddle_length + 2 * margin
        self.seed_reach = g.paddle_length + margin
        offsets, self.directions = circle_offsets(g.paddle_length + margin)
        self.circle = [(row, col, row * self.stride + col) for row, col in offsets.tolist()]
        self.circle_flat = [flat for _, _, flat in self.circle]
        self.circle_low = (int(offsets[:, 0].min()), int(offsets[:, 1].min()))
        self.circle_high = (int(offsets[:, 0].max()), int(offsets[:, 1].max()))
        self._shapes: Dict[float, PaddleShape] = {}
        self._turns: Dict[float, tuple] = {}
        self.seeds: List[Optional[Seed]] = [None] * 360  # by whole degrees from −180
        self.steps = []
        for (row, col), direction in zip(offsets.tolist(), self.directions):
            orientation = float(direction)
            back = draw.flipped(orientation)
            self.steps.append(Step((row, col), orientation, self.shape(back),
                                   (g.paddle_length * math.sin(back), g.paddle_length * math.cos(back))))

    def shape(self, orientation: float) -> PaddleShape:
        shape = self._shapes.get(orientation)
        if shape is None:
            shape = self._shapes[orientation] = PaddleShape(self.g, self.margin, orientation, self.stride)
        return shape

    def turn(self, orientation: float) -> tuple:
        """(the continuity weight cos²(min(continuity·Δθ, π/2)) of each circle pixel for a snake heading
        ``orientation``, sin and cos of ``orientation``)."""
        turn = self._turns.get(orientation)
        if turn is None:
            angle = np.abs(self.directions - orientation)
            angle = np.minimum(np.minimum(angle, 2 * math.pi - angle) * self.g.continuity, math.pi / 2)
            turn = self._turns[orientation] = ((np.maximum(np.cos(angle), 0) ** 2).tolist(), math.sin(orientation),
                                               math.cos(orientation))
        return turn

    def seed(self, degrees: int) -> Seed:
        seed = self.seeds[degrees + 180]
        if seed is None:
            g = self.g
            orientation = degrees * math.pi / 180
            kernel = seed_kernel(g.paddle_length, g.paddle_thickness, self.margin, g.antialias_scale, g.resolution,
                                 orientation)
            seed = self.seeds[degrees + 180] = Seed(orientation, kernel, {})
        return seed

    def empty_tails(self, seed: Seed, band: int) -> np.ndarray:
        tails = seed.empty_tails.get(band)
        if tails is None:
            tails = seed.empty_tails[band] = free_tails(self.empty_mask, band, seed.kernel)
        return tails


@lru_cache(maxsize=64)
def tables(g, margin: int) -> Tables:
    return Tables(g, margin)


class Canvas:
    """The state of one image being drawn: the occupancy mask stacked over its dilation by the
    margin's disk (read through memoryviews: a Python float per read, no numpy call), the ink stamps
    of the paddles kept so far, and the paddles drawn (as tuples until :meth:`paddles`). The mask is
    made on the first paddle that reads it: most target pairs end at their first orientation draw."""

    def __init__(self, t: Tables, rng):
        self.t, self.rng, self.g, self.margin = t, rng, t.g, t.margin
        self.state: Optional[np.ndarray] = None
        self.inks: List[tuple] = []  # (patch, centre) not yet drawn into ``ink``
        self.ink: Optional[np.ndarray] = None
        self.drawn: List[tuple] = []  # (snake, start, end, orientation) of each paddle

    def _allocate(self) -> None:
        t = self.t
        self.state = t.empty.copy()
        self.mask = self.state[0, t.frame : t.frame + t.resolution, t.frame : t.frame + t.resolution]
        self.mask_flat = self.state[0].reshape(-1)
        self.mask_at, self.near_at = memoryview(self.state[0].reshape(-1)), memoryview(self.state[1].reshape(-1))

    def inside(self, point) -> bool:
        return 0 <= point[0] < self.g.resolution and 0 <= point[1] < self.g.resolution

    def paddles(self) -> List[Paddle]:
        return [Paddle(snake, (float(start[0]), float(start[1])), (float(end[0]), float(end[1])), float(orientation))
                for snake, start, end, orientation in self.drawn]

    def random_orientation(self) -> float:
        return self.rng.integers(-180, 180) * math.pi / 180

    def commit(self, pending) -> None:
        """Add a paddle's occupancy (``pending``: its shape and centre) to the mask and its dilation."""
        shape, (row, col) = pending
        if self.state is None:
            self._allocate()
        top, left = row + self.t.frame - shape.half, col + self.t.frame - shape.half
        if not (0 <= top <= self.t.stride - shape.stacked.shape[1] and 0 <= left <= self.t.stride - shape.stacked.shape[2]):
            raise AssertionError(f"a paddle committed at {(row, col)}, beyond the mask's frame")
        window = self.state[:, top : top + shape.stacked.shape[1], left : left + shape.stacked.shape[2]]
        np.maximum(window, shape.stacked, out=window)

    def render(self) -> np.ndarray:
        """The ink of every paddle kept so far (drawn now: the max of the stamps, in any order)."""
        if self.ink is None:
            self.ink = np.zeros((self.g.resolution, self.g.resolution))
        for patch, centre in self.inks:
            draw.stamp(self.ink, patch, centre)
        self.inks.clear()
        return self.ink

    def free_share(self) -> float:
        """The share of pixels the mask leaves free."""
        return np.count_nonzero(self.mask <= FREE_BELOW) / self.mask.size

    def place_seed(self, snake: int, contrast: float, band: int, stop_below: Optional[float],
                   seed: Optional[Seed] = None):
        """A snake's first paddle at a free tail: ((pivot, pending mask, tail), orientation) or None.
        The tails free of the occupancy mask widened by a border ``band``; with nothing drawn yet
        (the first target) they depend on the orientation only and are cached. ``seed``: the first
        orientation, drawn already."""
        g, t = self.g, self.t
        for _ in range(g.paddle_retries + 1):
            if seed is None:
                seed = t.seed(self.rng.integers(-180, 180))
            if stop_below is not None and self.free_share() < stop_below:
                return None
            if seed.kernel is None:
                return None
            free = t.empty_tails(seed, band) if not self.drawn else free_tails(self.mask, band, seed.kernel)
            if len(free) == 0:
                return None
            row, col = free[self.rng.integers(len(free))].tolist()
            head = draw.translate((row, col), seed.orientation, g.paddle_length)
            pivot = draw.translate(head, draw.flipped(seed.orientation), t.seed_reach)
            if self.inside(head) and self.inside(pivot):
                return self.draw_seed(snake, (row, col), seed.orientation, contrast), seed.orientation
            seed = None
        return None

    def draw_seed(self, snake: int, tail, orientation: float, contrast: float):
        length, t = self.g.paddle_length, self.t
        shape = t.shape(orientation)
        self.inks.append((shape.ink_at(contrast), tail))
        end = (tail[0] + length * math.sin(orientation), tail[1] + length * math.cos(orientation))
        self.drawn.append((snake, tail, end, orientation))
        head = draw.translate(tail, orientation, length)
        pivot = draw.translate(head, draw.flipped(orientation), t.seed_reach)
        return pivot, (shape, tail), tail

    def extend(self, snake: int, pivot, orientation: float, pending, contrast: float):
        """The next paddle of a snake: (pivot, orientation, pending mask, its far end) or None."""
        if self.state is None:
            self._allocate()
        t = self.t
        weights, sin, cos = t.turn(orientation)
        new_pivot = (math.ceil(pivot[0] + t.pivot_step * sin), math.ceil(pivot[1] + t.pivot_step * cos))
        found = self.candidates(new_pivot, weights)
        if found is None:
            return None
        kept, cumulative = found
        random, steps = self.rng.random, t.steps
        for _ in range(self.g.paddle_retries + 1):
            k = bisect_right(cumulative, random())  # the first cumulative above
            k = 0 if k == len(cumulative) else k
            step = steps[k if kept is None else kept[k]]
            head = (new_pivot[0] + step.offset[0], new_pivot[1] + step.offset[1])
            if not self.overlaps(step.shape, head):
                self.inks.append((step.shape.ink_at(contrast), head))
                self.commit(pending)
                self.drawn.append((snake, (head[0] + step.start[0], head[1] + step.start[1]), head, step.orientation))
                return new_pivot, step.orientation, (step.shape, head), head
        return None

    def candidates(self, pivot, weights: List[float]):
        """The pixels on the circle around ``pivot`` inside the image (None: all of the circle's) and
        the cumulative probability of each, its continuity weight times how free its margin-wide
        neighbourhood is; None at a dead end."""
        t, near_at = self.t, self.near_at
        size = t.resolution
        row, col = pivot
        base = (row + t.frame) * t.stride + col + t.frame
        low, high = t.circle_low, t.circle_high
        if row + low[0] >= 0 and col + low[1] >= 0 and row + high[0] < size and col + high[1] < size:
            kept = None
            weight = [(1 - near_at[base + flat]) * w for flat, w in zip(t.circle_flat, weights)]
        else:
            kept = [i for i, (dr, dc, _) in enumerate(t.circle) if 0 <= row + dr < size and 0 <= col + dc < size]
            if not kept:
                return None
            weight = [(1 - near_at[base + t.circle_flat[i]]) * weights[i] for i in kept]
        total = numpy_sum(weight)
        if total < 1e-4:
            return None
        return kept, list(accumulate([w / total for w in weight]))

    def overlaps(self, shape: PaddleShape, centre) -> bool:
        """Whether the paddle's occupancy at ``centre`` plus the mask reaches the limit anywhere."""
        size, mask_at = self.t.resolution, self.mask_at
        row, col = centre
        base = (row + self.t.frame) * self.t.stride + col + self.t.frame
        reach = shape.heavy_reach
        if reach <= row < size - reach and reach <= col < size - reach:
            if shape.heavy_arrays is not None:
                offsets, values = shape.heavy_arrays
                return bool((self.mask_flat[offsets + base] + values).max() >= OVERLAP_LIMIT)
            for offset, value in shape.heavy_flat:
                if mask_at[base + offset] + value >= OVERLAP_LIMIT:
                    return True
            return False
        for dr, dc, offset, value in shape.heavy:
            if 0 <= row + dr < size and 0 <= col + dc < size and mask_at[base + offset] + value >= OVERLAP_LIMIT:
                return True
        return False

    def snapshot(self):
        return self.state.copy(), len(self.inks), len(self.drawn)

    def restore(self, state) -> None:
        self.state[...] = state[0]
        del self.inks[state[1]:]
        del self.drawn[state[2]:]
