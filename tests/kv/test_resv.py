"""ReSV: hash bits and Hamming distances as defined, WiCSum's minimal prefix, exact when it keeps everything."""

import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.kv.resv import ReSVConfig, ReSVPolicy, hamming, hash_bits, wicsum
from vidsight.kv.retrieval import make_policy



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


@pytest.mark.parametrize("settings", [{}, {"clustering": False}], ids=["clusters", "every token"])
def test_keeping_everything_equals_full(ask_along, tiny_adapter, frames, settings):
    full = ask_along(tiny_adapter, frames, make_policy("full"))[0]
    resv = ask_along(tiny_adapter, frames, ReSVPolicy(ReSVConfig(ratio=1.0, **settings)))[0]
    for a, b in zip(full, resv, strict=True):
        assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-5, rtol=0)


def test_at_its_default_threshold_each_head_attends_to_its_own_share(ask_along, tiny_adapter, frames):
    policy = ReSVPolicy()
    out = ask_along(tiny_adapter, frames, policy)[0]
    assert out[-1].stats.attended_tokens < out[-1].stats.cached_tokens
    report = policy.report()
    assert 0 < report["frame_ratio"] < 1 and 0 < report["answer_ratio"] <= 1 and report["tokens_per_cluster"] > 1
    shares = policy.ratios_by_layer_head("frame")
    assert len(shares) == tiny_adapter.num_layers * tiny_adapter.num_kv_heads and len(set(shares.values())) > 1
    top = ask_along(tiny_adapter, frames, make_policy("resv:selection=topk,top_clusters=2"))[0]
    assert top[-1].stats.attended_tokens < top[-1].stats.cached_tokens


def test_bad_settings_are_refused():
    for bad in (dict(hyperplanes=63), dict(ratio=0), dict(selection="best"), dict(hamming_threshold=0)):
        with pytest.raises(ConfigError):
            ReSVConfig(**bad)
