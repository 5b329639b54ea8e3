"""A server killed with SIGKILL mid-watch and started again on the same database resumes the watch;
a client reading its events across the kill sees every id once, none missing, and the windows an
uninterrupted run judges."""

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.api.serve.test_watches import SETTINGS, cli_lines, without_timing
from tests.api.serve.conftest import QUERY
from vidsight.bench.serve import sse_events

pytestmark = pytest.mark.slow


def start_server(model, media, db, attempts: int = 3) -> tuple[subprocess.Popen, str]:
    """`vidsight serve` on a free port: the process and its URL once healthy. A port found free can
    be taken before the server binds it (it exits then), so it is started again on another."""
    for _ in range(attempts):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "vidsight", "serve", "--model", str(model), "--device", "cpu",
                                   "--allowed-local-media-path", str(media), "--db", str(db), "--port", str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return server, f"http://127.0.0.1:{port}"
            except httpx.HTTPError:
                time.sleep(0.2)
        server.kill()
        server.wait()
    raise AssertionError("the server did not start")


def test_a_watch_survives_sigkill_and_its_events_have_no_gap_and_no_repeat(media, twelve_second_video, tmp_path,
                                                                         capsys, tiny_model_dir):
    expected = [r for r in cli_lines(capsys, twelve_second_video, tiny_model_dir) if r["type"] == "window"]
    db = tmp_path / "serve.db"
    server, url = start_server(tiny_model_dir, media, db)
    events = []
    try:
        spec = {"source": twelve_second_video.name, "query": QUERY, **SETTINGS, "realtime": True}
        watch_id = httpx.post(f"{url}/v1/watches", json=spec, timeout=60).json()["id"]
        with httpx.stream("GET", f"{url}/v1/watches/{watch_id}/events", timeout=120) as response:
            for event in sse_events(response.iter_lines()):
                events.append(event)
                if len(events) == 3:
                    os.kill(server.pid, signal.SIGKILL)   # mid-watch, mid-stream: no shutdown at all
                    server.wait()
                    break
        server, url = start_server(tiny_model_dir, media, db)   # a port of its own: the client reconnects there
        assert httpx.get(f"{url}/v1/watches/{watch_id}", timeout=60).json()["state"] in ("running", "done")
        with httpx.stream("GET", f"{url}/v1/watches/{watch_id}/events", headers={"Last-Event-ID": events[-1]["id"]},
                          timeout=120) as response:
            events += list(sse_events(response.iter_lines()))
    finally:
        server.kill()
        server.wait()
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["event"] == "end"
    windows = [e["data"] for e in events if e["event"] == "window"]
    assert [without_timing(w) for w in windows] == [without_timing(r) for r in expected]
