"""Mosaic's cluster memory: exact at a full budget, statistics as from scratch, deferred = eager splits."""

import pytest
import torch

from vidsight.engine import GenerationConfig
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.errors import ConfigError
from vidsight.kv import KVCache, TokenTable
from vidsight.kv.cache import VIDEO
from vidsight.kv.policies.clusters import ClusterTable, cosine_variance, unit
from vidsight.kv.policies.mosaic import MosaicConfig, MosaicPolicy, _flat, size_threshold
from vidsight.kv.policies import Step, make_policy

QUESTION = "What colour is the square?"
EVERYTHING = dict(local_tokens=1, top_frames=100_000, visual_top=100_000)
# One visual partition for the short test video, so its semantic clusters grow large enough to split.
ONE_PARTITION = dict(visual_tau=2.0)


@pytest.mark.parametrize("clustering, rotated", [("nested", True), ("nested", False), ("visual", True),
                                                 ("semantic", True), ("none", True), ("none", False)])
def test_a_budget_that_retrieves_every_cluster_equals_full(ask_along, tiny_adapter, frames, clustering, rotated):
    full, _ = ask_along(tiny_adapter, frames, make_policy("full"))
    config = MosaicConfig(clustering=clustering, rotated=rotated, **EVERYTHING)
    mosaic, _ = ask_along(tiny_adapter, frames, MosaicPolicy(config))
    for a, b in zip(full, mosaic, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0)


def test_prefetch_never_changes_what_is_attended(ask_along, tiny_adapter, frames):
    small = dict(local_tokens=40, top_frames=1)
    on, session = ask_along(tiny_adapter, frames, MosaicPolicy(MosaicConfig(**small)))
    off, _ = ask_along(tiny_adapter, frames, MosaicPolicy(MosaicConfig(prefetch=False, **small)))
    for a, b in zip(on, off, strict=True):
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
        assert a.stats.attended_tokens < a.stats.cached_tokens  # the budget did leave tokens out
    report = session.policy.report()
    assert report["prefetch_wanted"] > 0 and 0 <= report["prefetch_hit_rate"] <= 1


@pytest.mark.parametrize("rotated", [True, False], ids=["keys as cached", "keys before the rotary embedding"])
def test_running_statistics_equal_recomputation_from_the_members(ask_along, tiny_adapter, frames, rotated):
    config = MosaicConfig(local_tokens=40, top_frames=2, rotated=rotated, **ONE_PARTITION)
    _, session = ask_along(tiny_adapter, frames, MosaicPolicy(config))
    policy, cache = session.policy, session.cache
    assert policy.report()["splits"] > 0
    for layer, table in policy._layers.items():
        video = torch.nonzero(cache.tokens.kind[cache.rows(layer)] == VIDEO).flatten()
        assert (table.owner[video] >= 0).all()  # every video token belongs to a cluster
        for cluster in torch.nonzero(table.count > 0).flatten().tolist():
            members = table.members(cluster)
            cached, values = cache.read(layer, members)
            at = cache.tokens.position[cache.rows(layer)[members]].T
            keys, values = _flat(cached), _flat(values)
            scored = keys if rotated else _flat(tiny_adapter.rerotate_keys(cached, at, torch.zeros_like(at)))
            assert table.count[cluster] == len(members)
            torch.testing.assert_close(table.key_sum[cluster], keys.sum(dim=0), atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(table.value_sum[cluster], values.sum(dim=0), atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(table.score_sum[cluster], scored.sum(dim=0), atol=1e-3, rtol=1e-4)
            torch.testing.assert_close(table.unit_sum[cluster], unit(scored).sum(dim=0), atol=1e-4, rtol=1e-4)
            expected = cosine_variance(unit(scored).sum(0), torch.tensor(len(scored) * 1.))
            assert abs(table.variance(cluster) - float(expected)) < 1e-5


class _Elsewhere:
    """An offload capability whose tokens are never on the device."""

    def resident(self, layer, slots):
        return False

    def set_layout(self, group_of, per_head=False):
        pass

    def prefetch(self, layer, slots, heads=None):
        pass


class Offloaded(KVCache):
    """A one-tier cache that says its tokens are elsewhere, so splits must wait."""

    offload = _Elsewhere()


def unrotated(kind):
    """A one-token step at position 0, where the rotary embedding is the identity."""
    return Step(kind, positions=torch.zeros((3, 1), dtype=torch.long), unrotate=lambda x, at: x)


def scripted(cache_type, split):
    """Two patches of four tokens pointing two ways, then a question that fetches everything."""
    policy = MosaicPolicy(MosaicConfig(split=split, prefetch=False, min_split_size=1, **EVERYTHING))
    cache = cache_type(1, 1, 4, 64, torch.float32, torch.device("cpu"))
    directions = [torch.tensor([1.0, 0.1, 0.0, 0.0]), torch.tensor([0.0, 0.1, 1.0, 0.0])]
    q = torch.ones(1, 1, 1, 4)
    for patch, direction in enumerate(directions):
        policy.select(0, cache, q, unrotated("frame"))
        keys = (direction + 0.01 * torch.arange(4.0)[:, None])[None, None]
        cache.write(0, keys, keys)
        cache.keep(0, 4)
        rows = TokenTable.text(torch.zeros(3, 4, dtype=torch.long))
        rows.kind[:] = VIDEO
        rows.frame_index[:] = 2 * patch
        cache.commit(rows)
    policy.select(0, cache, q, unrotated("question"))
    table = policy._layers[0]
    return {frozenset(table.members(c).tolist()) for c in range(table.size) if table.count[c] > 0}, policy


def test_a_deferred_split_gives_the_clusters_an_eager_one_does_once_applied():
    eager, eager_policy = scripted(KVCache, "eager")
    deferred, deferred_policy = scripted(Offloaded, "deferred")
    assert eager == deferred == {frozenset(range(4)), frozenset(range(4, 8))}
    assert eager_policy.stats.deferred_splits == 0 and deferred_policy.stats.deferred_splits == 1
    assert deferred_policy.stats.splits == eager_policy.stats.splits == 1
    assert deferred_policy.stats.maintenance_transfers == 0  # split when fetched, not for its own sake
    assert eager_policy.stats.maintenance_transfers == 0     # (its tokens were on the device)


def test_the_threshold_moves_from_strict_to_loose_with_size_and_bad_settings_are_refused():
    config = MosaicConfig()
    assert size_threshold(1, config) == pytest.approx(config.tau_small)
    assert size_threshold(10_000, config) == pytest.approx(config.tau_large)
    assert size_threshold(5, config) < size_threshold(50, config)
    for bad in (dict(tau_small=0.5, tau_large=0.1), dict(clustering="kmeans"), dict(top_frames=0)):
        with pytest.raises(ConfigError):
            MosaicConfig(**bad)
    with pytest.raises(ConfigError):
        make_policy("mosaic:clustering")
    assert make_policy("mosaic:clustering=visual,summaries=false").config == MosaicConfig(clustering="visual",
                                                                                        summaries=False)
    assert ClusterTable().size == 0


def tiered_answers(adapter, frames, policy, tiers):
    out, reads = [], []
    with ChatSession(adapter, policy, ChatConfig(fps=2.0), tiers) as session:
        original, to_disk = session.cache.copies.from_disk, session.cache.copies.to_disk
        session.cache.copies.from_disk = lambda *a: reads.append(a[0]) or original(*a)
        # Writes land before the step goes on, so what is on disk when a layer predicts the next
        # does not depend on how busy the machine is.
        session.cache.copies.to_disk = lambda *a: (lambda t: t.wait() or t)(to_disk(*a))
        for start in range(0, len(frames), 6):
            session.push(frames[start : start + 6])
            out.append(session.ask(QUESTION, GenerationConfig(max_new_tokens=4)))
        cache = session.cache
        below = [(layer, b) for layer, blocks in enumerate(cache.table.layers) for b in blocks if b.tier != "device"]
        spans = [len(torch.unique(cache.tokens.frame_index[cache.rows(layer)[b.slots]])) for layer, b in below]
        return out, reads, below, spans, session.policy


def test_offloaded_mosaic_answers_as_on_the_device_with_cluster_blocks_and_prefetch(ask_along, tiny_adapter, frames, tmp_path):
    from vidsight.kv.tiers import TierConfig

    settings = dict(local_tokens=40, top_frames=2, **ONE_PARTITION)
    tiers = TierConfig(device_tokens=100, host_tokens=60, disk_dir=tmp_path)
    # Eager splits decide alike wherever the tokens are, so offloading must change nothing.
    plain, _ = ask_along(tiny_adapter, frames, MosaicPolicy(MosaicConfig(split="eager", **settings)))
    tiered, reads, below, spans, eager = tiered_answers(tiny_adapter, frames,
                                                        MosaicPolicy(MosaicConfig(split="eager", **settings)), tiers)
    for a, b in zip(plain, tiered, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0)
    assert below and all(b.grouped for _, b in below)  # below the device, blocks hold clusters
    assert max(spans) > 1  # a cluster gathered from several temporal patches moves as one block
    assert reads  # disk blocks were read ahead of the layer that needed them
    # Splitting offloaded clusters at once costs transfers for maintenance alone; deferring them does not.
    deferred = tiered_answers(tiny_adapter, frames, MosaicPolicy(MosaicConfig(**settings)), tiers)[-1]
    assert eager.report()["maintenance_transfers"] > 0 == deferred.report()["maintenance_transfers"]
    assert deferred.report()["deferred_splits"] > 0
    assert not list(tmp_path.iterdir())


def test_splits_stop_at_the_cluster_cap_and_spare_small_clusters(ask_along, tiny_adapter, frames):
    policy = ask_along(tiny_adapter, frames, MosaicPolicy(MosaicConfig(local_tokens=40, top_frames=2, min_split_size=2,
                                                                      max_clusters=3)))[1].policy
    for table in policy._layers.values():
        for partition in torch.unique(table.visual).tolist():
            assert len(table.candidates(partition)) <= 3
    never = ask_along(tiny_adapter, frames, MosaicPolicy(MosaicConfig(local_tokens=40, top_frames=2,
                                                                     min_split_size=10_000)))[1].policy
    assert never.report()["splits"] == 0 < policy.report()["splits"]
