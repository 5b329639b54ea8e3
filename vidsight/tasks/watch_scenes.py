"""A harder watch suite: the anomaly query ("a red object in the zone?") over scenes where cheap
policies can lose.

Each family changes one thing a motion-vector shortcut relies on: an object turns red without
moving (vectors see nothing; the residual does), one appears in the zone where it stands (no
motion in, only new content), one creeps in below a pixel per frame, the red object is in the zone
only briefly next to a window boundary, the camera pans (everything moves: pruning should save
little), the light drifts, or the picture is noisy. Videos are written with long GOPs so windows
fall between I-frames, where a pruned token is not seen in any kept frame. Half the videos of a
family hold a red object in the zone (by construction, checked against the scene), half a
near miss: the same event with another colour or outside the zone.
"""

from __future__ import annotations

import numpy as np

from vidsight.tasks.families import FRAME, OBJECT_SIZE, anomaly_label
from vidsight.tasks.scenes import COLOURS, OBJECT_SHAPES, Scene, SceneObject

FAMILIES = ("recolour", "appear", "creep", "brief", "pan", "lighting", "noise")
OTHER_COLOURS = tuple(c for c in COLOURS if c != "red")


def _zone(rng) -> tuple[int, int, int, int]:
    side = int(rng.integers(40, 57))
    x0, y0 = (int(v) for v in rng.integers(4, FRAME - side - 4, size=2))
    return x0, y0, x0 + side, y0 + side


def _inside(rng, zone, size: int) -> tuple[float, float]:
    """A top-left corner that puts a ``size`` object well inside ``zone`` (overlapping it)."""
    x0, y0, x1, y1 = zone
    return (float(rng.uniform(x0 - size / 3, x1 - 2 * size / 3)), float(rng.uniform(y0 - size / 3, y1 - 2 * size / 3)))


def _outside(rng, zone, size: int) -> tuple[float, float]:
    """A top-left corner whose object stays clear of ``zone``."""
    x0, y0, x1, y1 = zone
    while True:
        x, y = rng.uniform(0, FRAME - size, size=2)
        if x + size < x0 - 2 or x > x1 + 2 or y + size < y0 - 2 or y > y1 + 2:
            return float(x), float(y)


def watch_scene(family: str, rng, seed: int, duration: float, want: bool, times_s: np.ndarray) -> Scene:
    """One video of ``family`` whose label over ``times_s`` is ``want`` (checked; redrawn if not)."""
    while True:
        scene = _draw(family, rng, seed, duration, want)
        if anomaly_label(scene, times_s) == want:
            return scene


def _draw(family: str, rng, seed: int, duration: float, want: bool) -> Scene:
    zone = _zone(rng)
    size = int(rng.integers(OBJECT_SIZE[0], OBJECT_SIZE[1] + 1))
    shape = str(rng.choice(OBJECT_SHAPES))
    other = str(rng.choice(OTHER_COLOURS))
    t_event = float(rng.uniform(0.25 * duration, 0.75 * duration))
    scene = Scene(FRAME, FRAME, duration, seed, zone=zone)
    if family == "recolour":   # sits in the zone all along; turns red (or another colour) at t_event
        scene.objects.append(SceneObject(shape, other, size, 0.0, duration + 1, _inside(rng, zone, size),
                                         recolour_at=t_event, new_colour="red" if want else
                                         str(rng.choice([c for c in OTHER_COLOURS if c != other]))))
    elif family == "appear":   # appears where it stands: red in the zone, or another colour there, or red outside
        colour = "red" if want else (other if rng.random() < 0.5 else "red")
        place = _outside(rng, zone, size) if colour == "red" and not want else _inside(rng, zone, size)
        scene.objects.append(SceneObject(shape, colour, size, t_event, t_event + float(rng.uniform(6, 12)), place))
    elif family == "creep":    # drifts into the zone at 0.5-1.5 px/s
        target = _inside(rng, zone, size)
        speed = float(rng.uniform(0.5, 1.5))
        angle = float(rng.uniform(0, 2 * np.pi))
        travel = speed * duration * float(rng.uniform(0.4, 0.7))
        start = (target[0] - travel * np.cos(angle), target[1] - travel * np.sin(angle))
        velocity = (speed * np.cos(angle), speed * np.sin(angle))
        scene.objects.append(SceneObject(shape, "red" if want else other, size, 0.0, duration + 1, start, velocity))
    elif family == "brief":    # crosses the zone in about 2 s, around t_event
        entry = _inside(rng, zone, size)
        velocity = tuple(float(v) for v in rng.uniform(-1, 1, size=2) * 18)
        start = (entry[0] - velocity[0] * 1.5, entry[1] - velocity[1] * 1.5)
        scene.objects.append(SceneObject(shape, "red" if want else other, size, t_event - 1.5, t_event + 2.0, start,
                                         velocity))
    else:                      # pan, lighting, noise: an object crossing into the zone under a camera effect
        entry = _inside(rng, zone, size)
        velocity = tuple(float(v) for v in rng.uniform(-1, 1, size=2) * 6)
        start = (entry[0] - velocity[0] * 4, entry[1] - velocity[1] * 4)
        scene.objects.append(SceneObject(shape, "red" if want else other, size, t_event - 4, t_event + 8, start, velocity))
        if family == "pan":
            scene.pan = float(rng.uniform(4, 8)) * (1 if rng.random() < 0.5 else -1)
        elif family == "lighting":
            scene.drift = float(rng.uniform(0.5, 1.0)) * (1 if rng.random() < 0.5 else -1)
        else:
            scene.noise = float(rng.uniform(2, 5))
    return scene
