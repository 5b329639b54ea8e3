import json

from vidsight.api.cli import main
from vidsight.bench.ask import plot_ask_report, run_ask_bench


def test_ask_bench_runs_every_configuration_on_one_video(make_test_video, tmp_path, tiny_shape):
    path, _ = make_test_video(width=320, height=240, duration_s=12.0, fps=10, gop=10, seed=4)
    report = run_ask_bench(path, tiny_shape, rhos=(0.5,), group_frames=4, workers=2, fps=2.0, max_new_tokens=3,
                           dtype="float32")
    runs = report["runs"]
    assert list(runs) == ["full compute", "decode, then groups, rho=0.5", "overlap, rho=1", "overlap, rho=0.5",
                          "overlap, rho=0.5, skip pruned", "decode, then groups, rho=0.5, skip pruned",
                          "overlap, rho=0.5, skip pruned, oversubscribed"]
    assert runs["overlap, rho=0.5, skip pruned"]["kept_visual_tokens"] == runs["overlap, rho=0.5"]["kept_visual_tokens"]
    assert report["rho1_answer_identical"]
    assert runs["full compute"]["groups"] == 1 and runs["overlap, rho=1"]["groups"] == 6
    assert runs["overlap, rho=0.5"]["kept_visual_tokens"] * 2 == runs["full compute"]["visual_tokens"]
    assert runs["overlap, rho=0.5"]["overlap"] and not runs["full compute"]["overlap"]
    assert runs["full compute"]["prefill_peak_bytes"] > runs["overlap, rho=0.5"]["prefill_peak_bytes"] > 0
    assert set(report["overlap"]) == {"overlap, rho=0.5", "overlap, rho=0.5, skip pruned",
                                      "overlap, rho=0.5, skip pruned, oversubscribed"}
    # QuickVideo's eq. 3 from the decode-first run's stages and the overlapped run's first-group wait.
    skip_check = report["overlap"]["overlap, rho=0.5, skip pruned"]
    alone, overlapped = runs["decode, then groups, rho=0.5, skip pruned"], runs["overlap, rho=0.5, skip pruned"]
    stages = alone["stages_s"]
    prefill = stages["preprocess"] + stages["vision"] + stages["prefill"]
    assert 0 < overlapped["fill_s"] < overlapped["wall_s"] and 0 < alone["last_group_s"] < prefill
    assert skip_check["bound_s"] == max(stages["decode"] + alone["last_group_s"],
                                        prefill + overlapped["fill_s"]) + stages["generate"]
    assert skip_check["overlapped_wall_s"] == overlapped["wall_s"]
    assert skip_check["within_tolerance"] == (overlapped["wall_s"] <= 1.15 * skip_check["bound_s"])
    png = plot_ask_report(report, tmp_path / "ask.png")
    assert png.stat().st_size > 0
    json.dumps(report)


def test_bench_ask_rejects_unknown_shape(make_test_video, capsys):
    path, _ = make_test_video(duration_s=1.0)
    assert main(["bench", "ask", str(path), "--shape", "qwen9-vl"]) == 2
    assert "unknown model shape" in capsys.readouterr().err
