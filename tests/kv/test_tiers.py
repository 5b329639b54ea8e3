"""Tiered KV memory: lossless offload, budgets kept, bit-exact disk, the session directory removed."""

import errno
import os
import threading
import time

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

from tests.settings import DEVICE

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


@pytest.mark.device_check
def test_offloading_to_host_and_disk_changes_no_answer(tiny_adapter, frames, tmp_path):
    plain, session = run(tiny_adapter, frames)
    total = session.cache.length * tiny_adapter.num_layers
    budget = TierConfig(device_tokens=total // 5, host_tokens=total // 5, disk_dir=tmp_path)
    seen = []

    def check(session):
        tiers = session.cache.tokens_by_tier()
        assert tiers["device"] <= budget.device_tokens and tiers["host"] <= budget.host_tokens
        assert tiers == _recount(session.cache)
        seen.append(tiers)

    tiered, session = run(tiny_adapter, frames, budget, check)
    for a, b in zip(plain, tiered, strict=True):
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
    assert seen[-1]["disk"] > 0 and session.cache.traffic().bytes_moved["up"] > 0 and session.cache.traffic().evicted_tokens == 0
    assert not os.listdir(tmp_path)  # the session's directory went with it


class _CopyInFlight:
    """A device-to-host copy that lands only when waited for, as on CUDA's side stream: until then
    the host buffer holds NaNs, so a reader that does not wait reads them."""

    def __init__(self, host: torch.Tensor):
        self.host, self.landed, self.done = host, host.clone(), False
        host.fill_(float("nan"))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        if not self.done:
            self.host.copy_(self.landed)
            self.done = True


def _keep_host_copies_in_flight(monkeypatch) -> None:
    from vidsight.kv.tiers import copies

    to_host = copies.CopyEngine.to_host

    def in_flight(self, data):
        host, _ = to_host(self, data)
        return host, copies.Transfer(event=_CopyInFlight(host), keep_alive=data)

    monkeypatch.setattr(copies.CopyEngine, "to_host", in_flight)


def test_host_copies_still_in_flight_change_no_answer(tiny_adapter, frames, tmp_path, monkeypatch):
    """On CUDA a block's copy down to host memory is still running when a step may want it back
    (seen on an H200: such blocks were taken for disk writes); here the CPU's copies are made to
    stay in flight the same way."""
    _keep_host_copies_in_flight(monkeypatch)
    plain, session = run(tiny_adapter, frames)
    total = session.cache.length * tiny_adapter.num_layers
    tiered, _ = run(tiny_adapter, frames, TierConfig(device_tokens=total // 5, host_tokens=total // 5, disk_dir=tmp_path))
    for a, b in zip(plain, tiered, strict=True):
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
    assert not os.listdir(tmp_path)


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
    assert cache.traffic().evicted_tokens == 4 and cache.read(0)[0].shape[2] == 4


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


def _write_chunks(cache, chunks):
    for chunk in chunks:
        cache.write(0, chunk, -chunk)
        cache.keep(0, chunk.shape[2])
        cache.commit(TokenTable.text(torch.zeros(3, chunk.shape[2], dtype=torch.long)))


def test_a_block_is_readable_while_its_disk_write_is_in_flight(tmp_path, monkeypatch):
    from vidsight.kv.tiers.copies import CopyEngine

    release, write = threading.Event(), CopyEngine._write

    def slow_write(self, path, data):
        release.wait(10)
        write(self, path, data)

    monkeypatch.setattr(CopyEngine, "_write", slow_write)
    cache = TieredKVCache(1, 2, 8, torch.float32, torch.device("cpu"),
                          TierConfig(device_tokens=3, host_tokens=1, disk_dir=tmp_path))
    chunks = [torch.randn(1, 2, 3, 8) for _ in range(3)]
    started = time.monotonic()
    _write_chunks(cache, chunks)   # each chunk attends to the blocks whose writes hang
    assert cache.tokens_by_tier()["disk"] == 6 and not list(cache.disk.directory.iterdir())  # written later
    keys, _ = cache.read(0)  # waits for nothing it does not need: the host copies serve
    assert torch.equal(keys, torch.cat(chunks, dim=2))
    assert time.monotonic() - started < 5 and not release.is_set()   # no write was waited for
    release.set()
    cache.close()
    assert not os.listdir(tmp_path)   # the files of blocks that went up before their writes ended are gone


def test_a_full_disk_evicts_the_oldest_blocks_counted_with_one_warning(tmp_path, monkeypatch, caplog):
    from vidsight.kv.tiers.copies import CopyEngine

    def full(self, path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(CopyEngine, "_write", full)
    cache = TieredKVCache(1, 1, 4, torch.float32, torch.device("cpu"),
                          TierConfig(device_tokens=2, host_tokens=2, disk_dir=tmp_path))
    _write_chunks(cache, [torch.full((1, 1, 2, 4), float(k)) for k in range(5)])
    cache._reap(wait=True)
    assert cache.traffic().evicted_tokens == 6 and cache.tokens_by_tier() == {"device": 2, "host": 2, "disk": 0}
    assert cache.read(0)[0][0, 0, :, 0].tolist() == [3, 3, 4, 4]  # the newest stay
    assert len([r for r in caplog.records if "disk tier is full" in r.message]) == 1
    cache.close()


@pytest.mark.device_check
def test_a_tiered_session_forks_with_its_own_directory(tiny_adapter, frames, tmp_path):
    budget = TierConfig(device_tokens=200, host_tokens=200, disk_dir=tmp_path)
    with ChatSession(tiny_adapter, config=ChatConfig(fps=2.0), tiers=budget) as session:
        session.push(frames[:12])
        fork = session.fork()
        assert fork.cache.disk.directory != session.cache.disk.directory and fork.cache.tokens_by_tier()["disk"] > 0
        a, b = (s.ask(QUESTION, GenerationConfig(max_new_tokens=4)) for s in (session, fork))
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
        fork.close()
        assert os.listdir(tmp_path) == [session.cache.disk.directory.name]
        assert session.cache.traffic().device_peak_tokens >= 200 and session.cache.tokens_by_tier()["device"] <= 200
    assert not os.listdir(tmp_path)


def _recount(cache: TieredKVCache) -> dict[str, int]:
    """Tokens per tier from the blocks, a block of one key head counting for that head's share."""
    units = {"device": 0, "host": 0, "disk": 0}
    for block in (b for layer in cache.table.layers for b in layer):
        units[block.tier] += block.length * (cache.shape[0] if block.head is None else 1)
    return {tier: count // cache.shape[0] for tier, count in units.items()}


@pytest.mark.device_check
@pytest.mark.parametrize("in_flight", [False, True], ids=["copies done", "copies in flight"])
@pytest.mark.parametrize("per_head", [False, True], ids=["layout", "per-head layout"])
def test_reads_of_chosen_slots_match_what_was_written_through_moves_regroups_and_truncation(tmp_path, per_head,
                                                                                          in_flight, monkeypatch):
    """The slot index and the running tier counts agree with the blocks, whatever moved where; with a
    per-head layout each head's wanted slots are read exactly (the others are masked out anyway).
    Copies down to host memory may still be running when the next step comes, as on CUDA."""
    if in_flight:
        _keep_host_copies_in_flight(monkeypatch)
    torch.manual_seed(0)
    layers, heads, dim = 2, 2, 4
    cache = TieredKVCache(layers, heads, dim, torch.float32, DEVICE,
                          TierConfig(device_tokens=24, host_tokens=40, disk_dir=tmp_path))
    if per_head:   # host blocks regrouped by a stand-in clustering, one per head
        cache.set_layout(lambda layer, slots: torch.stack([slots % 3, slots % 2 + 5]), per_head=True)
    else:
        cache.set_layout(lambda layer, slots: slots % 3)
    written = [torch.empty(2, heads, 0, dim, device=DEVICE) for _ in range(layers)]
    for step in range(30):
        length = 1 + step % 4
        for layer in range(layers):
            k, v = torch.randn(2, 1, heads, length, dim).to(DEVICE)
            chosen = torch.randperm(cache.filled[layer])[: cache.filled[layer] // 2].sort().values
            wants = torch.rand(heads, len(chosen)) < (0.6 if per_head else 1.0)
            wants[0] |= ~wants.any(dim=0)   # each slot wanted by some head (as a selection's union is)
            past_k, past_v = cache.write(layer, k, v, chosen, wants if per_head else None)
            assert past_k.shape[2] == len(chosen) + length
            for head in range(heads):
                mine = wants[head]
                assert torch.equal(past_k[0, head, :-length][mine], written[layer][0][head, chosen[mine]])
                assert torch.equal(past_v[0, head, :-length][mine], written[layer][1][head, chosen[mine]])
            written[layer] = torch.cat([written[layer], torch.stack([k[0], v[0]])], dim=2)
            cache.keep(layer, length)
        cache.commit(TokenTable.text(torch.zeros(3, length, dtype=torch.long)))
        assert cache.tokens_by_tier() == _recount(cache)
        assert cache.tokens_by_tier()["device"] <= 24 and cache.tokens_by_tier()["host"] <= 40
        if step == 20:
            cache.truncate(len(cache.tokens) - length)
            written = [w[:, :, : cache.filled[layer]] for layer, w in enumerate(written)]
            assert cache.tokens_by_tier() == _recount(cache)
    # A host block whose copy is still landing joins the layout at the next step.
    below = [b for layer in cache.table.layers for b in layer
             if b.tier == "disk" or (b.tier == "host" and b.transfer is None)]
    assert _recount(cache)["disk"] > 0 and cache.traffic().evicted_tokens == 0
    assert all((b.head is not None) == per_head for b in below)
    for layer in range(layers):
        keys, values = cache.read(layer)
        assert torch.equal(keys[0], written[layer][0]) and torch.equal(values[0], written[layer][1])
    cache.close()


def test_a_split_group_is_laid_out_again_so_reading_one_half_moves_only_that_half():
    """After the layout gives some of a group's slots to a new group (a cluster split), the host
    block is divided, so fetching one of the two moves its own slots and nothing else."""
    heads, dim = 2, 4
    cache = TieredKVCache(1, heads, dim, torch.float32, torch.device("cpu"), TierConfig(device_tokens=4))
    layout = {"groups": 2}
    cache.set_layout(lambda layer, slots: slots % layout["groups"])
    for _ in range(12):
        k, v = torch.randn(2, 1, heads, 1, dim)
        cache.write(0, k, v, torch.empty(0, dtype=torch.long))
        cache.keep(0, 1)
        cache.commit(TokenTable.text(torch.zeros(3, 1, dtype=torch.long)))
    layout["groups"] = 4   # groups 0 and 1 split: slots 2, 6 and 3, 7 leave them
    cache.commit(TokenTable.text(torch.zeros(3, 0, dtype=torch.long)))
    host = [b for b in cache.table.layers[0] if b.tier == "host"]
    assert all(torch.equal(b.slots % 4, torch.full_like(b.slots, b.group)) for b in host)
    wanted = torch.tensor([2, 6])
    before = sum(cache.traffic().bytes_moved.values())
    cache.read(0, wanted)
    assert sum(cache.traffic().bytes_moved.values()) - before == 2 * heads * len(wanted) * dim * 4


def test_in_a_per_head_layout_one_heads_cluster_is_one_whole_block_read():
    heads, dim = 2, 4
    cache = TieredKVCache(1, heads, dim, torch.float32, torch.device("cpu"), TierConfig(device_tokens=4))
    cache.set_layout(lambda layer, slots: torch.stack([slots % 2, slots % 3]), per_head=True)
    for _ in range(12):
        k, v = torch.randn(2, 1, heads, 1, dim)
        cache.write(0, k, v, torch.empty(0, dtype=torch.long))
        cache.keep(0, 1)
        cache.commit(TokenTable.text(torch.zeros(3, 1, dtype=torch.long)))
    cluster = torch.tensor([0, 3, 6])   # head 1's group 0 among the host slots (0-7)
    wants = torch.tensor([[False] * 3, [True] * 3])
    before, whole = sum(cache.traffic().bytes_moved.values()), cache.traffic().whole_read_bytes["host"]
    cache.read(0, cluster, wants)
    moved = sum(cache.traffic().bytes_moved.values()) - before
    assert moved == 2 * len(cluster) * dim * 4 == cache.traffic().whole_read_bytes["host"] - whole


def test_a_per_head_layout_needs_somewhere_to_keep_every_head(tmp_path):
    cache = TieredKVCache(1, 2, 4, torch.float32, torch.device("cpu"), TierConfig(device_tokens=4, host_tokens=8))
    with pytest.raises(ConfigError, match="disk tier"):
        cache.set_layout(lambda layer, slots: torch.stack([slots, slots]), per_head=True)


@pytest.mark.device_check
def test_both_caches_clone_onto_the_cpu_and_back_unchanged(tmp_path):
    """A copy in host memory (the prefix cache's lower tier) and one brought back up read what the
    original reads, every tier of a tiered cache included, and each stays on its own device."""
    from vidsight.kv import KVCache

    torch.manual_seed(0)
    plain = KVCache(2, 2, 4, 4, torch.float32, DEVICE)
    tiered = TieredKVCache(2, 2, 4, torch.float32, DEVICE, TierConfig(device_tokens=6, host_tokens=6,
                                                                      disk_dir=tmp_path))
    for cache in (plain, tiered):
        for _ in range(3):
            cache.reserve(3)
            for layer in range(2):
                k, v = torch.randn(2, 1, 2, 3, 4).to(DEVICE)
                cache.write(layer, k, v)
                cache.keep(layer, 3)
            cache.commit(TokenTable.text(torch.zeros(3, 3, dtype=torch.long)))
        host = cache.clone(device="cpu")
        back = host.clone(device=DEVICE)
        for layer in range(2):
            want_k, want_v = cache.read(layer)
            for copy, device in ((host, "cpu"), (back, DEVICE.type)):
                keys, values = copy.read(layer)
                assert keys.device.type == device
                assert torch.equal(keys.cpu(), want_k.cpu()) and torch.equal(values.cpu(), want_v.cpu())
        assert host.tokens_by_tier() == cache.tokens_by_tier() and host.length == cache.length == 9
        for copy in (host, back, cache):
            copy.close()
    assert not os.listdir(tmp_path)
