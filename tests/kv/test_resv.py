"""ReSV: hash bits and Hamming distances as defined, WiCSum's minimal prefix, exact when it keeps everything."""

import math

import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.kv.policies import resv
from vidsight.kv.policies.resv import ReSVConfig, ReSVPolicy
from vidsight.kv.policies.resv_tables import HashClusters, hamming, hash_bits, row_scores, wicsum
from vidsight.kv.policies import make_policy



def test_packed_hash_bits_and_hamming_distances_match_a_plain_reference():
    generator = torch.Generator().manual_seed(3)
    keys, planes = torch.randn(20, 16, generator=generator), torch.randn(16, 32, generator=generator)
    bits = hash_bits(keys, planes)
    for row, packed in zip(keys, bits.tolist()):
        expected = sum(1 << i for i in range(32) if float(row @ planes[:, i]) > 0)
        assert packed == expected
    wide = torch.randint(0, 2**62, (20,), generator=generator)
    for packed, width in ((bits, 32), (bits, 62), (wide, 62)):
        distances = hamming(packed[:7], packed[7:], width)
        for i in range(7):
            for j in range(13):
                assert int(distances[i, j]) == bin(int(packed[i]) ^ int(packed[7 + j])).count("1")


@pytest.mark.parametrize("threshold", [4, 1], ids=["nearest", "identical bits"])
def test_tokens_join_the_nearest_cluster_under_the_threshold_in_token_order(threshold):
    generator = torch.Generator().manual_seed(4)
    policy = ReSVPolicy(ReSVConfig(hyperplanes=16, hamming_threshold=threshold))
    policy._planes = torch.randn(8, 16, generator=generator)
    centres = torch.randn(6, 8, generator=generator)
    table = HashClusters(8)
    owners = []
    for step in range(3):   # three steps of 40 tokens near six centres
        keys = centres[torch.randint(0, 6, (40,), generator=generator)] + 0.3 * torch.randn(40, 8, generator=generator)
        before = table.bits.tolist()
        table.cover(40 * (step + 1))
        policy._cluster(table, torch.arange(40 * step, 40 * (step + 1)), keys)
        # Plain reference: the nearest earlier cluster (first on ties), else the nearest begun in this step.
        leaders, expected = [], []
        for k in hash_bits(keys, policy._planes).tolist():
            for candidates, base in ((before, 0), ([b for _, b in leaders], len(before))):
                distances = [bin(k ^ b).count("1") for b in candidates]
                if distances and min(distances) < threshold:
                    expected.append(base + distances.index(min(distances)))
                    break
            else:
                expected.append(len(before) + len(leaders))
                leaders.append((k, k))
        owners += expected
    assert table.owner.tolist() == owners and len(table.count) > 6 and int(table.count.sum()) == 120
    for cluster in range(len(table.count)):
        members = [i for i, o in enumerate(owners) if o == cluster]
        assert int(table.count[cluster]) == len(members)


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
    assert wicsum(torch.tensor([[-1.0, -3.0]]), torch.ones(2), 0.3, attention=True).tolist() == [True, False]


@pytest.mark.parametrize("attention", [False, True], ids=["scores", "attention"])
def test_wicsum_with_early_exit_equals_a_full_sort_per_row(attention):
    generator = torch.Generator().manual_seed(5)
    scores = torch.randn(40, 700, generator=generator) * 3   # negatives included; more clusters than one rank
    counts = torch.randint(1, 50, (700,), generator=generator).float()
    for ratio in (0.05, 0.3, 0.9):
        expected = torch.zeros(700, dtype=torch.bool)
        for row in scores:
            weights = ((row - row.max()).exp() if attention else row.clamp(min=0)) * counts
            total, reached = float(weights.sum()), 0.0
            for j in torch.argsort(row, descending=True).tolist():
                expected[j] = True
                reached += float(weights[j])
                if reached >= ratio * total:
                    break
        assert torch.equal(wicsum(scores, counts, ratio, attention), expected)


def test_attention_weights_keep_a_share_of_the_softmax_mass():
    # Scores 2, 1, 0 with counts 1, 1, 10. As scores (clamped): weights 2, 1, 0; half of 3 is passed by the
    # first. As attention: exp(s - 2) * count = 1, 0.37, 1.35 (total 2.72); half (1.36) needs the first two,
    # since the ten low-scoring tokens hold half the mass.
    scores, counts = torch.tensor([[2.0, 1.0, 0.0]]), torch.tensor([1.0, 1.0, 10.0])
    assert wicsum(scores, counts, 0.5).tolist() == [True, False, False]
    assert wicsum(scores, counts, 0.5, attention=True).tolist() == [True, True, False]
    assert wicsum(scores, counts, 0.6, attention=True).tolist() == [True, True, True]


@pytest.mark.parametrize("settings", [{}, {"clustering": False}], ids=["clusters", "every token"])
def test_keeping_everything_equals_full(ask_along, tiny_adapter, frames, settings):
    full = ask_along(tiny_adapter, frames, make_policy("full"))[0]
    resv = ask_along(tiny_adapter, frames, ReSVPolicy(ReSVConfig(ratio=1.0, **settings)))[0]
    for a, b in zip(full, resv, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0)


def test_at_its_default_threshold_each_head_attends_to_its_own_share(ask_along, tiny_adapter, frames):
    out, session = ask_along(tiny_adapter, frames, ReSVPolicy())
    policy = session.policy
    assert out[-1].stats.attended_tokens < out[-1].stats.cached_tokens
    report = policy.report()
    assert 0 < report["frame_ratio"] < 1 and 0 < report["answer_ratio"] <= 1 and report["tokens_per_cluster"] > 1
    shares = policy.ratios_by_layer_head("frame")
    assert len(shares) == tiny_adapter.num_layers * tiny_adapter.num_kv_heads and len(set(shares.values())) > 1
    table = report["frame_ratio_by_layer_head"]
    assert [[shares[(layer, head)] for head in range(tiny_adapter.num_kv_heads)]
            for layer in range(tiny_adapter.num_layers)] == table
    assert report["frame_ratio_min"] == min(shares.values()) and report["frame_ratio_max"] == max(shares.values())
    top = ask_along(tiny_adapter, frames, make_policy("resv:selection=topk,top_clusters=2"))[0]
    assert top[-1].stats.attended_tokens < top[-1].stats.cached_tokens


def test_mean_rows_score_each_query_head_by_its_queries_mean(ask_along, tiny_adapter, frames, monkeypatch):
    seen = {"tokens": [], "mean": []}
    choose = ReSVPolicy._choose

    def spy(self, scores, counts):
        seen[self.config.rows].append(scores)
        return choose(self, scores, counts)

    monkeypatch.setattr(ReSVPolicy, "_choose", spy)
    policy = make_policy("resv:rows=mean,ratio=1")   # keeps everything: both sessions compute alike
    ask_along(tiny_adapter, frames[:6], make_policy("resv:ratio=1"))
    ask_along(tiny_adapter, frames[:6], policy)
    group = tiny_adapter.num_heads // tiny_adapter.num_kv_heads
    assert len(seen["mean"]) == len(seen["tokens"]) and all(len(s) == group for s in seen["mean"])
    assert any(len(s) > group for s in seen["tokens"]) and any(s.shape[1] for s in seen["tokens"])
    for rows, mean in zip(seen["tokens"], seen["mean"]):   # scores are linear in the query
        if rows.shape[1]:   # (no clusters yet: the first frames' steps)
            assert torch.allclose(rows.reshape(group, -1, rows.shape[1]).mean(dim=1), mean, atol=1e-4)


def test_max_rows_score_each_cluster_by_the_steps_best_token_per_query_head():
    generator = torch.Generator().manual_seed(6)
    queries, keys = torch.randn(3, 5, 8, generator=generator), torch.randn(11, 8, generator=generator)
    scores = row_scores(queries, keys, "max")
    assert scores.shape == (3, 11)
    for head in range(3):
        for cluster in range(11):
            best = max(float(queries[head, token] @ keys[cluster]) for token in range(5))
            assert abs(float(scores[head, cluster]) - best) < 1e-5
    assert torch.allclose(row_scores(queries, keys, "mean"), queries.mean(dim=1) @ keys.T)
    assert row_scores(queries, keys, "tokens").shape == (15, 11)


def test_mean_frame_rows_pool_frame_steps_only(ask_along, tiny_adapter, frames, monkeypatch):
    seen, kind = [], []
    select, row_scores = ReSVPolicy.select, resv.row_scores

    def spy_select(self, layer, cache, q, step):
        kind.append(step.kind)
        return select(self, layer, cache, q, step)

    def spy_scores(queries, keys, rows):
        seen.append((kind[-1], rows))
        return row_scores(queries, keys, rows)

    monkeypatch.setattr(ReSVPolicy, "select", spy_select)
    monkeypatch.setattr(resv, "row_scores", spy_scores)
    ask_along(tiny_adapter, frames[:6], make_policy("resv:mean_frame_rows=1"))
    assert {rows for step, rows in seen if step == "frame"} == {"mean"}
    assert {rows for step, rows in seen if step != "frame"} == {"tokens"} and len({step for step, _ in seen}) == 3


@pytest.mark.device_check
@pytest.mark.slow   # offloading is in the fast subset through Mosaic and tests/kv/test_tiers.py
def test_prefetch_moves_offloaded_blocks_early_and_never_changes_what_is_attended(ask_along, tiny_adapter,
                                                                                 frames, tmp_path):
    from vidsight.kv.tiers import TierConfig

    tiers = TierConfig(device_tokens=100, host_tokens=60, disk_dir=tmp_path)
    settings = "resv:hamming_threshold=2,ratio=0.05"
    on, session = ask_along(tiny_adapter, frames, make_policy(settings), tiers)
    off, _ = ask_along(tiny_adapter, frames, make_policy(settings + ",prefetch=0"), tiers)
    for a, b in zip(on, off, strict=True):
        assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)
        assert a.stats.attended_tokens < a.stats.cached_tokens
    assert 0 < session.policy.report()["prefetch_hit_rate"] <= 1
    _, single = ask_along(tiny_adapter, frames[:12], make_policy(settings))   # all on the device: nothing predicted
    assert math.isnan(single.policy.report()["prefetch_hit_rate"])


@pytest.mark.slow
def test_offloaded_kv_laid_out_by_cluster_per_head_changes_no_answer(ask_along, tiny_adapter, frames, tmp_path):
    from vidsight.kv.tiers import TierConfig

    settings = "resv:hamming_threshold=2,ratio=0.05"
    plain, _ = ask_along(tiny_adapter, frames, make_policy(settings))
    tiered, session = ask_along(tiny_adapter, frames, make_policy(settings),
                                TierConfig(device_tokens=100, host_tokens=60, disk_dir=tmp_path))
    for a, b in zip(plain, tiered, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0)
    cache = session.cache
    below = [b for layer in cache.table.layers for b in layer if b.tier != "device"]
    assert below and all(b.head is not None for b in below)   # one cluster of one head per block
    tables = session.policy._tables
    for block in below:
        if block.group >= 0:
            assert (tables[block.layer][block.head].owner[block.slots] == block.group).all()
    assert cache.traffic().whole_read_bytes["disk"] > 0


def test_bad_settings_are_refused():
    for bad in (dict(hyperplanes=63), dict(ratio=0), dict(selection="best"), dict(hamming_threshold=0), dict(weights="logits"),
                dict(rows="all")):
        with pytest.raises(ConfigError):
            ReSVConfig(**bad)
