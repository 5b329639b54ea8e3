"""Every chat retrieval policy on every model family: at a budget that retrieves everything it
answers exactly as `full` (the Qwen2.5-VL case of each is in the policy's own tests)."""

import pytest

from vidsight.kv.policies import MosaicConfig, MosaicPolicy
from vidsight.kv.policies import ReSVConfig, ReSVPolicy
from vidsight.kv.policies import ReKVConfig, ReKVPolicy, RecentConfig, RecentPolicy, make_policy

from tests.settings import assert_same_answer

EVERYTHING = {
    "recent": lambda: RecentPolicy(RecentConfig(window_tokens=100_000)),
    "rekv": lambda: ReKVPolicy(ReKVConfig(local_tokens=100_000, top_frames=100_000)),  # frames see the window alone
    "mosaic": lambda: MosaicPolicy(MosaicConfig(local_tokens=1, top_frames=100_000, visual_top=100_000)),
    "resv": lambda: ReSVPolicy(ReSVConfig(ratio=1.0)),
}


@pytest.mark.device_check
@pytest.mark.parametrize("family", ["qwen3_adapter", "llava_adapter", "internvl_adapter"])
@pytest.mark.parametrize("policy", sorted(EVERYTHING))
def test_a_policy_that_retrieves_everything_equals_full(ask_along, frames, request, family, policy):
    adapter = request.getfixturevalue(family)
    full, _ = ask_along(adapter, frames[:12], make_policy("full"))
    ours, _ = ask_along(adapter, frames[:12], EVERYTHING[policy]())
    for a, b in zip(full, ours, strict=True):
        assert_same_answer(b.token_ids, b.logits, a.token_ids, a.logits, atol=1e-5)
