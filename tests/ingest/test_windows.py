"""Sliding windows over sampled frames: where each starts, what it holds, and a short stream."""

import dataclasses

import pytest

from vidsight.errors import ConfigError
from vidsight.ingest.windows import WindowConfig, sliding_windows


@dataclasses.dataclass
class Sample:   # what the windows read of a `SampledFrame`
    index: int
    gop_start: bool = False


def starts_and_lengths(samples, config):
    return [(w[0].index, len(w)) for w in sliding_windows(iter(samples), config)]


@pytest.mark.parametrize("bad", [dict(fps=0), dict(window_s=0.5, fps=2), dict(stride_fraction=0)])
def test_window_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        WindowConfig(**bad)


def test_windows_start_every_stride_and_hold_a_window_of_consecutive_samples():
    config = WindowConfig(window_s=2.0, stride_fraction=0.5, fps=2.0)   # 4 samples every 2
    windows = list(sliding_windows(iter(Sample(k) for k in range(9)), config))
    assert [[s.index for s in w] for w in windows] == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7]]


def test_an_aligned_window_starts_at_a_gop_start_within_a_stride_of_its_due_sample():
    config = WindowConfig(window_s=4.0, stride_fraction=0.5, fps=2.0, align_keyframes=True)   # 8 samples every 4
    samples = [Sample(k, gop_start=k % 3 == 0) for k in range(20)]
    assert starts_and_lengths(samples, config) == [(0, 8), (6, 8), (9, 8), (12, 8)]


def test_a_stream_shorter_than_a_window_is_one_window_of_what_it_had():
    config = WindowConfig(window_s=4.0, fps=2.0)
    assert starts_and_lengths([Sample(k) for k in range(5)], config) == [(0, 5)]
    assert starts_and_lengths([], config) == []
