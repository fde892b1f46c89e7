"""A seeded Pathfinder generator (after Linsley et al. 2018) writing the official release layout.

An image holds two target "snakes" — chains of ``contour_length`` short paddles with a gap of
``paddle_margin`` between neighbours, each turn drawn with weight cos²(continuity·Δθ) (zero beyond
|Δθ| = π / (2·continuity)) — plus ``20 // (contour_length // 3)`` distractor snakes of
``contour_length // 3`` paddles, and two circular markers. Label 1 puts both markers on the ends of
one target snake, label 0 one marker on an end of each (label drawn uniformly, each pair of
consecutive images holding one of each, so any run of images is balanced).

Unlike the original (which only keeps snakes ``paddle_margin`` apart), different snakes here keep a
distance at which their drawn pixels can never touch: :func:`minimum_separation` derives it from the
rasteriser's footprint, so whether the markers are joined by drawn pixels (8-connected, gaps up to
the paddle margin bridged) always equals the label — checked by :func:`markers_connected`.

Each image draws from its own ``numpy`` generator seeded by ``(seed, image index)``, so the output
does not depend on the number of worker processes. Layout: ``<root>/imgs/<k>/sample_<i>.png`` and
``<root>/metadata/<k>.npy`` (plain text despite the name), one line per image:
``imgs/<k> sample_<i>.png <i> <label> <continuity> <contour_length> <distractor_length>
<paddle_length> <paddle_thickness> <paddle_margin> 1``.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import numpy as np

from lra.io import atomic_write_text

DIFFICULTIES = {"baseline": 6, "contour_length_9": 9, "contour_length_14": 14}


@dataclass(frozen=True)
class Geometry:
    """Drawing parameters of one Pathfinder variant, in output pixels."""

    resolution: int = 32
    contour_length: int = 14
    paddle_length: float = 2.0
    paddle_thickness: float = 0.5
    paddle_margin: float = 1.0
    marker_radius: float = 1.5
    continuity: float = 1.0
    seed_distance: float = 7.0
    padding: float = 1.0
    antialias_scale: int = 2

    @property
    def distractor_length(self) -> int:
        return self.contour_length // 3

    @property
    def num_distractors(self) -> int:
        return 20 // self.distractor_length

    @property
    def link(self) -> int:
        """Pixels this far apart (Chebyshev) count as joined: bridges the gaps between paddles."""
        return max(1, math.ceil(self.paddle_margin))


def geometry_for(resolution: int, difficulty: str) -> Geometry:
    """The spec's settings for pathfinder32/64/128 at a difficulty (``baseline``, ``contour_length_9|14``)."""
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"unknown Pathfinder difficulty '{difficulty}'; valid: {', '.join(DIFFICULTIES)}")
    presets = {
        32: dict(),
        64: dict(paddle_length=4.0, paddle_thickness=1.0, paddle_margin=2.0, marker_radius=2.5,
                 continuity=1.8, seed_distance=12.0),
        128: dict(paddle_length=6.0, paddle_thickness=1.5, paddle_margin=3.0, marker_radius=3.0,
                  continuity=1.8, seed_distance=20.0),
    }
    if resolution not in presets:
        raise ValueError(f"unsupported Pathfinder resolution {resolution}; valid: 32, 64, 128")
    return Geometry(resolution=resolution, contour_length=DIFFICULTIES[difficulty], **presets[resolution])


def release_folder_name(difficulty: str) -> str:
    return f"curv_{difficulty}"


# ----------------------------------------------------------------------------- geometry
def _point_segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from points ``p`` to segments ``a``–``b`` (broadcast over leading axes, last axis xy)."""
    ab = b - a
    length2 = np.maximum((ab * ab).sum(-1), 1e-12)
    t = np.clip(((p - a) * ab).sum(-1) / length2, 0.0, 1.0)
    closest = a + t[..., None] * ab
    return np.sqrt(((p - closest) ** 2).sum(-1))


def footprint_radius(shape_radius: float, scale: int) -> float:
    """How far from a shape's centre line a pixel centre can be and still receive ink.

    A sub-sample (``scale``² per pixel) gets ink within ``shape_radius + 0.5/scale`` of the line and
    lies within ``(1 − 1/scale)/√2`` of its pixel's centre.
    """
    return shape_radius + 0.5 / scale + (1.0 - 1.0 / scale) / math.sqrt(2.0)


def minimum_separation(g: Geometry, radius_1: float, radius_2: float) -> float:
    """Centre-line distance between shapes of different snakes at which no inked pixels link.

    Inked pixel centres of the two shapes are then more than √2·link apart, so their Chebyshev
    distance exceeds ``link``.
    """
    return (footprint_radius(radius_1, g.antialias_scale) + footprint_radius(radius_2, g.antialias_scale)
            + math.sqrt(2.0) * g.link + 1e-3)


CELLS_PER_PIXEL = 4  # resolution of the occupancy grid


def _window_distances(a: np.ndarray, b: np.ndarray, reach: np.ndarray, scale: int):
    """For each segment ``a[i]–b[i]``, the cells (``scale`` per pixel side) of a square window
    around it, their centres' distance to the segment → (rows, cols, distance), each [shapes, w, w]."""
    lo = np.floor((np.minimum(a, b) - reach[:, None]) * scale).astype(int)
    size = int(np.ceil(((np.abs(b - a) + 2 * reach[:, None]) * scale).max())) + 2
    offsets = np.arange(size)
    xs, ys = lo[:, 0, None] + offsets, lo[:, 1, None] + offsets
    centres = np.stack(np.broadcast_arrays((xs[:, None, :] + 0.5) / scale, (ys[:, :, None] + 0.5) / scale), -1)
    distance = _point_segment_distance(centres, a[:, None, None, :], b[:, None, None, :])
    rows = np.broadcast_to(ys[:, :, None], distance.shape)
    cols = np.broadcast_to(xs[:, None, :], distance.shape)
    return rows, cols, distance


class _Canvas:
    """The shapes drawn so far (a marker is a zero-length segment with the marker's radius) and an
    occupancy grid that makes a paddle's placement test O(its length): ``zone`` holds, per cell,
    the first finished snake whose separation zone covers it (else -1). Zones are widened by
    ``slack`` (half a cell diagonal plus half the sampling step along a paddle), so a paddle that
    passes the grid test is truly ``minimum_separation`` away from every other snake."""

    def __init__(self, g: Geometry):
        self.g = g
        self.zone = np.full((g.resolution * CELLS_PER_PIXEL,) * 2, -1, dtype=np.int16)
        self.shapes: List[Tuple[np.ndarray, np.ndarray, float, int]] = []
        self.paddle_radius = g.paddle_thickness / 2
        self.slack = (math.sqrt(0.5) + 0.5) / CELLS_PER_PIXEL
        steps = max(1, math.ceil(g.paddle_length * CELLS_PER_PIXEL))
        self.along = np.linspace(0.0, 1.0, steps + 1)[None, :, None]

    def __len__(self) -> int:
        return len(self.shapes)

    def add(self, a, b, radius: float, owner: int) -> None:
        self.shapes.append((a, b, radius, owner))

    def truncate(self, count: int) -> None:
        del self.shapes[count:]

    def finish_snake(self, first: int) -> None:
        """Mark the zones of ``shapes[first:]`` (one snake) in the grid."""
        g, r = self.g, self.paddle_radius
        shapes = self.shapes[first:]
        a = np.stack([shape[0] for shape in shapes])
        b = np.stack([shape[1] for shape in shapes])
        zone_radius = np.array([minimum_separation(g, shape[2], r) for shape in shapes]) + self.slack
        rows, cols, distance = _window_distances(a, b, zone_radius, CELLS_PER_PIXEL)
        cells = self.zone.shape[0]
        hit = (distance <= zone_radius[:, None, None]) & (rows >= 0) & (rows < cells) & (cols >= 0) & (cols < cells)
        rows, cols = rows[hit], cols[hit]
        free = self.zone[rows, cols] < 0
        self.zone[rows[free], cols[free]] = shapes[0][3]

    def _inside(self, points: np.ndarray, radius: float) -> np.ndarray:
        low, high = self.g.padding + radius, self.g.resolution - self.g.padding - radius
        return ((points >= low) & (points <= high)).all(-1)

    def paddles_fit(self, a: np.ndarray, b: np.ndarray, own_points: np.ndarray) -> np.ndarray:
        """Which candidate paddles ``a[k]–b[k]`` fit: inside the window, outside other snakes'
        zones, and with their ends and middle ``paddle_margin`` clear of ``own_points`` (the ends and
        middles of their own snake's earlier paddles: the snake does not cross itself)."""
        points = a[:, None, :] + self.along * (b - a)[:, None, :]
        cells = np.clip((points * CELLS_PER_PIXEL).astype(int), 0, self.zone.shape[0] - 1)
        ok = (self.zone[cells[..., 1], cells[..., 0]] < 0).all(-1)
        ok &= self._inside(a, self.paddle_radius) & self._inside(b, self.paddle_radius)
        if len(own_points):
            probes = points[:, :: max(1, (points.shape[1] - 1) // 2)]  # ends and middle
            gap2 = ((probes[:, :, None, :] - own_points[None, None]) ** 2).sum(-1).min(axis=(1, 2))
            ok &= gap2 >= (self.g.paddle_margin + 2 * self.paddle_radius) ** 2
        return ok

    def marker_fits(self, centre: np.ndarray, owner: int) -> bool:
        """A marker needs the exact separation from every shape of another snake."""
        g = self.g
        if not self._inside(centre, g.marker_radius):
            return False
        for a, b, radius, shape_owner in self.shapes:
            if shape_owner != owner and _point_segment_distance(centre, a, b) < minimum_separation(g, g.marker_radius, radius):
                return False
        return True


def _draw_snake(canvas: _Canvas, rng: np.random.Generator, owner: int, num_paddles: int,
                marker_at_start: bool, tries: int = 10) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """Add one snake (and a marker on its first end if asked); returns its two ends, or None
    when ``tries`` attempts all ran into a dead end (the canvas is then as before)."""
    for _ in range(tries):
        first = len(canvas)
        ends = _try_snake(canvas, rng, owner, num_paddles, marker_at_start)
        if ends is not None:
            canvas.finish_snake(first)
            return ends
        canvas.truncate(first)
    return None


def _try_snake(canvas: _Canvas, rng: np.random.Generator, owner: int, num_paddles: int,
               marker_at_start: bool, starts: int = 16, turns: int = 48) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    g = canvas.g
    no_paddles = np.zeros((0, 2))
    start = rng.uniform(g.padding, g.resolution - g.padding, size=(starts, 2))
    heading = rng.uniform(-math.pi, math.pi, size=starts)
    end = start + g.paddle_length * np.stack([np.cos(heading), np.sin(heading)], -1)
    fits = canvas.paddles_fit(start, end, no_paddles)
    for k in np.flatnonzero(fits):
        if not marker_at_start or canvas.marker_fits(start[k], owner):
            break
    else:
        return None
    a, b, theta = start[k], end[k], heading[k]
    if marker_at_start:
        canvas.add(a, a, g.marker_radius, owner)
    canvas.add(a, b, canvas.paddle_radius, owner)
    own_points = [a, (a + b) / 2, b]
    # Turns on a jittered grid over |Δθ| < π/(2·continuity), chosen among the paddles that fit with
    # weight cos²(continuity·Δθ): the original's continuity prior restricted to free directions.
    max_turn = min(math.pi, math.pi / (2 * g.continuity))
    grid = np.linspace(-max_turn, max_turn, turns, endpoint=False)
    weight = np.cos(g.continuity * (grid + max_turn / turns)) ** 2
    for _ in range(1, num_paddles):
        delta = grid + rng.uniform(0, 2 * max_turn / turns)
        new_theta = theta + delta
        direction = np.stack([np.cos(new_theta), np.sin(new_theta)], -1)
        a_next = b + g.paddle_margin * direction
        b_next = a_next + g.paddle_length * direction
        earlier = np.array(own_points[:-3]).reshape(-1, 2)  # all but the paddle just drawn
        p = weight * canvas.paddles_fit(a_next, b_next, earlier)
        cumulative = np.cumsum(p)
        if cumulative[-1] <= 0:
            return None
        k = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
        theta, b = new_theta[k], b_next[k]
        canvas.add(a_next[k], b, canvas.paddle_radius, owner)
        own_points += [a_next[k], (a_next[k] + b) / 2, b]
    return a, b


def _render(canvas: _Canvas) -> np.ndarray:
    """Rasterise at ``antialias_scale`` sub-samples per pixel side (each shape only in a window
    around it), combine shapes by maximum, average down to pixels, uint8 0–255."""
    g = canvas.g
    s, n = g.antialias_scale, g.resolution
    a = np.stack([shape[0] for shape in canvas.shapes])
    b = np.stack([shape[1] for shape in canvas.shapes])
    radius = np.array([shape[2] for shape in canvas.shapes])
    rows, cols, distance = _window_distances(a, b, radius + 1.0 / s, s)
    coverage = np.clip((radius[:, None, None] - distance) * s + 0.5, 0.0, 1.0)
    keep = (coverage > 0) & (rows >= 0) & (rows < n * s) & (cols >= 0) & (cols < n * s)
    fine = np.zeros((n * s, n * s))
    np.maximum.at(fine, (rows[keep], cols[keep]), coverage[keep])
    image = fine.reshape(n, s, n, s).mean(axis=(1, 3))
    return np.rint(image * 255.0).astype(np.uint8)


def generate_image(g: Geometry, seed: int, index: int, max_tries: int = 100) -> Tuple[np.ndarray, int, np.ndarray]:
    """One image: (uint8 [res, res], label, marker centres [2, 2] as x, y)."""
    rng = np.random.default_rng([seed, index])
    # Uniform labels, exactly balanced per pair of images: a seeded coin for the pair, flipped for its second image.
    label = int(np.random.default_rng([seed, index // 2, 1]).integers(2)) ^ (index % 2)
    for _ in range(max_tries):
        canvas = _Canvas(g)
        snake_a = _draw_snake(canvas, rng, 0, g.contour_length, marker_at_start=True)
        if snake_a is None:
            continue
        if label == 1:
            marker_b, owner_b = snake_a[1], 0
        else:
            snake_b = _draw_snake(canvas, rng, 1, g.contour_length, marker_at_start=True)
            if snake_b is None:
                continue
            marker_b, owner_b = snake_b[0], 1
        if np.hypot(*(snake_a[0] - marker_b)) < g.seed_distance or (label == 1 and not canvas.marker_fits(marker_b, 0)):
            continue
        if label == 1:
            canvas.add(marker_b, marker_b, g.marker_radius, owner_b)
            canvas.finish_snake(len(canvas) - 1)
            if _draw_snake(canvas, rng, 1, g.contour_length, marker_at_start=False) is None:
                continue
        targets, zone = len(canvas), canvas.zone.copy()
        for _ in range(5):  # the distractors, redrawn as a set a few times before new targets
            if all(_draw_snake(canvas, rng, 2 + d, g.distractor_length, False) is not None
                   for d in range(g.num_distractors)):
                return _render(canvas), label, np.stack([snake_a[0], marker_b])
            canvas.truncate(targets)
            canvas.zone = zone.copy()
    raise RuntimeError(f"could not place the snakes of image {index} in {max_tries} tries; the geometry is too crowded")


def markers_connected(image: np.ndarray, markers: np.ndarray, link: int = 1) -> bool:
    """Whether the two marker centres lie in one component of inked pixels (value > 0), pixels up to
    ``link`` apart (Chebyshev) counting as neighbours: a flood fill from the first marker."""
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


# ----------------------------------------------------------------------------- files
@dataclass
class GeneratorSettings:
    """What to generate: the variant, how many images, the seed, and the files' grouping."""

    num_images: int = 200_000
    seed: int = 0
    images_per_folder: int = 1000
    workers: int = 0  # processes; 0 = all CPU cores

    def as_dict(self) -> dict:
        return asdict(self)


def metadata_line(g: Geometry, folder: int, index: int, label: int) -> str:
    return (f"imgs/{folder} sample_{index}.png {index} {label} {g.continuity} {g.contour_length} "
            f"{g.distractor_length} {g.paddle_length} {g.paddle_thickness} {g.paddle_margin} 1")


def _write_folder(args) -> int:
    from PIL import Image

    g, root, seed, folder, first, count = args
    image_dir = Path(root) / "imgs" / str(folder)
    image_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for index in range(first, first + count):
        image, label, _ = generate_image(g, seed, index)
        # Atomic: a concurrent job generating the same (seeded) folder never exposes a half-written PNG.
        temporary = image_dir / f".sample_{index}.{os.getpid()}.png"
        Image.fromarray(image).save(temporary, format="PNG")
        os.replace(temporary, image_dir / f"sample_{index}.png")
        lines.append(metadata_line(g, folder, index, label))
    # The metadata file is written last and atomically: it marks the folder complete.
    atomic_write_text(Path(root) / "metadata" / f"{folder}.npy", "\n".join(lines) + "\n")
    return count


def write_release(g: Geometry, settings: GeneratorSettings, root: Path,
                  progress: Optional[Callable[[int], None]] = None) -> None:
    """Write ``settings.num_images`` images into ``root`` (a ``curv_*`` folder) in the release layout.

    Folders whose metadata file exists are complete and skipped, so an interrupted run resumes.
    """
    root = Path(root)
    (root / "metadata").mkdir(parents=True, exist_ok=True)
    jobs: List[tuple] = []
    for folder, first in enumerate(range(0, settings.num_images, settings.images_per_folder)):
        count = min(settings.images_per_folder, settings.num_images - first)
        if (root / "metadata" / f"{folder}.npy").is_file():
            if progress:
                progress(count)
            continue
        jobs.append((g, str(root), settings.seed, folder, first, count))
    workers = settings.workers or os.cpu_count() or 1
    if workers == 1 or len(jobs) <= 1:
        for job in jobs:
            done = _write_folder(job)
            if progress:
                progress(done)
        return
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        for done in pool.map(_write_folder, jobs):
            if progress:
                progress(done)
