"""The model thread serves clients in turn, and refuses what still waits when it closes."""

import threading

import pytest

from vidsight.api.serve.media import RequestError
from vidsight.api.serve.scheduler import Scheduler


def test_clients_take_turns_one_piece_of_work_each():
    scheduler = Scheduler()
    gate, order = threading.Event(), []
    started = threading.Event()
    blocker = scheduler.submit("first", lambda: started.set() or gate.wait())   # holds the worker
    assert started.wait(10)
    futures = [scheduler.submit(client, lambda c=client, k=k: order.append(f"{c}{k}"))
               for client, count in (("a", 3), ("b", 1), ("c", 2)) for k in range(count)]
    assert scheduler.waiting == 6
    gate.set()
    for future in [blocker, *futures]:
        future.result(timeout=10)
    assert order == ["a0", "b0", "c0", "a1", "c1", "a2"]
    scheduler.close()


def test_closing_finishes_the_running_work_and_refuses_the_rest():
    scheduler = Scheduler()
    gate = threading.Event()
    started = threading.Event()
    running = scheduler.submit("a", lambda: (started.set(), gate.wait()) and "finished")
    assert started.wait(10)
    waiting = scheduler.submit("b", lambda: "never")
    closer = threading.Thread(target=scheduler.close)
    closer.start()
    gate.set()
    closer.join(10)
    assert running.result(timeout=10) == "finished"
    with pytest.raises(RequestError, match="shutting down"):
        waiting.result(timeout=10)
    with pytest.raises(RequestError, match="shutting down"):
        scheduler.submit("c", lambda: None)


def test_stepped_work_waiting_in_several_lines_is_encoded_in_one_batch():
    batches = []

    def encode(requests):
        batches.append([r for r in requests])
        return [f"embeds of {r}" for r in requests]

    def window(name):
        embeds = yield name            # pauses for its encoding
        return f"{name} judged with {embeds}"

    scheduler = Scheduler(encode=encode)
    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    futures = [scheduler.submit_steps(client, window(client)) for client in ("a", "b", "c")]
    plain = scheduler.submit("d", lambda: "plain")
    later = scheduler.submit_steps("a", window("a2"))    # a's second window waits for a's turn
    gate.set()
    assert [f.result(timeout=10) for f in futures] == [f"{c} judged with embeds of {c}" for c in "abc"]
    assert plain.result(timeout=10) == "plain" and later.result(timeout=10).startswith("a2")
    blocker.result(timeout=10)
    assert batches == [["a", "b", "c"], ["a2"]]
    scheduler.close()


class _Answer:
    def __init__(self):
        self.done = False

    def cancel(self):
        self.done = True


class _Progress:
    """An `AskInProgress` whose answer ends at its first decode step."""

    def __init__(self, name):
        self.name, self.answer = name, _Answer()

    def finish(self):
        return f"{self.name} answered"


class _Chunk(str):
    """A prefill chunk of one token."""

    length = 1


class _Decode:
    def __init__(self):
        self.running, self.steps = [], []

    def add(self, answer):
        self.running.append(answer)

    def step(self):
        self.steps.append("alone")
        for answer in self.running:
            answer.done = True
        self.running = []
        return 0

    def step_beside(self, chunks):
        self.steps.append("beside " + " ".join(chunks))
        self.step()
        self.steps.pop()
        return [f"hidden of {chunk}" for chunk in chunks]


def test_a_long_prefill_pauses_between_groups_and_streams_go_first():
    """Prefills waiting in two lines run a group each together; a watch window that arrives
    meanwhile runs before the next group."""
    scheduler = Scheduler(decode=_Decode())
    order, closed = [], []

    def prefill(name, groups):
        def steps():
            try:
                for group in range(groups):
                    if group:
                        yield
                    order.append(f"{name}{group}")
                    if (name, group) == ("long", 0):
                        scheduler.submit("watch", lambda: order.append("window"))
                return _Progress(name)
            finally:
                closed.append(name)
        return steps

    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    long, _ = scheduler.submit_answer("a", prefill("long", 3))
    short, _ = scheduler.submit_answer("b", prefill("short", 1))
    gate.set()
    assert long.result(timeout=10) == "long answered" and short.result(timeout=10) == "short answered"
    blocker.result(timeout=10)
    # long's and short's first groups went together; the window came before long's next group.
    assert order == ["long0", "short0", "window", "long1", "long2"]
    assert sorted(closed) == ["long", "short"]
    scheduler.close()


def test_a_client_gone_during_its_prefill_ends_it_at_the_next_group():
    scheduler = Scheduler(decode=_Decode())
    ran, closed, tickets = [], [], []

    def steps():
        try:
            for group in range(100):
                if group:
                    yield
                ran.append(group)
                if group == 1:
                    tickets[0].cancel()
            return _Progress("never")
        finally:
            closed.append(True)

    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    future, ticket = scheduler.submit_answer("a", lambda: steps())
    tickets.append(ticket)
    gate.set()
    blocker.result(timeout=10)
    with pytest.raises(RequestError, match="went away"):
        future.result(timeout=10)
    assert ran == [0, 1] and closed == [True]   # its generator closed: its decoders stop
    scheduler.close()


def test_a_prefill_chunk_carries_the_running_answers_step():
    """Chunked prefill: the group's chunk and one token of every running answer go through the
    model in one pass, and that turn takes no second step."""
    decode = _Decode()
    scheduler = Scheduler(decode=decode)
    got = []

    def prefill(name, groups):
        def steps():
            for group in range(groups):
                if group:
                    yield
                got.append((yield _Chunk(f"{name}{group}")))
            return _Progress(name)
        return steps

    first, _ = scheduler.submit_answer("a", prefill("first", 1))
    assert first.result(timeout=10) == "first answered"
    second, _ = scheduler.submit_answer("b", prefill("second", 2))
    assert second.result(timeout=10) == "second answered"
    assert got == ["hidden of first0", "hidden of second0", "hidden of second1"]
    # Each chunk went through in a pass with the answers' step; an answer's own steps follow alone.
    assert decode.steps == ["beside first0", "alone", "beside second0", "beside second1", "alone"]
    # Prefills waiting in several lines go through together, a group each per pass.
    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    decode.steps.clear()
    futures = [scheduler.submit_answer(name, prefill(name, groups))[0] for name, groups in (("x", 2), ("y", 1))]
    gate.set()
    assert [f.result(timeout=10) for f in futures] == ["x answered", "y answered"]
    blocker.result(timeout=10)
    assert decode.steps[:2] == ["beside x0 y0", "beside x1"]
    scheduler.close()


def test_a_turn_takes_other_prefills_only_within_its_token_budget():
    """With no room past the first group (a CPU's budget), prefills waiting in several lines take
    a turn each, so stream work waits for one group at most."""
    decode = _Decode()
    scheduler = Scheduler(decode=decode, max_prefill_tokens=0)

    def prefill(name):
        def steps():
            yield _Chunk(f"{name}0")
            return _Progress(name)
        return steps

    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    futures = [scheduler.submit_answer(name, prefill(name))[0] for name in ("x", "y")]
    gate.set()
    assert [f.result(timeout=10) for f in futures] == ["x answered", "y answered"]
    blocker.result(timeout=10)
    assert [s for s in decode.steps if s.startswith("beside")] == ["beside x0", "beside y0"]
    scheduler.close()


def test_groups_longer_than_a_turns_budget_go_over_several_turns_and_answer_as_alone(tiny_adapter,
                                                                                       make_test_video):
    """Chunked prefill inside a group: with a budget of 24 prompt tokens a pass, every pass stays
    within it, a window queued after the first part of a group runs before that group's next part,
    and each answer (its first-token logits, its greedy tokens) is what the question gets alone."""
    from vidsight.engine import Asker, GenerationConfig, PrefillConfig
    from vidsight.engine.generate import DecodeBatch
    from vidsight.ingest import SamplingConfig

    from tests.settings import assert_same_answer

    budget, passes, order = 24, [], []

    class Recording(DecodeBatch):
        def step_beside(self, chunks):
            passes.append([chunk.length for chunk in chunks])
            order.append("part")
            if len(passes) == 1:
                scheduler.submit("watch", lambda: order.append("window"))
            return super().step_beside(chunks)

    scheduler = Scheduler(decode=Recording(tiny_adapter), max_prefill_tokens=budget)
    asker = Asker(tiny_adapter)
    options = dict(sampling=SamplingConfig(fps=2.0), generation=GenerationConfig(max_new_tokens=5),
                   prefill=PrefillConfig(group_frames=4))
    requests = [(make_test_video(width=176, height=144, duration_s=4.0, fps=8, gop=8, bframes=True, seed=1)[0],
                 "What colour is the square?"),
                (make_test_video(width=160, height=120, duration_s=3.0, fps=6, gop=6, bframes=False, seed=2)[0],
                 "Where did the square go?")]
    first_logits = {}

    def begin(path, question):
        def steps():
            progress = yield from asker.begin_steps(path, question, **options)
            first_logits[question] = progress.answer.logits.clone()
            return progress
        return steps

    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    futures = [scheduler.submit_answer(f"client{k}", begin(path, question))[0]
               for k, (path, question) in enumerate(requests)]
    gate.set()
    results = [future.result(timeout=60) for future in futures]
    blocker.result(timeout=10)
    scheduler.close()
    # The first group was split at the budget; the window ran before its next part.
    assert passes[0] == [budget] and order[:3] == ["part", "window", "part"]
    assert all(sum(lengths) <= budget for lengths in passes) and len(passes) > 6
    for result, (path, question) in zip(results, requests):
        begun = asker.begin(path, question, **options)
        reference_logits = begun.answer.logits.clone()
        reference = begun.generate_alone()
        assert_same_answer(result.token_ids, first_logits[question], reference.token_ids, reference_logits)


def test_session_questions_join_the_decode_batch_and_their_frames_wait_for_the_answer(tiny_adapter,
                                                                                        make_test_video):
    """Two sessions (full and ReKV) ask beside a completion: each question's chunk goes through a
    pass with the running answers' decode step and its answer is generated in the decode batch;
    the frames queued after a question wait for its answer; every answer (greedy tokens, first-token
    logits) is what the session gives alone."""
    from vidsight.engine import Asker, GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.engine.generate import DecodeBatch
    from vidsight.engine.steps import encode_together
    from vidsight.ingest import SamplingConfig
    from vidsight.kv.policies import make_policy

    from tests.engine.test_chat import FPS, QUESTIONS, VIDEOS, as_frames, sampled
    from tests.settings import assert_same_answer

    generation = GenerationConfig(max_new_tokens=6)
    batches = [sampled(make_test_video, fields) for fields in VIDEOS[:2]]
    policies = [lambda: None, lambda: make_policy("rekv", local_tokens=40, top_frames=1)]
    halves = [(0, len(batch) // 2) for batch in batches], [(len(batch) // 2, len(batch)) for batch in batches]

    def sessions():
        return [ChatSession(tiny_adapter, policy(), ChatConfig(fps=FPS)) for policy in policies]

    alone = []
    for n, (session, batch) in enumerate(zip(sessions(), batches)):
        for half, question in zip(halves, QUESTIONS):
            session.push(as_frames(batch, *half[n]))
            alone.append(session.ask(question, generation))

    beside, events = [], []

    class Recording(DecodeBatch):
        def step_beside(self, chunks):
            beside.append((len(self.running), len(chunks)))
            return super().step_beside(chunks)

    def logged(name, steps):
        events.append(name)
        return (yield from steps)

    scheduler = Scheduler(encode=lambda requests: encode_together(tiny_adapter, requests),
                          decode=Recording(tiny_adapter), max_prefill_tokens=0)
    gate, started = threading.Event(), threading.Event()
    blocker = scheduler.submit("busy", lambda: started.set() or gate.wait())
    assert started.wait(10)
    video = make_test_video(width=160, height=120, duration_s=3.0, fps=6, gop=6, bframes=False, seed=2)[0]
    asker = Asker(tiny_adapter)
    options = dict(sampling=SamplingConfig(fps=2.0), generation=GenerationConfig(max_new_tokens=24))
    completion, _ = scheduler.submit_answer("completion", lambda: asker.begin_steps(video, QUESTIONS[0], **options))
    answers = []
    for n, (session, batch) in enumerate(zip(sessions(), batches)):
        for k, (half, question) in enumerate(zip(halves, QUESTIONS)):
            scheduler.submit_steps(f"s{n}", logged(f"s{n} frames {k}", session.pushing(as_frames(batch, *half[n]))))
            answer, _ = scheduler.submit_answer(f"s{n}", lambda s=session, q=question: s.asking(q, generation))
            answer.add_done_callback(lambda _, name=f"s{n} answered {k}": events.append(name))
            answers.append(answer)
    gate.set()
    results = [answer.result(timeout=120) for answer in answers]
    reference = asker.begin(video, QUESTIONS[0], **options).generate_alone()
    assert completion.result(timeout=60).token_ids == reference.token_ids
    blocker.result(timeout=10)
    scheduler.close()
    for ours, theirs in zip(results, alone):
        assert_same_answer(ours.token_ids, ours.logits, theirs.token_ids, theirs.logits)
    # A session's second frames went in after its first answer was finished, not while it was decoded.
    for n in range(2):
        assert events.index(f"s{n} answered 0") < events.index(f"s{n} frames 1")
    # Some question went through a pass with running answers beside it.
    assert any(running and chunks for running, chunks in beside)


def test_a_session_question_whose_client_went_away_ends_and_keeps_no_turn(tiny_adapter, make_test_video):
    """A session answer cancelled mid-way (its HTTP client gone) stops at the next decode step, and
    a session that keeps its dialogue keeps no turn of it: the next question answers as in a session
    never asked the cancelled one."""
    from vidsight.engine import GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.engine.generate import DecodeBatch

    from tests.engine.test_chat import FPS, QUESTIONS, VIDEOS, as_frames, sampled
    from tests.settings import assert_same_answer

    batch = sampled(make_test_video, VIDEOS[2])
    config = ChatConfig(fps=FPS, keep_dialogue=True)
    asked, never = (ChatSession(tiny_adapter, config=config) for _ in range(2))
    for session in (asked, never):
        session.push(as_frames(batch, 0, len(batch)))
    video_only = asked.cache.length
    tickets = []

    class CancellingAfterTwo(DecodeBatch):
        steps = 0

        def step(self):
            CancellingAfterTwo.steps += 1
            if CancellingAfterTwo.steps == 2:
                tickets[0].cancel()
            return super().step()

    scheduler = Scheduler(decode=CancellingAfterTwo(tiny_adapter))
    future, ticket = scheduler.submit_answer("s", lambda: asked.asking(QUESTIONS[0], GenerationConfig(max_new_tokens=12)))
    tickets.append(ticket)
    cut = future.result(timeout=60)
    scheduler.close()
    assert 1 <= len(cut.token_ids) <= 3 and asked.cache.length == video_only
    ours = asked.ask(QUESTIONS[1], GenerationConfig(max_new_tokens=6))
    theirs = never.ask(QUESTIONS[1], GenerationConfig(max_new_tokens=6))
    assert_same_answer(ours.token_ids, ours.logits, theirs.token_ids, theirs.logits)


def test_the_turns_prefill_budget_defaults_per_device_and_is_checked(capsys):
    from vidsight.api.cli import main
    from vidsight.api.serve.config import DEFAULT_MAX_PREFILL_TOKENS, ServeConfig
    from vidsight.errors import ConfigError

    default = ServeConfig(model="tiny")
    assert default.prefill_budget("cuda") == DEFAULT_MAX_PREFILL_TOKENS["cuda"] == 8192
    assert default.prefill_budget("cpu") == DEFAULT_MAX_PREFILL_TOKENS["cpu"] == 0
    assert ServeConfig(model="tiny", max_prefill_tokens=64).prefill_budget("cpu") == 64
    with pytest.raises(ConfigError, match="--max-prefill-tokens must be 0"):
        ServeConfig(model="tiny", max_prefill_tokens=-1)
    assert main(["serve", "--model", "tiny", "--max-prefill-tokens", "-5"]) == 2
    assert "--max-prefill-tokens must be 0" in capsys.readouterr().err
