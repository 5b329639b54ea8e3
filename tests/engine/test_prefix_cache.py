"""The video prefix cache: a question continuing a stored video prefix answers as `ask` does
without it; what shapes the video's KV (its bytes, sampling, prefill settings) decides a hit."""

import shutil
import threading
import time

import pytest
import torch

from vidsight.engine import Asker, GenerationConfig, PrefillConfig
from vidsight.engine.prefix_cache import PrefixCache
from vidsight.errors import ConfigError, VideoError
from vidsight.ingest import SamplingConfig
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.kv.config import PruneConfig
from vidsight.models import TASK_MODEL, load_model
from vidsight.models.conversation import Conversation, Message

from tests.settings import DEVICE, DTYPE, assert_same_answer
from tests.variants import fast_first

QUESTIONS = ["What colour is the square?", "Where is the square at the end of the video?", "How many squares?"]
VIDEO = dict(width=176, height=144, duration_s=4.0, fps=8, gop=8, bframes=True, seed=4)
SAMPLING = SamplingConfig(fps=2.0)
GENERATION = GenerationConfig(max_new_tokens=6)


@pytest.fixture(scope="module")
def task_adapter():
    """The trained task model: its answers depend on the question, so a reused prefix that mixed
    up questions would show."""
    return load_model(TASK_MODEL, DEVICE, DTYPE)


def answer(asker, path, question, **options):
    """The answer's ids, its first-token logits and its stats."""
    begun = asker.begin(path, question, sampling=options.pop("sampling", SAMPLING), generation=GENERATION, **options)
    logits = begun.answer.logits.clone()
    result = begun.generate_alone()
    return result.token_ids, logits, result.stats


@pytest.mark.device_check
@pytest.mark.parametrize("prefill", fast_first([PrefillConfig(group_frames=4),
                                                PrefillConfig(group_frames=4, motion=MotionPruneConfig(),
                                                              dedup_patches=True)],
                                               ids=["every patch", "motion pruning and dedup"]))
def test_questions_after_a_cached_prefix_answer_as_without_the_cache(task_adapter, make_test_video, prefill):
    path, _ = make_test_video(**VIDEO)
    plain, cached = Asker(task_adapter), Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    answers = []
    for n, question in enumerate(QUESTIONS):
        ids, logits, stats = answer(cached, path, question, prefill=prefill)
        ref_ids, ref_logits, ref_stats = answer(plain, path, question, prefill=prefill)
        assert_same_answer(ids, logits, ref_ids, ref_logits)
        assert stats.prompt_tokens == ref_stats.prompt_tokens
        assert (stats.frames, stats.visual_tokens, stats.kept_visual_tokens, stats.motion_source) == (
            ref_stats.frames, ref_stats.visual_tokens, ref_stats.kept_visual_tokens, ref_stats.motion_source)
        # The first question prefilled the video; the later ones only their own text.
        assert (stats.cached_tokens > 0) == (n > 0)
        assert stats.encoded_visual_tokens == (ref_stats.encoded_visual_tokens if n == 0 else 0)
        answers.append(ids)
    assert len({tuple(a) for a in answers}) > 1   # the questions were told apart
    counted = cached.prefix_cache.stats()
    assert (counted.hits, counted.misses, counted.entries) == (2, 1, 1)
    assert 0 < ref_stats.prompt_tokens - stats.cached_tokens < 40   # only the question's text was prefilled


def test_a_changed_file_or_setting_misses_and_the_same_bytes_under_another_name_hit(task_adapter, make_test_video,
                                                                                    tmp_path):
    path, _ = make_test_video(**VIDEO)
    other, _ = make_test_video(**{**VIDEO, "seed": 5})
    renamed = tmp_path / "renamed.mp4"
    shutil.copy(path, renamed)
    asker = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    cache, question = asker.prefix_cache, QUESTIONS[0]
    answer(asker, path, question)
    for changed in (dict(path=other), dict(sampling=SamplingConfig(fps=4.0)),
                    dict(prefill=PrefillConfig(group_frames=8)), dict(prefill=PrefillConfig(motion=MotionPruneConfig()))):
        misses = cache.stats().misses
        _, _, stats = answer(asker, changed.pop("path", path), question, **changed)
        assert cache.stats().misses == misses + 1 and stats.cached_tokens == 0
    _, _, stats = answer(asker, renamed, question)
    assert stats.cached_tokens > 0


def test_a_follow_up_turn_continues_the_prefix_and_another_system_message_misses(task_adapter, make_test_video):
    """A conversation's later turn (the first question, its answer, a second question) begins as
    the first question's prompt did, so it continues the stored prefix; a system message of its
    own changes the text before the video, so it prefills the video again. Each answers as
    without the cache."""
    path, _ = make_test_video(**VIDEO)
    plain, cached = Asker(task_adapter), Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    first = Conversation.of(QUESTIONS[0])
    follow_up = Conversation((*first.messages, Message("assistant", ("red",)), Message("user", (QUESTIONS[1],))))
    for n, conversation in enumerate((first, follow_up, Conversation.of(QUESTIONS[0], "You watch a shop's camera."))):
        ids, logits, stats = answer(cached, path, conversation)
        ref_ids, ref_logits, ref_stats = answer(plain, path, conversation)
        assert_same_answer(ids, logits, ref_ids, ref_logits)
        assert stats.prompt_tokens == ref_stats.prompt_tokens
        assert (stats.cached_tokens > 0) == (n == 1)
    counted = cached.prefix_cache.stats()
    assert (counted.hits, counted.misses, counted.entries) == (1, 2, 2)


def round_robin(works, adapter):
    """Preemptible works advanced a step each in turn on this thread, as the server's scheduler
    interleaves requests (a chunk a work yields is run and sent back at its next turn); their results."""
    started, sent, results = [False] * len(works), [None] * len(works), [None] * len(works)
    while any(result is None for result in results):
        for k, work in enumerate(works):
            if results[k] is not None:
                continue
            try:
                request = work.send(sent[k]) if started[k] else next(work)
            except StopIteration as stop:
                results[k] = stop.value
                continue
            started[k], sent[k] = True, None if request is None else request.run(adapter)
    return results


def test_requests_about_one_video_at_once_prefill_it_once_and_answer_as_alone(task_adapter, make_test_video):
    """Three questions about one video interleaved on one thread: the first prefills the video, the
    others wait for its prefix (no second prefill) and answer as they do without the cache."""
    path, _ = make_test_video(**VIDEO)
    asker = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    prefill = PrefillConfig(group_frames=4)   # several groups: the first pauses between them
    works = [asker.begin_steps(path, q, sampling=SAMPLING, generation=GENERATION, prefill=prefill) for q in QUESTIONS]
    first, second, _ = round_robin(works, task_adapter)
    stats = asker.prefix_cache.stats()
    assert (stats.misses, stats.hits, stats.waited) == (1, 2, 2)
    assert first.request.clock.stats.encoded_visual_tokens > 0
    assert second.request.clock.stats.cached_tokens > 0 and second.request.clock.stats.encoded_visual_tokens == 0
    logits = second.answer.logits.clone()
    ref_ids, ref_logits, _ = answer(Asker(task_adapter), path, QUESTIONS[1], prefill=prefill)
    assert_same_answer(second.generate_alone().token_ids, logits, ref_ids, ref_logits)


def test_a_waiting_request_prefills_the_video_itself_when_the_first_is_abandoned(task_adapter, make_test_video):
    path, _ = make_test_video(**VIDEO)
    asker = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    prefill = PrefillConfig(group_frames=4)
    first, second = (asker.begin_steps(path, q, sampling=SAMPLING, generation=GENERATION, prefill=prefill)
                     for q in QUESTIONS[:2])
    assert next(first) is not None   # the first claimed the prefill and wants its first group run
    assert next(second) is None      # the second waits for it
    first.close()                    # its client went away
    (waited,) = round_robin([second], task_adapter)   # resumes from its pause
    counted = asker.prefix_cache.stats()
    assert (counted.misses, counted.waited) == (2, 0) and waited.request.clock.stats.encoded_visual_tokens > 0
    ref_ids, _, _ = answer(Asker(task_adapter), path, QUESTIONS[1], prefill=prefill)
    assert waited.generate_alone().token_ids == ref_ids


def test_a_request_on_another_thread_blocks_until_the_prefix_it_waits_for_is_kept(task_adapter, make_test_video):
    path, _ = make_test_video(**VIDEO)
    asker = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    first = asker.begin_steps(path, QUESTIONS[0], sampling=SAMPLING, generation=GENERATION)
    chunk = next(first)
    assert chunk is not None   # the prefill is claimed, its first group wants running
    done = []
    other = threading.Thread(target=lambda: done.append(answer(asker, path, QUESTIONS[1])))
    other.start()
    time.sleep(0.5)
    assert other.is_alive() and not done   # waiting for the first's prefix, not prefilling its own
    try:
        request = first.send(chunk.run(task_adapter))
        while True:
            request = first.send(None if request is None else request.run(task_adapter))
    except StopIteration:
        pass
    other.join(timeout=60)
    (_, _, stats), = done
    counted = asker.prefix_cache.stats()
    assert stats.cached_tokens > 0 and (counted.misses, counted.hits, counted.waited) == (1, 1, 1)


def test_kv_pruning_is_never_cached(task_adapter, make_test_video):
    """The last group is pruned with the question in it: its KV depends on the question."""
    path, _ = make_test_video(**VIDEO)
    asker = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    pruned = PrefillConfig(group_frames=4, prune=PruneConfig(rho=0.5))
    for question in QUESTIONS[:2]:
        _, _, stats = answer(asker, path, question, prefill=pruned)
        assert stats.cached_tokens == 0
    assert asker.prefix_cache.stats().to_dict()["entries"] == 0


def test_least_recently_used_prefixes_leave_first_within_the_budget(task_adapter, make_test_video):
    first, _ = make_test_video(**VIDEO)
    second, _ = make_test_video(**{**VIDEO, "seed": 6})
    probe = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    answer(probe, first, QUESTIONS[0])
    one = probe.prefix_cache.stats().bytes
    asker = Asker(task_adapter, prefix_cache=PrefixCache(one + one // 2))   # room for one prefix
    answer(asker, first, QUESTIONS[0])
    answer(asker, second, QUESTIONS[0])
    stats = asker.prefix_cache.stats()
    assert (stats.entries, stats.evictions, stats.bytes) == (1, 1, one)
    _, _, again = answer(asker, first, QUESTIONS[1])
    assert again.cached_tokens == 0   # evicted: prefilled again
    assert torch.isfinite(torch.tensor(asker.prefix_cache.stats().hit_rate))


@pytest.mark.device_check
def test_prefixes_past_the_device_budget_wait_in_host_memory_and_answer_as_before(task_adapter, make_test_video):
    """Device room for one prefix, host room for one: the second video pushes the first down to
    host memory, the third pushes it out; the first asked again comes back up (a hit) and answers
    as `ask` does without the cache."""
    videos = [make_test_video(**{**VIDEO, "seed": seed})[0] for seed in (4, 6, 7)]
    probe = Asker(task_adapter, prefix_cache=PrefixCache(1 << 30))
    answer(probe, videos[0], QUESTIONS[0])
    one = probe.prefix_cache.stats().bytes
    asker = Asker(task_adapter, prefix_cache=PrefixCache(one + one // 2, host_bytes=one + one // 2,
                                                         device=task_adapter.device))
    cache = asker.prefix_cache
    answer(asker, videos[0], QUESTIONS[0])
    answer(asker, videos[1], QUESTIONS[0])
    stats = cache.stats()
    assert (stats.entries, stats.host_entries, stats.offloads, stats.evictions) == (1, 1, 1, 0)
    assert stats.host_bytes == one
    ids, logits, again = answer(asker, videos[0], QUESTIONS[1])   # up from host memory; the second goes down
    ref_ids, ref_logits, _ = answer(Asker(task_adapter), videos[0], QUESTIONS[1])
    assert_same_answer(ids, logits, ref_ids, ref_logits)
    assert again.cached_tokens > 0 and again.encoded_visual_tokens == 0
    stats = cache.stats()
    assert (stats.hits, stats.host_hits, stats.offloads, stats.entries, stats.host_entries) == (1, 1, 2, 1, 1)
    answer(asker, videos[2], QUESTIONS[0])   # the third: the first down, the second (host's oldest) out
    stats = cache.stats()
    assert (stats.entries, stats.host_entries, stats.evictions) == (1, 1, 1)
    _, _, kept = answer(asker, videos[0], QUESTIONS[2])
    _, _, dropped = answer(asker, videos[1], QUESTIONS[0])
    assert kept.cached_tokens > 0 and dropped.cached_tokens == 0


def test_bad_budgets_and_missing_files_are_refused(task_adapter, tmp_path):
    with pytest.raises(ConfigError, match="budget"):
        PrefixCache(0)
    with pytest.raises(ConfigError, match="host budget"):
        PrefixCache(1 << 20, host_bytes=-1)
    asker = Asker(task_adapter, prefix_cache=PrefixCache(1 << 20))
    with pytest.raises(VideoError, match="missing.mp4"):
        asker.ask(tmp_path / "missing.mp4", QUESTIONS[0])
