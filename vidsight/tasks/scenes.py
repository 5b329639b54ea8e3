"""Procedural scenes with ground truth: shapes that enter, move, stop, leave and change colour.

A `Scene` is a continuous-time description; `render` draws any instant, so the same scene can be
sampled straight into training frames or written to H.264 at any frame rate for evaluation.
Everything is determined by the seed that built it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from vidsight.ingest.synthetic import smooth_texture

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (50, 90, 230),
    "yellow": (235, 210, 40),
    "white": (245, 245, 245),
}
OBJECT_SHAPES = ("circle", "square", "triangle")
ZONE_COLOUR = (15, 15, 15)


def shape_mask(shape: str, size: int) -> np.ndarray:
    """Boolean ``(size, size)`` silhouette of a shape."""
    yy, xx = np.mgrid[0:size, 0:size] + 0.5
    if shape == "circle":
        return (yy - size / 2) ** 2 + (xx - size / 2) ** 2 <= (size / 2) ** 2
    if shape == "square":
        return np.ones((size, size), dtype=bool)
    if shape == "triangle":  # apex up, base along the bottom
        return np.abs(xx - size / 2) <= yy / 2
    raise ValueError(f"unknown shape {shape!r}")


@dataclasses.dataclass
class SceneObject:
    """One object's life: visible on ``[t_in, t_out)``, moving until ``t_stop``, maybe recoloured.

    Positions are the top-left corner in pixels; ``velocity`` is in pixels per second.
    """

    shape: str
    colour: str
    size: int
    t_in: float
    t_out: float
    start: tuple[float, float]
    velocity: tuple[float, float] = (0.0, 0.0)
    t_stop: float = math.inf
    recolour_at: float = math.inf
    new_colour: str | None = None

    def visible(self, t: float) -> bool:
        return self.t_in <= t < self.t_out

    def position(self, t: float) -> tuple[float, float]:
        moving = max(0.0, min(t, self.t_stop) - self.t_in)
        return self.start[0] + self.velocity[0] * moving, self.start[1] + self.velocity[1] * moving

    def colour_at(self, t: float) -> str:
        return self.new_colour if self.new_colour and t >= self.recolour_at else self.colour

    def box(self, t: float) -> tuple[int, int, int, int]:
        """``(x0, y0, x1, y1)`` pixel box at time ``t`` (exclusive ends)."""
        x, y = self.position(t)
        x0, y0 = int(round(x)), int(round(y))
        return x0, y0, x0 + self.size, y0 + self.size


@dataclasses.dataclass
class Scene:
    """A static textured background (optionally panning), a marked zone and objects.

    Attributes:
        width: Frame width in pixels.
        height: Frame height in pixels.
        duration_s: Length in seconds.
        seed: Seeds the background texture.
        pan: Camera pan in pixels per second (0 for a static camera).
        zone: ``(x0, y0, x1, y1)`` marked zone, drawn as a dark outline, or None.
        objects: The objects, drawn in order.
        cuts: Times of scene changes, ascending: each starts a new background (a new shot).
        noise: Sensor noise: Gaussian, this standard deviation in 8-bit levels, new every frame
            (a real camera's picture; 0 for none).
        drift: Lighting drift: the whole picture brightens by this many levels per second.
        photo: An image file to use as the background instead of the generated texture (a real
            photograph: a static camera's view), scaled to cover the frame.
    """

    width: int
    height: int
    duration_s: float
    seed: int
    pan: float = 0.0
    zone: tuple[int, int, int, int] | None = None
    objects: list[SceneObject] = dataclasses.field(default_factory=list)
    cuts: tuple[float, ...] = ()
    noise: float = 0.0
    drift: float = 0.0
    photo: str | None = None

    def __post_init__(self):
        self._backgrounds: dict[int, np.ndarray] = {}

    def shot(self, t: float) -> int:
        """Index of the shot showing at time ``t`` (0 before the first cut)."""
        return int(np.searchsorted(self.cuts, t, side="right"))

    def background(self, shot: int = 0) -> np.ndarray:
        """Muted smooth texture of one shot, wide enough for the pan."""
        if shot not in self._backgrounds and self.photo is not None:
            self._backgrounds[shot] = _photograph(self.photo, self.height, self.width + int(math.ceil(
                abs(self.pan) * self.duration_s)) + 2)
        if shot not in self._backgrounds:
            rng = np.random.default_rng(self.seed if shot == 0 else [self.seed, shot])
            width = self.width + int(math.ceil(abs(self.pan) * self.duration_s)) + 2
            smooth = smooth_texture(rng, self.height, width, 90, 165)
            grey = smooth.mean(axis=2, keepdims=True)
            # Desaturate so object colours are unmistakable; keep grain so motion search is honest.
            texture = 0.6 * grey + 0.4 * smooth + rng.normal(0, 6, size=(self.height, width, 1))
            self._backgrounds[shot] = np.clip(texture, 0, 255).astype(np.uint8)
        return self._backgrounds[shot]

    def render(self, t: float) -> np.ndarray:
        """The frame at time ``t``: ``(height, width, 3)`` uint8."""
        offset = int(round(abs(self.pan) * t))
        bg = self.background(self.shot(t))
        start = offset if self.pan >= 0 else bg.shape[1] - self.width - offset
        frame = bg[:, start : start + self.width].copy()
        if self.zone is not None:
            x0, y0, x1, y1 = self.zone
            frame[y0 : y0 + 2, x0:x1] = frame[y1 - 2 : y1, x0:x1] = ZONE_COLOUR
            frame[y0:y1, x0 : x0 + 2] = frame[y0:y1, x1 - 2 : x1] = ZONE_COLOUR
        for obj in self.objects:
            if obj.visible(t):
                self._draw(frame, obj, t)
        if self.noise or self.drift:
            light = frame + np.float32(self.drift * t)
            if self.noise:
                light += np.random.default_rng([self.seed, round(t * 1e6)]).normal(0, self.noise, frame.shape)
            frame = np.clip(np.rint(light), 0, 255).astype(np.uint8)
        return frame

    def _draw(self, frame: np.ndarray, obj: SceneObject, t: float, value=None) -> None:
        x0, y0, x1, y1 = obj.box(t)
        mask = shape_mask(obj.shape, obj.size)
        cx0, cy0, cx1, cy1 = max(x0, 0), max(y0, 0), min(x1, self.width), min(y1, self.height)
        if cx0 >= cx1 or cy0 >= cy1:
            return
        sub = mask[cy0 - y0 : cy1 - y0, cx0 - x0 : cx1 - x0]
        frame[cy0:cy1, cx0:cx1][sub] = COLOURS[obj.colour_at(t)] if value is None else value

    def object_map(self, t: float) -> np.ndarray:
        """``(height, width)`` index of the object drawn at each pixel at time ``t``, -1 for none."""
        out = np.full((self.height, self.width), -1, dtype=np.int16)
        for i, obj in enumerate(self.objects):
            if obj.visible(t):
                self._draw(out, obj, t, value=i)
        return out

    def in_zone(self, obj: SceneObject, t: float) -> bool:
        """Whether the object's visible pixels overlap the zone at time ``t``."""
        if self.zone is None or not obj.visible(t):
            return False
        x0, y0, x1, y1 = obj.box(t)
        zx0, zy0, zx1, zy1 = self.zone
        return x0 < zx1 and zx0 < x1 and y0 < zy1 and zy0 < y1

    def events(self, step_s: float = 0.25) -> list[dict]:
        """Timestamped events: appear, leave, recolour, enter_zone, meet (boxes touching)."""
        out = []
        for i, obj in enumerate(self.objects):
            out.append({"t": obj.t_in, "event": "appear", "object": i})
            if obj.t_out < self.duration_s:
                out.append({"t": obj.t_out, "event": "leave", "object": i})
            if obj.new_colour and obj.recolour_at < obj.t_out:
                out.append({"t": obj.recolour_at, "event": "recolour", "object": i, "colour": obj.new_colour})
        times = np.arange(0, self.duration_s, step_s)
        for i, obj in enumerate(self.objects):
            inside = [self.in_zone(obj, t) for t in times]
            out += [{"t": float(times[k]), "event": "enter_zone", "object": i}
                    for k in range(len(times)) if inside[k] and (k == 0 or not inside[k - 1])]
            for j in range(i + 1, len(self.objects)):
                touching = [_touch(obj, self.objects[j], t) for t in times]
                out += [{"t": float(times[k]), "event": "meet", "objects": [i, j]}
                        for k in range(len(times)) if touching[k] and (k == 0 or not touching[k - 1])]
        return sorted(out, key=lambda e: e["t"])

    def to_dict(self) -> dict:
        return {
            "width": self.width, "height": self.height, "duration_s": self.duration_s, "seed": self.seed,
            "pan": self.pan, "zone": self.zone, "cuts": list(self.cuts), "noise": self.noise, "drift": self.drift,
            "photo": self.photo,
            "objects": [dataclasses.asdict(o) | {"t_stop": _finite(o.t_stop), "recolour_at": _finite(o.recolour_at)}
                        for o in self.objects],
            "events": self.events(),
        }


def _photograph(path: str, height: int, width: int) -> np.ndarray:
    """The image at ``path`` as RGB, scaled to cover ``(height, width)`` and cropped to its centre."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        scale = max(height / image.height, width / image.width)
        size = (math.ceil(image.width * scale), math.ceil(image.height * scale))
        pixels = np.asarray(image.resize(size, Image.Resampling.BICUBIC))
    top, left = (pixels.shape[0] - height) // 2, (pixels.shape[1] - width) // 2
    return np.ascontiguousarray(pixels[top : top + height, left : left + width])


def _touch(a: SceneObject, b: SceneObject, t: float) -> bool:
    if not (a.visible(t) and b.visible(t)):
        return False
    ax0, ay0, ax1, ay1 = a.box(t)
    bx0, by0, bx1, by1 = b.box(t)
    return ax0 <= bx1 and bx0 <= ax1 and ay0 <= by1 and by0 <= ay1


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else value
