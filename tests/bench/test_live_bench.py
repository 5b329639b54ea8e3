"""`vidsight bench live`: a real-time replay watched catching up and judging every window."""

import json

from vidsight.api.cli import main


def test_the_live_bench_reports_both_modes_on_one_replay(make_test_video, tiny_model_dir, tmp_path, capsys):
    path = make_test_video(width=224, height=168, duration_s=1.5, fps=8, gop=16, bframes=False, seed=5)[0]
    code = main(["bench", "live", str(path), "--model", str(tiny_model_dir), "--window", "0.5", "--stride", "0.5",
                 "--fps", "4", "--prune-tau", "0.25", "--out", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and json.loads((tmp_path / "live.json").read_text()) == report
    every, caught_up = report["runs"]["every-window"], report["runs"]["catch-up"]
    assert [v["window"] for v in every["verdicts"]] == list(range(5))   # 6 samples, windows of 2 every 1
    assert every["windows_skipped"] == 0 and every["frames_decoded"] == caught_up["frames_decoded"] == 12
    judged = [v["window"] for v in caught_up["verdicts"]]
    assert judged[-1] == 4 and caught_up["windows_judged"] + caught_up["windows_skipped"] == 5
    assert report["shared_windows"] == len(judged) and report["p_yes_max_difference"] < 1e-6
    assert all(v["lag_s"] >= 0 and v["work_s"] > 0 for run in (every, caught_up) for v in run["verdicts"])


def test_a_missing_video_is_refused_by_name(tmp_path, tiny_model_dir, capsys):
    code = main(["bench", "live", str(tmp_path / "gone.mp4"), "--model", str(tiny_model_dir), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "gone.mp4" in err and "Traceback" not in err
