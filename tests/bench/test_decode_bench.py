from vidsight.bench.decode import format_decode_report, run_decode_bench, write_decode_report


def test_decode_bench_reports_every_method_with_frames_checked(make_test_video, tmp_path):
    path, _ = make_test_video(width=320, height=240, duration_s=4.0, gop=12, bframes=True)
    report = run_decode_bench(path, fps_values=(2.0,), workers=2, lengths_s=(2.0, 4.0))
    (run,) = report["runs"]
    methods = run["methods"]
    assert run["sampled_frames"] == 8
    for name in ["sequential, 1 thread", "PyAV, FFmpeg threads", "vidsight parallel, 1 workers",
                 "vidsight parallel, 2 workers", "vidsight parallel, 2 processes",
                 "vidsight parallel, 2 workers, trimmed GOPs"]:
        assert methods[name]["identical"] and methods[name]["seconds"] > 0
    assert methods["sequential, 1 thread"]["speedup"] == 1.0
    assert methods["vidsight parallel, 2 workers"]["parallel_efficiency"] > 0
    assert [r["sampled_frames"] for r in report["lengths"]] == [4, 8]
    assert all(r["identical"] and r["speedup"] > 0 for r in report["lengths"])
    json_path, png_path = write_decode_report(report, tmp_path)
    assert json_path.is_file() and png_path.stat().st_size > 0
    assert "identical" in format_decode_report(report)
