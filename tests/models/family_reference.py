"""`ask` at full compute against transformers' own model, for any family: the generated videos and
the two checks each family's tests run with the inputs its processor would write."""

import torch

from vidsight.engine import Asker, GenerationConfig, PrefillConfig
from vidsight.ingest import SamplingConfig

from tests.settings import assert_logits_close, assert_same_greedy_ids, exact_answers, on_device

QUESTION = "What colour is the square?"
NEW_TOKENS = 12
CASES = [
    ("odd frames, B-frames, 320x240", dict(width=320, height=240, duration_s=2.5, bframes=True), 2.0),
    ("even frames, no B-frames, 320x240", dict(width=320, height=240, duration_s=2.0, bframes=False), 4.0),
    ("odd frames, no B-frames, 176x144", dict(width=176, height=144, duration_s=1.5, bframes=False), 2.0),
    ("even frames, B-frames, 176x144", dict(width=176, height=144, duration_s=3.0, bframes=True, seed=2), 4.0),
]
CASE_IDS = [c[0] for c in CASES]


def check_greedy_answer(adapter, make_test_video, name, fields, fps, reference_inputs):
    """`ask`'s greedy answer ids equal `generate`'s on ``reference_inputs(adapter, path, sampling)``
    (transformers' inputs and the frames they hold)."""
    path, _ = make_test_video(**fields)
    sampling = SamplingConfig(fps=fps)
    result = Asker(adapter).ask(path, QUESTION, sampling=sampling, prefill=PrefillConfig(group_frames=2),
                                generation=GenerationConfig(max_new_tokens=NEW_TOKENS))
    inputs, frames = reference_inputs(adapter, path, sampling)
    inputs = on_device(inputs)
    assert result.stats.frames == len(frames) and len(frames) % 2 == (0 if "even" in name else 1)
    assert result.stats.prompt_tokens == inputs["input_ids"].shape[1]
    out = adapter.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
    expected = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    assert_same_greedy_ids(result.token_ids, expected, out.logits)
    if exact_answers():
        assert len(set(result.token_ids)) > 1  # an answer that says something, not one token repeated


def check_first_token_logits(adapter, make_test_video, reference_inputs, group_sizes):
    """First-token logits within tolerance (1e-4 in float32) of transformers' forward, for prefill groups of each size."""
    path, _ = make_test_video(**CASES[0][1])
    inputs, _ = reference_inputs(adapter, path, SamplingConfig(fps=2.0))
    inputs = on_device(inputs)
    with torch.inference_mode():
        reference = adapter.model(**inputs).logits[0, -1]
    for group_frames in group_sizes:
        ours = Asker(adapter).prefill_logits(path, QUESTION, sampling=SamplingConfig(fps=2.0),
                                             prefill=PrefillConfig(group_frames=group_frames))
        assert_logits_close(ours, reference)
