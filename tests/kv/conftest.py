"""A sampled stream and a way to ask about it every few frames, shared by the retrieval policies' tests."""

import pytest

from vidsight.engine import GenerationConfig
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.stream import SampledFrame
from vidsight.ingest.types import CodecInfo

QUESTION = "What colour is the square?"


@pytest.fixture(scope="module")
def frames(make_test_video):
    """An 8-second 176x144 stream sampled at 2 fps."""
    path, _ = make_test_video(width=176, height=144, fps=24, duration_s=8.0, gop=12, bframes=True, seed=4)
    info = probe(path)
    batch = decode_frames(path, sample_frames(info, SamplingConfig(fps=2.0)), info=info)
    return [SampledFrame(k, int(batch.indices[k]), float(batch.pts_s[k]), batch.data[k], CodecInfo("?", 0))
            for k in range(len(batch))]


@pytest.fixture
def ask_along():
    """``ask_along(adapter, frames, policy, tiers=None) -> (answers, session)``: a question every 6 frames."""

    def run(adapter, frames, policy, tiers=None):
        out = []
        with ChatSession(adapter, policy, ChatConfig(fps=2.0), tiers) as session:
            for start in range(0, len(frames), 6):
                session.push(frames[start : start + 6])
                out.append(session.ask(QUESTION, GenerationConfig(max_new_tokens=4)))
        return out, session

    return run
