"""The model's CPU threads follow the background decoders."""

import types

import torch

from vidsight.engine.cores import CoreSplit
from vidsight.ingest import SamplingConfig, probe, sample_frames
from vidsight.ingest.feed import FrameFeed


def test_model_threads_shrink_while_decoding_and_come_back():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    feed = types.SimpleNamespace(decoding=True)
    try:
        with CoreSplit(feed, 1) as split:
            assert torch.get_num_threads() == 1
            feed.decoding = False
            split.update()
            assert torch.get_num_threads() == 2
            feed.decoding = True
            split.update()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_feed_reports_when_decoding_is_over(make_test_video):
    path, _ = make_test_video(width=320, height=240, duration_s=4.0, fps=10, gop=8)
    info = probe(path)
    with FrameFeed.background(path, sample_frames(info, SamplingConfig(fps=5.0)), info, workers=1) as feed:
        feed.frames(0, len(feed))
        assert not feed.decoding
