"""`vidsight run-batch`: OpenAI's batch format answered offline as the server answers each request."""

import io
import json

import pytest

from vidsight.api.cli import main
from vidsight.engine import Asker, GenerationConfig
from vidsight.ingest import SamplingConfig

QUESTION = "What colour is the square?"


def request(custom_id: str, video: str, **fields) -> dict:
    body = {"model": "tiny", "max_tokens": 8, "mm_processor_kwargs": {"fps": 2.0}, **fields,
            "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}},
                                                      {"type": "text", "text": QUESTION}]}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


@pytest.fixture
def media(tmp_path, make_test_video):
    path, _ = make_test_video(width=176, height=144, duration_s=2.0)
    (tmp_path / "clip.mp4").write_bytes(path.read_bytes())
    return tmp_path


def test_each_line_is_answered_as_the_server_answers_it_in_input_order(media, tiny_model_dir, capsys):
    lines = [request("plain", "clip.mp4"), request("again", str(media / "clip.mp4")),
             request("sampled", "clip.mp4", n=2, temperature=1.0, seed=4),
             request("chosen", "clip.mp4", structured_outputs={"choice": ["red", "blue"]}),
             request("outside", "/etc/passwd"), "not json",
             {"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {}},
             request("streamed", "clip.mp4", stream=True), request("plain", "clip.mp4")]
    (media / "in.jsonl").write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                                            for line in lines))
    code = main(["run-batch", "-i", str(media / "in.jsonl"), "-o", str(media / "out.jsonl"), "--model",
                 str(tiny_model_dir), "--served-model-name", "tiny", "--allowed-local-media-path", str(media)])
    assert code == 0
    assert "9 requests, 4 answered, 5 refused" in capsys.readouterr().err
    results = [json.loads(line) for line in (media / "out.jsonl").read_text().splitlines()]
    assert [r["custom_id"] for r in results] == ["plain", "again", "sampled", "chosen", "outside", None, "embed",
                                                 "streamed", "plain"]
    statuses = [r["response"]["status_code"] for r in results]
    assert statuses == [200, 200, 200, 200, 403, 400, 400, 400, 400]
    asker = Asker(tiny_model_dir)
    sampling = SamplingConfig(fps=2.0)
    expected = asker.ask(media / "clip.mp4", QUESTION, sampling=sampling, generation=GenerationConfig(max_new_tokens=8))
    bodies = [r["response"]["body"] for r in results]
    assert bodies[0]["choices"][0]["message"]["content"] == bodies[1]["choices"][0]["message"]["content"] == expected.answer
    # The four requests about one video: one prefilled it, the others found it in the prefix cache.
    assert sorted(b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0 for b in bodies[:4]) == [False, True, True, True]
    sampled = [asker.ask(media / "clip.mp4", QUESTION, sampling=sampling,
                         generation=GenerationConfig(max_new_tokens=8, temperature=1.0, seed=4 + i)).answer for i in range(2)]
    assert [c["message"]["content"] for c in bodies[2]["choices"]] == sampled
    scored = asker.score(media / "clip.mp4", QUESTION, ["red", "blue"], sampling=sampling)
    assert bodies[3]["choices"][0]["message"]["content"] == ["red", "blue"][scored.best]
    messages = [b["error"]["message"] for b in bodies[4:]]
    assert "outside the allowed media directory" in messages[0] and "in.jsonl:6: not JSON" in messages[1]
    assert "only POST /v1/chat/completions" in messages[2] and "stream is not answered" in messages[3]
    assert "custom_id 'plain' is given twice" in messages[4]
    assert results[0]["response"]["request_id"] == bodies[0]["id"]


def test_standard_input_and_output(media, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(request("one", "clip.mp4")) + "\n"))
    monkeypatch.chdir(media)   # local videos lie under the current directory by default
    assert main(["run-batch", "-i", "-", "-o", "-", "--model", str(tiny_model_dir), "--served-model-name", "tiny"]) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert result["custom_id"] == "one" and result["response"]["status_code"] == 200


@pytest.mark.parametrize("content,said", [(None, "cannot read the requests"), ("\n\n", "no requests")])
def test_an_unusable_input_file_is_refused(tmp_path, tiny_model_dir, capsys, content, said):
    path = tmp_path / "in.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["run-batch", "-i", str(path), "-o", str(tmp_path / "out.jsonl"), "--model", str(tiny_model_dir)]) == 2
    assert said in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()
