"""Refusals: API key, the media allow-list, size caps, slow fetches, malformed requests; none
leaves a temporary file behind."""

import contextlib
import http.server
import os
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.slow


def body(url: str, question: str = "What colour is the square?") -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                                      {"type": "text", "text": question}]}],
            "max_tokens": 4}


@pytest.fixture
def slow_http(media):
    """A local HTTP server: /slow answers a byte a second, /big declares no length and sends more than
    any cap, /NAME serves the media directory's file NAME."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/slow":
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                for _ in range(100):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(1)
            elif self.path == "/big":
                self.send_response(200)
                self.end_headers()   # no length: the cap is found while reading
                try:
                    for _ in range(64):
                        self.wfile.write(b"x" * 65536)
                except OSError:
                    return
            else:
                send_file(self, media / self.path.rsplit("/", 1)[-1])

        def log_message(self, *args):
            pass

    with serving(Handler) as port:
        yield f"http://127.0.0.1:{port}"


def send_file(handler: http.server.BaseHTTPRequestHandler, path) -> None:
    """Answer ``handler``'s request with the file at ``path``, its length declared."""
    data = path.read_bytes()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


@contextlib.contextmanager
def serving(handler, host: str = "127.0.0.1"):
    """An HTTP server with ``handler`` on a free port of ``host``, in a thread; yields the port."""
    server = http.server.ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()


# One server for the key test, the caps and both fetch tests (on Ray, one deployment: each takes
# 12 s). The cap lets clip.mp4 (45 kB) in and keeps long.mp4 (240 kB) out.
CAP_BYTES = 2**16
FETCHING = {"api_key": "sesame", "fetch_timeout_s": 1.0, "allowed_media_domains": ("127.0.0.1",),
            "max_video_bytes": CAP_BYTES}
KEY = {"Authorization": "Bearer sesame"}


def test_the_api_key_is_required_on_v1_only(make_server, media):
    with make_server(**FETCHING) as (url, _):
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        answer = httpx.get(f"{url}/v1/models", headers=KEY)
        assert answer.status_code == 200
        refused = httpx.post(f"{url}/v1/chat/completions", json=body(str(media / "clip.mp4")))
        assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
        assert httpx.get(f"{url}/health").status_code == 200


def test_local_paths_outside_the_allow_list_are_forbidden(make_server, media, tmp_path, scratch):
    outside = tmp_path / "secret.mp4"
    outside.write_bytes((media / "clip.mp4").read_bytes())
    link = media / "escape.mp4"
    link.symlink_to(outside)
    try:
        with make_server() as (url, _):
            for path in (str(outside), f"{media}/../{outside.name}", "file://" + str(outside), str(link), "/etc/passwd"):
                answer = httpx.post(f"{url}/v1/chat/completions", json=body(path), timeout=60)
                assert answer.status_code == 403, path
                assert "outside the allowed media directory" in answer.json()["error"]["message"]
    finally:
        link.unlink()
    assert not os.listdir(scratch)


def test_without_an_allow_list_no_local_path_is_served(make_local_server, media):
    # The replica's own check (Ray forwards the request as is): one backend proves it.
    with make_local_server(allowed_local_media_path=None) as (url, _):
        answer = httpx.post(f"{url}/v1/chat/completions", json=body(str(media / "clip.mp4")))
        assert answer.status_code == 403 and "--allowed-local-media-path" in answer.json()["error"]["message"]


def test_videos_and_bodies_over_the_cap_get_413(make_server, media, long_video, slow_http, scratch):
    assert (media / "clip.mp4").stat().st_size <= CAP_BYTES < long_video.stat().st_size
    with make_server(**FETCHING) as (url, _):
        for source in (str(long_video), f"{slow_http}/{long_video.name}", f"{slow_http}/big"):
            answer = httpx.post(f"{url}/v1/chat/completions", json=body(source), headers=KEY, timeout=60)
            assert answer.status_code == 413, source
        huge = httpx.post(f"{url}/v1/chat/completions", content=b"{" + b" " * (CAP_BYTES * 2 + 2**20) + b"}",
                          headers={**KEY, "Content-Type": "application/json"}, timeout=60)
        assert huge.status_code == 413
    assert not os.listdir(scratch)


def test_a_fetch_slower_than_the_timeout_is_a_clean_error(make_server, slow_http, scratch):
    with make_server(**FETCHING) as (url, _):
        started = time.monotonic()
        answer = httpx.post(f"{url}/v1/chat/completions", json=body(f"{slow_http}/slow"), headers=KEY, timeout=60)
        assert answer.status_code == 504 and "not fetched within 1 s" in answer.json()["error"]["message"]
        assert time.monotonic() - started < 10
    assert not os.listdir(scratch)


def test_a_fetched_video_is_answered(make_server, slow_http, scratch):
    with make_server(**FETCHING) as (url, _):
        answer = httpx.post(f"{url}/v1/chat/completions", json=body(f"{slow_http}/clip.mp4"), headers=KEY,
                            timeout=120)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] >= 1
    assert not os.listdir(scratch)


@pytest.mark.parametrize("payload,status,message", [
    ({"messages": "hello"}, 422, "messages"),
    ({"messages": []}, 422, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "video_url"}]}]}, 422, "video_url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 422, "image_url"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, 400, "input_audio parts are not supported"),
    (body("data:video/mp4;base64,AAAA") | {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:video/mp4;base64,AAAA"}}, {"type": "text", "text": "Hi?"}]}]},
     400, "a data URL must be data:image/...;base64,"),
    ({**body("clip.mp4"), "max_tokens": 0}, 422, "max_tokens"),
    ({**body("clip.mp4"), "mm_processor_kwargs": {"fsp": 2}}, 422, "unknown video settings: fsp"),
    ({**body("clip.mp4"), "mm_processor_kwargs": {"fps": -1}}, 422, "fps must be a positive number"),
    ({**body("clip.mp4"), "model": "gpt-4o"}, 404, "does not exist"),
    (body("ftp://host/clip.mp4"), 400, "unsupported URL scheme"),
    (body("data:video/mp4;base64,@@@"), 400, "not valid base64"),
    (body("data:video/mp4;base64,bm90IGEgdmlkZW8="), 400, "the video_url: not a readable video file"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
                                                {"type": "text", "text": "What?"}]}]}, 400, "the image_url: file is empty"),
    (body("missing.mp4"), 400, "missing.mp4"),
])
def test_malformed_requests_get_a_message(make_server, payload, status, message, scratch):
    with make_server() as (url, _):
        answer = httpx.post(f"{url}/v1/chat/completions", json=payload, timeout=60)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]
    assert str(scratch) not in answer.text   # an uploaded file is named by its part, not the server's path
    assert not os.listdir(scratch)


# Refused while the request is read, before the video is touched: one server, not one per deployment.
@pytest.mark.parametrize("payload,status,message", [
    ({"messages": [*body("clip.mp4")["messages"], {"role": "assistant", "content": "red"},
                   *body("other.mp4", "And this one?")["messages"]]}, 400,
     "at most one video_url or image_url part, got 2"),
    ({"messages": [*body("clip.mp4")["messages"], {"role": "assistant", "content": "red"}]}, 400,
     "the last message must be the user's (or a tool's result)"),
    ({"messages": [{"role": "user", "content": "Look."}, {"role": "assistant", "content": body("clip.mp4")["messages"][0]["content"]},
                   {"role": "user", "content": "What colour?"}]}, 400, "the video must be in a user message"),
    ({**body("clip.mp4"), "top_logprobs": 2}, 422, "top_logprobs needs logprobs: true"),
    ({**body("clip.mp4"), "logprobs": True, "top_logprobs": 21}, 422, "top_logprobs"),
    ({**body("clip.mp4"), "response_format": {"type": "xml"}}, 400, "'xml' is not supported"),
    ({**body("clip.mp4"), "structured_outputs": {"regex": "[a-"}}, 422, "regex is not valid"),
    ({**body("clip.mp4"), "tools": [{"type": "function", "function": {"name": "f"}}]}, 400,
     '"auto" tool choice needs a server started with --enable-auto-tool-choice'),
    ({**body("clip.mp4"), "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required",
      "structured_outputs": {"regex": "a"}}, 400, "tool_choice required holds the answer to the calls"),
    ({**body("clip.mp4"), "tool_choice": "required"}, 400, "tool_choice needs tools"),
    ({**body("clip.mp4"), "logit_bias": {"42": 101}}, 422, "biases in [-100, 100]"),
    ({**body("clip.mp4"), "logit_bias": {"99999999": 1}}, 422, "has no token 99999999"),
    ({**body("clip.mp4"), "presence_penalty": 3}, 422, "presence_penalty"),
])
def test_malformed_conversations_and_generation_fields_get_a_message(make_local_server, payload, status, message,
                                                                    scratch):
    with make_local_server() as (url, _):
        answer = httpx.post(f"{url}/v1/chat/completions", json=payload, timeout=60)
    assert answer.status_code == status, answer.text
    assert message in answer.json()["error"]["message"]
    assert not os.listdir(scratch)
