import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.kv import TEXT, VIDEO, GroupPruner, PruneConfig, TokenTable


def rows(kinds):
    n = len(kinds)
    table = TokenTable.text(torch.arange(n).expand(3, -1))
    table.kind = torch.tensor(kinds, dtype=torch.int8)
    return table


def kv_with_norms(norms):
    """``(1, 2, n, 4)`` keys whose per-token norm is ``norms`` on both heads."""
    k = torch.zeros(1, 2, len(norms), 4)
    k[..., 0] = torch.tensor(norms, dtype=torch.float32)
    return k


@pytest.mark.parametrize("bad", [dict(rho=0), dict(rho=1.5), dict(scorer="random"), dict(start_layer=-1)])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ConfigError):
        PruneConfig(**bad)


def test_key_norm_small_keeps_smallest_keys_and_every_text_token():
    table = rows([TEXT, VIDEO, VIDEO, VIDEO, VIDEO, TEXT])
    k = kv_with_norms([9, 4, 1, 3, 2, 9])
    kept = GroupPruner(PruneConfig(rho=0.5)).after_attention(0, None, k, k, table)
    assert kept.tolist() == [0, 2, 4, 5]


def test_value_norm_keeps_largest_values():
    table = rows([VIDEO] * 4)
    v = kv_with_norms([1, 5, 2, 4])
    kept = GroupPruner(PruneConfig(rho=0.5, scorer="value-norm")).after_attention(0, None, v, v, table)
    assert kept.tolist() == [1, 3]


def test_attention_score_keeps_keys_the_question_looks_at():
    table = rows([VIDEO] * 4)
    k = torch.zeros(1, 1, 4, 2)
    k[0, 0, 2] = torch.tensor([1.0, 0.0])   # aligned with the question
    k[0, 0, 0] = torch.tensor([-1.0, 0.0])  # opposed
    question = [torch.tensor([[[[3.0, 0.0]]]]).expand(1, 2, 1, 2)]  # two query heads share one KV head
    kept = GroupPruner(PruneConfig(rho=0.25, scorer="attention"), question).after_attention(0, None, k, k, table)
    assert kept.tolist() == [2]


def test_rho_one_and_layers_below_start_keep_everything():
    table = rows([VIDEO] * 4)
    k = kv_with_norms([1, 2, 3, 4])
    assert GroupPruner(PruneConfig(rho=1.0)).after_attention(0, None, k, k, table) is None
    assert GroupPruner(PruneConfig(rho=0.5, start_layer=2)).after_attention(1, None, k, k, table) is None
    assert len(GroupPruner(PruneConfig(rho=0.5, start_layer=2)).after_attention(2, None, k, k, table)) == 2


def test_attention_score_needs_the_question():
    with pytest.raises(ConfigError, match="question"):
        GroupPruner(PruneConfig(rho=0.5, scorer="attention"))


def test_every_named_scorer_has_a_score():
    from vidsight.kv.config import SCORERS
    from vidsight.kv.prune import SCORES

    assert set(SCORES) == set(SCORERS)


def test_attention_received_keeps_the_keys_the_group_attends_to():
    from vidsight.kv.prune import attention_received

    torch.manual_seed(0)
    q, k = torch.randn(4, 6, 8), torch.randn(2, 6, 8)
    k[:, 3] = q[:, 3:].mean(dim=1).reshape(2, 2, 8).mean(dim=1) * 8   # what the later queries look for
    table = rows([VIDEO] * 6)
    kept = GroupPruner(PruneConfig(rho=1 / 6, scorer="attention-received")).after_attention(0, q[None], k[None],
                                                                                          k[None], table)
    assert kept.tolist() == [3]
    # Against the definition: softmax over the keys each query sees, averaged over heads and seers.
    keys = k.repeat_interleave(2, dim=0)
    logits = (q @ keys.transpose(1, 2)) / 8**0.5
    probs = logits.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    expected = probs.sum(dim=(0, 1)) / (4 * torch.arange(6, 0, -1))
    torch.testing.assert_close(attention_received(q, k, k, None, rows_per_block=4), expected)
