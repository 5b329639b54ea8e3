"""How answers end and what they avoid: stop strings (OpenAI's ``stop``) end an answer at the token
that completes one, its text ends before it and streamed text never shows one; the repetition
penalty is transformers' own, over the prompt and the answer so far; a sampled token is drawn from
transformers' warpers' distribution (temperature, top-k, top-p, min-p)."""

import pytest
import torch

from vidsight.engine import Asker, GenerationConfig
from vidsight.engine.generate import Answer
from vidsight.engine.text_stream import answer_text
from vidsight.engine.sampling import sampling_distribution
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig

QUESTION = "What colour is the square?"
SAMPLING = SamplingConfig(fps=2.0)


def test_the_text_ends_before_the_first_stop_string_and_a_possible_beginning_waits():
    assert answer_text(" Red. Then blue.\nQ: why", ("\nQ:", ". T")) == "Red"
    assert answer_text(" Red.\n", ("\nQ:",)) == "Red."
    assert answer_text(" Red.\n", ("\nQ:",), final=False) == "Red."   # "\n" may begin "\nQ:": held back
    assert answer_text("Red.\nQ", ("\nQ:",), final=False) == "Red."
    assert answer_text("\nRed", ("\n",)) == ""                       # stops before anything, as vLLM does
    assert answer_text(" Red ", ()) == answer_text(" Red ", (), final=False) == "Red"
    # Kept (vLLM's include_stop_str_in_output): through the first stop string, whole or streamed.
    for final in (True, False):
        assert answer_text(" Red. Then blue.\nQ: why", ("\nQ:", ". T"), final, keep_stop=True) == "Red. T"
        assert answer_text("Red.\nQ: x", ("\nQ:",), final, keep_stop=True) == "Red.\nQ:"
    assert answer_text("Red.\nQ", ("\nQ:",), final=False, keep_stop=True) == "Red."   # not a stop yet: held


def test_stop_settings_are_checked():
    assert GenerationConfig(stop="\n").stop == ("\n",) and GenerationConfig(stop=["a", "b"]).stop == ("a", "b")
    for bad in ([""], ["x"] * 17, ["x" * 257], [3]):
        with pytest.raises(ConfigError, match="stop takes at most 16 strings"):
            GenerationConfig(stop=bad)


def test_an_answer_stops_at_the_token_that_completes_a_stop_string(tiny_adapter, make_test_video):
    path, _ = make_test_video(duration_s=2.0)
    asker = Asker(tiny_adapter)
    whole = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12))
    ids, decode = whole.token_ids, tiny_adapter.decode_text
    assert whole.finish_reason == "length" and len(ids) == 12   # the random model ends on the limit
    # A stop string from the middle of the answer: the answer ends at the first token whose text completes it.
    stop = next(text for k in range(4, 10) if len(text := decode(ids[k:k + 2]).strip()) >= 2 and "\ufffd" not in text)
    completes = next(k for k in range(len(ids)) if stop in decode(ids[:k + 1]))
    pieces = []
    stopped = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12, stop=(stop,)),
                        on_text=pieces.append)
    assert stopped.token_ids == ids[:completes + 1] and stopped.finish_reason == "stop"
    assert stopped.answer == decode(ids).split(stop, 1)[0].strip() and stop not in stopped.answer
    assert "".join(pieces) == stopped.answer
    assert stopped.to_dict()["finish_reason"] == "stop"
    # vLLM's include_stop_str_in_output: the same tokens, the text through the stop string.
    pieces = []
    kept = asker.ask(path, QUESTION, sampling=SAMPLING, on_text=pieces.append,
                     generation=GenerationConfig(max_new_tokens=12, stop=(stop,), include_stop_str_in_output=True))
    before, _, _ = decode(ids).partition(stop)
    assert kept.token_ids == stopped.token_ids and kept.answer == (before + stop).strip() and "".join(pieces) == kept.answer


class _Model:
    """What `Answer.choose` reads of an adapter."""

    eos_token_ids, repetition_penalty = frozenset({99}), 1.3


def test_the_repetition_penalty_is_transformers_over_the_prompt_and_the_answer_so_far():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    generator = torch.Generator().manual_seed(0)
    prompt = torch.tensor([3, 5, 5, 8])
    answer = Answer(None, torch.zeros(20), 0, GenerationConfig(max_new_tokens=50), context=prompt)
    for _ in range(6):
        answer.logits = torch.randn(20, generator=generator) * 3
        seen = torch.tensor([[*prompt.tolist(), *answer.ids]])
        expected = RepetitionPenaltyLogitsProcessor(1.3)(seen, answer.logits[None].clone())[0]
        assert torch.equal(answer._penalised(_Model()), expected)
        assert answer.choose(_Model()) == int(expected.argmax())
    assert torch.equal(Answer(None, answer.logits, 0, GenerationConfig(repetition_penalty=1.0))._penalised(_Model()),
                       answer.logits)   # 1 leaves the logits as they are, whatever the checkpoint says
    with pytest.raises(ConfigError, match="repetition_penalty must be positive"):
        GenerationConfig(repetition_penalty=0)


def test_frequency_and_presence_penalties_are_openais_over_the_answer_after_the_repetition_penalty():
    """vLLM's order and OpenAI's definition: logit / repetition (x repetition below 0) for tokens of
    the prompt and the answer, then minus frequency x count and presence x [count > 0], counts over
    the answer alone."""
    generator = torch.Generator().manual_seed(1)
    prompt = torch.tensor([3, 5])
    config = GenerationConfig(max_new_tokens=50, frequency_penalty=0.7, presence_penalty=-0.4)
    answer = Answer(None, torch.zeros(6), 0, config, context=prompt)
    for _ in range(10):   # more tokens than the vocabulary: some come again
        answer.logits = torch.randn(6, generator=generator) * 3
        counts = torch.bincount(torch.tensor(answer.ids, dtype=torch.long), minlength=6).float()
        seen = torch.zeros(6, dtype=torch.bool)
        seen[prompt], seen[counts > 0] = True, True
        repeated = torch.where(seen, torch.where(answer.logits < 0, answer.logits * 1.3, answer.logits / 1.3), answer.logits)
        expected = repeated - 0.7 * counts - (-0.4) * (counts > 0).float()
        assert torch.allclose(answer._penalised(_Model()), expected, atol=1e-6)
        answer.choose(_Model())
    with pytest.raises(ConfigError, match="must be in \\[-2, 2\\]"):
        GenerationConfig(presence_penalty=2.5)


@pytest.mark.parametrize("settings", [dict(temperature=0.7), dict(temperature=1.0, top_k=5),
                                      dict(temperature=0.8, top_p=0.6), dict(temperature=1.3, min_p=0.2),
                                      dict(temperature=0.9, top_k=12, top_p=0.7, min_p=0.05),
                                      dict(temperature=1.0, top_k=1)])
def test_the_sampling_distribution_is_transformers_warpers(settings):
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    config = GenerationConfig(**settings)
    logits = torch.randn(64, generator=torch.Generator().manual_seed(5)) * 3
    warpers = [TemperatureLogitsWarper(config.temperature)]
    warpers += [TopKLogitsWarper(config.top_k)] if config.top_k else []
    warpers += [TopPLogitsWarper(config.top_p)] if config.top_p < 1 else []
    warpers += [MinPLogitsWarper(config.min_p)] if config.min_p else []
    scores = logits[None].clone()
    for warper in warpers:
        scores = warper(None, scores)
    ours = sampling_distribution(logits, config)
    assert torch.allclose(ours, torch.softmax(scores[0], -1), atol=1e-6)
    kept = int((ours > 0).sum())
    assert kept < 64 if len(warpers) > 1 else kept == 64   # each filter cuts something here


def test_sampling_settings_are_checked():
    for bad, said in [(dict(top_k=-1), "top_k must be"), (dict(top_k=2.5), "top_k must be"),
                      (dict(min_p=1.5), "min_p must be"), (dict(min_p=-0.1), "min_p must be"),
                      (dict(min_tokens=-1), "min_tokens must be"),
                      (dict(min_tokens=9, max_new_tokens=8), r"min_tokens must be between 0 and max_new_tokens \(8\)"),
                      (dict(logit_bias={"5": 101}), r"token 5 gets 101.0; ids are >= 0 and biases in \[-100, 100\]"),
                      (dict(logit_bias={"-1": 1}), "token -1 gets"), (dict(logit_bias={"5": float("nan")}), "gets nan"),
                      (dict(logit_bias={"five": 1}), "logit_bias maps token ids"),
                      (dict(logit_bias=[(1.5, 1)]), "logit_bias maps token ids")]:
        with pytest.raises(ConfigError, match=said):
            GenerationConfig(**bad)


def test_sampling_among_the_one_likeliest_token_is_the_greedy_answer(tiny_adapter, make_test_video):
    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    asker = Asker(tiny_adapter)
    greedy = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=10))
    for settings in (dict(top_k=1), dict(min_p=1.0)):
        sampled = asker.ask(path, QUESTION, sampling=SAMPLING,
                            generation=GenerationConfig(max_new_tokens=10, temperature=1.5, seed=3, **settings))
        assert sampled.token_ids == greedy.token_ids
    free = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=10, temperature=1.5,
                                                                                     seed=3))
    assert free.token_ids != greedy.token_ids   # the filters, not the seed, made the answers agree


def test_no_stop_string_ends_an_answer_before_min_tokens(tiny_adapter, make_test_video):
    """vLLM's rule: stop strings are looked for only from ``min_tokens`` on."""
    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    asker = Asker(tiny_adapter)
    free = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12))
    stop = free.answer[0]
    early = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12, stop=(stop,)))
    assert early.finish_reason == "stop"
    floor = len(early.token_ids) + 3
    assert len(free.token_ids) >= floor   # the unstopped answer goes on past the floor
    late = asker.ask(path, QUESTION, sampling=SAMPLING,
                     generation=GenerationConfig(max_new_tokens=12, stop=(stop,), min_tokens=floor))
    assert len(late.token_ids) >= floor and late.token_ids[:floor] == free.token_ids[:floor]


def test_an_answer_without_a_length_runs_until_the_context_window_is_full(tiny_model_dir, make_test_video,
                                                                          monkeypatch):
    """``max_new_tokens=None`` (a server's completion without ``max_tokens``, as vLLM's): the answer
    ends where prompt and answer fill the context window, with the tokens an answer of that length
    has, though its cache started with room for fewer and grew as it went (by the answer's own
    length each time, to exactly the room it needed at the end)."""
    from vidsight.engine import config as engine_config
    from vidsight.kv.cache import KVCache
    from vidsight.models import load_model

    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    adapter = load_model(tiny_model_dir, "cpu")
    assert adapter.context_window == 32768   # the checkpoint's max_position_embeddings
    fixed = Asker(adapter).ask(path, QUESTION, sampling=SAMPLING,
                               generation=GenerationConfig(max_new_tokens=9, ignore_eos=True))
    prompt = fixed.stats.prompt_tokens
    monkeypatch.setattr(engine_config, "OPEN_ANSWER_ROOM", 2)   # so the cache grows during the answer
    grown = []
    monkeypatch.setattr(KVCache, "_grow", lambda cache, capacity, _grow=KVCache._grow: (grown.append(capacity),
                                                                                        _grow(cache, capacity)))
    windowed = load_model(tiny_model_dir, "cpu", max_model_len=prompt + 9)
    open_ended = Asker(windowed).ask(path, QUESTION, sampling=SAMPLING,
                                     generation=GenerationConfig(max_new_tokens=None, ignore_eos=True))
    assert open_ended.token_ids == fixed.token_ids and open_ended.finish_reason == "length"
    # The answer outgrew the room its prefill left, and the cache grew by the answer's length (2, 4,
    # 8 tokens), not by doubling the prompt's slots; the ninth token ends the answer unfed.
    assert grown == [prompt + 4, prompt + 8]
    assert open_ended.stats.prompt_tokens == prompt
    # A limit of its own is kept, within the window or past it.
    assert len(Asker(windowed).ask(path, QUESTION, sampling=SAMPLING,
                                   generation=GenerationConfig(max_new_tokens=12, ignore_eos=True)).token_ids) == 12
    full = load_model(tiny_model_dir, "cpu", max_model_len=prompt)
    with pytest.raises(ConfigError, match=f"the prompt's {prompt} tokens fill the model's context window of {prompt}"):
        Asker(full).ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=None))


def test_the_context_window_and_an_open_length_are_checked(tiny_model_dir):
    from vidsight.models import load_model

    assert GenerationConfig(max_new_tokens=None, min_tokens=300).answer_room == 512
    assert GenerationConfig(max_new_tokens=40).answer_limit(context_window=30, prompt_tokens=50) == 40
    assert GenerationConfig(max_new_tokens=None).answer_limit(context_window=60, prompt_tokens=50) == 10
    for bad in (0, -3, 32769):
        with pytest.raises(ConfigError, match="max_new_tokens must be between 1 and 32768"):
            GenerationConfig(max_new_tokens=bad)
    for bad in (0, 32769, 2.5):
        with pytest.raises(ConfigError, match=f"--max-model-len must be between 1 and .*context window of 32768 "
                                              f"tokens .*got {bad}"):
            load_model(tiny_model_dir, "cpu", max_model_len=bad)


def test_a_stop_token_ends_the_answer_as_an_end_token_would(tiny_adapter, make_test_video):
    """vLLM's ``stop_token_ids``: the answer is the unstopped one up to and including the first
    of the tokens; before ``min_tokens`` the token cannot be chosen, as an end token cannot."""
    path, _ = make_test_video(width=176, height=144, duration_s=1.5, bframes=False)
    asker = Asker(tiny_adapter)
    free = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GenerationConfig(max_new_tokens=12))
    ids = free.token_ids
    k = next(k for k in range(1, len(ids)) if ids[k] not in ids[:k])
    stopped = asker.ask(path, QUESTION, sampling=SAMPLING,
                        generation=GenerationConfig(max_new_tokens=12, stop_token_ids=(ids[k], 5)))
    assert stopped.token_ids == ids[:k + 1] and stopped.finish_reason == "stop"
    late = asker.ask(path, QUESTION, sampling=SAMPLING,
                     generation=GenerationConfig(max_new_tokens=12, stop_token_ids=[ids[k]], min_tokens=k + 2))
    assert late.token_ids[:k] == ids[:k] and late.token_ids[k] != ids[k] and len(late.token_ids) >= k + 2
    with pytest.raises(ConfigError, match=f"stop_token_ids: .* has no token {len(tiny_adapter.tokenizer)}"):
        asker.ask(path, QUESTION, generation=GenerationConfig(stop_token_ids=(len(tiny_adapter.tokenizer),)))
    for bad in ((-1,), ("7",), tuple(range(65))):
        with pytest.raises(ConfigError, match="stop_token_ids takes at most 64 token ids"):
            GenerationConfig(stop_token_ids=bad)
