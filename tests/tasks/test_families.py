import numpy as np
import pytest

from vidsight.tasks.chat import make_chat_stream
from vidsight.tasks.scenes import COLOURS, OBJECT_SHAPES, Scene, SceneObject, shape_mask
from vidsight.tasks.families import (ANOMALY_QUERY, DEFAULT_FRAMES, FAMILIES, FRAME, Sample, anomaly_label,
                                     answer_choices, make_sample, order_shapes, probe_questions)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_samples_are_deterministic_per_seed_and_vary_across_seeds(family):
    a, b, c = make_sample(family, 11), make_sample(family, 11), make_sample(family, 12)
    assert (a.question, a.answer) == (b.question, b.answer)
    np.testing.assert_array_equal(a.render(), b.render())
    assert a.render().shape == (DEFAULT_FRAMES[family], FRAME, FRAME, 3)
    assert not np.array_equal(a.render(), c.render())


def test_answers_match_the_scene():
    for seed in range(40):
        count = make_sample("count", seed)
        assert int(count.answer) == len(count.scene.objects)
        needle = make_sample("needle", seed)
        shape = needle.question.split()[-1].rstrip("?")
        (target,) = [o for o in needle.scene.objects if o.shape == shape]
        assert target.colour == needle.answer and target.t_out - target.t_in == pytest.approx(2.0)
        order = make_sample("order", seed)
        first = min(order.scene.objects, key=lambda o: o.t_in)
        assert order.answer == first.shape
        attribute = make_sample("attribute", seed)
        objects = attribute.scene.objects
        assert attribute.answer in {o.colour for o in objects} | {o.shape for o in objects}
        anomaly = make_sample("anomaly", seed)
        assert anomaly.question == ANOMALY_QUERY
        assert (anomaly.answer == "Yes") == anomaly_label(anomaly.scene, anomaly.times_s)


def test_anomaly_is_balanced():
    answers = [make_sample("anomaly", seed).answer for seed in range(60)]
    assert 20 <= answers.count("Yes") <= 40


def test_rendered_object_has_its_colour_and_shape_where_the_track_says():
    obj = SceneObject("triangle", "blue", 20, t_in=1.0, t_out=3.0, start=(10.0, 30.0), velocity=(5.0, 0.0))
    scene = Scene(FRAME, FRAME, 4.0, seed=1, objects=[obj])
    assert not (scene.render(0.5) == COLOURS["blue"]).all(axis=-1).any()
    frame = scene.render(2.0)  # moved 5 px: box x 15..35, y 30..50
    painted = (frame == COLOURS["blue"]).all(axis=-1)
    np.testing.assert_array_equal(painted[30:50, 15:35], shape_mask("triangle", 20))
    assert painted.sum() == shape_mask("triangle", 20).sum()


def test_events_are_recorded():
    a = SceneObject("square", "red", 20, 0.0, 10.0, (0.0, 40.0), velocity=(10.0, 0.0), recolour_at=6.0,
                    new_colour="green")
    b = SceneObject("circle", "white", 20, 2.0, 10.0, (80.0, 40.0))
    scene = Scene(FRAME, FRAME, 8.0, seed=0, zone=(50, 30, 75, 70), objects=[a, b])
    kinds = {(e["event"], e.get("object", tuple(e.get("objects", [])))) for e in scene.events()}
    assert ("appear", 0) in kinds and ("appear", 1) in kinds and ("recolour", 0) in kinds
    assert ("enter_zone", 0) in kinds and ("meet", (0, 1)) in kinds
    enter = next(e["t"] for e in scene.events() if e["event"] == "enter_zone")
    assert enter == pytest.approx(3.25, abs=0.25)  # right edge 20 + 10 t passes x = 50 after 3 s


def test_cell_labels_mark_the_cells_an_object_covers():
    scene = Scene(FRAME, FRAME, 2.0, seed=1)
    scene.objects.append(SceneObject("square", "blue", 28, 0.0, 5.0, (28.0, 56.0)))  # exactly one 28-px cell
    sample = Sample("attribute", 1, scene, "What colour is the square?", "blue", 4)
    labels = sample.cell_labels(28, 2)
    assert labels.shape == (2, 4, 4)
    expected = np.zeros((4, 4), dtype=int)
    expected[2, 1] = 1 + list(COLOURS).index("blue") * len(OBJECT_SHAPES) + OBJECT_SHAPES.index("square")
    assert (labels == expected).all()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_probe_questions_are_answered_by_the_scene(family):
    for seed in range(20):
        sample = make_sample(family, seed)
        times = sample.times_s
        seen = [o for o in sample.scene.objects if any(o.visible(t) for t in times)]
        for question, answer in probe_questions(sample):
            if question.startswith("What colour"):
                shape = question.split()[-1].rstrip("?")
                assert [o.colour for o in seen if o.shape == shape] == [answer]
            elif question.startswith("What shape"):
                colour = question.split()[-2]
                assert [o.shape for o in seen if o.colour == colour] == [answer]
            elif question.startswith("How many"):
                assert int(answer) == len(seen)
            elif question.startswith("Which appeared"):
                a, b = order_shapes(question)
                appears = {o.shape: min(k for k, t in enumerate(times) if o.visible(t)) for o in seen}
                assert answer == (a if appears[a] < appears[b] else b) and abs(appears[a] - appears[b]) >= 2
            else:
                assert question == ANOMALY_QUERY and answer == ("Yes" if anomaly_label(sample.scene, times) else "No")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_question_has_its_answer_among_its_choices_and_no_repeats(family):
    for seed in range(30):
        sample = make_sample(family, seed)
        for question, answer in [(sample.question, sample.answer), *probe_questions(sample)]:
            choices = answer_choices(question)
            assert answer in choices and len(set(choices)) == len(choices) >= 2, (question, answer, choices)
    with pytest.raises(ValueError, match="no answer choices"):
        answer_choices("Why?")


def test_probe_order_questions_do_not_name_the_earlier_shape_first_by_rule():
    """Objects are listed as they appear: probes named in that order would always be answered by
    the shape named first, a bias a model learns."""
    named_first = []
    for seed in range(40):
        stream = make_chat_stream(seed)
        for sample in (make_sample("order", seed), stream.sample(stream.questions[-1])):
            for question, answer in probe_questions(sample):
                if question.startswith("Which appeared"):
                    named_first.append(answer == order_shapes(question)[0])
    assert len(named_first) >= 30
    assert 0.3 < sum(named_first) / len(named_first) < 0.7
