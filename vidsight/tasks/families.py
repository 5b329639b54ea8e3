"""Task families over generated scenes, each with question templates and one exact answer.

Clips are ``FRAME`` x ``FRAME`` pixels sampled at ``SAMPLE_FPS``. Objects live in separate
quadrants unless a task needs them to cross, so every question has exactly one right answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from vidsight.tasks.scenes import COLOURS, OBJECT_SHAPES, Scene, SceneObject

FRAME = 112
SAMPLE_FPS = 2.0
QUADRANT = FRAME // 2
# Objects span two to three 14-pixel patches: large enough that a patch-based encoder can tell a
# circle from a square from a triangle, small enough to move inside a quadrant.
OBJECT_SIZE = (26, 34)
ANOMALY_QUERY = "Is there a red object in the zone? Answer Yes or No."
# Clip length in sampled frames per family at its default length.
DEFAULT_FRAMES = {"count": 16, "attribute": 16, "order": 16, "needle": 64, "anomaly": 20}


@dataclasses.dataclass
class Sample:
    """One question about one clip, with its answer.

    ``offset_patches`` places the clip that many temporal patches into a longer stream: the
    frames are the same, their temporal positions later (training reads late positions this way
    without long sequences).
    """

    family: str
    seed: int
    scene: Scene
    question: str
    answer: str
    frames: int
    offset_patches: int = 0
    # `_covering` per (cell, frames_per_step): training reads it for both its cell and order targets.
    _covered: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def times_s(self) -> np.ndarray:
        return np.arange(self.frames) / SAMPLE_FPS

    def render(self) -> np.ndarray:
        """``(frames, FRAME, FRAME, 3)`` uint8 frames at the sample times."""
        return np.stack([self.scene.render(t) for t in self.times_s])

    def cell_labels(self, cell: int, frames_per_step: int) -> np.ndarray:
        """What covers each ``cell`` x ``cell`` block per step of ``frames_per_step`` frames.

        Returns ``(steps, FRAME // cell, FRAME // cell)`` ints: 0 for background, else
        ``1 + colour * len(OBJECT_SHAPES) + shape`` of the object covering most of the block (at least
        a tenth of it) over the step's frames. Training uses these as dense per-token targets.
        """
        covering, step_times = self._covering(cell, frames_per_step)
        labels = np.zeros(covering.shape, dtype=np.int64)
        colours = list(COLOURS)
        for i, obj in enumerate(self.scene.objects):
            colour = np.array([colours.index(obj.colour_at(t)) for t in step_times])[:, None, None]
            labels = np.where(covering == i, 1 + colour * len(OBJECT_SHAPES) + OBJECT_SHAPES.index(obj.shape), labels)
        return labels

    def cell_earlier(self, cell: int, frames_per_step: int) -> np.ndarray:
        """Like `cell_labels`, the shapes of the objects that appeared before the covering one, as a
        bitmask (bit ``i``: ``OBJECT_SHAPES[i]``), -1 for background. "Which came first, A or B?" is
        then whether B's tokens hold A's bit, and no token has to count. Only meaningful when no two
        objects appear at the same time (`appearances_distinct`)."""
        covering, _ = self._covering(cell, frames_per_step)
        objects = self.scene.objects
        earlier = np.array([sum(1 << i for i in {OBJECT_SHAPES.index(o.shape) for o in objects if o.t_in < obj.t_in})
                            for obj in objects] or [-1])
        return np.where(covering >= 0, earlier[np.maximum(covering, 0)], -1)

    @property
    def appearances_distinct(self) -> bool:
        """Whether the scene's objects all appear at different times (so their order is defined)."""
        starts = [obj.t_in for obj in self.scene.objects]
        return len(starts) > 1 and len(set(starts)) == len(starts)

    def _covering(self, cell: int, frames_per_step: int) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, side, side)`` index of the object covering most of each block (at least a tenth
        of it) over each step's frames, -1 for none; and each step's first frame time."""
        if (cell, frames_per_step) not in self._covered:
            self._covered[cell, frames_per_step] = self._cover(cell, frames_per_step)
        return self._covered[cell, frames_per_step]

    def _cover(self, cell: int, frames_per_step: int) -> tuple[np.ndarray, np.ndarray]:
        maps = np.stack([self.scene.object_map(t) for t in self.times_s])
        pad = -len(maps) % frames_per_step
        maps = np.concatenate([maps, maps[-1:].repeat(pad, axis=0)]) if pad else maps
        steps, side = len(maps) // frames_per_step, FRAME // cell
        blocks = maps.reshape(steps, frames_per_step, side, cell, side, cell).transpose(0, 2, 4, 1, 3, 5)
        blocks = blocks.reshape(steps, side, side, -1)
        step_times = self.times_s[np.minimum(np.arange(steps) * frames_per_step, len(self.times_s) - 1)]
        if not self.scene.objects:
            return np.full((steps, side, side), -1, dtype=np.int64), step_times
        cover = np.stack([(blocks == i).mean(axis=-1) for i in range(len(self.scene.objects))])
        winner = cover.argmax(axis=0)
        return np.where(cover.max(axis=0) >= 0.1, winner, -1), step_times


def _quadrant_object(rng, quadrant: int, shape: str, colour: str, t_in: float, t_out: float,
                     speed: float = 3.0) -> SceneObject:
    """An object that wanders inside one quadrant for its whole life."""
    size = int(rng.integers(OBJECT_SIZE[0], OBJECT_SIZE[1] + 1))
    qx, qy = (quadrant % 2) * QUADRANT, (quadrant // 2) * QUADRANT
    room = QUADRANT - size - 4
    travel = rng.uniform(-1, 1, size=2) * speed
    life = max(t_out - t_in, 1e-6)
    travel = np.clip(travel * life, -room, room) / life  # never leaves the quadrant
    start = np.array([rng.uniform(2, 2 + room), rng.uniform(2, 2 + room)])
    end = start + travel * life
    start = np.where(end < 2, start + (2 - end), np.where(end > 2 + room, start - (end - 2 - room), start))
    return SceneObject(shape, colour, size, t_in, t_out, (qx + start[0], qy + start[1]), tuple(travel))


def _scene(rng, seed: int, frames: int, **fields) -> Scene:
    pan = float(rng.choice([0.0, 0.0, 3.0, -3.0]))
    return Scene(FRAME, FRAME, frames / SAMPLE_FPS, seed, pan=pan, **fields)


def count_task(rng, seed: int, frames: int) -> Sample:
    n = int(rng.integers(1, 5))
    scene = _scene(rng, seed, frames)
    duration = scene.duration_s
    for quadrant in rng.permutation(4)[:n]:
        scene.objects.append(_quadrant_object(rng, int(quadrant), str(rng.choice(OBJECT_SHAPES)),
                                              str(rng.choice(list(COLOURS))), 0.0, duration + 1))
    question = str(rng.choice(["How many objects are there?", "How many shapes can you see?"]))
    return Sample("count", seed, scene, question, str(n), frames)


def attribute_task(rng, seed: int, frames: int) -> Sample:
    n = int(rng.integers(1, 4))
    shapes = rng.permutation(OBJECT_SHAPES)[:n]
    colours = rng.permutation(list(COLOURS))[:n]
    scene = _scene(rng, seed, frames)
    for quadrant, shape, colour in zip(rng.permutation(4)[:n], shapes, colours):
        scene.objects.append(_quadrant_object(rng, int(quadrant), str(shape), str(colour), 0.0, scene.duration_s + 1))
    target = int(rng.integers(n))
    if rng.random() < 0.5:
        question, answer = f"What colour is the {shapes[target]}?", str(colours[target])
    else:
        question, answer = f"What shape is the {colours[target]} object?", str(shapes[target])
    return Sample("attribute", seed, scene, question, answer, frames)


def order_task(rng, seed: int, frames: int) -> Sample:
    first, second = (str(s) for s in rng.permutation(OBJECT_SHAPES)[:2])
    scene = _scene(rng, seed, frames)
    duration = scene.duration_s
    t_first = float(rng.uniform(0.0, duration * 0.4))
    t_second = float(rng.uniform(t_first + 1.5, duration - 1.0))
    quadrants = rng.permutation(4)
    for quadrant, shape, t_in in zip(quadrants, (first, second), (t_first, t_second)):
        scene.objects.append(_quadrant_object(rng, int(quadrant), shape, str(rng.choice(list(COLOURS))),
                                              t_in, duration + 1))
    a, b = (first, second) if rng.random() < 0.5 else (second, first)
    return Sample("order", seed, scene, order_question(a, b), first, frames)


def needle_task(rng, seed: int, frames: int) -> Sample:
    needle_shape = str(rng.choice(OBJECT_SHAPES))
    others = [s for s in OBJECT_SHAPES if s != needle_shape]
    scene = _scene(rng, seed, frames)
    duration = scene.duration_s
    quadrants = rng.permutation(4)
    for quadrant in quadrants[: int(rng.integers(1, 3))]:
        scene.objects.append(_quadrant_object(rng, int(quadrant), str(rng.choice(others)),
                                              str(rng.choice(list(COLOURS))), 0.0, duration + 1))
    colour = str(rng.choice(list(COLOURS)))
    t_in = float(rng.uniform(0.5, duration - 2.5))
    scene.objects.append(_quadrant_object(rng, int(quadrants[3]), needle_shape, colour, t_in, t_in + 2.0, speed=0.0))
    return Sample("needle", seed, scene, f"What colour was the {needle_shape}?", colour, frames)


def anomaly_label(scene: Scene, times_s: np.ndarray) -> bool:
    """Yes when a red object overlaps the zone at any of the sampled times."""
    return any(scene.in_zone(o, t) and o.colour_at(t) == "red" for o in scene.objects for t in times_s)


def _crossing_object(rng, duration: float, colour: str, t_in: float, t_out: float) -> SceneObject:
    """An object gliding across the frame in a straight line."""
    size = int(rng.integers(OBJECT_SIZE[0], OBJECT_SIZE[1] + 1))
    start = rng.uniform(0, FRAME - size, size=2)
    end = rng.uniform(0, FRAME - size, size=2)
    velocity = (end - start) / max(t_out - t_in, 1e-6)
    return SceneObject(str(rng.choice(OBJECT_SHAPES)), colour, size, t_in, t_out, tuple(start), tuple(velocity))


def anomaly_scene(rng, seed: int, duration: float, want: bool, times_s: np.ndarray) -> Scene:
    """A scene with a marked zone whose label over ``times_s`` is ``want`` (by rejection)."""
    while True:
        side = int(rng.integers(36, 57))
        x0, y0 = (int(v) for v in rng.integers(4, FRAME - side - 4, size=2))
        scene = Scene(FRAME, FRAME, duration, seed, zone=(x0, y0, x0 + side, y0 + side))
        for _ in range(int(rng.integers(1, 4))):
            colour = "red" if rng.random() < 0.45 else str(rng.choice([c for c in COLOURS if c != "red"]))
            t_in = float(rng.uniform(0, duration * 0.6))
            t_out = float(rng.uniform(t_in + min(3.0, duration / 3), duration + 2))
            scene.objects.append(_crossing_object(rng, duration, colour, t_in, t_out))
        if anomaly_label(scene, times_s) == want:
            return scene


def anomaly_task(rng, seed: int, frames: int) -> Sample:
    times = np.arange(frames) / SAMPLE_FPS
    want = bool(rng.random() < 0.5)
    scene = anomaly_scene(rng, seed, frames / SAMPLE_FPS, want, times)
    return Sample("anomaly", seed, scene, ANOMALY_QUERY, "Yes" if want else "No", frames)


def probe_questions(sample: Sample) -> list[tuple[str, str]]:
    """Further questions the clip answers exactly, beyond the sample's own.

    Training asks them as later turns of the same conversation, so one clip's vision pass
    teaches several answers: the colour and shape of each uniquely identifiable object, the
    object count when it never changes, and which of two objects appeared first.
    """
    times = sample.times_s
    seen = [o for o in sample.scene.objects if any(o.visible(t) for t in times)]
    first_frame = {id(o): next(k for k, t in enumerate(times) if o.visible(t)) for o in seen}
    shapes = [o.shape for o in seen]
    colours = [o.colour_at(t) for o in seen for t in times if o.visible(t)]
    out = []
    for obj in seen:
        palette = {obj.colour_at(t) for t in times if obj.visible(t)}
        if shapes.count(obj.shape) == 1 and len(palette) == 1:
            verb = "is" if all(obj.visible(t) for t in times) else "was"
            out.append((f"What colour {verb} the {obj.shape}?", obj.colour))
        if len(palette) == 1 and colours.count(obj.colour) == sum(obj.visible(t) for t in times) \
                and all(obj.visible(t) for t in times):
            out.append((f"What shape is the {obj.colour} object?", obj.shape))
    visible_counts = {sum(o.visible(t) for o in seen) for t in times}
    if len(visible_counts) == 1 and 1 <= len(seen) <= 4:
        out.append(("How many objects are there?", str(len(seen))))
    # Objects are listed in the order they appear; naming a pair in that order would teach that
    # the shape named first is the answer. Alphabetical order says nothing about time.
    unique = sorted((o for o in seen if shapes.count(o.shape) == 1), key=lambda o: o.shape)
    for i, a in enumerate(unique):
        for b in unique[i + 1 :]:
            if abs(first_frame[id(a)] - first_frame[id(b)]) >= 2:
                early = a if first_frame[id(a)] < first_frame[id(b)] else b
                out.append((order_question(a.shape, b.shape), early.shape))
    if sample.scene.zone is not None:
        out.append((ANOMALY_QUERY, "Yes" if anomaly_label(sample.scene, times) else "No"))
    return [qa for qa in out if qa != (sample.question, sample.answer)]


def key_word(question: str) -> str | None:
    """The word a question hinges on: the shape a colour question asks about, the colour a shape
    question names, the second shape an order question names (the first is read by then); else None."""
    words = question.rstrip("?").split()
    if words[:2] == ["What", "colour"]:
        return words[-1]
    if words[:2] == ["What", "shape"]:
        return words[-2]
    shapes = order_shapes(question)
    return shapes[1] if shapes else None


_ORDER_OPENING, _ORDER_JOIN = "Which appeared first, the ", " or the "


def order_question(first: str, second: str) -> str:
    """The order question naming shape ``first``, then ``second``."""
    return f"{_ORDER_OPENING}{first}{_ORDER_JOIN}{second}?"


def order_shapes(question: str) -> tuple[str, str] | None:
    """The two shapes an order question (`order_question`) names, in the order it names them; None
    for other questions."""
    if not question.startswith(_ORDER_OPENING):
        return None
    first, _, second = question.removeprefix(_ORDER_OPENING).rstrip("?").partition(_ORDER_JOIN)
    return first, second


def answer_choices(question: str) -> list[str]:
    """The answers a family's ``question`` can have, the right one among them: what a
    multiple-choice reading of a suite ranks (`vidsight bench lmms-task --multiple-choice`)."""
    if question == ANOMALY_QUERY:
        return ["Yes", "No"]
    if question.startswith("How many"):
        return ["1", "2", "3", "4"]   # count_task places one to four objects
    if question.startswith("What colour"):
        return list(COLOURS)
    if question.startswith("What shape"):
        return list(OBJECT_SHAPES)
    if shapes := order_shapes(question):
        return list(shapes)
    raise ValueError(f"no answer choices for the question {question!r}")


FAMILIES: dict[str, Callable] = {
    "count": count_task,
    "attribute": attribute_task,
    "order": order_task,
    "needle": needle_task,
    "anomaly": anomaly_task,
}


def make_sample(family: str, seed: int, frames: int | None = None) -> Sample:
    """The sample of ``family`` determined by ``seed`` (``frames`` defaults to the family's length)."""
    rng = np.random.default_rng([seed, list(FAMILIES).index(family)])
    return FAMILIES[family](rng, seed, frames or DEFAULT_FRAMES[family])


def vocabulary() -> list[str]:
    """Every word a question, an answer or the chat template can use."""
    words = {"how", "many", "objects", "are", "there", "shapes", "can", "you", "see", "what", "colour", "is", "the",
             "shape", "object", "which", "appeared", "first", "or", "was", "a", "red", "in", "zone", "answer",
             "yes", "no", "system", "helpful", "assistant", "user", "?", ".", ",", "1", "2", "3", "4"}
    return sorted(words | set(COLOURS) | set(OBJECT_SHAPES))
