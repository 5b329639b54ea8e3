"""Watches over HTTP: SSE events equal `vidsight watch --json`, resumable by Last-Event-ID and
across a server restart without loss or duplicates; alerts reach a webhook; metrics move."""

import http.server
import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.serve.conftest import QUERY
from vidsight.api.cli import main
from vidsight.bench.serve import sse_events

pytestmark = pytest.mark.slow
SETTINGS = {"window_s": 4.0, "stride": 0.25, "fps": 2.0, "alert_after": 1, "prune_tau": 0.25, "prune_alpha": 0.004,
            "prune_rule": "persistent"}


def read_events(url: str, watch_id: str, last: int | None = None) -> list[dict]:
    """SSE events of a watch, parsed, until the stream ends."""
    headers = {"Last-Event-ID": str(last)} if last is not None else {}
    with httpx.stream("GET", f"{url}/v1/watches/{watch_id}/events", headers=headers, timeout=120) as response:
        assert response.status_code == 200
        return list(sse_events(response.iter_lines()))


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("stages_s", "lag_s")}


def cli_lines(capsys, source, tiny_model_dir) -> list[dict]:
    code = main(["watch", str(source), "--query", QUERY, "--model", str(tiny_model_dir), "--window", "4",
                 "--stride", "0.25", "--fps", "2", "--alert-after", "1", "--prune-tau", "0.25", "--prune-alpha", "0.004",
                 "--prune-rule", "persistent", "--json", "--device", "cpu"])
    assert code == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_sse_events_equal_the_cli_and_resume_from_last_event_id(make_server, media, capsys, tiny_model_dir):
    expected = cli_lines(capsys, media / "clip.mp4", tiny_model_dir)
    with make_server() as (url, _):
        created = httpx.post(f"{url}/v1/watches", json={"source": "clip.mp4", "query": QUERY, **SETTINGS})
        assert created.status_code == 201, created.text
        watch_id = created.json()["id"]
        events = read_events(url, watch_id)
        assert [e["event"] for e in events] == [r["type"] for r in expected]
        assert [without_timing(e["data"]) for e in events] == [without_timing(r) for r in expected]
        assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
        # A reader that saw the first two events reconnects: it gets the rest, once each.
        again = read_events(url, watch_id, last=2)
        assert [e["id"] for e in again] == [e["id"] for e in events[2:]]
        assert httpx.get(f"{url}/v1/watches/{watch_id}").json()["state"] == "done"
        assert httpx.get(f"{url}/v1/watches/{watch_id}/frame.jpg").content[:2] == b"\xff\xd8"
        refused = httpx.post(f"{url}/v1/watches", json={"source": "clip.mp4", "query": QUERY, **SETTINGS,
                                                        "prune_rule": "median"})
        assert refused.status_code == 422 and "motion rule" in refused.text
        refused = httpx.post(f"{url}/v1/watches", json={"source": "clip.mp4", "query": QUERY, **SETTINGS,
                                                        "refresh": "anchors", "refresh_share": 0.3})
        assert refused.status_code == 422 and "deviation refresh only" in refused.text


def test_a_restart_mid_file_resumes_and_stores_what_an_uninterrupted_run_does(make_local_server, twelve_second_video,
                                                                              capsys, tiny_model_dir):
    expected = [r for r in cli_lines(capsys, twelve_second_video, tiny_model_dir) if r["type"] == "window"]
    spec = {"source": twelve_second_video.name, "query": QUERY, **SETTINGS, "realtime": True}
    with make_local_server() as (url, server):
        watch_id = httpx.post(f"{url}/v1/watches", json=spec).json()["id"]
        wait_for(lambda: len(server.store.verdicts(watch_id)) >= 3)
    from vidsight.api.serve.store import Store

    stopped_at = len(Store(server.config.db).verdicts(watch_id))
    assert 3 <= stopped_at < len(expected)
    with make_local_server() as (url, server):
        assert httpx.get(f"{url}/v1/watches/{watch_id}").json()["state"] == "running"
        events = read_events(url, watch_id)
    windows = [e["data"] for e in events if e["event"] == "window"]
    assert [without_timing(w) for w in windows] == [without_timing(r) for r in expected]
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["event"] == "end"


def test_alerts_reach_the_webhook_and_metrics_move(make_local_server, media, monkeypatch):
    from vidsight.engine.watch import Watcher

    judging = Watcher.judging

    def every_window_yes(self, frames, number=0):   # the random model never says Yes; the rule is tested elsewhere
        verdict = yield from judging(self, frames, number)
        verdict.yes = True
        return verdict

    monkeypatch.setattr(Watcher, "judging", every_window_yes)
    received = []

    class Hook(http.server.BaseHTTPRequestHandler):
        calls = 0

        def do_POST(self):
            Hook.calls += 1
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if Hook.calls == 1:      # the first delivery fails: the sender must retry
                self.send_response(503)
            else:
                received.append(payload)
                self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    with make_local_server(allowed_webhook_networks=("127.0.0.0/8",)) as (url, server):
        def scrape() -> dict:
            families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
            return {s.name: s.value for f in families for s in f.samples if not s.labels.get("le")}

        before = scrape()
        spec = {"source": "clip.mp4", "query": QUERY, **SETTINGS,
                "webhook_url": f"http://127.0.0.1:{hook.server_address[1]}/alerts"}
        watch_id = httpx.post(f"{url}/v1/watches", json=spec).json()["id"]
        events = read_events(url, watch_id)
        alerts = [e["data"] for e in events if e["event"] == "alert"]
        deadline = time.monotonic() + 30
        while len(received) < len(alerts) and time.monotonic() < deadline:
            time.sleep(0.1)
        after = scrape()
    hook.shutdown()
    windows = sum(e["event"] == "window" for e in events)
    assert len(alerts) == 1 and windows >= 1   # a run of Yes windows alerts once
    assert after["vidsight:windows_judged_total"] - before["vidsight:windows_judged_total"] == windows
    assert after["vidsight:watch_lag_seconds_count"] - before["vidsight:watch_lag_seconds_count"] == windows
    assert after["vidsight:windows_skipped_total"] == before["vidsight:windows_skipped_total"]   # a file
    assert after["vidsight:frames_decoded_total"] > before["vidsight:frames_decoded_total"]
    assert after["vidsight:alerts_total"] - before["vidsight:alerts_total"] == len(alerts)
    assert sorted(a["window"] for a in received) == [a["window"] for a in alerts]
    assert all(a["watch_id"] == watch_id for a in received)


def wait_for(condition, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_live_source_resumes_from_now_numbered_after_the_stored_windows(make_local_server, media, make_test_video):
    import functools

    path, _ = make_test_video(".ts", width=160, height=120, fps=8, duration_s=24.0, gop=16, bframes=False, seed=5)
    (media / "live.ts").write_bytes(path.read_bytes())   # MPEG-TS: FFmpeg reads it over HTTP as a stream

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(media))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *args: None
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    spec = {"source": f"http://127.0.0.1:{files.server_address[1]}/live.ts", "query": QUERY, **SETTINGS,
            "realtime": True}
    try:
        with make_local_server(allowed_stream_networks=("127.0.0.0/8",)) as (url, server):
            watch_id = httpx.post(f"{url}/v1/watches", json=spec).json()["id"]
            wait_for(lambda: len(server.store.verdicts(watch_id)) >= 3)
        from vidsight.api.serve.store import Store

        before = len(Store(server.config.db).verdicts(watch_id))
        with make_local_server(allowed_stream_networks=("127.0.0.0/8",)) as (url, server):
            wait_for(lambda: len(server.store.verdicts(watch_id)) >= before + 3)
            httpx.delete(f"{url}/v1/watches/{watch_id}", timeout=60)
            windows = [v["window"] for v in server.store.verdicts(watch_id)]
    finally:
        files.shutdown()
    assert windows == list(range(len(windows))) and len(windows) >= before + 3


def test_a_watch_that_breaks_ends_with_an_error_event(make_local_server, monkeypatch):
    from vidsight.engine.watch import Watcher

    def broken(self, frames, number=0):
        raise RuntimeError("a bug")
        yield  # stepped work, as the real one

    monkeypatch.setattr(Watcher, "judging", broken)
    with make_local_server() as (url, _):
        watch_id = httpx.post(f"{url}/v1/watches", json={"source": "clip.mp4", "query": QUERY, **SETTINGS}).json()["id"]
        events = read_events(url, watch_id)
        record = httpx.get(f"{url}/v1/watches/{watch_id}").json()
    assert [e["event"] for e in events] == ["error"] and "RuntimeError: a bug" in events[0]["data"]["message"]
    assert record["state"] == "failed"


def test_a_source_that_never_comes_back_ends_failed_with_its_last_error(make_local_server, tmp_path):
    import functools

    (tmp_path / "page.html").write_text("<html>" + "no video here " * 500 + "</html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *args: None
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{files.server_address[1]}"
    try:
        with make_local_server(allowed_stream_networks=("127.0.0.1",), source_retries=1) as (url, server):
            ids = [httpx.post(f"{url}/v1/watches", json={"source": f"{base}/{name}", "query": QUERY, **SETTINGS}
                              ).json()["id"] for name in ("missing.ts", "page.html")]
            ends = [read_events(url, watch_id)[-1] for watch_id in ids]
            records = [server.store.watch(watch_id) for watch_id in ids]
    finally:
        files.shutdown()
    assert [e["event"] for e in ends] == ["error", "error"] and [r["state"] for r in records] == ["failed"] * 2
    assert "failed 2 times in a row" in ends[0]["data"]["message"]   # a 404 may come back: retried once
    assert "not a video stream" in ends[1]["data"]["message"]          # an HTML page never will: at once
    assert records[0]["error"] == ends[0]["data"]["message"]
