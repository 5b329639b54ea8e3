"""Video the command line reads besides files: standard input (``-``) and http(s) URLs, each read
as the file it carries."""

import functools
import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from vidsight.api.cli import main

from tests.ingest.test_stream import pipe_of

WATCH = ["--query", "Is there a red object in the zone? Answer Yes or No.", "--window", "2", "--stride", "0.5",
         "--prune-tau", "0.25", "--json"]


class _Stdin:
    """Standard input as a shell pipeline gives it: ``buffer`` a pipe (or a terminal, ``tty``)."""

    def __init__(self, buffer, tty: bool = False):
        self.buffer, self._tty = buffer, tty

    def isatty(self) -> bool:
        return self._tty


def _lines(capsys) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("stages_s", "lag_s")}
            for line in capsys.readouterr().out.splitlines()]


def test_ask_answers_a_video_piped_to_its_standard_input(make_test_video, tiny_model_dir, tmp_path):
    """A real pipeline (``... | vidsight ask - ...``): the video read whole into a temporary file,
    then answered as the file is, and the temporary file removed."""
    path, _ = make_test_video(".mp4", width=224, height=168, duration_s=3.0, fps=8, gop=8, seed=4)
    args = ["ask", "-", "What colour is the square?", "--model", str(tiny_model_dir), "--max-new-tokens", "4",
            "--json"]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    piped = subprocess.run([sys.executable, "-m", "vidsight.api.cli", *args], input=path.read_bytes(),
                           capture_output=True, timeout=600, env={**os.environ, "TMPDIR": str(scratch)})
    assert piped.returncode == 0, piped.stderr.decode()
    assert list(scratch.iterdir()) == []
    direct = subprocess.run([sys.executable, "-m", "vidsight.api.cli", *args[:1], str(path), *args[2:]],
                            capture_output=True, timeout=600)
    assert direct.returncode == 0, direct.stderr.decode()
    a, b = json.loads(piped.stdout), json.loads(direct.stdout)
    assert a["answer"] == b["answer"]
    assert {k: a["stats"][k] for k in ("frames", "visual_tokens", "generated_tokens")} == \
        {k: b["stats"][k] for k in ("frames", "visual_tokens", "generated_tokens")}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="the system does not name a descriptor's file")
def test_standard_input_redirected_from_a_file_is_read_in_place(make_test_video, tmp_path):
    """``vidsight probe - < clip.mp4``: the file itself, not a copy of it (a piped one is copied)."""
    path, _ = make_test_video(".mp4", width=128, height=96, duration_s=1.0)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = functools.partial(subprocess.run, [sys.executable, "-m", "vidsight.api.cli", "probe", "-", "--json"],
                            capture_output=True, timeout=120, env={**os.environ, "TMPDIR": str(scratch)})
    with open(path, "rb") as redirected:
        in_place = run(stdin=redirected)
    piped = run(input=path.read_bytes())
    assert in_place.returncode == piped.returncode == 0, (in_place.stderr, piped.stderr)
    a, b = json.loads(in_place.stdout), json.loads(piped.stdout)
    assert a.pop("path") == str(path.resolve()) and b.pop("path").endswith("/stdin") and a == b
    assert list(scratch.iterdir()) == []


def test_watch_reads_standard_input_as_the_file(make_test_video, tiny_model_dir, capsys, monkeypatch):
    path, _ = make_test_video(".ts", width=224, height=168, duration_s=4.0, fps=8, gop=8, seed=6)
    assert main(["watch", str(path), "--model", str(tiny_model_dir), *WATCH]) == 0
    expected = _lines(capsys)
    with pipe_of(path) as pipe:
        monkeypatch.setattr(sys, "stdin", _Stdin(pipe))
        assert main(["watch", "-", "--model", str(tiny_model_dir), *WATCH]) == 0
    assert _lines(capsys) == expected and len(expected) >= 4


def test_chat_reads_standard_input_with_its_questions_from_a_file(make_test_video, tiny_model_dir, tmp_path,
                                                                  capsys, monkeypatch):
    path, _ = make_test_video(".ts", width=224, height=168, duration_s=4.0, fps=8, gop=8, seed=6)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"time_s": 3.0, "question": "What colour is the square?"}) + "\n")
    chat = ["--model", str(tiny_model_dir), "--questions", str(questions), "--max-new-tokens", "2", "--json"]
    assert main(["chat", str(path), *chat]) == 0
    expected = _lines(capsys)
    with pipe_of(path) as pipe:
        monkeypatch.setattr(sys, "stdin", _Stdin(pipe))
        assert main(["chat", "-", *chat]) == 0
    records = _lines(capsys)
    answers = [r for r in records if r["type"] == "answer"]
    assert len(answers) == 1 and records[-1] == expected[-1] == {"type": "end", "frames_seen": 4, "frames_dropped": 0,
                                                                             "damaged_packets": 0}
    assert answers[0]["answer"] == [r for r in expected if r["type"] == "answer"][0]["answer"]


@pytest.mark.parametrize("command, stdin, message", [
    (["ask", "-", "What?"], b"", "<stdin>: the pipe gave no bytes"),
    (["ask", "-", "What?"], None, "standard input is a terminal"),
    (["watch", "-", "--query", "Yes?"], None, "standard input is a terminal"),
    (["probe", "-"], b"not a video at all", "stdin: not a readable video file"),
    (["chat", "-"], b"", "give them with --questions"),
    (["watch", "-", "--query", "Yes?", "--follow", "2"], b"x", "a pipe is read as it comes"),
])
def test_what_cannot_be_read_from_a_pipe_is_refused_naming_it(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                               command, stdin, message):
    if stdin is None:
        monkeypatch.setattr(sys, "stdin", _Stdin(None, tty=True))
    else:
        (tmp_path / "in").write_bytes(stdin)
        monkeypatch.setattr(sys, "stdin", _Stdin(pipe_of(tmp_path / "in")))
    model = [] if command[0] == "probe" else ["--model", str(tiny_model_dir)]
    assert main([*command, *model]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.fixture
def web_root(tmp_path):
    """``(root directory, base URL)``: a loopback HTTP server serving the directory's files."""
    root = tmp_path / "web"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_ask_and_probe_download_an_http_url_and_answer_as_for_the_file(make_test_video, tiny_model_dir, web_root,
                                                                      capsys):
    path, _ = make_test_video(".mp4", width=224, height=168, duration_s=3.0, fps=8, gop=8, seed=4)
    root, base = web_root
    (root / "clip.mp4").write_bytes(path.read_bytes())
    answers = []
    for video in (str(path), f"{base}/clip.mp4"):
        assert main(["ask", video, "What colour is the square?", "--model", str(tiny_model_dir),
                     "--max-new-tokens", "4", "--json"]) == 0
        record = json.loads(capsys.readouterr().out)
        answers.append((record["answer"], record["stats"]["visual_tokens"]))
    assert answers[0] == answers[1]
    assert main(["probe", f"{base}/clip.mp4", "--json"]) == 0
    probed = json.loads(capsys.readouterr().out)
    assert main(["probe", str(path), "--json"]) == 0
    direct = json.loads(capsys.readouterr().out)
    assert probed.pop("path").endswith("clip.mp4") and probed == {k: v for k, v in direct.items() if k != "path"}


@pytest.mark.parametrize("url, message", [
    ("{base}/missing.mp4", "{base}/missing.mp4: the server answered 404"),
    ("{base}/empty.mp4", "the server sent no bytes"),
    ("{base}/notes.txt", "notes.txt: not a readable video file"),
    ("http://127.0.0.1:9/clip.mp4", "http://127.0.0.1:9/clip.mp4: cannot fetch"),
    ("rtsp://127.0.0.1/cam", "a live stream has no end to answer about"),
    ("ftp://127.0.0.1/clip.mp4", "unsupported URL scheme"),
])
def test_a_url_ask_cannot_read_is_refused_naming_it(web_root, tiny_model_dir, capsys, url, message):
    root, base = web_root
    (root / "empty.mp4").write_bytes(b"")
    (root / "notes.txt").write_text("not a video")
    assert main(["ask", url.format(base=base), "What?", "--model", str(tiny_model_dir)]) == 2
    err = capsys.readouterr().err
    assert message.format(base=base) in err and "Traceback" not in err
