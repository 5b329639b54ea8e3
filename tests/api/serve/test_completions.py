"""OpenAI-compatible chat completions: the official client gets what `vidsight ask` answers."""

import base64

import pytest
from openai import OpenAI

from vidsight.engine import Asker, GenerationConfig
from vidsight.ingest import SamplingConfig

pytestmark = pytest.mark.slow
QUESTION = "What colour is the square?"


def video_message(url: str, question: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                         {"type": "text", "text": question}]}]


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


def test_a_base64_video_is_answered_and_leaves_no_file(make_server, media, expected, scratch):
    data = "data:video/mp4;base64," + base64.b64encode((media / "clip.mp4").read_bytes()).decode()
    with make_server() as (url, _):
        client = OpenAI(base_url=f"{url}/v1", api_key="unused")
        answer = client.chat.completions.create(model="tiny", messages=video_message(data), max_tokens=12,
                                                extra_body={"media_io_kwargs": {"video": {"fps": 4.0}}})
    assert answer.choices[0].message.content == expected.answer
    assert not list(scratch.iterdir())
