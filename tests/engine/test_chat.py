"""Chat sessions: `full` answers exactly as `ask` on the same frames; the baselines reduce to it."""

import pytest
import torch

from vidsight.engine import GenerationConfig, PrefillConfig
from vidsight.engine.chat import MAX_BATCH_PATCHES, ChatConfig, ChatSession
from vidsight.engine.prefill import prefill_video
from vidsight.engine.request import Request
from vidsight.engine.stats import AskStats, StageClock
from vidsight.engine.forward import unrotation
from vidsight.engine.generate import generate
from vidsight.engine.score import score_continuations
from vidsight.errors import ConfigError
from vidsight.ingest import FrameBatch, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.feed import FrameFeed
from vidsight.ingest.stream import SampledFrame
from vidsight.ingest.types import CodecInfo
from vidsight.kv import VIDEO
from vidsight.kv.policies import ReKVConfig, ReKVPolicy, RecentConfig, RecentPolicy, Step

from vidsight.models.conversation import Conversation

from tests.settings import DEVICE, DTYPE, assert_input_matters, assert_logits_close, assert_same_answer, logits_error
from tests.variants import fast_first

QUESTIONS = ["What colour is the square?", "Where is the square now?", "How many squares?"]
NEW_TOKENS = 6
FPS = 2.0

# (spec fields): at 2 fps every video's sampled rate equals its duration rate, as in a stream.
VIDEOS = [
    dict(width=320, height=240, fps=24, duration_s=6.0, gop=12, bframes=True),
    dict(width=320, height=240, fps=24, duration_s=6.0, gop=16, bframes=False, seed=3),
    dict(width=176, height=144, fps=24, duration_s=4.0, gop=10, bframes=True, seed=5),
]


def sampled(make_test_video, fields) -> FrameBatch:
    path, _ = make_test_video(**fields)
    info = probe(path)
    return decode_frames(path, sample_frames(info, SamplingConfig(fps=FPS)), info=info)


def as_frames(batch: FrameBatch, start: int, stop: int) -> list[SampledFrame]:
    return [SampledFrame(k, int(batch.indices[k]), float(batch.pts_s[k]), batch.data[k], CodecInfo("?", 0))
            for k in range(start, stop)]


def reference(adapter, batch: FrameBatch, count: int, question: str):
    """`ask` at full compute on the first ``count`` frames: first-token logits and greedy answer."""
    frames = FrameBatch(batch.data[:count], batch.pts_s[:count], batch.indices[:count])
    clock = StageClock(AskStats(), adapter.device)
    state = prefill_video(adapter, FrameFeed.decoded(frames), question, FPS, PrefillConfig(), NEW_TOKENS, Request(clock))
    ids = generate(adapter, state.cache, state.logits, state.next_position, GenerationConfig(max_new_tokens=NEW_TOKENS))
    return state.logits, ids


@pytest.mark.device_check
@pytest.mark.parametrize("fields", fast_first(VIDEOS, ids=["b-frames", "no-b-frames", "176x144"]))
def test_full_answers_as_ask_on_the_frames_seen_at_every_question(family_adapter, make_test_video, fields):
    batch = sampled(make_test_video, fields)
    session = ChatSession(family_adapter, config=ChatConfig(fps=FPS))
    cuts = [4, 8, len(batch)]
    seen, earlier = 0, None
    for cut, question in zip(cuts, QUESTIONS):
        session.push(as_frames(batch, seen, cut))
        seen = cut
        answer = session.ask(question, GenerationConfig(max_new_tokens=NEW_TOKENS))
        logits, ids = reference(family_adapter, batch, cut, question)
        assert_same_answer(answer.token_ids, answer.logits, ids, logits)
        assert answer.stats.attended_tokens == answer.stats.cached_tokens  # full attends to everything
        if earlier is not None:   # more frames and another question: the comparison could fail
            assert_input_matters(logits, earlier, logits_error(answer.logits, logits))
        earlier = logits


def test_a_repetition_penalty_counts_the_streams_prompt_as_ask_counts_its_own(family_adapter, make_test_video):
    """A checkpoint's repetition penalty (Qwen2.5-VL's sets 1.05; 1.3 here) counts every token id of
    the prompt, as transformers counts its input ids: the video's placeholder id and the family's
    text between patches (Qwen3-VL's times) included, so the session answers as `ask` under it."""
    batch = sampled(make_test_video, VIDEOS[2])
    generation = GenerationConfig(max_new_tokens=NEW_TOKENS, repetition_penalty=1.3)
    session = ChatSession(family_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, len(batch)))
    begun = session.begin(QUESTIONS[0], generation)
    clock = StageClock(AskStats(), family_adapter.device)
    state = prefill_video(family_adapter, FrameFeed.decoded(batch), QUESTIONS[0], FPS, PrefillConfig(), NEW_TOKENS,
                          Request(clock))
    assert sorted(set(begun.answer.context.tolist())) == sorted(set(state.prompt_ids.tolist()))
    answer = begun.generate_alone()
    ids = generate(family_adapter, state.cache, state.logits, state.next_position, generation,
                   context=state.prompt_ids)
    assert_same_answer(answer.token_ids, answer.logits, ids, state.logits)


def test_scores_under_full_are_asks_on_the_same_frames_and_leave_only_the_video(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[0])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, len(batch)))
    length = session.cache.length
    choices = ["red", "a blue square", "red"]
    result = session.score(QUESTIONS[0], choices)
    assert session.cache.length == length and all(f == length for f in session.cache.filled)
    state = prefill_video(tiny_adapter, FrameFeed.decoded(batch), QUESTIONS[0], FPS, PrefillConfig(), NEW_TOKENS,
                          Request(StageClock(AskStats(), tiny_adapter.device)))
    expected = score_continuations(tiny_adapter, state, choices)
    for ours, theirs in zip(result.scores, expected):
        assert [t.token_id for t in ours.tokens] == [t.token_id for t in theirs.tokens]
        assert_logits_close(torch.tensor([t.logprob for t in ours.tokens]),
                            torch.tensor([t.logprob for t in theirs.tokens]), atol=1e-3)
    assert result.scores[0] == result.scores[2] and result.stats.cached_tokens == length
    with pytest.raises(ConfigError, match="no tokens"):
        session.score(QUESTIONS[0], ["red", ""])
    assert session.cache.length == length and session.score(QUESTIONS[0], choices).scores == result.scores


def test_under_resv_a_continuation_scores_as_generating_it_would(make_test_video, monkeypatch):
    """Under a policy that retrieves per generated token (ReSV), a continuation is fed as an answer
    is generated: each token's score is the log probability the decode loop gives it when it is
    the token chosen (the sampler forced to choose the continuation)."""
    from vidsight.engine.sampling import TokenSampler
    from vidsight.kv.policies.registry import make_policy
    from vidsight.models import TASK_MODEL, load_model

    adapter = load_model(TASK_MODEL, DEVICE, DTYPE)
    batch = sampled(make_test_video, VIDEOS[0])
    session = ChatSession(adapter, make_policy("resv"), ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, len(batch)))
    text = "red circle blue square"
    forced = adapter.text_ids(text)
    chosen = iter(forced)
    monkeypatch.setattr(TokenSampler, "__call__", lambda sampler, logits: next(chosen))
    begun = session.begin(QUESTIONS[1], GenerationConfig(max_new_tokens=len(forced), logprobs=1,
                                                         repetition_penalty=1.0))
    assert begun.generate_alone().token_ids == forced
    (score,) = session.score(QUESTIONS[1], [text]).scores
    assert [t.token_id for t in score.tokens] == forced and len(forced) == 4
    assert_logits_close(torch.tensor([t.logprob for t in score.tokens]),
                        torch.tensor([logprob for logprob, _, _ in begun.answer.logprobs]), atol=1e-3)
    assert not score.greedy   # the task model answers one word, then ends


def test_a_system_message_goes_before_the_stream_as_before_a_question_to_ask(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[2])
    system = "You watch a shop's camera."
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS, system=system))
    session.push(as_frames(batch, 0, len(batch)))
    answer = session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS))
    logits, ids = reference(tiny_adapter, batch, len(batch), Conversation.of(QUESTIONS[0], system))
    assert_same_answer(answer.token_ids, answer.logits, ids, logits)
    plain, _ = reference(tiny_adapter, batch, len(batch), QUESTIONS[0])
    assert_input_matters(logits, plain, logits_error(answer.logits, logits))


def test_the_question_and_answer_leave_only_the_video_in_the_cache(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[0])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, 6))
    length = session.cache.length
    session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS))
    assert session.cache.length == length and all(f == length for f in session.cache.filled)


@pytest.mark.device_check
@pytest.mark.parametrize("policy", [RecentPolicy(RecentConfig(window_tokens=100_000)),
                                    ReKVPolicy(ReKVConfig(local_tokens=100_000, top_frames=64))],
                         ids=["recent, window over the whole history", "rekv, k over every block"])
def test_a_baseline_that_covers_the_whole_history_equals_full(tiny_adapter, make_test_video, policy):
    batch = sampled(make_test_video, VIDEOS[1])
    full = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    baseline = ChatSession(tiny_adapter, policy, ChatConfig(fps=FPS))
    for session in (full, baseline):
        session.push(as_frames(batch, 0, len(batch)))
    a, b = (s.ask(QUESTIONS[1], GenerationConfig(max_new_tokens=NEW_TOKENS)) for s in (full, baseline))
    assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)


def question_step(adapter, cache, tokens):
    """A question step of ``tokens`` after what ``cache`` holds, as the forward pass fills it in."""
    positions = (torch.arange(tokens) + int(cache.tokens.position.max()) + 1).expand(3, -1)
    return Step("question", positions=positions, unrotate=unrotation(adapter))


def test_rekv_at_a_question_selects_every_slot_when_k_covers_every_block(tiny_adapter, make_test_video):
    """With a one-token local window, what the question sees comes from retrieval alone."""
    batch = sampled(make_test_video, VIDEOS[1])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, len(batch)))
    cache, filled = session.cache, session.cache.filled[0]
    q = torch.randn(1, tiny_adapter.num_heads, 5, tiny_adapter.head_dim)
    policy = ReKVPolicy(ReKVConfig(local_tokens=1, top_frames=len(batch) // 2))
    step = question_step(tiny_adapter, cache, 5)
    for layer in range(tiny_adapter.num_layers):
        assert torch.equal(policy.select(layer, cache, q, step), torch.arange(filled))
    video = int((cache.tokens.kind == VIDEO).sum())
    assert step.retrieved == tiny_adapter.num_layers * (video - 1)  # all video, bar the window's one token
    fewer = ReKVPolicy(ReKVConfig(local_tokens=1, top_frames=2)).select(0, cache, q, question_step(tiny_adapter, cache, 5))
    assert len(fewer) < filled


def test_rekv_and_recent_attend_to_less_than_everything(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[0])
    for policy in (RecentPolicy(RecentConfig(window_tokens=64)), ReKVPolicy(ReKVConfig(local_tokens=64, top_frames=1))):
        session = ChatSession(tiny_adapter, policy, ChatConfig(fps=FPS))
        session.push(as_frames(batch, 0, len(batch)))
        answer = session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=2))
        assert answer.stats.attended_tokens < answer.stats.cached_tokens
    assert answer.stats.retrieved_tokens > 0  # rekv chose a block outside its local window


def test_bad_questions_and_frames_are_refused(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[2])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    with pytest.raises(ConfigError, match="no video yet"):
        session.ask(QUESTIONS[0])
    session.push(as_frames(batch, 0, 1))
    with pytest.raises(ConfigError, match="no video yet"):  # one frame of a two-frame patch
        session.ask(QUESTIONS[0])
    session.push(as_frames(batch, 1, 2))
    with pytest.raises(ConfigError, match="empty"):
        session.ask("   ")
    other = SampledFrame(2, 99, 9.0, torch.zeros((10, 12, 3), dtype=torch.uint8), CodecInfo("?", 0))
    with pytest.raises(ConfigError, match="frame size changed"):
        session.push([other])
    with pytest.raises(ConfigError, match="fps"):
        ChatConfig(fps=0)


def test_a_fork_starts_from_the_same_memory_and_goes_its_own_way(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[0])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, 6))
    fork = session.fork(RecentPolicy(RecentConfig(window_tokens=8)))
    fork.push(as_frames(batch, 6, 8))
    assert fork.cache.length > session.cache.length and session.policy.name == "full"
    a, b = (s.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=2)) for s in (session, session.fork()))
    assert a.token_ids == b.token_ids and torch.equal(a.logits, b.logits)


def test_a_cache_that_grows_during_steps_stays_usable(tiny_adapter, make_test_video, monkeypatch):
    import vidsight.engine.chat as chat

    monkeypatch.setattr(chat, "INITIAL_CAPACITY", 16)  # every patch and question grows it
    batch = sampled(make_test_video, VIDEOS[2])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    for cut in (4, 8):
        session.push(as_frames(batch, cut - 4, cut))
        session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=3))
    assert session.cache.capacity > 16


def test_the_answer_text_streams_as_it_is_generated(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[0])
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(batch, 0, 4))
    pieces = []
    answer = session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS), on_text=pieces.append)
    text = tiny_adapter.decode_text(answer.token_ids)
    streamed = "".join(pieces)
    assert pieces and text.startswith(streamed)
    assert streamed == text or text.endswith("\ufffd")  # an unfinished character waits for its bytes


def test_rekvs_index_kept_across_questions_chooses_as_a_fresh_one(tiny_adapter, make_test_video):
    batch = sampled(make_test_video, VIDEOS[0])
    kept = ReKVPolicy(ReKVConfig(local_tokens=8, top_frames=2))
    session = ChatSession(tiny_adapter, kept, ChatConfig(fps=FPS))
    for cut in (4, 8, len(batch)):
        session.push(as_frames(batch, cut - 4 if cut < len(batch) else 8, cut))
        session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=2))
    q = torch.randn(1, tiny_adapter.num_heads, 3, tiny_adapter.head_dim)
    fresh = ReKVPolicy(ReKVConfig(local_tokens=8, top_frames=2))
    for layer in range(tiny_adapter.num_layers):
        assert torch.equal(kept.select(layer, session.cache, q, question_step(tiny_adapter, session.cache, 3)),
                           fresh.select(layer, session.cache, q, question_step(tiny_adapter, session.cache, 3)))


@pytest.mark.parametrize("stopped", [False, True], ids=["whole answer", "stop string"])
def test_a_kept_dialogue_is_one_prompt_with_two_videos_as_the_model_reads_it(tiny_adapter, make_test_video, stopped):
    """With turns kept, the second answer equals one transformers forward over the whole dialogue:
    video, question, answer, a new user turn with the next video span (Qwen's positions for a
    second video), and the second question; a repetition penalty counts that whole prompt's ids.
    An answer a stop string ended is kept as the text shown, as a chat client sends it back."""
    from vidsight.models.positions import video_grid_positions
    from vidsight.vision import preprocess_video

    batch = sampled(make_test_video, VIDEOS[0])
    generation = GenerationConfig(max_new_tokens=NEW_TOKENS)
    if stopped:
        whole = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
        whole.push(as_frames(batch, 0, 4))
        text = whole.ask(QUESTIONS[0], generation).answer
        stop = next(piece for k in range(1, len(text) - 1) if len(piece := text[k:k + 2].strip()) == 2
                    and "\ufffd" not in piece)
        generation = GenerationConfig(max_new_tokens=NEW_TOKENS, stop=(stop,))
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS, keep_dialogue=True))
    session.push(as_frames(batch, 0, 4))
    first = session.ask(QUESTIONS[0], generation)
    after_first = session.cache.length
    session.push(as_frames(batch, 4, 8))
    begun = session.begin(QUESTIONS[1], GenerationConfig(max_new_tokens=NEW_TOKENS))
    context = set(begun.answer.context.tolist())
    second = begun.generate_alone()
    assert session.cache.length > after_first  # the second turn stays too

    spec, tokenizer = tiny_adapter.vision, tiny_adapter.tokenizer
    videos = [preprocess_video(batch.data[lo:hi], spec, size=session._size) for lo, hi in ((0, 4), (4, 8))]
    tokens = [v.pixel_values.shape[0] // spec.merge_size**2 for v in videos]
    one = tiny_adapter.build_prompt(QUESTIONS[0], tokens[0])
    two = tiny_adapter.build_prompt(QUESTIONS[1], tokens[1])
    prefix = one.input_ids[: one.video_start].tolist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if stopped:
        assert first.answer == text.split(stop, 1)[0].strip()
        answer = tiny_adapter.text_ids(first.answer) + [end]
    else:
        answer = first.token_ids if first.token_ids[-1] == end else first.token_ids + [end]
    reopen = prefix[prefix.index(end) + 1 :]
    ids = one.input_ids.tolist() + answer + reopen + two.input_ids[two.video_start :].tolist()
    assert context == set(ids)

    def video_positions(video, start):
        return video_grid_positions(tuple(video.grid_thw), spec.merge_size, spec.temporal_patch_size / FPS,
                                    spec.tokens_per_second, start)

    first_video = video_positions(videos[0], one.video_start)
    text = len(one.input_ids) - one.video_start - tokens[0] + len(answer) + len(reopen)
    second_start = int(first_video.max()) + 1 + text
    second_video = video_positions(videos[1], second_start)
    rest = len(two.input_ids) - two.video_start - tokens[1]
    positions = torch.cat([torch.arange(one.video_start).expand(3, -1), first_video,
                           (torch.arange(text) + int(first_video.max()) + 1).expand(3, -1), second_video,
                           (torch.arange(rest) + int(second_video.max()) + 1).expand(3, -1)], dim=1)
    assert positions.shape[1] == len(ids)
    with torch.no_grad():
        logits = tiny_adapter.model(input_ids=torch.tensor([ids]), position_ids=positions[:, None],
                                    pixel_values_videos=torch.cat([v.pixel_values for v in videos]),
                                    video_grid_thw=torch.tensor([list(v.grid_thw) for v in videos])).logits[0, -1]
    assert torch.allclose(second.logits, logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("batch", [2, 3])
def test_patches_encoded_and_prefilled_together_answer_as_one_at_a_time(tiny_adapter, make_test_video, batch):
    frames = sampled(make_test_video, VIDEOS[0])
    one, many = (ChatSession(tiny_adapter, config=ChatConfig(fps=FPS, batch_patches=b)) for b in (1, batch))
    for session in (one, many):
        session.push(as_frames(frames, 0, 11))  # the last patches wait for the batch, then the question
    assert len(many.patches) < len(one.patches) and sum(p.patches for p in many.patches) < 5
    a, b = (s.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS)) for s in (one, many))
    assert sum(p.patches for p in many.patches) == 5  # the question prefilled the complete patches waiting
    assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-4, rtol=0)
    assert torch.equal(one.cache.tokens.position, many.cache.tokens.position)
    assert many.frames_seen == 11 and len(many._pending) == 1  # the odd frame still waits for its partner


def test_a_push_may_batch_its_patches_and_the_next_goes_one_by_one(tiny_adapter, make_test_video):
    """A history loaded in bulk (`bench chat --history-batch`): one push prefills its patches in
    batches, the next goes back to the session's own batch, and the answer is one-at-a-time's."""
    frames = sampled(make_test_video, VIDEOS[0])
    one, bulk = (ChatSession(tiny_adapter, config=ChatConfig(fps=FPS)) for _ in range(2))
    one.push(as_frames(frames, 0, 12))
    bulk.push(as_frames(frames, 0, 10), batch_patches=4)
    assert [p.patches for p in bulk.patches] == [4] and len(bulk._pending) == 2   # the fifth patch waits
    bulk.push(as_frames(frames, 10, 12))   # the waiting patch goes first, then the new one
    assert [p.patches for p in bulk.patches] == [4, 1, 1]
    a, b = (s.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS)) for s in (one, bulk))
    assert a.token_ids == b.token_ids and torch.allclose(a.logits, b.logits, atol=1e-4, rtol=0)
    assert torch.equal(one.cache.tokens.position, bulk.cache.tokens.position)
    with pytest.raises(ConfigError, match="batch_patches"):
        bulk.push([], batch_patches=MAX_BATCH_PATCHES + 1)


@pytest.mark.parametrize("name", ["rekv", "mosaic", "resv"])
def test_each_session_and_fork_owns_its_policys_state(tiny_adapter, make_test_video, name):
    """A policy object given to two sessions, or kept by a fork, is started afresh for each memory:
    two sessions sharing one answer as two given their own, and neither disturbs the other."""
    from vidsight.kv.policies import POLICIES, make_policy

    assert all(callable(getattr(POLICIES[n].load(), "start", None)) for n in POLICIES)   # every registered policy
    batch = sampled(make_test_video, VIDEOS[0])
    settings = {"rekv": dict(local_tokens=40, top_frames=1), "mosaic": dict(local_tokens=40, top_frames=1),
                "resv": dict(ratio=0.05)}[name]
    shared = make_policy(name, **settings)
    a, b = ChatSession(tiny_adapter, shared, ChatConfig(fps=FPS)), ChatSession(tiny_adapter, shared, ChatConfig(fps=FPS))
    alone = ChatSession(tiny_adapter, make_policy(name, **settings), ChatConfig(fps=FPS))
    assert len({id(s.policy) for s in (a, b, alone)} | {id(shared)}) == 4
    a.push(as_frames(batch, 0, 8))       # a reads more video before b starts
    for session in (b, alone):
        session.push(as_frames(batch, 0, 4))
    first, reference = (s.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS)) for s in (b, alone))
    assert first.token_ids == reference.token_ids and torch.equal(first.logits, reference.logits)
    assert first.stats.attended_tokens < first.stats.cached_tokens   # the policy did select
    twin = ChatSession(tiny_adapter, make_policy(name, **settings), ChatConfig(fps=FPS))
    twin.push(as_frames(batch, 0, 8))
    fork = a.fork()
    assert fork.policy is not a.policy
    fork.ask(QUESTIONS[2], GenerationConfig(max_new_tokens=NEW_TOKENS))   # the fork works first...
    after, untouched = (s.ask(QUESTIONS[1], GenerationConfig(max_new_tokens=NEW_TOKENS)) for s in (a, twin))
    assert after.token_ids == untouched.token_ids and torch.equal(after.logits, untouched.logits)   # ...a is as before


def test_chat_is_timed_by_stage_like_ask_and_watch(tiny_adapter, make_test_video):
    session = ChatSession(tiny_adapter, config=ChatConfig(fps=FPS))
    session.push(as_frames(sampled(make_test_video, VIDEOS[0]), 0, 4))
    answer = session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS))
    for patch in session.patches:
        assert set(patch.stages_s) == {"preprocess", "vision", "prefill"} and min(patch.stages_s.values()) > 0
        assert sum(patch.stages_s.values()) <= patch.latency_s
    stages = answer.stats.stages_s
    assert answer.stats.ttft_s == stages["prefill"] > 0 and stages["generate"] > 0
    assert stages["prefill"] + stages["generate"] <= answer.stats.answer_s


@pytest.mark.device_check
def test_sessions_pushed_together_in_shared_passes_answer_as_each_alone(tiny_adapter, make_test_video):
    """Three sessions (full, ReKV, Mosaic) of different videos fed frame by frame as a server feeds
    them: their encodings in one vision call, their chunks in one language-model pass (each over
    its own cache, its policy selecting for it). Every answer is what the session gives alone."""
    from vidsight.engine.batch import forward_packed
    from vidsight.engine.steps import EncodeRequest, encode_together
    from vidsight.kv.policies import make_policy

    batches = [sampled(make_test_video, fields) for fields in VIDEOS]
    policies = [lambda: None, lambda: make_policy("rekv", local_tokens=40, top_frames=1),
                lambda: make_policy("mosaic", local_tokens=40, top_frames=1)]

    def sessions():
        return [ChatSession(tiny_adapter, policy(), ChatConfig(fps=FPS)) for policy in policies]

    alone, together = sessions(), sessions()
    for session, batch in zip(alone, batches):
        session.push(as_frames(batch, 0, len(batch)))
    shared_passes = 0
    for k in range(max(len(b) for b in batches)):
        pending = {}
        for n, (session, batch) in enumerate(zip(together, batches)):
            work = session.pushing(as_frames(batch, k, k + 1) if k < len(batch) else [])
            try:
                pending[n] = (work, next(work))
            except StopIteration:
                pass
        while pending:
            encoding = [n for n, (_, request) in pending.items() if isinstance(request, EncodeRequest)]
            keys = encoding or list(pending)
            run = encode_together if encoding else forward_packed
            results = run(tiny_adapter, [pending[n][1] for n in keys])
            shared_passes += len(keys) > 1 and not encoding
            for n, result in zip(keys, results):
                try:
                    pending[n] = (pending[n][0], pending[n][0].send(result))
                except StopIteration:
                    del pending[n]
    assert shared_passes >= 4
    for mine, theirs in zip(together, alone):
        a, b = (s.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=NEW_TOKENS)) for s in (mine, theirs))
        assert_same_answer(a.token_ids, a.logits, b.token_ids, b.logits)
        assert len(mine.patches) == len(theirs.patches)


def test_a_thinking_models_answer_is_parted_as_asks(thinking_adapter, make_test_video):
    """With a reasoning parser, a session's answer is parted into its thinking and its content as
    `ask`'s is (`engine.reasoning`), the tokens being those chosen without the parser."""
    from vidsight.engine.reasoning import REASONING_PARSERS

    batch = sampled(make_test_video, VIDEOS[2])
    end = thinking_adapter.tokenizer.convert_tokens_to_ids("</think>")
    answers = []
    for parser in (None, "qwen3"):
        session = ChatSession(thinking_adapter, config=ChatConfig(fps=FPS))
        session.push(as_frames(batch, 0, len(batch)))
        answers.append(session.ask(QUESTIONS[0], GenerationConfig(max_new_tokens=24, temperature=1.0, seed=4,
                                                                  logit_bias={end: 3}, reasoning_parser=parser)))
    plain, parted = answers
    assert parted.token_ids == plain.token_ids and end in plain.token_ids
    assert (parted.reasoning, parted.answer) == REASONING_PARSERS["qwen3"].split(plain.answer, thinking=True)
    assert parted.reasoning and parted.to_dict()["reasoning"] == parted.reasoning and plain.reasoning is None
