"""The harder watch families hold the event each one names, labelled from the scene itself."""

import numpy as np
import pytest

from vidsight.tasks.families import anomaly_label
from vidsight.tasks.watch_scenes import FAMILIES, watch_scene

TIMES = np.arange(80) / 2.0  # 40 s at 2 fps


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("want", [True, False])
def test_each_family_gives_the_label_asked_for(family, want):
    for seed in range(3):
        scene = watch_scene(family, np.random.default_rng(seed), seed, 40.0, want, TIMES)
        assert anomaly_label(scene, TIMES) == want
        obj = scene.objects[0]
        if family in ("recolour", "appear"):
            assert obj.velocity == (0.0, 0.0)          # nothing moves: motion vectors see nothing
        if family == "recolour":
            assert obj.colour != "red" and obj.new_colour is not None and obj.t_in == 0
        if family == "appear":
            assert obj.t_in > 0
        if family == "creep":
            assert np.hypot(*obj.velocity) <= 1.5       # below a pixel per second and a half
        if family == "brief":
            assert obj.t_out - obj.t_in <= 3.5
        assert (scene.pan != 0) == (family == "pan") and (scene.drift != 0) == (family == "lighting")
        assert (scene.noise > 0) == (family == "noise")
