"""Chat sessions over HTTP: the answer after the stream equals a `ChatSession` fed the same frames."""

import time

import httpx
import pytest

from vidsight.bench.serve import sse_events
from vidsight.engine import GenerationConfig
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.ingest.stream import StreamSource

pytestmark = pytest.mark.slow
QUESTION = "What colour was the square?"
SYSTEM = "You watch a shop's camera."


def test_a_session_answers_as_a_chat_session_fed_the_same_stream(make_server, media, tiny_adapter):
    """With a system message of its own: the session's, as `vidsight chat --system` gives it."""
    with ChatSession(tiny_adapter, config=ChatConfig(fps=2.0, system=SYSTEM)) as chat:
        chat.push(StreamSource(media / "clip.mp4", fps=2.0))
        expected = chat.ask(QUESTION, GenerationConfig(max_new_tokens=8))
    with make_server() as (url, _):
        opened = httpx.post(f"{url}/v1/sessions", json={"source": "clip.mp4", "fps": 2.0, "system": SYSTEM})
        assert opened.status_code == 201, opened.text
        session_id = opened.json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/sessions/{session_id}").json()["state"] == "reading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with httpx.stream("POST", f"{url}/v1/sessions/{session_id}/messages",
                          json={"question": QUESTION, "max_tokens": 8}, timeout=60) as response:
            assert response.status_code == 200
            events = list(sse_events(response.iter_lines()))
        pieces = [e["data"]["content"] for e in events if e["event"] == "text"]
        assert [e["event"] for e in events[len(pieces):]] == ["answer"]
        final = events[-1]["data"]
        assert "".join(pieces) == final["answer"] == expected.answer
        per_token = 2 * tiny_adapter.num_kv_heads * tiny_adapter.head_dim * 4 * tiny_adapter.num_layers  # float32 K and V
        device_bytes = float(final["stats"]["cached_tokens"] * per_token)
        assert f'vidsight:kv_cache_bytes{{model_name="tiny",tier="device"}} {device_bytes}' in httpx.get(f"{url}/metrics").text
        assert final["stats"]["frames_seen"] == expected.stats.frames_seen
        whole = httpx.post(f"{url}/v1/sessions/{session_id}/messages",
                           json={"question": QUESTION, "max_tokens": 8, "stream": False}, timeout=60)
        assert whole.json()["answer"] == expected.answer   # the memory holds only video between questions
        assert httpx.delete(f"{url}/v1/sessions/{session_id}").json()["state"] == "closed"
        assert httpx.get(f"{url}/v1/sessions/{session_id}").status_code == 404


@pytest.mark.parametrize("payload,status,message", [
    ({"source": "clip.mp4", "policy": "oracle"}, 422, "unknown KV policy"),
    ({"source": "/etc/passwd"}, 403, "outside the allowed media directory"),
    ({"source": "clip.mp4", "policy": "rekv", "settings": {"top_frames": 0}}, 422, "top_frames"),
    ({"source": "clip.mp4", "fps": 0}, 422, "fps"),
])
def test_bad_sessions_are_refused(make_server, payload, status, message):
    with make_server() as (url, _):
        answer = httpx.post(f"{url}/v1/sessions", json=payload)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]


def test_a_session_that_breaks_says_so(make_local_server, monkeypatch):
    def broken(self, frames):
        raise RuntimeError("a bug")

    monkeypatch.setattr(ChatSession, "pushing", broken)
    with make_local_server() as (url, _):
        session_id = httpx.post(f"{url}/v1/sessions", json={"source": "clip.mp4"}).json()["id"]
        deadline = time.monotonic() + 60
        while (record := httpx.get(f"{url}/v1/sessions/{session_id}").json())["state"] == "reading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert record["state"] == "failed" and "RuntimeError: a bug" in record["error"]


def test_a_session_with_kv_budgets_spills_to_the_servers_disk_tier_and_answers_the_same(make_local_server, tmp_path):
    disk = tmp_path / "kv"
    answers = {}
    with make_local_server(kv_disk=disk) as (url, _):
        for name, budgets in (("plain", {}), ("tiered", {"kv_device_budget": 100, "kv_host_budget": 60})):
            opened = httpx.post(f"{url}/v1/sessions", json={"source": "clip.mp4", "fps": 2.0, **budgets})
            assert opened.status_code == 201, opened.text
            session_id = opened.json()["id"]
            deadline = time.monotonic() + 60
            while (record := httpx.get(f"{url}/v1/sessions/{session_id}").json())["state"] == "reading":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            answers[name] = httpx.post(f"{url}/v1/sessions/{session_id}/messages",
                                       json={"question": QUESTION, "max_tokens": 8, "stream": False}, timeout=60).json()
            if name == "tiered":
                tiers = record["tokens_by_tier"]
                assert tiers["device"] <= 100 and tiers["host"] <= 60 and tiers["disk"] > 0
                assert len(list(disk.iterdir())) == 1   # the session's own directory
            httpx.delete(f"{url}/v1/sessions/{session_id}")
        assert not list(disk.iterdir())   # closing the session removed it
        refused = httpx.post(f"{url}/v1/sessions", json={"source": "clip.mp4", "kv_disk": "/tmp"})
        assert refused.status_code == 422   # where the disk tier lives is the server's choice
    assert answers["tiered"]["answer"] == answers["plain"]["answer"]


def test_a_sessions_message_takes_the_completions_sampling_and_format_fields(make_local_server, media, tiny_adapter):
    """A message's temperature, seed, stop and answer format (vLLM's structured outputs, OpenAI's
    response_format): its answer is a `ChatSession`'s under the same `GenerationConfig`."""
    import json

    from vidsight.engine.config import AnswerFormat

    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "blue"]}}, "required": ["colour"],
              "additionalProperties": False}
    settings = [({"structured_outputs": {"json": schema, "disable_any_whitespace": True}},
                 dict(answer_format=AnswerFormat("json_schema", json.dumps(schema), any_whitespace=False))),
                ({"response_format": {"type": "json_object"}, "temperature": 1.2, "seed": 5},
                 dict(answer_format=AnswerFormat("json_schema", '{"type": "object"}'), temperature=1.2, seed=5)),
                ({"temperature": 0.9, "top_p": 0.8, "seed": 2, "stop": ["x"]},
                 dict(temperature=0.9, top_p=0.8, seed=2, stop=("x",))),
                # The completion's other sampling fields (`SamplingFields`), which sessions share.
                ({"temperature": 1.1, "top_k": 40, "min_p": 0.01, "min_tokens": 3, "seed": 4,
                  "repetition_penalty": 1.2, "frequency_penalty": 0.5, "presence_penalty": 0.3,
                  "logit_bias": {"101": 5.0}},
                 dict(temperature=1.1, top_k=40, min_p=0.01, min_tokens=3, seed=4, repetition_penalty=1.2,
                      frequency_penalty=0.5, presence_penalty=0.3, logit_bias={"101": 5.0}))]
    expected = []
    with ChatSession(tiny_adapter, config=ChatConfig(fps=2.0)) as chat:
        chat.push(StreamSource(media / "clip.mp4", fps=2.0))
        for _, fields in settings:
            expected.append(chat.ask(QUESTION, GenerationConfig(max_new_tokens=40, **fields)).answer)
    assert json.loads(expected[0]) in ({"colour": "red"}, {"colour": "blue"})
    with make_local_server() as (url, _):
        session_id = httpx.post(f"{url}/v1/sessions", json={"source": "clip.mp4", "fps": 2.0}).json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/sessions/{session_id}").json()["state"] == "reading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for (fields, _), want in zip(settings, expected):
            answer = httpx.post(f"{url}/v1/sessions/{session_id}/messages", timeout=60,
                                json={"question": QUESTION, "max_tokens": 40, "stream": False, **fields})
            assert answer.json()["answer"] == want, fields
        for bad, status, said in [({"structured_outputs": {"choice": ["a"]}}, 400, "choice is not supported"),
                                  ({"structured_outputs": {"regex": "[a-"}}, 422, "regex is not valid")]:
            refused = httpx.post(f"{url}/v1/sessions/{session_id}/messages", timeout=60,
                                 json={"question": QUESTION, "stream": False, **bad})
            assert refused.status_code == status and said in refused.json()["error"]["message"], refused.text


def test_a_reasoning_models_session_answers_with_its_thinking_apart(thinking_adapter, media, tmp_path):
    """On a server with ``--reasoning-parser``, a session's answer is parted as `ChatSession.ask`
    parts it; streamed, its ``text`` events carry ``reasoning`` and ``content`` pieces joining to them."""
    from vidsight.api.serve import ServeConfig, create_app
    from vidsight.api.serve.background import serve_in_background

    end = thinking_adapter.tokenizer.convert_tokens_to_ids("</think>")
    fields = {"max_tokens": 24, "temperature": 1.0, "seed": 4, "logit_bias": {str(end): 3}}
    with ChatSession(thinking_adapter, config=ChatConfig(fps=2.0)) as chat:
        chat.push(StreamSource(media / "clip.mp4", fps=2.0))
        expected = chat.ask(QUESTION, GenerationConfig(max_new_tokens=24, temperature=1.0, seed=4, logit_bias={end: 3},
                                                       reasoning_parser="qwen3"))
    assert expected.reasoning and expected.answer
    config = ServeConfig(model="tiny", allowed_local_media_path=media, db=tmp_path / "serve.db", reasoning_parser="qwen3")
    with serve_in_background(create_app(config, adapter=thinking_adapter)) as url:
        session_id = httpx.post(f"{url}/v1/sessions", json={"source": "clip.mp4", "fps": 2.0}).json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/v1/sessions/{session_id}").json()["state"] == "reading":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        whole = httpx.post(f"{url}/v1/sessions/{session_id}/messages", timeout=60,
                           json={"question": QUESTION, "stream": False, **fields}).json()
        with httpx.stream("POST", f"{url}/v1/sessions/{session_id}/messages", timeout=60,
                          json={"question": QUESTION, **fields}) as response:
            events = list(sse_events(response.iter_lines()))
    assert (whole["reasoning"], whole["answer"]) == (expected.reasoning, expected.answer)
    texts = [e["data"] for e in events if e["event"] == "text"]
    assert "".join(t.get("reasoning", "") for t in texts) == expected.reasoning
    assert "".join(t.get("content", "") for t in texts) == expected.answer
    assert events[-1]["data"]["reasoning"] == expected.reasoning
