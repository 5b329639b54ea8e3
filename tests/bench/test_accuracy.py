import json

import av
import pytest

from vidsight.bench.accuracy import format_report, normalise, precision_recall_f1, run_accuracy, video_positive
from vidsight.bench.intervals import wilson
from vidsight.bench.suite import SUITES, build_suite, window_starts


def test_two_consecutive_yes_windows_make_a_positive_video():
    assert not video_positive([True, False, True, False])
    assert video_positive([False, True, True, False])
    assert not video_positive([])


def test_precision_recall_f1():
    scores = precision_recall_f1([True, True, False, False], [True, False, True, False])
    assert (scores["precision"], scores["recall"], scores["f1"]) == (0.5, 0.5, 0.5)
    assert precision_recall_f1([False], [False])["f1"] == 0.0


def test_normalise_answers():
    assert normalise(" Yes.") == "yes" and normalise("red <unk>") == "red" and normalise("") == ""


def test_windows_cover_the_video_at_the_stride():
    assert window_starts(80) == list(range(0, 61, 4))


def test_suite_is_deterministic(tmp_path):
    first = json.loads(build_suite("smoke", tmp_path / "a").read_text())
    second = json.loads(build_suite("smoke", tmp_path / "b").read_text())
    assert first == second
    assert len(first["clips"]) == 5 * SUITES["smoke"].per_family
    labels = [v["label"] for v in first["anomaly_videos"]]
    assert labels == [True, False]
    assert all(len(v["window_labels"]) == len(window_starts(80)) for v in first["anomaly_videos"])
    assert all(any(v["window_labels"]) == v["label"] for v in first["anomaly_videos"])


def test_accuracy_report_is_deterministic(tmp_path, tiny_adapter):
    from vidsight.engine import Asker

    asker = Asker(tiny_adapter)
    first = run_accuracy(asker, "smoke", tmp_path)
    second = run_accuracy(asker, "smoke", tmp_path)
    assert first == second
    assert set(first["families"]) == {"count", "attribute", "order", "needle", "anomaly"}
    assert first["anomaly_videos"]["windows"] == 2 * len(window_starts(80))
    for score in first["families"].values():
        assert score["interval"] == pytest.approx(wilson(score["correct"], score["total"]))
        assert score["interval"][0] <= score["accuracy"] <= score["interval"][1]
    assert "95 % Wilson" in format_report(first)


def test_a_suite_stored_in_wide_pixels_shows_the_same_pictures(make_test_video, tmp_path):
    """`store_in_wide_pixels` (the non-square-pixel check in docs/benchmarks.md): each video stored
    at 3/4 of its width in 4:3 pixels, shown at its own size and close to its own pictures."""
    import shutil

    import numpy as np

    from vidsight.bench.storage import store_in_wide_pixels
    from vidsight.ingest import decode_frames, probe

    video, _ = make_test_video(width=160, height=96, fps=8, duration_s=2.0)
    source = tmp_path / "suite"
    source.mkdir()
    shutil.copy(video, source / "clip.mp4")
    (source / "manifest.json").write_text("{}")
    manifest = store_in_wide_pixels(source, tmp_path / "wide")
    wide, plain = probe(manifest.parent / "clip.mp4"), probe(video)
    assert wide.pixel_aspect == (4, 3) and (wide.width, wide.height, wide.frame_count) == (160, 96, plain.frame_count)
    with av.open(str(manifest.parent / "clip.mp4")) as container:
        assert container.streams.video[0].codec_context.width == 120
    error = (decode_frames(manifest.parent / "clip.mp4").data.float() - decode_frames(video).data.float()) ** 2
    assert 10 * np.log10(255**2 / error.mean().item()) > 25


@pytest.mark.parametrize("transfer", ["pq", "hlg"])
def test_a_suite_stored_in_hdr_shows_the_same_pictures(make_test_video, tmp_path, transfer):
    """`store_in_hdr` (the HDR check in docs/benchmarks.md): each video stored as 10-bit HDR, read
    back close to its own pictures, and far from them when its code values are read as SDR."""
    import shutil

    import numpy as np

    from vidsight.bench.storage import store_in_hdr
    from vidsight.ingest import decode_frames, probe

    video, _ = make_test_video(width=160, height=96, fps=8, duration_s=1.0)
    source = tmp_path / "suite"
    source.mkdir()
    shutil.copy(video, source / "clip.mp4")
    (source / "manifest.json").write_text("{}")
    manifest = store_in_hdr(source, tmp_path / transfer, transfer)
    stored, plain = probe(manifest.parent / "clip.mp4"), probe(video)
    assert (stored.dynamic_range, stored.wide_gamut, stored.frame_count) == (transfer, True, plain.frame_count)
    original = decode_frames(video).data.float()
    error = (decode_frames(manifest.parent / "clip.mp4").data.float() - original) ** 2
    assert 10 * np.log10(255**2 / error.mean().item()) > 30
    with av.open(str(manifest.parent / "clip.mp4")) as container:
        as_sdr = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
    assert 10 * np.log10(255**2 / ((as_sdr - original.numpy()) ** 2).mean()) < 25
