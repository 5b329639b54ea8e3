import numpy as np
import pytest

from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig, probe, sample_frames
from vidsight.ingest.sampling import nearest_frames


def test_samples_at_fps_land_on_nearest_timestamps_with_variable_frame_rate(make_test_video):
    path, truth = make_test_video(duration_s=4.0, variable_frame_rate=True, start_time_s=1.5, seed=3)
    info = probe(path)
    pts = np.asarray(truth["pts_s"])
    indices = sample_frames(info, SamplingConfig(fps=3.0))
    requested = 1.5 + np.arange(len(indices)) / 3.0
    for index, t in zip(indices, requested):
        assert abs(pts[index] - t) == pytest.approx(np.abs(pts - t).min(), abs=1e-6)
    # Interpolating by nominal rate would be wrong somewhere on this jittered timeline.
    naive = np.round((requested - 1.5) * info.average_fps).astype(int)
    assert not np.array_equal(naive, indices)


def test_max_frames_spreads_samples_over_whole_video(make_test_video):
    path, _ = make_test_video(fps=24, duration_s=4.0)
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=24.0, max_frames=8))
    assert len(indices) == 8
    assert indices[0] < 12 and indices[-1] > 84
    assert np.all(np.diff(indices) > 0)


def test_fps_above_native_rate_yields_each_frame_once(make_test_video):
    path, _ = make_test_video(fps=24, duration_s=1.0)
    indices = sample_frames(probe(path), SamplingConfig(fps=100.0))
    np.testing.assert_array_equal(indices, np.arange(24))


def test_nearest_frames_ties_go_earlier(make_test_video):
    path, _ = make_test_video(fps=24, duration_s=1.0)
    info = probe(path)
    midpoint = (info.pts_s[3] + info.pts_s[4]) / 2
    np.testing.assert_array_equal(nearest_frames(info, np.array([midpoint, -5.0, 99.0])), [3, 0, 23])


@pytest.mark.parametrize("fields", [dict(fps=0), dict(fps=-1), dict(fps=float("nan")), dict(max_frames=0),
                                    dict(start_s=-1), dict(start_s=float("inf")), dict(start_s=2.0, end_s=2.0),
                                    dict(end_s=float("nan"))])
def test_bad_sampling_settings_are_refused(fields):
    with pytest.raises(ConfigError):
        SamplingConfig(**fields)


def test_a_clip_is_sampled_as_the_whole_video_is_from_its_start_to_its_end(make_test_video):
    """``start_s``/``end_s`` (qwen-vl-utils' ``video_start``/``video_end``): samples at ``k / fps``
    from the clip's start, counted from the video's first frame (here 1.5 s into its clock)."""
    path, truth = make_test_video(duration_s=4.0, variable_frame_rate=True, start_time_s=1.5, seed=3)
    info = probe(path)
    pts = np.asarray(truth["pts_s"])
    indices = sample_frames(info, SamplingConfig(fps=3.0, start_s=1.2, end_s=2.9))
    requested = 1.5 + 1.2 + np.arange(5) / 3.0   # floor(1.7 s x 3) samples
    assert len(indices) == 5
    for index, t in zip(indices, requested):
        assert abs(pts[index] - t) == pytest.approx(np.abs(pts - t).min(), abs=1e-6)
    spread = sample_frames(info, SamplingConfig(fps=30.0, max_frames=4, start_s=1.0, end_s=3.0))
    assert len(spread) == 4 and 1.5 + 1.0 <= pts[spread[0]] and pts[spread[-1]] <= 1.5 + 3.0
    # An end past the video's is its end; a start there is refused, naming the file.
    np.testing.assert_array_equal(sample_frames(info, SamplingConfig(fps=3.0, start_s=2.0, end_s=99.0)),
                                  sample_frames(info, SamplingConfig(fps=3.0, start_s=2.0)))
    with pytest.raises(ConfigError, match=f"{path}: the clip starts at 5 s, at or past the video's end"):
        sample_frames(info, SamplingConfig(start_s=5.0))
