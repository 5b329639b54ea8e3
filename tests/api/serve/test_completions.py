"""OpenAI-compatible chat completions: the official client gets what `vidsight ask` answers."""

import base64
import dataclasses
import os
import re

import pytest
from openai import APIStatusError, OpenAI

from vidsight.api.serve.config import DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_PREFIX_CACHE_HOST_BYTES, ServeConfig
from vidsight.engine import Asker, GenerationConfig
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig
from vidsight.models import load_model
from vidsight.models.conversation import IMAGE_PART, VIDEO_PART, Conversation, Message

from tests.settings import FLOAT32_TOLERANCE

pytestmark = pytest.mark.slow
QUESTION = "What colour is the square?"


def video_message(url: str, question: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                         {"type": "text", "text": question}]}]


def complete(client, media, request):
    """One completion of ``request`` (a video's name and an answer length) at 4 fps."""
    name, limit = request
    return client.chat.completions.create(model="tiny", messages=video_message(str(media / name)), max_tokens=limit,
                                          extra_body={"mm_processor_kwargs": {"fps": 4.0}})


@pytest.fixture(scope="module")
def expected(tiny_adapter, media):
    return Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0),
                                   generation=GenerationConfig(max_new_tokens=12))


def test_a_completion_answers_what_ask_answers_streamed_or_not(make_server, media, expected):
    with make_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == ["tiny"]
        options = {"mm_processor_kwargs": {"fps": 4.0}}
        whole = client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                               max_tokens=12, extra_body=options)
        assert whole.choices[0].message.content == expected.answer
        assert whole.usage.prompt_tokens == expected.stats.prompt_tokens
        assert whole.usage.completion_tokens == len(expected.token_ids)
        assert whole.choices[0].finish_reason in ("stop", "length")
        stream = client.chat.completions.create(model="tiny", messages=video_message("file://" + str(media / "clip.mp4")),
                                                max_tokens=12, stream=True, extra_body=options,
                                                stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == expected.answer
        assert chunks[-1].usage.completion_tokens == len(expected.token_ids)


def test_a_stop_string_ends_the_answer_streamed_or_not(make_local_server, media, expected, tiny_adapter):
    text = expected.answer
    stop = next(text[k:k + 2] for k in range(1, len(text) - 1) if text[k:k + 2].strip() and "\ufffd" not in text[k:k + 2])
    want = Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0),
                                   generation=GenerationConfig(max_new_tokens=12, stop=(stop,)))
    assert want.finish_reason == "stop" and len(want.token_ids) < len(expected.token_ids)
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        request = dict(model="tiny", messages=video_message(str(media / "clip.mp4")), max_tokens=12,
                       extra_body={"mm_processor_kwargs": {"fps": 4.0}})
        whole = client.chat.completions.create(**request, stop=stop)
        chunks = list(client.chat.completions.create(**request, stop=[stop], stream=True))
    assert whole.choices[0].message.content == want.answer and whole.choices[0].finish_reason == "stop"
    assert whole.usage.completion_tokens == len(want.token_ids)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.answer
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    kept = Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0), generation=
                                   GenerationConfig(max_new_tokens=12, stop=(stop,), include_stop_str_in_output=True))
    assert kept.answer.endswith(stop) and kept.token_ids == want.token_ids
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        extra = {"mm_processor_kwargs": {"fps": 4.0}, "include_stop_str_in_output": True}
        whole = client.chat.completions.create(**{**request, "extra_body": extra}, stop=stop)
        chunks = list(client.chat.completions.create(**{**request, "extra_body": extra}, stop=stop, stream=True))
    assert whole.choices[0].message.content == kept.answer
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == kept.answer


def test_logprobs_come_whole_or_with_the_pieces_they_made(make_local_server, media, tiny_adapter):
    want = Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0),
                                   generation=GenerationConfig(max_new_tokens=12, logprobs=2))
    expected = [entry.to_dict() for entry in want.logprobs]
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        request = dict(model="tiny", messages=video_message(str(media / "clip.mp4")), max_tokens=12, logprobs=True,
                       top_logprobs=2, extra_body={"mm_processor_kwargs": {"fps": 4.0}})
        whole = client.chat.completions.create(**request)
        chunks = list(client.chat.completions.create(**request, stream=True))
    streamed = [entry.model_dump() for c in chunks if c.choices and c.choices[0].logprobs
                for entry in c.choices[0].logprobs.content]
    for got in ([entry.model_dump() for entry in whole.choices[0].logprobs.content], streamed):
        # The server's float32 passes round as `ask`'s do, within the tolerance (batched, packed weights).
        assert [(e["token"], e["bytes"], [t["token"] for t in e["top_logprobs"]]) for e in got] == \
            [(e["token"], e["bytes"], [t["token"] for t in e["top_logprobs"]]) for e in expected]
        values = lambda entries: [v for e in entries for v in (e["logprob"], *(t["logprob"] for t in e["top_logprobs"]))]
        assert max(abs(a - b) for a, b in zip(values(got), values(expected))) < FLOAT32_TOLERANCE
    assert len(expected) == len(want.token_ids)
    for c in chunks:   # a piece of text comes with the tokens that made it
        if c.choices and c.choices[0].delta.content:
            assert c.choices[0].logprobs.content


def test_a_base64_video_is_answered_and_leaves_no_file(make_server, media, expected, scratch):
    data = "data:video/mp4;base64," + base64.b64encode((media / "clip.mp4").read_bytes()).decode()
    with make_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        answer = client.chat.completions.create(model="tiny", messages=video_message(data), max_tokens=12,
                                                extra_body={"media_io_kwargs": {"video": {"fps": 4.0}}})
    assert answer.choices[0].message.content == expected.answer
    assert not list(scratch.iterdir())


def test_concurrent_completions_are_decoded_together_and_answer_as_alone(make_local_server, media, tiny_adapter):
    """Eight clients at once, two videos and three lengths: each answer is the one `ask` gives
    alone, decode steps fed several answers together, and each video was prefilled once (the
    requests that came while it was being prefilled waited for its prefix)."""
    import concurrent.futures
    import re

    import httpx

    requests = [(name, limit) for name in ("clip.mp4", "other.mp4") for limit in (4, 12, 20, 12)]
    expected = {(name, limit): Asker(tiny_adapter).ask(media / name, QUESTION, sampling=SamplingConfig(fps=4.0),
                                                       generation=GenerationConfig(max_new_tokens=limit))
                for name, limit in set(requests)}
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")

        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(lambda request: complete(client, media, request), requests))
        metrics = httpx.get(f"{url}/metrics").text
    for request, answer in zip(requests, answers):
        assert answer.choices[0].message.content == expected[request].answer
        assert answer.usage.completion_tokens == len(expected[request].token_ids)
    steps = float(re.search(r'vidsight:decode_batch_size_count\{model_name="tiny"\} (\S+)', metrics).group(1))
    fed = float(re.search(r'vidsight:decode_batch_size_sum\{model_name="tiny"\} (\S+)', metrics).group(1))
    assert fed > steps   # some steps fed several answers at once
    assert re.search(r'vidsight:prefix_cache_misses_total\{model_name="tiny"\} 2\.0', metrics)
    assert re.search(r'vidsight:prefix_cache_hits_total\{model_name="tiny"\} 6\.0', metrics)


def test_a_client_that_goes_away_ends_its_answer(make_local_server, media, tiny_adapter):
    import re

    import httpx

    alone = Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0),
                                    generation=GenerationConfig(max_new_tokens=600))
    assert len(alone.token_ids) == 600   # no end token comes: only leaving stops it

    body = {"model": "tiny", "messages": video_message(str(media / "clip.mp4")), "max_tokens": 600,
            "stream": True, "mm_processor_kwargs": {"fps": 4.0}}
    with make_local_server() as (url, server):
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            next(response.iter_lines())   # the answer has begun
        # Its sequence is dropped at the next step: the model is free again long before 600 tokens.
        quick = httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=60)
        assert quick.status_code == 200
        steps = float(re.search(r'vidsight:decode_batch_size_count\{model_name="tiny"\} (\S+)',
                                httpx.get(f"{url}/metrics").text).group(1))
    assert steps < 300   # the first answer, which runs to 600 tokens when nobody leaves, stopped early


def test_a_second_question_about_a_video_reuses_its_prefix(make_local_server, media, tiny_adapter, tmp_path):
    """The same video's bytes under another name, a second question: its video KV comes from the
    prefix cache (OpenAI's ``cached_tokens``), its answer is `ask`'s; a server without the cache
    prefills every time."""
    import re
    import shutil

    import httpx

    shutil.copy(media / "clip.mp4", media / "clip-copy.mp4")
    questions = [QUESTION, "Where is the square at the end?"]
    expected = [Asker(tiny_adapter).ask(media / "clip.mp4", q, sampling=SamplingConfig(fps=4.0),
                                        generation=GenerationConfig(max_new_tokens=8)) for q in questions]
    try:
        for budget in (DEFAULT_PREFIX_CACHE_BYTES, 0):
            with make_local_server(prefix_cache_bytes=budget) as (url, _):
                client = OpenAI(base_url=f"{url}/v1", api_key="unused")
                answers = [client.chat.completions.create(
                    model="tiny", messages=video_message(str(media / name), q), max_tokens=8,
                    extra_body={"mm_processor_kwargs": {"fps": 4.0}})
                    for name, q in zip(("clip.mp4", "clip-copy.mp4"), questions)]
                metrics = httpx.get(f"{url}/metrics").text
            for answer, want in zip(answers, expected):
                assert answer.choices[0].message.content == want.answer
                assert answer.usage.prompt_tokens == want.stats.prompt_tokens
            cached = [a.usage.prompt_tokens_details.cached_tokens for a in answers]
            if budget:
                assert cached[0] == 0 and 0 < cached[1] < answers[1].usage.prompt_tokens
                assert re.search(r'vidsight:prefix_cache_hits_total\{model_name="tiny"\} 1\.0', metrics)
                assert re.search(r'vidsight:prefix_cache_misses_total\{model_name="tiny"\} 1\.0', metrics)
                assert float(re.search(r'vidsight:prefix_cache_bytes\{model_name="tiny"\} (\S+)', metrics).group(1)) > 0
                # On the CPU the device's memory is the host's: nothing is offloaded below it.
                assert re.search(r'vidsight:prefix_cache_host_bytes\{model_name="tiny"\} 0\.0', metrics)
            else:
                assert cached == [0, 0] and "prefix_cache" not in metrics
    finally:
        (media / "clip-copy.mp4").unlink()


def test_a_conversation_is_answered_as_ask_answers_it_and_its_follow_up_reuses_the_prefix(make_local_server, media,
                                                                                             tiny_adapter):
    """What chat clients send: a developer (system) message, the video and a question; then the
    same with the answer and a follow-up question. Each is answered as `Asker` answers the same
    conversation, and the follow-up's video comes from the prefix cache."""
    fps, generation = SamplingConfig(fps=4.0), GenerationConfig(max_new_tokens=8)
    first = [{"role": "developer", "content": "Answer briefly."}, *video_message(str(media / "clip.mp4"))]

    def expected(messages):
        turns = [Message("system" if m["role"] == "developer" else m["role"],
                         (m["content"],) if isinstance(m["content"], str) else (VIDEO_PART, QUESTION)) for m in messages]
        return Asker(tiny_adapter).ask(media / "clip.mp4", Conversation(tuple(turns)), sampling=fps,
                                       generation=generation)

    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        ask = lambda messages: client.chat.completions.create(model="tiny", messages=messages, max_tokens=8,
                                                              extra_body={"mm_processor_kwargs": {"fps": 4.0}})
        answer = ask(first)
        follow_up = [*first, {"role": "assistant", "content": answer.choices[0].message.content},
                     {"role": "user", "content": "And where is it at the end?"}]
        second = ask(follow_up)
    for got, messages in ((answer, first), (second, follow_up)):
        want = expected(messages)
        assert got.choices[0].message.content == want.answer
        assert got.usage.prompt_tokens == want.stats.prompt_tokens
    assert answer.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


def test_the_prefix_caches_host_budget_defaults_to_none_on_the_cpu_and_is_checked():
    default = ServeConfig(model="tiny")
    assert default.prefix_host_budget("cuda") == DEFAULT_PREFIX_CACHE_HOST_BYTES and default.prefix_host_budget("cpu") == 0
    assert ServeConfig(model="tiny", prefix_cache_host_bytes=123).prefix_host_budget("cpu") == 123
    with pytest.raises(ConfigError, match="--prefix-cache-host-bytes"):
        ServeConfig(model="tiny", prefix_cache_host_bytes=-1)


def test_completions_beside_a_watch_and_a_session_answer_as_each_alone(make_local_server, media, tiny_adapter,
                                                                        capsys, tiny_model_dir):
    """Six clients' completions, a watch and a chat session at once, through the preempting,
    stream-first scheduler and the shared decode batch: each gives what it gives alone."""
    import concurrent.futures
    import time

    import httpx

    from tests.api.serve.test_watches import SETTINGS, cli_lines, read_events, without_timing
    from tests.api.serve.conftest import QUERY
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.ingest.stream import StreamSource

    requests = [(name, limit) for name in ("clip.mp4", "other.mp4") for limit in (4, 12, 20)]
    expected = {(name, limit): Asker(tiny_adapter).ask(media / name, QUESTION, sampling=SamplingConfig(fps=4.0),
                                                       generation=GenerationConfig(max_new_tokens=limit))
                for name, limit in requests}
    watched = cli_lines(capsys, media / "clip.mp4", tiny_model_dir)
    with ChatSession(tiny_adapter, config=ChatConfig(fps=2.0)) as chat:
        chat.push(StreamSource(media / "other.mp4", fps=2.0))
        chatted = chat.ask(QUESTION, GenerationConfig(max_new_tokens=8))
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        watch = httpx.post(f"{url}/v1/watches", json={"source": "clip.mp4", "query": QUERY, **SETTINGS}).json()["id"]
        session = httpx.post(f"{url}/v1/sessions", json={"source": "other.mp4", "fps": 2.0}).json()["id"]

        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(lambda request: complete(client, media, request), requests))
            events = read_events(url, watch)
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/sessions/{session}").json()["state"] == "reading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        said = httpx.post(f"{url}/v1/sessions/{session}/messages",
                          json={"question": QUESTION, "max_tokens": 8, "stream": False}, timeout=60).json()
    for request, answer in zip(requests, answers):
        assert answer.choices[0].message.content == expected[request].answer
    # Windows went through the model beside the answers' decode steps: the verdicts are the same,
    # their probabilities within float32's tolerance.
    served, alone = [without_timing(e["data"]) for e in events], [without_timing(r) for r in watched]
    assert [{**e, "p_yes": None} for e in served] == [{**r, "p_yes": None} for r in alone]
    assert all(abs(e["p_yes"] - r["p_yes"]) < FLOAT32_TOLERANCE for e, r in zip(served, alone) if "p_yes" in r)
    assert said["answer"] == chatted.answer


def test_a_choice_among_given_answers_is_the_likeliest_of_them_scored(make_local_server, media, tiny_adapter):
    """vLLM's structured-output choice (and its older guided_choice): the reply is the answer given
    that `Asker.score` finds likeliest, whole or streamed as one piece, scored in the decode batch
    or alone."""
    import httpx

    choices = ["red", "blue", "a green square"]
    expected = Asker(tiny_adapter).score(media / "clip.mp4", QUESTION, choices, sampling=SamplingConfig(fps=4.0))
    best = choices[expected.best]
    options = {"mm_processor_kwargs": {"fps": 4.0}}
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
            whole = client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                                   extra_body={**options, **extra})
            assert whole.choices[0].message.content == best and whole.choices[0].finish_reason == "stop"
            assert whole.usage.prompt_tokens == expected.stats.prompt_tokens
            assert whole.usage.completion_tokens == len(expected.scores[expected.best].tokens)
        stream = client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                                stream=True, extra_body={**options, "guided_choice": choices})
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == best
        for bad, said in [({"guided_choice": []}, "1 to 64"), ({"guided_choice": ["red", " "]}, "non-empty"),
                          ({"structured_outputs": {"structural_tag": "a+"}}, "structural_tag is not supported"),
                          ({"guided_choice": choices, "guided_regex": "a+"}, "one answer format at most"),
                          ({"guided_choice": choices, "logprobs": True}, "logprobs, stop and n"),
                          ({"guided_choice": choices, "n": 2}, "logprobs, stop and n")]:
            body = {"model": "tiny", "messages": video_message(str(media / "clip.mp4")), **options, **bad}
            refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
    with make_local_server(batch_answers=False) as (url, _):   # scored alone, not in a decode batch
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        alone = client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                               extra_body={**options, "guided_choice": choices})
        assert alone.choices[0].message.content == best


def test_n_answers_are_sampled_with_consecutive_seeds_after_one_video_prefill(make_local_server, media, tiny_adapter):
    """``n`` answers: answer ``i`` is `ask`'s with ``seed + i``, whole or streamed by index; the
    usage counts the prompt once and every answer's tokens; the video is prefilled once (the other
    answers wait for its prefix) and a server without the cache still answers the same."""
    import re

    import httpx

    sampled = dict(max_new_tokens=10, temperature=1.0, logprobs=1)
    expected = [Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0),
                                        generation=GenerationConfig(seed=7 + i, **sampled)) for i in range(3)]
    assert len({e.answer for e in expected}) > 1   # the seeds matter
    logprobs = [[entry.logprob for entry in e.logprobs] for e in expected]
    request = dict(model="tiny", messages=video_message(str(media / "clip.mp4")), max_tokens=10, temperature=1.0,
                   seed=7, n=3, logprobs=True, top_logprobs=1, extra_body={"mm_processor_kwargs": {"fps": 4.0}})
    for settings in ({}, {"prefix_cache_bytes": 0}, {"batch_answers": False}):
        with make_local_server(**settings) as (url, _):
            client = OpenAI(base_url=f"{url}/v1", api_key="unused")
            whole = client.chat.completions.create(**request)
            metrics = httpx.get(f"{url}/metrics").text
            chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
            too_many = httpx.post(f"{url}/v1/chat/completions", json={**request, "n": 17}, timeout=60)
        assert [c.index for c in whole.choices] == [0, 1, 2]
        assert [c.message.content for c in whole.choices] == [e.answer for e in expected]
        assert [c.finish_reason for c in whole.choices] == [e.finish_reason for e in expected]
        assert whole.usage.prompt_tokens == expected[0].stats.prompt_tokens
        assert whole.usage.completion_tokens == sum(len(e.token_ids) for e in expected)
        if not settings:
            assert re.search(r'vidsight:prefix_cache_misses_total\{model_name="tiny"\} 1\.0', metrics)
            assert re.search(r'vidsight:prefix_cache_hits_total\{model_name="tiny"\} 2\.0', metrics)
        streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                    for i in range(3)]
        assert streamed == [e.answer for e in expected]
        ends = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
        assert ends == [0, 1, 2] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        # Each answer's log probabilities, whole and as its own chunks carried them.
        for i in range(3):
            assert [t.logprob for t in whole.choices[i].logprobs.content] == pytest.approx(logprobs[i], abs=1e-5)
            pieces = [t.logprob for c in chunks if c.choices and c.choices[0].index == i and c.choices[0].logprobs
                      for t in c.choices[0].logprobs.content]
            assert pieces == pytest.approx(logprobs[i], abs=1e-5)
        assert too_many.status_code == 422 and "n" in too_many.json()["error"]["message"]


def test_an_answer_format_holds_the_reply_in_each_of_its_spellings(make_local_server, media, tiny_adapter):
    """OpenAI's response_format and vLLM's structured outputs (and its older guided fields): the
    reply is what `ask` answers under the same `AnswerFormat`, whole, streamed, or n of them sampled."""
    import json
    import re

    from vidsight.engine.config import AnswerFormat

    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}, "moving": {"type": "boolean"}},
              "required": ["colour", "moving"], "additionalProperties": False}

    def expected(kind, text, compact=False):
        generation = GenerationConfig(max_new_tokens=60, answer_format=AnswerFormat(kind, text, not compact))
        return Asker(tiny_adapter).ask(media / "clip.mp4", QUESTION, sampling=SamplingConfig(fps=4.0),
                                       generation=generation).answer

    compact_schema = expected("json_schema", json.dumps(schema), compact=True)
    assert set(json.loads(compact_schema)) == {"colour", "moving"}
    cases = [({"response_format": {"type": "json_schema", "json_schema": {"name": "seen", "schema": schema}}},
              expected("json_schema", json.dumps(schema))),
             ({"response_format": {"type": "json_object"}}, expected("json_schema", '{"type": "object"}')),
             ({"structured_outputs": {"json": schema, "disable_any_whitespace": True}}, compact_schema),
             ({"guided_json": schema, "structured_outputs": {"disable_any_whitespace": True}}, compact_schema),
             ({"structured_outputs": {"regex": "(red|blue) [0-9]"}}, expected("regex", "(red|blue) [0-9]")),
             ({"guided_grammar": 'root ::= "yes" | "no"'}, expected("grammar", 'root ::= "yes" | "no"'))]
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        request = dict(model="tiny", messages=video_message(str(media / "clip.mp4")), max_tokens=60)
        for fields, want in cases:
            response_format = fields.pop("response_format", None)
            extra = {"mm_processor_kwargs": {"fps": 4.0}, **fields}
            formatted = {"response_format": response_format} if response_format else {}
            whole = client.chat.completions.create(**request, **formatted, extra_body=extra)
            assert whole.choices[0].message.content == want, fields
            chunks = client.chat.completions.create(**request, **formatted, extra_body=extra, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
        sampled = client.chat.completions.create(**request, n=3, temperature=1.5, extra_body={
            "mm_processor_kwargs": {"fps": 4.0}, "structured_outputs": {"regex": "(red|blue) [0-9]"}})
    assert all(re.fullmatch("(red|blue) [0-9]", choice.message.content) for choice in sampled.choices)


def test_a_reasoning_models_thinking_comes_apart_from_its_answer(thinking_adapter, media, tmp_path):
    """``--reasoning-parser``: each answer's thinking is ``reasoning`` (and vLLM's older
    ``reasoning_content``), its content ``content``, as `ask` parts them; streamed, the reasoning
    deltas join to the reasoning and the content deltas to the content; ``chat_template_kwargs``
    reach the template (thinking off: all content)."""
    from vidsight.api.serve import create_app
    from vidsight.api.serve.background import serve_in_background

    end = str(thinking_adapter.tokenizer.convert_tokens_to_ids("</think>"))
    sampled = dict(max_new_tokens=24, temperature=1.0, logit_bias={end: 3}, reasoning_parser="qwen3")
    off = {"enable_thinking": False}
    expected = [Asker(thinking_adapter).ask(media / "clip.mp4", Conversation.of(QUESTION, template_kwargs=kwargs),
                                            sampling=SamplingConfig(fps=4.0), generation=GenerationConfig(seed=seed, **sampled))
                for seed, kwargs in ((4, None), (5, None), (4, off))]
    assert all(e.reasoning and e.answer for e in expected[:2]) and expected[2].reasoning is None
    config = ServeConfig(model="tiny", allowed_local_media_path=media, db=tmp_path / "serve.db", reasoning_parser="qwen3")
    with serve_in_background(create_app(config, adapter=thinking_adapter)) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        for e, seed, kwargs in zip(expected, (4, 5, 4), ({}, {}, {"chat_template_kwargs": off})):
            request = dict(model="tiny", messages=video_message(str(media / "clip.mp4")), max_tokens=24,
                           temperature=1.0, seed=seed, logit_bias={end: 3},
                           extra_body={"mm_processor_kwargs": {"fps": 4.0}, **kwargs})
            message = client.chat.completions.create(**request).choices[0].message.model_dump()
            assert (message.get("reasoning"), message["content"]) == (e.reasoning, e.answer)
            assert message.get("reasoning_content") == e.reasoning
            deltas = [c.choices[0].delta.model_dump() for c in client.chat.completions.create(**request, stream=True)
                      if c.choices]
            assert "".join(d.get("reasoning") or "" for d in deltas) == (e.reasoning or "")
            assert "".join(d["content"] or "" for d in deltas) == e.answer
            assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
    # --default-chat-template-kwargs: thinking off unless a request turns it on again.
    config = dataclasses.replace(config, default_chat_template_kwargs=off)
    with serve_in_background(create_app(config, adapter=thinking_adapter)) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        for e, kwargs in ((expected[2], {}), (expected[0], {"chat_template_kwargs": {"enable_thinking": True}})):
            message = client.chat.completions.create(
                model="tiny", messages=video_message(str(media / "clip.mp4")), max_tokens=24, temperature=1.0, seed=4,
                logit_bias={end: 3}, extra_body={"mm_processor_kwargs": {"fps": 4.0}, **kwargs}).choices[0].message
            assert (message.model_dump().get("reasoning"), message.content) == (e.reasoning, e.answer)
    with pytest.raises(ConfigError, match="may not set tools"):
        dataclasses.replace(config, default_chat_template_kwargs={"tools": []})


def test_a_reasoning_parser_for_a_model_without_think_tokens_is_refused_at_the_start(tiny_adapter, tmp_path):
    from vidsight.api.serve.state import Server

    config = ServeConfig(model="tiny", db=tmp_path / "serve.db", reasoning_parser="deepseek_r1")
    with pytest.raises(ConfigError, match="reasoning-parser deepseek_r1: .* has no <think> token"):
        Server(config, adapter=tiny_adapter).start()
    with pytest.raises(ConfigError, match="unknown reasoning parser 'granite'"):
        ServeConfig(model="tiny", db=tmp_path / "serve.db", reasoning_parser="granite")


def test_a_completion_without_max_tokens_answers_until_the_context_window_is_full(tiny_model_dir, media, tmp_path):
    """vLLM's default: no ``max_tokens``, no limit but ``--max-model-len`` (prompt and answer)."""
    from vidsight.api.serve import create_app
    from vidsight.api.serve.background import serve_in_background

    sampling = SamplingConfig(fps=4.0)
    fixed = Asker(load_model(tiny_model_dir, "cpu")).ask(media / "clip.mp4", QUESTION, sampling=sampling,
                                                        generation=GenerationConfig(max_new_tokens=20, ignore_eos=True))
    window = fixed.stats.prompt_tokens + 20
    config = ServeConfig(model=str(tiny_model_dir), model_name="tiny", allowed_local_media_path=media,
                         db=tmp_path / "serve.db", packed_weights=False, max_model_len=window)
    with serve_in_background(create_app(config)) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        assert client.models.list().data[0].max_model_len == window
        options = {"mm_processor_kwargs": {"fps": 4.0}, "ignore_eos": True}
        whole = client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                               extra_body=options)
        assert whole.choices[0].message.content == fixed.answer and whole.choices[0].finish_reason == "length"
        assert whole.usage.completion_tokens == 20 and whole.usage.total_tokens == window
        # Asked for more than the window holds, an answer keeps its own limit.
        assert client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                              max_tokens=24, extra_body=options).usage.completion_tokens == 24
    full = dataclasses.replace(config, max_model_len=fixed.stats.prompt_tokens, db=tmp_path / "full.db")
    with serve_in_background(create_app(full)) as url:
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        with pytest.raises(APIStatusError, match="fill the model's context window") as refused:
            client.chat.completions.create(model="tiny", messages=video_message(str(media / "clip.mp4")),
                                           extra_body={"mm_processor_kwargs": {"fps": 4.0}})
        assert refused.value.status_code == 422
    with pytest.raises(ConfigError, match="--max-model-len must be a positive number of tokens, got 0"):
        ServeConfig(model="tiny", db=tmp_path / "serve.db", max_model_len=0)


def test_serve_ends_with_status_2_and_its_message_when_the_model_does_not_load(tiny_model_dir, tmp_path, capsys):
    """The model loads before the web server starts: a bad model or model setting is the command's
    error (exit 2, one line), not a traceback from inside the server's start (it was exit 3)."""
    from vidsight.api.cli import main

    db = ["--db", str(tmp_path / "serve.db"), "--port", "1"]
    for flags, said in [(["--model", str(tmp_path / "missing")], "missing: no such model directory"),
                        (["--model", str(tiny_model_dir), "--max-model-len", "40000"],
                         "--max-model-len must be between 1 and .* context window of 32768 tokens"),
                        (["--model", str(tiny_model_dir), "--reasoning-parser", "qwen3"], "has no <think> token")]:
        assert main(["serve", *flags, *db]) == 2
        err = capsys.readouterr().err
        assert re.search(said, err) and "Traceback" not in err


def test_an_answer_begun_is_continued_as_ask_continues_it(make_local_server, media, tiny_adapter):
    """vLLM's ``continue_final_message`` with ``add_generation_prompt: false``: the reply is what
    follows the assistant's answer begun, as `ask` gives it for the same conversation."""
    begun = "The square is"
    conversation = Conversation((Message("user", (VIDEO_PART, QUESTION)),)).continued(begun)
    want = Asker(tiny_adapter).ask(media / "clip.mp4", conversation, sampling=SamplingConfig(fps=4.0),
                                   generation=GenerationConfig(max_new_tokens=8))
    messages = [*video_message(str(media / "clip.mp4")), {"role": "assistant", "content": begun}]
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        request = dict(model="tiny", messages=messages, max_tokens=8)
        options = {"mm_processor_kwargs": {"fps": 4.0}}
        whole = client.chat.completions.create(**request, extra_body={
            **options, "continue_final_message": True, "add_generation_prompt": False})
        assert whole.choices[0].message.content == want.answer
        assert whole.usage.prompt_tokens == want.stats.prompt_tokens
        for flags, said in [({"continue_final_message": True}, "goes with add_generation_prompt: false"),
                            ({}, "an answer begun is continued with continue_final_message")]:
            with pytest.raises(APIStatusError, match=said) as refused:
                client.chat.completions.create(**request, extra_body={**options, **flags})
            assert refused.value.status_code == 400


def test_a_request_of_text_alone_is_answered_as_ask_answers_it(make_local_server, tiny_adapter, scratch):
    """No video_url part (a chat client's greeting, or the title it asks for): answered as `ask`
    answers the conversation without a video, whole, streamed and as a choice; nothing fetched."""
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hello, who are you?"}]
    talk = Conversation((Message("system", ("Answer briefly.",)), Message("user", ("Hello, who are you?",))))
    want = Asker(tiny_adapter).ask(None, talk, generation=GenerationConfig(max_new_tokens=10))
    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10)
        assert whole.choices[0].message.content == want.answer
        assert whole.usage.prompt_tokens == want.stats.prompt_tokens
        chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.answer
        scores = Asker(tiny_adapter).score(None, talk, ["yes", "no"])
        chosen = client.chat.completions.create(model="tiny", messages=messages,
                                                extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert chosen.choices[0].message.content == scores.scores[scores.best].text
    assert not os.listdir(scratch)


def test_an_image_url_is_answered_as_ask_answers_the_image(make_local_server, tiny_adapter, llava_adapter, picture,
                                                         media, scratch, tmp_path):
    """OpenAI's ``image_url`` part, as a base64 data URL (what clients send) or an allowed path:
    the answer `ask` gives about the picture shown as an image, whole and streamed; nothing left
    behind; a choice among given answers is scored after it. LLaVA-OneVision, whose processor
    tiles pictures its own way, refuses it before fetching."""
    from vidsight.api.serve import ServeConfig, create_app
    from vidsight.api.serve.background import serve_in_background

    want = Asker(tiny_adapter).ask(picture, Conversation.of(QUESTION, visual=IMAGE_PART),
                                   generation=GenerationConfig(max_new_tokens=10))
    (media / "square.png").write_bytes(picture.read_bytes())
    data = "data:image/png;base64," + base64.b64encode(picture.read_bytes()).decode()

    def message(url):
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url, "detail": "auto"}},
                                             {"type": "text", "text": QUESTION}]}]

    with make_local_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        for source in (data, "square.png"):
            whole = client.chat.completions.create(model="tiny", messages=message(source), max_tokens=10)
            assert whole.choices[0].message.content == want.answer
            assert whole.usage.prompt_tokens == want.stats.prompt_tokens
        chunks = list(client.chat.completions.create(model="tiny", messages=message(data), max_tokens=10, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.answer
        scores = Asker(tiny_adapter).score(picture, Conversation.of(QUESTION, visual=IMAGE_PART), ["red", "blue"])
        chosen = client.chat.completions.create(model="tiny", messages=message(data),
                                                extra_body={"structured_outputs": {"choice": ["red", "blue"]}})
        assert chosen.choices[0].message.content == scores.scores[scores.best].text
    assert not os.listdir(scratch)
    app = create_app(ServeConfig(model="llava", db=tmp_path / "llava.db"), adapter=llava_adapter)
    with serve_in_background(app) as url:
        with pytest.raises(APIStatusError, match="tiles pictures") as refused:
            OpenAI(base_url=f"{url}/v1", api_key="unused").chat.completions.create(
                model="llava", messages=message(data), max_tokens=2)
    assert refused.value.status_code == 400


def test_requests_sample_as_the_checkpoints_generation_config_says_unless_they_say_otherwise(tiny_model_dir, media,
                                                                                          tmp_path):
    """vLLM's ``--generation-config auto`` (the default): a request without sampling fields takes
    the checkpoint's generation_config.json temperature, top_p, top_k and max_new_tokens; its own
    fields win; ``vllm`` keeps vidsight's own defaults (greedy)."""
    import json
    import shutil

    from vidsight.api.serve import create_app
    from vidsight.api.serve.background import serve_in_background
    from vidsight.models import load_model

    checkpoint = tmp_path / "sampling"
    shutil.copytree(tiny_model_dir, checkpoint)
    recommended = {"do_sample": True, "temperature": 1.3, "top_p": 0.9, "top_k": 20, "max_new_tokens": 9}
    config_path = checkpoint / "generation_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), **recommended}))
    adapter = load_model(checkpoint, "cpu")
    assert adapter.sampling_defaults == {"temperature": 1.3, "top_p": 0.9, "top_k": 20, "max_new_tokens": 9}
    assert load_model(tiny_model_dir, "cpu").sampling_defaults == {}
    asker, sampling = Asker(adapter), SamplingConfig(fps=4.0)
    sampled = asker.ask(media / "clip.mp4", QUESTION, sampling=sampling,
                        generation=GenerationConfig(temperature=1.3, top_p=0.9, top_k=20, max_new_tokens=9))
    greedy = asker.ask(media / "clip.mp4", QUESTION, sampling=sampling, generation=GenerationConfig(max_new_tokens=9))
    assert sampled.token_ids != greedy.token_ids
    request = dict(model="tiny", messages=video_message(str(media / "clip.mp4")),
                   extra_body={"mm_processor_kwargs": {"fps": 4.0}})
    for setting, want in (("auto", sampled), ("vllm", greedy)):
        config = ServeConfig(model=str(checkpoint), model_name="tiny", allowed_local_media_path=media,
                             db=tmp_path / f"{setting}.db", packed_weights=False, generation_config=setting)
        with serve_in_background(create_app(config)) as url:
            client = OpenAI(base_url=f"{url}/v1", api_key="unused")
            answer = client.chat.completions.create(**request, **({} if setting == "auto" else {"max_tokens": 9}))
            assert answer.choices[0].message.content == want.answer
            own = client.chat.completions.create(**request, temperature=0, max_tokens=9)
            assert own.choices[0].message.content == greedy.answer   # a request's own field wins
    with pytest.raises(ConfigError, match="--generation-config is one of auto, vllm"):
        ServeConfig(model="tiny", db=tmp_path / "x.db", generation_config="file")
