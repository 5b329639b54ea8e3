"""`vidsight bench serve --soak SECONDS`: a server process under mixed load for a long while, and
whether it gives back what it took.

The server runs as its own process (`vidsight serve` on loopback, its own temporary directory), so
its resident memory, open file descriptors and threads are its own, read from ``/proc``. Clients
at once: streamed and whole chat completions, real-time watches whose event streams are dropped at
a random point, chat sessions asked a question and closed, and malformed or refused requests
(broken JSON, unknown fields, a private address, a file outside the allow-list). The report gives
the answers by status (5xx named), the server's RSS over time, and its RSS, descriptors, threads
and temporary directories after the warm-up (the first fifth) against after the load (once the
server has settled).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from vidsight.bench.serve import sse_events

SETTLE_S = 10.0          # after the load: watches stop at a window boundary, sessions close
SAMPLE_EVERY_S = 5.0
QUESTION = "What colour is the square?"


def process_sample(pid: int, scratch: Path) -> dict:
    """The server's resident memory, descriptors, threads and temporary entries, now."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = {line.split(":")[0]: line.split(":")[1].split() for line in status if ":" in line}
    return {"t": time.monotonic(), "rss_bytes": int(fields["VmRSS"][0]) * 1024, "threads": int(fields["Threads"][0]),
            "fds": len(os.listdir(f"/proc/{pid}/fd")), "temp_entries": len(os.listdir(scratch))}


def run_soak(seconds: float, model: str, videos: list[Path], device: str | None = None, seed: int = 0,
             progress=lambda line: None, settle_s: float = SETTLE_S) -> dict:
    """Soak a server on loopback for ``seconds`` (see the module docstring) with ``videos`` to ask
    about, and read it again ``settle_s`` after the load."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="vidsight-soak-") as root:
        root = Path(root)
        scratch = root / "tmp"
        scratch.mkdir()
        with _server(model, videos[0].parent, root / "serve.db", scratch, device) as (url, pid):
            statuses: Counter = Counter()
            server_errors: list[str] = []
            lock = threading.Lock()

            def note(kind: str, response_status: int, text: str = "") -> None:
                with lock:
                    statuses[f"{kind} {response_status}"] += 1
                    if response_status >= 500:
                        server_errors.append(f"{kind} {response_status}: {text[:200]}")

            start = time.monotonic()
            deadline = start + seconds
            clients = [_completions, _completions, _watches, _sessions, _malformed]
            threads = [threading.Thread(target=client, args=(url, [v.name for v in videos], deadline,
                                                             random.Random(rng.random()), note), daemon=True)
                       for client in clients]
            for thread in threads:
                thread.start()
            samples, warm = [], None
            while time.monotonic() < deadline:
                samples.append(process_sample(pid, scratch))
                if warm is None and time.monotonic() - start >= seconds / 5:
                    warm = samples[-1]
                    progress(f"warmed up: RSS {warm['rss_bytes'] / 2**20:.0f} MiB, {warm['fds']} fds, "
                             f"{warm['threads']} threads")
                time.sleep(min(SAMPLE_EVERY_S, max(0.0, deadline - time.monotonic())))
            for thread in threads:
                thread.join(timeout=120)
            time.sleep(settle_s)
            end = process_sample(pid, scratch)
            samples.append(end)
    warm = warm or samples[0]
    return {"seconds": seconds, "model": model, "statuses": dict(sorted(statuses.items())),
            "server_errors": server_errors,
            "warm": warm, "end": end, "rss_change": end["rss_bytes"] / warm["rss_bytes"] - 1,
            "samples": [{**s, "t": s["t"] - samples[0]["t"]} for s in samples]}


@contextlib.contextmanager
def _server(model: str, media: Path, db: Path, scratch: Path, device: str | None, attempts: int = 3):
    """`vidsight serve` in a process of its own on a free port; ``(url, pid)`` once it is healthy.

    A port found free can be taken before the server binds it: a server that exits on that is
    started again on another port.
    """
    for attempt in range(1, attempts + 1):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        command = [sys.executable, "-m", "vidsight", "serve", "--model", model, "--allowed-local-media-path",
                   str(media), "--db", str(db), "--port", str(port), *(["--device", device] if device else [])]
        server = subprocess.Popen(command, env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        try:
            exited = _wait_until_healthy(server, f"http://127.0.0.1:{port}")
            if exited is None:
                yield f"http://127.0.0.1:{port}", server.pid
                return
            if "address already in use" not in exited or attempt == attempts:
                raise RuntimeError(f"the server exited: {exited[-2000:]}")
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()


def _wait_until_healthy(server: subprocess.Popen, url: str) -> str | None:
    """None once ``server`` answers ``/health``; what it wrote to stderr if it exits first."""
    deadline = time.monotonic() + 300
    while server.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return None
        if time.monotonic() > deadline:
            raise RuntimeError("the server did not start within 300 s")
        time.sleep(0.3)
    return server.stderr.read().decode(errors="replace")


def _body(video: str, stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}},
                                                      {"type": "text", "text": QUESTION}]}],
            "max_tokens": 8, "stream": stream}


def _completions(url, videos, deadline, rng, note) -> None:
    while time.monotonic() < deadline:
        stream = rng.random() < 0.5
        try:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=_body(rng.choice(videos), stream),
                              timeout=300) as response:
                text = response.read().decode(errors="replace")
                note("completion", response.status_code, text)
        except httpx.HTTPError as exc:
            note("completion", 599, repr(exc))


def _watches(url, videos, deadline, rng, note) -> None:
    """Real-time watches whose event streams are read for a random number of events, then dropped."""
    while time.monotonic() < deadline:
        spec = {"source": rng.choice(videos), "query": "Is there a red object?", "window_s": 2.0, "stride": 0.5,
                "fps": 2.0, "realtime": True}
        try:
            created = httpx.post(f"{url}/v1/watches", json=spec, timeout=60)
            note("watch", created.status_code, created.text)
            if created.status_code != 201:
                continue
            watch_id = created.json()["id"]
            keep = rng.randint(1, 4)
            with httpx.stream("GET", f"{url}/v1/watches/{watch_id}/events", timeout=120) as response:
                note("events", response.status_code)
                for number, _ in enumerate(sse_events(response.iter_lines()), 1):
                    if number >= keep:
                        break   # the client goes away mid-stream
            stopped = httpx.delete(f"{url}/v1/watches/{watch_id}", timeout=120)
            note("stop watch", stopped.status_code, stopped.text)
        except httpx.HTTPError as exc:
            note("watch", 599, repr(exc))


def _sessions(url, videos, deadline, rng, note) -> None:
    while time.monotonic() < deadline:
        try:
            opened = httpx.post(f"{url}/v1/sessions", json={"source": rng.choice(videos), "fps": 2.0}, timeout=60)
            note("session", opened.status_code, opened.text)
            if opened.status_code != 201:
                continue
            session_id = opened.json()["id"]
            time.sleep(rng.uniform(0.5, 2.0))
            asked = httpx.post(f"{url}/v1/sessions/{session_id}/messages",
                               json={"question": QUESTION, "max_tokens": 4, "stream": False}, timeout=300)
            note("message", asked.status_code, asked.text)
            closed = httpx.delete(f"{url}/v1/sessions/{session_id}", timeout=120)
            note("close session", closed.status_code, closed.text)
        except httpx.HTTPError as exc:
            note("session", 599, repr(exc))


MALFORMED = [
    ("POST", "/v1/chat/completions", b"{not json"),
    ("POST", "/v1/chat/completions", b'{"messages": "hello"}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "video_url", '
                                     b'"video_url": {"url": "http://169.254.169.254/latest"}}, '
                                     b'{"type": "text", "text": "hi"}]}]}'),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": [{"type": "video_url", '
                                     b'"video_url": {"url": "/etc/passwd"}}, {"type": "text", "text": "hi"}]}]}'),
    ("POST", "/v1/watches", b'{"source": "rtsp://127.0.0.1/cam", "query": "x"}'),
    ("POST", "/v1/watches", b'{"source": "clip.mp4", "query": "x", "unknown": 1}'),
    ("GET", "/v1/watches/nonexistent", b""),
    ("DELETE", "/v1/sessions/nonexistent", b""),
]


def _malformed(url, videos, deadline, rng, note) -> None:
    while time.monotonic() < deadline:
        method, path, content = rng.choice(MALFORMED)
        try:
            answer = httpx.request(method, f"{url}{path}", content=content or None, timeout=60,
                                   headers={"Content-Type": "application/json"})
            note(f"malformed {method} {path.split('/')[2]}", answer.status_code, answer.text)
        except httpx.HTTPError as exc:
            note("malformed", 599, repr(exc))
        time.sleep(rng.uniform(0.05, 0.3))


def format_soak_report(report: dict) -> str:
    warm, end = report["warm"], report["end"]
    lines = [f"soak of {report['seconds']:g} s, model {report['model']}", "", "answers by status:",
             *(f"  {key}: {count}" for key, count in report["statuses"].items()), "",
             f"5xx: {len(report['server_errors'])}", *(f"  {e}" for e in report["server_errors"][:10]), "",
             f"{'':<16}{'after warm-up':>14}{'after the load':>16}",
             f"{'RSS MiB':<16}{warm['rss_bytes'] / 2**20:>14.0f}{end['rss_bytes'] / 2**20:>16.0f}"
             f"  ({report['rss_change']:+.1%})"]
    lines += [f"{label:<16}{warm[key]:>14}{end[key]:>16}"
              for label, key in (("descriptors", "fds"), ("threads", "threads"), ("temp entries", "temp_entries"))]
    return "\n".join(lines)


def plot_soak_report(report: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from vidsight.bench.report import save_figure

    samples = report["samples"]
    fig, (memory, counts) = plt.subplots(1, 2, figsize=(12, 4))
    memory.plot([s["t"] for s in samples], [s["rss_bytes"] / 2**20 for s in samples])
    memory.set(xlabel="seconds", ylabel="MiB", title="server RSS")
    for key in ("fds", "threads", "temp_entries"):
        counts.plot([s["t"] for s in samples], [s[key] for s in samples], label=key)
    counts.set(xlabel="seconds", title="descriptors, threads, temporary entries")
    counts.legend()
    return save_figure(fig, path)
