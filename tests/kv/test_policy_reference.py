"""Every policy on every family at budgets that drop tokens: each layer's attention equals attention
computed from its definition over exactly the slots the policy selected (per key head where it
selects per head) plus its summary entries, and the step's own tokens causally."""

import pytest
import torch

from vidsight.engine import forward as forward_module
from vidsight.kv.policies import make_policy

PARTIAL = {
    "recent": "recent:window_tokens=40",
    "rekv": "rekv:local_tokens=40,top_frames=1",
    "mosaic": "mosaic:local_tokens=1,top_frames=1,visual_top=1,min_split_size=4",
    "resv": "resv:ratio=0.05",
}


class Recording:
    """A policy's selections, in call order, beside the policy that makes them."""

    def __init__(self, policy):
        self.policy, self.name, self.calls = policy, policy.name, []

    def start(self, cache):
        return Recording(self.policy.start(cache))

    def report(self):
        return self.policy.report()

    def select(self, layer, cache, q, step):
        chosen = self.policy.select(layer, cache, q, step)
        self.calls.append((layer, step.kind, chosen))
        return chosen


def definition(q, past_keys, past_values, own_keys, own_values, visible, summary_keys, summary_values):
    """Softmax attention in float64 from its definition: each query head sees the summaries, the past
    slots its key head may see (``visible`` ``(kv_heads, past)``) and its chunk's tokens up to its own."""
    heads, kv_heads, length = q.shape[1], past_keys.shape[1], q.shape[2]
    group = heads // kv_heads
    keys = torch.cat([summary_keys, past_keys, own_keys], dim=2).double().repeat_interleave(group, dim=1)
    values = torch.cat([summary_values, past_values, own_values], dim=2).double().repeat_interleave(group, dim=1)
    m = summary_keys.shape[2]
    allowed = torch.cat([torch.ones((kv_heads, length, m), dtype=torch.bool),
                         visible[:, None, :].expand(-1, length, -1),
                         torch.ones((length, length), dtype=torch.bool).tril().expand(kv_heads, -1, -1)], dim=2)
    allowed = allowed.repeat_interleave(group, dim=0)[None]
    scores = q.double() @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return weights @ values


def check_against_definition(monkeypatch, session, recording):
    """Wraps `attend` so that each call made with a recorded selection is checked; returns what was seen."""
    attend, seen = forward_module.attend, {"checked": 0, "dropped": 0, "summaries": 0, "per_head": 0}

    def checked(q, keys, values, past, query_slots=None, past_mask=None):
        out = attend(q, keys, values, past, query_slots=query_slots, past_mask=past_mask)
        layer, kind, chosen = recording.calls[-1]
        cache, length = session.cache, q.shape[2]
        past_keys, past_values = cache.read(layer)
        filled = past_keys.shape[2]
        kv_heads, dim = cache.shape
        empty = torch.zeros((1, kv_heads, 0, dim))
        slots, heads, s_keys, s_values = None, None, empty, empty
        if chosen is not None:
            slots = chosen if isinstance(chosen, torch.Tensor) else chosen.slots
            if not isinstance(chosen, torch.Tensor):
                heads = chosen.heads
                if chosen.keys is not None:
                    s_keys, s_values = chosen.keys.float(), chosen.values.float()
        visible = torch.zeros((kv_heads, filled), dtype=torch.bool)
        if slots is None:
            visible[:] = True
        elif heads is None:
            visible[:, slots] = True
        else:
            visible[:, slots] = heads
        expected = definition(q, past_keys, past_values, keys[:, :, -length:], values[:, :, -length:], visible,
                              s_keys, s_values)
        torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)
        seen["checked"] += 1
        seen["dropped"] += int(kind != "frame" and not bool(visible.all()))
        seen["summaries"] += s_keys.shape[2]
        seen["per_head"] += int(heads is not None and not bool((heads == heads[:1]).all()))
        return out

    monkeypatch.setattr(forward_module, "attend", checked)
    return seen


@pytest.mark.parametrize("family", ["tiny_adapter", "qwen3_adapter", "llava_adapter", "internvl_adapter"])
@pytest.mark.parametrize("name", sorted(PARTIAL))
def test_a_partial_selection_attends_exactly_what_was_selected(request, monkeypatch, frames, family, name):
    from vidsight.engine import GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession

    adapter = request.getfixturevalue(family)
    session = ChatSession(adapter, Recording(make_policy(PARTIAL[name])), ChatConfig(fps=2.0))
    seen = check_against_definition(monkeypatch, session, session.policy)
    for start in range(0, 12, 6):
        session.push(frames[start : start + 6])
        session.ask("What colour is the square?", GenerationConfig(max_new_tokens=2))
    assert seen["checked"] == len(session.policy.calls) > 0
    assert seen["dropped"] > 0   # questions and answers attended less than everything
    if name == "mosaic":
        assert seen["summaries"] > 0   # representatives of the clusters left out were attended
    if name == "resv":
        assert seen["per_head"] > 0    # key heads saw different slots
