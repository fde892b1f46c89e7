"""A seeded Pathfinder generator that re-derives the process of the original (Linsley et al. 2018,
``drewlinsley/pathfinder``, ``snakes2``; the generator behind the LRA release) and writes the
release layout.

An image: two target snakes grown side by side from origins ``seed_distance`` apart, then
``distractor_budget // distractor_length`` distractor snakes of ``contour_length // 3`` paddles, then
two markers. A snake is a chain of paddles (short antialiased lines) with a gap between
neighbours: each next paddle starts about ``paddle_margin`` beyond a pivot one margin past the
previous paddle's end, its direction drawn among the free pixels on a circle around the pivot with
weight cos²(min(continuity·Δθ, π/2)). Placement follows the original's rules: an occupancy mask
(every committed paddle dilated by the margin) that a new paddle may overlap by at most 1.8 in sum,
a paddle retried ``paddle_retries`` times, a distractor ``distractor_retries`` times and then left
out, target pairs redrawn until both grow to full length; the first origin lies at least
2·``seed_distance`` from the border. Nothing else keeps snakes apart, so, as in the original, they
touch and cross each other and run along the border. Contrasts: target paddles at
``paddle_contrast × snake_contrast``, distractors at ``snake_contrast``, markers at 1; the float
image is stretched to 0–255 per image. One marker sits on the origin of a randomly chosen target
snake, the other on the far end of the same snake (label 1) or of the other one (label 0); labels
are uniform and independent per image.

Connectivity: the label says whether the markers sit on the two ends of one contour. It is not
a statement about pixels: the snakes touch and cross, and the gaps between paddles are not inked,
so ink connectivity agrees with neither label reliably (in the original's images either). The
check, :func:`contour_connected`, follows the contour from the first marker through the drawn
paddles (each visible in the image, each continuing the previous one within the gap and turn the
process allows) to its far end, and asks whether the second marker is there. An image where that
disagrees with the label (a label-0 image whose second marker lands near the far end of the first
marker's snake) is redrawn, so every written image agrees.

Each image draws from its own generator seeded by ``(seed, image index)`` (numpy's
``default_rng([seed, index])``, its draws reproduced faster by
:class:`~lra.data.pathfinder_stream.SeededStream`), so the output does not depend on the number of
worker processes. The drawing state and the per-geometry tables that make an image cost
milliseconds are in :mod:`lra.data.pathfinder_canvas`. Layout: ``<root>/imgs/<k>/sample_<i>.png``
and ``<root>/metadata/<k>.npy`` (plain text despite the name), one line per image:
``imgs/<k> sample_<i>.png <i> <label> <continuity> <contour_length> <distractor_length>
<paddle_length> <paddle_thickness> <paddle_margin> 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np

from lra.data import pathfinder_drawing as draw
from lra.data.pathfinder_canvas import Canvas, Paddle, Seed, Tables, tables
from lra.data.pathfinder_stream import SeededStream

DIFFICULTIES = {"baseline": 6, "contour_length_9": 9, "contour_length_14": 14}


@dataclass(frozen=True)
class Geometry:
    """One Pathfinder variant: the original's arguments, lengths in output pixels."""

    resolution: int = 32
    contour_length: int = 14
    paddle_length: int = 2
    paddle_thickness: float = 0.5
    paddle_margins: Tuple[int, ...] = (1,)  # one drawn per image
    marker_radius: float = 1.5
    continuity: float = 1.0
    seed_distance: int = 7
    padding: int = 1
    antialias_scale: int = 2
    distractor_budget: int = 20  # distractor snakes: budget // distractor_length
    snake_contrast: float = 2.0
    paddle_contrast: float = 0.75
    paddle_retries: int = 2
    distractor_retries: int = 4
    target_retries: int = 100_000  # the original retries target pairs without end

    @property
    def distractor_length(self) -> int:
        return self.contour_length // 3

    @property
    def num_distractors(self) -> int:
        return self.distractor_budget // self.distractor_length

    @property
    def max_turn(self) -> float:
        """The largest turn between consecutive paddles with non-zero prior weight."""
        return math.pi / (2 * self.continuity)

    def gap_limit(self, margin: int) -> float:
        """Farthest apart the facing ends of two consecutive paddles of one snake can be: the
        pivot steps (ceil-rounded twice) and the truncated circle point put them within 2·margin + 3."""
        return 2 * margin + 3.0


# The tfds builders of the LRA release list each variant's arguments (all at contour lengths 6, 9, 14).
PRESETS = {
    32: dict(),
    64: dict(paddle_length=5, paddle_thickness=1.0, paddle_margins=(1,), marker_radius=2.5, continuity=1.8,
             seed_distance=12, distractor_budget=22, snake_contrast=0.8, paddle_contrast=1.0),
    128: dict(paddle_length=5, paddle_thickness=1.5, paddle_margins=(2, 3), marker_radius=3.0, continuity=1.8,
              seed_distance=20, distractor_budget=35, snake_contrast=0.9, paddle_contrast=1.0),
}


def geometry_for(resolution: int, difficulty: str) -> Geometry:
    """The original's settings for pathfinder32/64/128 at a difficulty (``baseline``, ``contour_length_9|14``)."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown Pathfinder difficulty '{difficulty}'; valid: {', '.join(DIFFICULTIES)}")
    if resolution not in PRESETS:
        raise ValueError(f"unsupported Pathfinder resolution {resolution}; valid: 32, 64, 128")
    return Geometry(resolution=resolution, contour_length=DIFFICULTIES[difficulty], **PRESETS[resolution])


def release_folder_name(difficulty: str) -> str:
    return f"curv_{difficulty}"


# ----------------------------------------------------------------------------- snakes
@dataclass
class Scene:
    """One generated image and what the generator knows about it."""

    image: np.ndarray  # uint8 [resolution, resolution]
    targets: np.ndarray  # bool: the pixels the target snakes and markers ink (non-zero in ``image``'s scale)
    label: int
    markers: np.ndarray  # [2, 2] marker centres as (x, y)
    margin: int
    paddles: List[Paddle]
    marked: Tuple[Tuple[int, int], Tuple[int, int]]  # (snake, paddle index within it) under each marker
    redraws: int = 0  # images drawn and discarded because their contour connectivity missed the label
    target_attempts: int = 1


def _target_pair(t: Tables, rng: SeededStream, seed: Seed) -> Optional[Tuple[Canvas, list]]:
    """Both target snakes grown in step from a first paddle in the orientation of ``seed`` (the
    attempt's first draw), or None (the original then starts the image over)."""
    g, margin = t.g, t.margin
    canvas = Canvas(t, rng)
    contrast = g.paddle_contrast * g.snake_contrast
    first = canvas.place_seed(0, contrast, 2 * g.seed_distance, None, seed)
    if first is None:
        return None
    (pivot, pending, origin), orientation = first
    states = [(pivot, orientation, pending)]
    origins, ends = [origin], [None, None]
    for _ in range(g.paddle_retries + 1):
        orientation2 = canvas.random_orientation()
        angle = rng.integers(0, 360) * math.pi / 180
        tail = (round(origin[0] + g.seed_distance * math.sin(angle)),  # half to even, as numpy's round
                round(origin[1] + g.seed_distance * math.cos(angle)))
        head = draw.translate(tail, orientation2, g.paddle_length)
        pivot2 = draw.translate(head, draw.flipped(orientation2), g.paddle_length + margin)
        if canvas.inside(head) and canvas.inside(pivot2):
            break
    else:
        return None
    pivot2, pending2, origin2 = canvas.draw_seed(1, tail, orientation2, contrast)
    states.append((pivot2, orientation2, pending2))
    origins.append(origin2)
    for _ in range(g.contour_length - 1):
        for snake in (0, 1):
            grown = canvas.extend(snake, *states[snake], contrast)
            if grown is None:
                return None
            states[snake], ends[snake] = grown[:3], grown[3]
    canvas.commit(states[1][2])  # as the original, only the second snake's last paddle is committed
    return canvas, list(zip(origins, ends))


def _distractor(canvas: Canvas, snake: int) -> bool:
    """One distractor snake (committed) or False (the canvas as before)."""
    g = canvas.g
    state = canvas.snapshot()
    seeded = canvas.place_seed(snake, g.snake_contrast, 1, stop_below=0.01)
    if seeded is not None:
        (pivot, pending, _), orientation = seeded
        for _ in range(g.distractor_length - 1):
            grown = canvas.extend(snake, pivot, orientation, pending, g.snake_contrast)
            if grown is None:
                break
            pivot, orientation, pending = grown[:3]
        else:
            canvas.commit(pending)
            return True
    canvas.restore(state)
    return False


def _draw_scene(g: Geometry, rng: SeededStream, label: int) -> Scene:
    margin = int(g.paddle_margins[rng.integers(len(g.paddle_margins))])
    t = tables(g, margin)
    for attempt in range(1, g.target_retries + 1):
        seed = t.seed(rng.integers(-180, 180))
        if seed.kernel is None:
            continue  # most attempts: no snake can start in this orientation
        drawn = _target_pair(t, rng, seed)
        if drawn is not None:
            break
    else:
        raise RuntimeError(f"no pair of target snakes fits in {g.target_retries} attempts; the geometry is too crowded")
    canvas, tips = drawn
    target_ink = canvas.render().copy()
    for index in range(g.num_distractors):
        for _ in range(g.distractor_retries + 1):
            if _distractor(canvas, 2 + index):
                break
    origin_snake = int(rng.integers(2))
    end_snake = origin_snake if label == 1 else 1 - origin_snake
    centres = [tips[origin_snake][0], tips[end_snake][1]]
    image = canvas.render()
    for centre in centres:
        disk = draw.marker(g.resolution, centre, g.marker_radius, g.antialias_scale)
        image, target_ink = np.maximum(image, disk), np.maximum(target_ink, disk)
    markers = np.array([[c[1], c[0]] for c in centres], dtype=float)
    paddles = canvas.paddles()
    last = sum(p.snake == end_snake for p in paddles) - 1
    targets = draw.bytescale(np.stack([image, np.maximum(target_ink, image.min())]))[1] > 0
    return Scene(draw.bytescale(image), targets, label, markers, margin, paddles,
                 ((origin_snake, 0), (end_snake, last)), target_attempts=attempt)


def contour_connected(scene: Scene, g: Geometry) -> bool:
    """Whether the two markers sit on the two ends of one contour: the snake whose origin lies under
    the first marker is followed paddle by paddle (each drawn in the image, each within
    ``gap_limit`` of the previous one and turning no more than the continuity prior allows) to its
    far end, and the second marker must lie on that end (within the marker radius). A second marker
    neither on that end nor clear of it (more than two radii away) counts as connected too, so the
    label-0 images it accepts are unambiguous."""
    first, second = scene.markers[0][::-1], scene.markers[1][::-1]  # (row, col)
    snakes = {}
    for p in scene.paddles:
        snakes.setdefault(p.snake, []).append(p)
    origin = min((0, 1), key=lambda s: np.hypot(*np.subtract(snakes[s][0].start, first)))
    chain = snakes[origin]
    if np.hypot(*np.subtract(chain[0].start, first)) > g.marker_radius:
        raise AssertionError("the first marker is not on a target snake's origin")
    for a, b in zip(chain, chain[1:]):
        turn = abs((b.orientation - a.orientation + math.pi) % (2 * math.pi) - math.pi)
        if np.hypot(*np.subtract(b.start, a.end)) > g.gap_limit(scene.margin) or turn > g.max_turn + 1e-9:
            raise AssertionError(f"snake {origin} is not a contour between paddles {a} and {b}")
    for p in chain:
        row, col = (int(np.rint((p.start[i] + p.end[i]) / 2)) for i in (0, 1))  # pixel centres at integers
        if scene.image[min(max(row, 0), g.resolution - 1), min(max(col, 0), g.resolution - 1)] == 0:
            raise AssertionError(f"a paddle of snake {origin} is not drawn: {p}")
    distance = np.hypot(*np.subtract(chain[-1].end, second))
    return bool(distance <= 2 * g.marker_radius)


# Bumped whenever the same (seed, geometry) draws other images, so generated caches are not reused:
# 2 = the label drawn once per image (revision 1 drew a fresh label with every rejected draw).
REVISION = 2


def generate_scene(g: Geometry, seed: int, index: int, max_redraws: int = 100) -> Scene:
    """Image ``index`` of the run ``seed``: its label drawn once, the image drawn until its contour
    connectivity agrees with that label."""
    rng = SeededStream([seed, index])  # np.random.default_rng([seed, index])'s draws, faster
    label = rng.integers(2)  # once per image: a redraw keeps it, so labels stay balanced by construction
    for redraws in range(max_redraws + 1):
        scene = _draw_scene(g, rng, label)
        if contour_connected(scene, g) == bool(scene.label):
            scene.redraws = redraws
            return scene
    raise RuntimeError(f"image {index}: contour connectivity missed the label {max_redraws + 1} times")


def generate_image(g: Geometry, seed: int, index: int) -> Tuple[np.ndarray, int, np.ndarray]:
    """One image: (uint8 [res, res], label, marker centres [2, 2] as x, y)."""
    scene = generate_scene(g, seed, index)
    return scene.image, scene.label, scene.markers


def markers_joined_by_ink(image: np.ndarray, markers: np.ndarray, link: int = 1) -> bool:
    """Whether the two marker centres lie in one component of inked pixels (value > 0), pixels up to
    ``link`` apart (Chebyshev) counting as neighbours: a flood fill from the first marker. Crossing
    and touching snakes join pixels, so this is a statistic of the images, not the label."""
    inked = image > 0
    (x1, y1), (x2, y2) = np.floor(markers).astype(int)
    if not (inked[y1, x1] and inked[y2, x2]):
        return False
    reached = np.zeros_like(inked)
    reached[y1, x1] = True
    padded = np.zeros((inked.shape[0] + 2 * link, inked.shape[1] + 2 * link), dtype=bool)
    while True:
        padded[link:-link, link:-link] = reached
        grown = np.zeros_like(reached)
        for dy in range(2 * link + 1):
            for dx in range(2 * link + 1):
                grown |= padded[dy : dy + inked.shape[0], dx : dx + inked.shape[1]]
        grown &= inked
        if (grown == reached).all():
            return bool(reached[y2, x2])
        reached = grown
