"""ReSV: hash bits and Hamming distances as defined, WiCSum's minimal prefix, exact when it keeps everything."""

import pytest
import torch

from vidsight.engine import GenerationConfig
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.stream import SampledFrame
from vidsight.ingest.types import CodecInfo
from vidsight.kv.resv import ReSVConfig, ReSVPolicy, hamming, hash_bits, wicsum
from vidsight.kv.retrieval import make_policy

QUESTION = "What colour is the square?"


def test_packed_hash_bits_and_hamming_distances_match_a_plain_reference():
    generator = torch.Generator().manual_seed(3)
    keys, planes = torch.randn(20, 16, generator=generator), torch.randn(16, 32, generator=generator)
    bits = hash_bits(keys, planes)
    for row, packed in zip(keys, bits.tolist()):
        expected = sum(1 << i for i in range(32) if float(row @ planes[:, i]) > 0)
        assert packed == expected
    distances = hamming(bits[:7], bits[7:])
    for i in range(7):
        for j in range(13):
            assert int(distances[i, j]) == bin(int(bits[i]) ^ int(bits[7 + j])).count("1")


def test_wicsum_takes_the_minimal_prefix_that_passes_the_threshold():
    counts = torch.tensor([1.0, 2.0, 1.0, 4.0])
    # Row 0: weights 4, 6, 1, 0 (total 11): 4 < 3.3 is false, so the best alone passes 0.3 of it.
    # Row 1: the negative score adds nothing; weights 0, 2, 0, 8 (total 10): 8 >= 5 needs only cluster 3;
    # at 0.9 (9) it needs clusters 3 and 1.
    scores = torch.tensor([[4.0, 3.0, 1.0, 0.0], [-5.0, 1.0, 0.0, 2.0]])
    assert wicsum(scores, counts, 0.3).tolist() == [True, False, False, True]
    assert wicsum(scores[1:], counts, 0.9).tolist() == [False, True, False, True]
    assert wicsum(scores[1:], counts, 1.0).all()  # ratio 1 keeps everything, negatives included
    assert wicsum(torch.tensor([[-1.0, -3.0]]), torch.ones(2), 0.3).tolist() == [True, False]  # all negative: the best


@pytest.fixture(scope="module")
def frames(make_test_video):
    path, _ = make_test_video(width=176, height=144, fps=24, duration_s=8.0, gop=12, bframes=True, seed=6)
    info = probe(path)
    batch = decode_frames(path, sample_frames(info, SamplingConfig(fps=2.0)), info=info)
    return [SampledFrame(k, int(batch.indices[k]), float(batch.pts_s[k]), batch.data[k], CodecInfo("?", 0))
            for k in range(len(batch))]


def answers(adapter, frames, policy):
    out = []
    with ChatSession(adapter, policy, ChatConfig(fps=2.0)) as session:
        for start in range(0, len(frames), 6):
            session.push(frames[start : start + 6])
            out.append(session.ask(QUESTION, GenerationConfig(max_new_tokens=4)))
    return out


@pytest.mark.parametrize("settings", [{}, {"clustering": False}], ids=["clusters", "every token"])
def test_keeping_everything_equals_full(tiny_adapter, frames, settings):
    full = answers(tiny_adapter, frames, make_policy("full"))
    resv = answers(tiny_adapter, frames, ReSVPolicy(ReSVConfig(ratio=1.0, **settings)))
    for a, b in zip(full, resv, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0)


def test_at_its_default_threshold_each_head_attends_to_its_own_share(tiny_adapter, frames):
    policy = ReSVPolicy()
    out = answers(tiny_adapter, frames, policy)
    assert out[-1].stats.attended_tokens < out[-1].stats.cached_tokens
    report = policy.report()
    assert 0 < report["frame_ratio"] < 1 and 0 < report["answer_ratio"] <= 1 and report["tokens_per_cluster"] > 1
    shares = policy.ratios_by_layer_head("frame")
    assert len(shares) == tiny_adapter.num_layers * tiny_adapter.num_kv_heads and len(set(shares.values())) > 1
    top = answers(tiny_adapter, frames, make_policy("resv:selection=topk,top_clusters=2"))
    assert top[-1].stats.attended_tokens < top[-1].stats.cached_tokens


def test_bad_settings_are_refused():
    for bad in (dict(hyperplanes=63), dict(ratio=0), dict(selection="best"), dict(hamming_threshold=0)):
        with pytest.raises(ConfigError):
            ReSVConfig(**bad)
