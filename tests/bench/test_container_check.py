"""`bench containers`: one video copied into four containers, every decoding path checked."""

from vidsight.bench.containers import all_equal, format_container_report, run_container_check
from vidsight.ingest import probe


def test_the_copies_hold_the_same_stream_and_every_path_agrees(make_test_video, tmp_path):
    path, _ = make_test_video(width=160, height=120, square_size=16, duration_s=4.0, fps=25, gop=20, bframes=True)
    rows = run_container_check(path, tmp_path, fps=3.0, workers=2)
    assert [row["container"] for row in rows] == [".mp4", ".mkv", ".ts", ".mpg"]
    assert all(row["frames"] == probe(path).frame_count for row in rows)
    assert all(row["sequential"] == row["sampled"] == 12 for row in rows)
    assert all_equal(rows), format_container_report(rows)
