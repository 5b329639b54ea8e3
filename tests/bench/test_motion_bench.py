"""The static-camera motion bench: noise sweeps the first rule's kept share up, not the default's."""

import dataclasses

import pytest

from vidsight.bench.motion import format_motion_report, run_motion_bench
from vidsight.bench.watch import configurations, sweeps
from vidsight.ingest.dynamic import MotionPruneConfig


@pytest.mark.slow
def test_static_scene_report_per_rule(tmp_path):
    rules = {"max": MotionPruneConfig(rule="max"), "persistent": MotionPruneConfig()}
    report = run_motion_bench(tmp_path, rules, duration_s=16.0)
    scenes = report["scenes"]
    assert {"photo, noise 0", "photo, noise 5", "photo, drift 2/s", "texture, noise 5"} <= set(scenes)
    noisy = scenes["photo, noise 5"]["rules"]
    assert noisy["persistent"]["kept_inside_gop"] < 0.5 < noisy["max"]["kept_inside_gop"]
    assert all(r["object_recall"] == 1.0 and r["windows_inside_gop"] >= 2 for s in scenes.values()
               for r in s["rules"].values())
    assert "photo, noise 5" in format_motion_report(report)


def test_each_sweep_changes_one_setting_of_pruning_plus_refresh():
    both = configurations(0.25)["pruning+refresh"]
    for axis, values in sweeps(0.25).items():
        assert len(values) >= 2, axis
        for config in values.values():
            changed = [f.name for f in dataclasses.fields(both) if getattr(config, f.name) != getattr(both, f.name)]
            assert len(changed) <= 1, (axis, changed)
