"""Tiered KV memory: lossless offload, budgets kept, bit-exact disk, the session directory removed."""

import os

import pytest
import torch

from vidsight.engine import GenerationConfig
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.stream import SampledFrame
from vidsight.ingest.types import CodecInfo
from vidsight.kv import TokenTable
from vidsight.kv.tiers import TierConfig, TieredKVCache

QUESTION = "What colour is the square?"


@pytest.fixture(scope="module")
def frames(make_test_video):
    path, _ = make_test_video(width=176, height=144, fps=24, duration_s=8.0, gop=12, bframes=True)
    info = probe(path)
    batch = decode_frames(path, sample_frames(info, SamplingConfig(fps=2.0)), info=info)
    return [SampledFrame(k, int(batch.indices[k]), float(batch.pts_s[k]), batch.data[k], CodecInfo("?", 0))
            for k in range(len(batch))]


def run(adapter, frames, tiers=None, check=None):
    answers = []
    with ChatSession(adapter, config=ChatConfig(fps=2.0), tiers=tiers) as session:
        for start in range(0, len(frames), 4):
            session.push(frames[start : start + 4])
            if check:
                check(session)
            answers.append(session.ask(QUESTION, GenerationConfig(max_new_tokens=4)))
            if check:
                check(session)
    return answers, session


def test_offloading_to_host_and_disk_changes_no_answer(tiny_adapter, frames, tmp_path):
    plain, session = run(tiny_adapter, frames)
    total = session.cache.length * tiny_adapter.num_layers
    budget = TierConfig(device_tokens=total // 5, host_tokens=total // 5, disk_dir=tmp_path)
    seen = []

    def check(session):
        tiers = session.cache.tokens_by_tier()
        assert tiers["device"] <= budget.device_tokens and tiers["host"] <= budget.host_tokens
        seen.append(tiers)

    tiered, session = run(tiny_adapter, frames, budget, check)
    for a, b in zip(plain, tiered, strict=True):
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
    assert seen[-1]["disk"] > 0 and session.cache.bytes_moved["up"] > 0 and session.cache.evicted_tokens == 0
    assert not os.listdir(tmp_path)  # the session's directory went with it


def test_a_block_round_trips_through_the_disk_bit_exactly(tmp_path):
    cache = TieredKVCache(1, 2, 8, torch.bfloat16, torch.device("cpu"),
                          TierConfig(device_tokens=3, host_tokens=1, disk_dir=tmp_path))
    chunks = [torch.randn(1, 2, 3, 8, dtype=torch.bfloat16) for _ in range(3)]
    for chunk in chunks:
        cache.write(0, chunk, -chunk)
        cache.keep(0, 3)
        cache.commit(TokenTable.text(torch.zeros(3, 3, dtype=torch.long)))
    assert cache.tokens_by_tier() == {"device": 3, "host": 0, "disk": 6}
    keys, values = cache.read(0)
    assert torch.equal(keys, torch.cat(chunks, dim=2)) and torch.equal(values, -keys)
    cache.close()
    assert not os.listdir(tmp_path)


def test_without_a_disk_the_oldest_blocks_are_evicted_and_counted():
    cache = TieredKVCache(1, 1, 4, torch.float32, torch.device("cpu"), TierConfig(device_tokens=2, host_tokens=2))
    for _ in range(4):
        cache.write(0, torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4))
        cache.keep(0, 2)
        cache.commit(TokenTable.text(torch.zeros(3, 2, dtype=torch.long)))
    assert cache.evicted_tokens == 4 and cache.read(0)[0].shape[2] == 4


def test_the_session_directory_goes_on_error_too(tiny_adapter, frames, tmp_path):
    with pytest.raises(ConfigError):
        with ChatSession(tiny_adapter, tiers=TierConfig(device_tokens=10, disk_dir=tmp_path)) as session:
            session.push(frames[:2])
            session.ask("   ")
    assert not os.listdir(tmp_path)


def test_an_unwritable_disk_directory_is_refused(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(ConfigError, match="cannot hold the KV disk tier"):
        TieredKVCache(1, 1, 4, torch.float32, torch.device("cpu"), TierConfig(disk_dir=blocked / "kv"))
    with pytest.raises(ConfigError):
        TierConfig(device_tokens=0)
