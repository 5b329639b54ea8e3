import json

from vidsight.api.cli import main
from vidsight.bench.suite import anomaly_video_scene
from vidsight.bench.watch import SUITE_WINDOWS, anomaly_videos, configurations, hard_videos, run_watch, window_label
from vidsight.engine.watch import Watcher


def test_watch_bench_compares_the_four_configurations(tmp_path, tiny_adapter):
    videos = anomaly_videos(tmp_path, count=1, gop=32)
    results = run_watch(tiny_adapter, videos, configurations())
    assert list(results) == ["full-comp", "pruning", "refresh", "pruning+refresh"]
    full, both = results["full-comp"], results["pruning+refresh"]
    assert full["mean_per_window"]["kept"] == full["mean_per_window"]["visual"]
    assert results["pruning"]["mean_per_window"]["kept"] < full["mean_per_window"]["kept"]
    assert results["refresh"]["mean_per_window"]["reused"] > 0 and full["mean_per_window"]["reused"] == 0
    assert results["pruning"]["motion_sources"] == ["codec"] and full["motion_sources"] == []   # H.264: its vectors
    assert both["flops_reduction"] > 1
    vision = {name: r["mean_per_window"]["vision_flops"] for name, r in results.items()}
    assert vision["pruning"] < vision["full-comp"] and vision["refresh"] < vision["full-comp"]
    assert all(0 < r["mean_per_window"]["vision_flops"] < r["mean_per_window"]["flops"] for r in results.values())
    assert 0 <= both["f1"] <= 1 and {"precision", "recall"} <= set(both)
    positives = sum(anomaly_video_scene(0)[2])
    for result in results.values():  # every window of the video scored against its own label
        window = result["per_window"]
        assert 0 <= window["f1"] <= 1 and window["tp"] + window["fn"] == positives
    assert full["mean_per_window"]["carry"] == 0 and results["pruning"]["mean_per_window"]["carry"] == 0
    assert results["refresh"]["mean_per_window"]["carry"] > 0 and both["mean_per_window"]["carry"] > 0
    # Intervals around each accuracy; each configuration paired with Full-Comp window by window.
    for result in results.values():
        window = result["per_window"]
        low, high = window["accuracy_interval"]
        assert low <= window["accuracy"] == sum(window["correct"]) / len(window["correct"]) <= high
        paired = result["against_full_comp"]["windows"]
        pairs = list(zip(full["per_window"]["correct"], window["correct"]))
        assert paired["only_first"] == sum(a and not b for a, b in pairs)
        assert paired["only_second"] == sum(b and not a for a, b in pairs)
    assert full["against_full_comp"]["windows"] == {"only_first": 0, "only_second": 0, "p_value": 1.0}


def test_without_a_flop_count_the_timings_are_reported_and_the_flops_are_nan(tmp_path, tiny_adapter):
    import math

    videos = anomaly_videos(tmp_path, count=1, gop=32)
    configs = {name: c for name, c in configurations().items() if name in ("full-comp", "refresh")}
    results = run_watch(tiny_adapter, videos, configs, flop_videos=0)
    assert results["refresh"]["speedup_vision_prefill"] > 0 and results["refresh"]["mean_per_window"]["reused"] > 0
    assert all(math.isnan(r["mean_per_window"]["flops"]) and math.isnan(r["flops_reduction"]) for r in results.values())


def test_window_labels_match_the_suites_own(tmp_path, tiny_adapter):
    videos = anomaly_videos(tmp_path, count=2, gop=32)
    config = configurations()["full-comp"]
    for number, video in enumerate(videos):
        verdicts = list(Watcher(tiny_adapter, video["query"], config).watch(config.open(video["video"])))
        labels = [window_label(video["scene"], v, SUITE_WINDOWS.fps) for v in verdicts]
        assert labels == anomaly_video_scene(number)[2]


def test_bench_watch_cli_with_a_labelled_folder(tmp_path, tiny_model_dir, make_test_video, capsys):
    path, _ = make_test_video(width=224, height=168, duration_s=12.0, fps=8, gop=32, seed=11)
    (tmp_path / "labels.csv").write_text(f"video,label\n{path.name},1\n")
    code = main(["bench", "watch", "--model", str(tiny_model_dir), "--folder", str(path.parent), "--labels",
                 str(tmp_path / "labels.csv"), "--query", "Is there a red square? Answer Yes or No.", "--out",
                 str(tmp_path), "--motion-source", "pixels", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["videos"] == 1 and set(report["configs"]) == {"full-comp", "pruning", "refresh", "pruning+refresh"}
    assert report["motion_source"] == "pixels" and report["configs"]["pruning"]["motion_sources"] == ["pixels"]
    assert (tmp_path / "watch.png").stat().st_size > 0


def test_bench_watch_folder_needs_labels(tmp_path, capsys):
    assert main(["bench", "watch", "--folder", str(tmp_path)]) == 2
    assert "--labels" in capsys.readouterr().err


def test_the_hard_suite_writes_each_family_with_long_gops(tmp_path):
    from vidsight.ingest import probe
    from vidsight.tasks.watch_scenes import FAMILIES

    videos = hard_videos(tmp_path, per_family=1, gop=64)
    assert [v["family"] for v in videos] == list(FAMILIES) and all(v["label"] for v in videos)
    info = probe(videos[0]["video"])
    assert info.duration_s >= 39 and len(info.keyframe_indices) == 3  # 160 frames: I-frames at 0, 64, 128


def test_the_hard_suite_takes_a_video_length(tmp_path):
    from vidsight.ingest import probe

    videos = hard_videos(tmp_path, per_family=1, gop=64, duration_s=60.0)
    assert probe(videos[0]["video"]).duration_s >= 59
    assert videos[0]["video"] != hard_videos(tmp_path, per_family=1, gop=64)[0]["video"]


def test_window_and_video_lengths_are_checked(tmp_path, capsys):
    assert main(["bench", "watch", "--videos", "1", "--root", str(tmp_path), "--video-s", "120"]) == 2
    assert "--suite hard" in capsys.readouterr().err
    hard = ["bench", "watch", "--suite", "hard", "--videos", "1", "--root", str(tmp_path)]
    assert main([*hard, "--window-s", "50"]) == 2
    assert "longer than the 40-s videos" in capsys.readouterr().err


def test_an_unknown_sweep_axis_is_refused(tmp_path, capsys):
    code = main(["bench", "watch", "--videos", "1", "--root", str(tmp_path), "--sweeps", "colour"])
    err = capsys.readouterr().err
    assert code == 2 and "unknown sweep axis colour" in err and "Traceback" not in err


def test_a_camera_rate_out_of_range_is_refused(tmp_path, capsys):
    code = main(["bench", "watch", "--videos", "1", "--root", str(tmp_path), "--static-scenes", "--camera-fps", "0"])
    err = capsys.readouterr().err
    assert code == 2 and "--camera-fps must be in [1, 120], got 0" in err and "Traceback" not in err


def test_configurations_a_family_refuses_are_left_out_with_the_reason(tmp_path, llava_adapter):
    import pytest

    from vidsight.bench.watch import run_watch_bench
    from vidsight.errors import ConfigError

    videos = anomaly_videos(tmp_path, count=1, gop=32)
    report = run_watch_bench(llava_adapter, videos)
    assert list(report["configs"]) == ["full-comp", "refresh"]
    refresh = report["configs"]["refresh"]
    assert refresh["mean_per_window"]["reused"] > 0 and refresh["flops_reduction"] > 1
    assert set(report["refused"]) == {"pruning", "pruning+refresh"}
    with pytest.raises(ConfigError, match="refuses: motion pruning"):
        run_watch_bench(llava_adapter, videos, axes=("tau",))
