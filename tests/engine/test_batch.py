"""Sequences packed into one pass answer as each does alone: the packed forward, and decode steps
of several answers with different videos, prompt lengths, settings and policies."""

import pytest
import torch

from vidsight.engine import GenerationConfig, PrefillConfig
from vidsight.engine.batch import Chunk, forward_packed
from vidsight.engine.forward import forward, new_cache
from vidsight.engine.generate import Answer, DecodeBatch
from vidsight.engine.prefill import prefill_video
from vidsight.engine.request import Request
from vidsight.engine.stats import AskStats, StageClock
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.feed import FrameFeed
from vidsight.kv import TokenTable
from vidsight.kv.policies import RecentConfig, RecentPolicy, Step
from vidsight.models.packed_linear import can_pack

from tests.settings import DEVICE, DTYPE, assert_logits_close

# Different sizes, lengths and questions, so the packed sequences differ in every way.
REQUESTS = [
    (dict(width=176, height=144, duration_s=4.0, fps=8, gop=8, bframes=True, seed=1), 2.0,
     "What colour is the square?", GenerationConfig(max_new_tokens=8), False),
    (dict(width=320, height=240, duration_s=3.0, fps=10, gop=10, bframes=False, seed=2), 1.0,
     "Where did the square go after it stopped moving near the edge of the picture?",
     GenerationConfig(max_new_tokens=3), False),
    (dict(width=160, height=120, duration_s=5.0, fps=6, gop=6, bframes=True, seed=3), 2.0,
     "How many squares?", GenerationConfig(max_new_tokens=6, temperature=0.8, top_p=0.9, seed=7), True),
]


def prefilled(adapter, make_test_video, spec, fps, question, max_new_tokens):
    path, _ = make_test_video(**spec)
    info = probe(path)
    frames = decode_frames(path, sample_frames(info, SamplingConfig(fps=fps)), info=info)
    request = Request(StageClock(AskStats(), adapter.device))
    return prefill_video(adapter, FrameFeed.decoded(frames), question, fps, PrefillConfig(group_frames=4),
                         max_new_tokens, request)


def answers(adapter, make_test_video):
    """One `Answer` per request, each over its own prefilled cache; the last attends to a window."""
    out = []
    for spec, fps, question, generation, windowed in REQUESTS:
        state = prefilled(adapter, make_test_video, spec, fps, question, generation.max_new_tokens)
        policy = RecentPolicy(RecentConfig(window_tokens=40)).start(state.cache) if windowed else None
        out.append(Answer(state.cache, state.logits, state.next_position, generation, policy=policy,
                          step=Step("answer") if windowed else None))
    return out


@pytest.mark.device_check
@pytest.mark.parametrize("weights", ["tiny_adapter", pytest.param(
    "packed_tiny_adapter", marks=pytest.mark.skipif(not can_pack(DEVICE, DTYPE), reason="the same model elsewhere"))])
def test_answers_decoded_together_equal_each_decoded_alone(request, make_test_video, weights):
    tiny_adapter = request.getfixturevalue(weights)
    together, alone = answers(tiny_adapter, make_test_video), answers(tiny_adapter, make_test_video)
    batch, singles = DecodeBatch(tiny_adapter), [DecodeBatch(tiny_adapter) for _ in alone]
    for answer, single in zip(together, singles):
        batch.add(answer)
    for answer, single in zip(alone, singles):
        single.add(answer)
    steps, running = 0, True
    while running:
        running = batch.step()
        for single in singles:
            single.step()
        steps += 1
        for a, b in zip(together, alone, strict=True):
            assert a.done == b.done
            if not a.done:   # the next token's logits, from a packed pass and from a pass alone
                assert_logits_close(a.logits, b.logits)
        if DTYPE != torch.float32:
            return   # later tokens follow from a different rounding of the context (tests/settings.py)
    assert [a.ids for a in together] == [b.ids for b in alone]
    assert [len(a.ids) for a in together] == [8, 3, 6] and steps == 8   # answers left the batch as they ended
    assert together[2].step.attended < together[2].step.cached    # the window policy did select


def test_the_answer_depends_on_its_own_video(tiny_adapter, make_test_video):
    a, b = answers(tiny_adapter, make_test_video)[:2]
    assert (a.logits - b.logits).abs().max() > 1e-2


def test_a_cancelled_answer_leaves_the_batch_at_the_next_step(tiny_adapter, make_test_video):
    first, second, _ = answers(tiny_adapter, make_test_video)
    batch = DecodeBatch(tiny_adapter)
    batch.add(first), batch.add(second)
    batch.step()
    length = second.cache.length
    second.cancel()
    assert batch.step() == 1 and second.cache.length == length and len(second.ids) == 1


def test_asks_and_a_session_question_generated_together_answer_as_each_alone(tiny_adapter, make_test_video):
    """`generate_together` from Python: two videos' questions (different settings) and a chat
    session's question, begun one by one and decoded in one batch, give each one's own result."""
    from vidsight.engine import Asker, ChatConfig, ChatSession, generate_together
    from vidsight.errors import ConfigError
    from vidsight.ingest.stream import StreamSource

    asker = Asker(tiny_adapter)
    (first, fps, question, generation, _), (second, *_) = REQUESTS[:2]
    videos = [make_test_video(**spec)[0] for spec in (first, second)]
    settings = [dict(sampling=SamplingConfig(fps=fps), generation=generation),
                dict(sampling=SamplingConfig(fps=1.0), generation=GenerationConfig(max_new_tokens=5),
                     prefill=PrefillConfig(group_frames=4))]

    def begin_all(session):
        return [asker.begin(video, question, **options) for video, options in zip(videos, settings)] + [
            session.begin("Where is the square?", GenerationConfig(max_new_tokens=7))]

    sessions = []
    for _ in range(2):
        session = ChatSession(tiny_adapter, config=ChatConfig(fps=2.0))
        session.push(StreamSource(videos[1], fps=2.0))
        sessions.append(session)
    together = generate_together(begin_all(sessions[0]))
    alone = [progress.generate_alone() for progress in begin_all(sessions[1])]
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [len(r.token_ids) for r in together] == [8, 5, 7]
    assert together[2].answer == alone[2].answer and sessions[0].cache.length == sessions[1].cache.length
    # Until its answer is finished a session takes no frames and no other question (both would go
    # into the cache the answer is decoded over); then it does.
    begun = sessions[0].begin("Where?")
    with pytest.raises(ConfigError, match="'Where\\?' is not finished"):
        sessions[0].begin("What?")
    with pytest.raises(ConfigError, match="takes no frames"):
        sessions[0].push(StreamSource(videos[0], fps=2.0))
    begun.generate_alone()
    assert sessions[0].ask("What?").token_ids
    # A question given up before its pass (a scheduler closing, a failed pass) leaves no trace.
    length, asking = sessions[0].cache.length, sessions[0].asking("When?")
    next(asking)
    asking.close()
    assert sessions[0].cache.length == length and sessions[0].begin("When?").answer.cache is sessions[0].cache


@pytest.mark.parametrize("family", ["tiny_adapter", "qwen3_adapter"])
def test_packed_prefill_equals_each_chunk_alone(request, family):
    adapter = request.getfixturevalue(family)
    prompts = [adapter.text_ids("What colour is the square in the corner?"), adapter.text_ids("Count them."),
               adapter.text_ids("Yes")]
    caches = [new_cache(adapter, 64) for _ in prompts], [new_cache(adapter, 64) for _ in prompts]
    chunks, alone = [], []
    for ids, packed_cache, single_cache in zip(prompts, *caches):
        ids = torch.tensor(ids)
        positions = torch.arange(len(ids)).expand(3, -1) + 5
        embeds = adapter.embed_tokens(ids[None])
        chunks.append(Chunk(packed_cache, embeds, positions, TokenTable.text(positions)))
        alone.append(forward(adapter, single_cache, embeds, positions, TokenTable.text(positions)))
    for packed, single, packed_cache, single_cache in zip(forward_packed(adapter, chunks), alone, *caches):
        torch.testing.assert_close(packed, single, atol=1e-5, rtol=1e-5)
        for layer in range(adapter.num_layers):
            torch.testing.assert_close(packed_cache.read(layer)[0], single_cache.read(layer)[0], atol=1e-5, rtol=1e-5)


def test_a_chunk_split_and_run_in_parts_gives_what_the_whole_gives(tiny_adapter, make_test_video):
    """Chunked prefill inside a group: a video prompt's chunk run in three parts over three passes
    (one beside another sequence's chunk) leaves the cache and hidden states of one pass."""
    state = prefilled(tiny_adapter, make_test_video, *REQUESTS[0][:3], 4)
    length = state.cache.length
    ids = torch.tensor(tiny_adapter.text_ids("Where is the square now, and what colour is it?"))
    positions = torch.arange(len(ids)).expand(3, -1) + int(state.next_position)
    embeds = tiny_adapter.embed_tokens(ids[None])
    whole, parted = state.cache.clone(room=len(ids)), state.cache.clone(room=len(ids))
    reference = forward(tiny_adapter, whole, embeds, positions, TokenTable.text(positions))
    first, rest = Chunk(parted, embeds, positions, TokenTable.text(positions)).split(5)
    second, third = rest.split(3)
    other = Chunk(new_cache(tiny_adapter, 64), embeds[:, :4], positions[:, :4], TokenTable.text(positions[:, :4]))
    hidden = [forward_packed(tiny_adapter, [first])[0], forward_packed(tiny_adapter, [other, second])[1],
              forward_packed(tiny_adapter, [third])[0]]
    assert [h.shape[1] for h in hidden] == [5, 3, len(ids) - 8]
    torch.testing.assert_close(torch.cat(hidden, dim=1), reference, atol=1e-5, rtol=1e-5)
    assert parted.length == whole.length == length + len(ids)
    for layer in range(tiny_adapter.num_layers):
        torch.testing.assert_close(parted.read(layer)[0], whole.read(layer)[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        first.split(5)


def test_a_prefill_chunk_packed_with_decode_steps_changes_neither(tiny_adapter, make_test_video):
    """Chunked prefill: another request's prompt goes through in the answers' pass
    (`DecodeBatch.step_beside`); the answers' tokens and the chunk's hidden states and cache are
    what each gives alone."""
    together, alone = answers(tiny_adapter, make_test_video)[:2], answers(tiny_adapter, make_test_video)[:2]
    batch, single = DecodeBatch(tiny_adapter), DecodeBatch(tiny_adapter)
    for answer in together:
        batch.add(answer)
    for answer in alone:
        single.add(answer)
    ids = torch.tensor(tiny_adapter.text_ids("What colour is the square in the corner?"))
    positions = torch.arange(len(ids)).expand(3, -1) + 3
    embeds = tiny_adapter.embed_tokens(ids[None])
    packed_cache, own_cache = new_cache(tiny_adapter, 64), new_cache(tiny_adapter, 64)
    [hidden] = batch.step_beside([Chunk(packed_cache, embeds, positions, TokenTable.text(positions))])
    single.step()
    reference = forward(tiny_adapter, own_cache, embeds, positions, TokenTable.text(positions))
    torch.testing.assert_close(hidden, reference, atol=1e-5, rtol=1e-5)
    for layer in range(tiny_adapter.num_layers):
        torch.testing.assert_close(packed_cache.read(layer)[0], own_cache.read(layer)[0], atol=1e-5, rtol=1e-5)
    batch.run(), single.run()
    assert [a.ids for a in together] == [b.ids for b in alone]
