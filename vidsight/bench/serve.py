"""`vidsight bench serve`: load against a running server, over HTTP only.

Chat completions at several concurrency levels (each request streamed, so time to first token is
measured by the client), then completions at the highest level for as long as concurrent watches
replayed in real time run. A watch keeps real time when its verdicts come as fast as its windows end: its real-time
factor is the stream time its windows advanced between its first and last verdicts over the wall
time between them (1: kept up; below 1: fell behind), and its lag is how long after its window's
last frame was replayed a verdict arrived.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx

from vidsight.bench.report import save_figure, write_report
from vidsight.errors import VidsightError


def sse_events(lines: Iterable[str]) -> Iterator[dict]:
    """Server-Sent Events from a response's lines: ``{"id", "event", "data"}``, data decoded from JSON."""
    fields: dict[str, str] = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
            continue
        if "data" in fields:
            yield {"id": fields.get("id"), "event": fields.get("event", "message"), "data": json.loads(fields["data"])}
        fields = {}


class ServeClient:
    """The calls the load generator makes."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 600.0):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout_s = timeout_s

    def completion(self, video: str, question: str, max_tokens: int) -> dict:
        """One streamed chat completion: ``{"ttft_s", "e2e_s", "error"}``."""
        body = {"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": video}},
                                                          {"type": "text", "text": question}]}],
                "max_tokens": max_tokens, "stream": True}
        started, ttft = time.perf_counter(), None
        try:
            with httpx.stream("POST", f"{self.url}/v1/chat/completions", json=body, headers=self.headers,
                              timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    response.read()
                    return {"ttft_s": None, "e2e_s": time.perf_counter() - started,
                            "error": f"{response.status_code}: {response.text[:200]}"}
                for line in response.iter_lines():
                    if ttft is None and line.startswith("data: {") and '"content"' in line:
                        ttft = time.perf_counter() - started
                    if line.startswith('data: {"error"'):
                        return {"ttft_s": ttft, "e2e_s": time.perf_counter() - started, "error": line[6:200]}
        except httpx.HTTPError as exc:
            return {"ttft_s": ttft, "e2e_s": time.perf_counter() - started, "error": repr(exc)}
        return {"ttft_s": ttft, "e2e_s": time.perf_counter() - started, "error": None}

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus samples by name (histogram buckets left out)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=60).text
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if "le" not in s.labels}

    def watch(self, spec: dict) -> dict:
        """Start a watch and read its events to the end: verdict arrival times and errors."""
        response = httpx.post(f"{self.url}/v1/watches", json=spec, headers=self.headers, timeout=60)
        if response.status_code != 201:
            return {"error": f"{response.status_code}: {response.text[:200]}", "verdicts": []}
        started, verdicts, error = time.perf_counter(), [], None
        with httpx.stream("GET", f"{self.url}/v1/watches/{response.json()['id']}/events", headers=self.headers,
                          timeout=self.timeout_s) as events:
            for event in sse_events(events.iter_lines()):
                data = event["data"]
                if event["event"] == "window":
                    verdicts.append({"end_s": data["end_s"], "start_s": data["start_s"],
                                     "arrived_s": time.perf_counter() - started})
                elif event["event"] == "error":
                    error = data["message"]
        return {"error": error, "verdicts": verdicts}


def completion_load(client: ServeClient, video: str, question: str, concurrency: int, requests: int,
                    max_tokens: int, until: threading.Event | None = None) -> dict:
    """``requests`` streamed completions from ``concurrency`` clients at once (with ``until``: at
    least that many, and on until it is set)."""
    results: list[dict] = []
    lock, remaining = threading.Lock(), [requests]

    def worker():
        while True:
            with lock:
                if remaining[0] <= 0 and (until is None or until.is_set()):
                    return
                remaining[0] -= 1
            result = client.completion(video, question, max_tokens)
            with lock:
                results.append(result)

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    ok = [r for r in results if r["error"] is None]
    return {"concurrency": concurrency, "requests": len(results), "errors": len(results) - len(ok),
            "error_messages": sorted({r["error"] for r in results if r["error"]})[:5],
            "wall_s": wall, "requests_per_s": len(ok) / wall,
            "ttft_s": _percentiles([r["ttft_s"] for r in ok if r["ttft_s"] is not None]),
            "e2e_s": _percentiles([r["e2e_s"] for r in ok])}


def watch_figures(result: dict, stride_s: float, fps: float) -> dict:
    verdicts = result["verdicts"]
    lags = [v["arrived_s"] - (v["end_s"] - 1 / fps) for v in verdicts]   # end_s is one interval past the last frame
    factor = None
    if len(verdicts) >= 2:
        advanced = verdicts[-1]["end_s"] - verdicts[0]["end_s"]
        factor = advanced / max(verdicts[-1]["arrived_s"] - verdicts[0]["arrived_s"], 1e-9)
    judged = verdicts[-1]["end_s"] - verdicts[0]["start_s"] if verdicts else 0.0
    return {"windows": len(verdicts), "error": result["error"], "video_s_judged": judged,
            "realtime_factor": factor, "lag_s": _percentiles(lags), "stride_s": stride_s}


def completion_levels(client: ServeClient, video: str, question: str, concurrency: list[int], requests: int,
                      max_tokens: int, progress=print) -> list[dict]:
    """`completion_load` at each level, with the decode steps the server ran meanwhile: how many
    answers each fed on average, and answer tokens fed per second."""
    levels = []
    for level in concurrency:
        before = client.metrics()
        levels.append(completion_load(client, video, question, level, max(requests, level), max_tokens))
        after = client.metrics()
        steps = after.get("vidsight:decode_batch_size_count", 0) - before.get("vidsight:decode_batch_size_count", 0)
        fed = after.get("vidsight:decode_batch_size_sum", 0) - before.get("vidsight:decode_batch_size_sum", 0)
        levels[-1].update(decode_steps=steps, mean_decode_batch=fed / steps if steps else None,
                          decode_tokens_per_s=fed / levels[-1]["wall_s"],
                          prefix_cache_hit_rate=prefix_hit_rate(before, after),
                          peak_memory_bytes=after.get("vidsight:peak_memory_bytes"),
                          prefix_cache_bytes=after.get("vidsight:prefix_cache_bytes"),
                          prefix_cache_host_bytes=after.get("vidsight:prefix_cache_host_bytes"))
        progress(f"completions x{level}: {levels[-1]['requests_per_s']:.2f} req/s, errors {levels[-1]['errors']}, "
                 f"answers per decode step {levels[-1]['mean_decode_batch'] or 0:.1f}")
    return levels


# Questions of the task families' kinds, for several questions about one video.
REUSE_QUESTIONS = ("Is there a red object in the zone? Answer Yes or No.", "How many objects are there?",
                   "What colour is the circle?", "What shape is the red object?",
                   "Which appeared first, the square or the circle?", "What colour was the triangle?")


def prefix_hit_rate(before: dict, after: dict) -> float | None:
    """The share of completions between two metrics snapshots whose video prefix was cached (None:
    the server has no prefix cache, or nothing was asked)."""
    hits, misses = (after.get(f"vidsight:prefix_cache_{n}_total", 0) - before.get(f"vidsight:prefix_cache_{n}_total", 0)
                    for n in ("hits", "misses"))
    return hits / (hits + misses) if hits + misses else None


def prefix_reuse(client: ServeClient, videos: list[str], questions: list[str], max_tokens: int,
                 progress=print) -> dict:
    """Several questions about each of a few videos, one at a time: time to first token of each
    video's first question (its video prefilled) against the later ones (its prefix reused)."""
    first, later, answers = [], [], []
    before = client.metrics()
    for video in videos:
        for n, question in enumerate(questions):
            result = client.completion(video, question, max_tokens)
            if result["error"] is not None:
                raise VidsightError(f"{video}: the completion failed: {result['error']}")
            (later if n else first).append(result["ttft_s"])
            answers.append(result)
    hit_rate = prefix_hit_rate(before, client.metrics())
    report = {"videos": len(videos), "questions_per_video": len(questions), "first_ttft_s": _percentiles(first),
              "later_ttft_s": _percentiles(later), "prefix_cache_hit_rate": hit_rate}
    report["ttft_ratio"] = (report["first_ttft_s"]["p50"] / report["later_ttft_s"]["p50"]
                            if later and report["later_ttft_s"]["p50"] else None)
    progress(f"questions about {len(videos)} videos: first TTFT {report['first_ttft_s']['p50']:.2f} s, later "
             f"{report['later_ttft_s']['p50'] or 0:.3f} s, hit rate {hit_rate}")
    return report


def run_serve_bench(client: ServeClient, video: str, question: str, concurrency: list[int], requests: int,
                    watches: int, watch_video: str, watch_spec: dict, max_tokens: int = 16,
                    progress=print) -> dict:
    """Completions alone at each level, then the highest level beside ``watches`` real-time watches."""
    levels = completion_levels(client, video, question, concurrency, requests, max_tokens, progress)
    watch_results: list[dict] = [{} for _ in range(watches)]
    # Every window judged, so a watch that cannot keep up shows as a real-time factor under 1.
    spec = {"source": watch_video, "realtime": True, "catch_up": False, **watch_spec}

    def run_watch(k):
        watch_results[k] = client.watch(spec)

    before = client.metrics()
    started = time.perf_counter()
    threads = [threading.Thread(target=run_watch, args=(k,)) for k in range(watches)]
    for thread in threads:
        thread.start()
    watching = threading.Event()

    def end_when_watched():
        for thread in threads:
            thread.join()
        watching.set()

    ender = threading.Thread(target=end_when_watched)
    ender.start()
    # Completions at the highest level for as long as the watches run.
    mixed = completion_load(client, video, question, max(concurrency), max(requests, max(concurrency)), max_tokens,
                            until=watching)
    ender.join()
    after = client.metrics()
    batches = after["vidsight:vision_batch_size_count"] - before["vidsight:vision_batch_size_count"]
    batched = after["vidsight:vision_batch_size_sum"] - before["vidsight:vision_batch_size_sum"]
    stride_s = watch_spec["window_s"] * watch_spec["stride"]
    per_watch = [watch_figures(r, stride_s, watch_spec["fps"]) for r in watch_results]
    judged = sum(w["video_s_judged"] for w in per_watch)
    wall = time.perf_counter() - started
    progress(f"mixed: {mixed['requests_per_s']:.2f} req/s beside {watches} watches; real-time factors "
             f"{[round(w['realtime_factor'] or 0, 3) for w in per_watch]}")
    return {"completions": levels, "mixed": {"completions": mixed, "watches": per_watch, "wall_s": wall,
                                             "video_s_judged_per_s": judged / wall, "vision_batches": batches,
                                             "windows_per_vision_batch": batched / batches if batches else None},
            "settings": {"video": video, "question": question, "requests": requests, "max_tokens": max_tokens,
                         "watch_video": watch_video, "watch": spec}}


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    ordered = sorted(values)
    return {"p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
            "mean": statistics.fmean(ordered)}


def format_serve_report(report: dict) -> str:
    lines = ["concurrency  requests  errors  req/s   TTFT p50/p99 s    e2e p50/p99 s  answers/step  tokens/s"
             "  prefix hits  peak GiB"]
    for level in [*report["completions"], {**report["mixed"]["completions"], "concurrency": "mixed"}]:
        lines.append(_level_line(level))
    if report.get("unbatched"):
        lines.append("unbatched server (each request whole in its turn, plain weights), same load:")
        lines += [_level_line(level) for level in report["unbatched"]]
    lines.append("")
    lines.append("watch  windows  errors  real-time factor  lag p50/p99 s")
    for k, watch in enumerate(report["mixed"]["watches"]):
        factor = f"{watch['realtime_factor']:.3f}" if watch["realtime_factor"] is not None else "-"
        lines.append(f"{k:5d}  {watch['windows']:7d}  {'yes' if watch['error'] else 'no':>6}  {factor:>16}  "
                     f"{_pair(watch['lag_s'])}")
    lines.append(f"video seconds judged per second: {report['mixed']['video_s_judged_per_s']:.2f}")
    reuse = report.get("prefix_reuse")
    if reuse:
        ratio = reuse["ttft_ratio"]
        lines.append(f"{reuse['questions_per_video']} questions about each of {reuse['videos']} videos, one at a time: "
                     f"TTFT of a video's first question {_pair(reuse['first_ttft_s'])} s, of the later ones "
                     f"{_pair(reuse['later_ttft_s'])} s (p50/p99; {'-' if ratio is None else f'{ratio:.1f}x'} lower), "
                     f"prefix-cache hit rate {_share(reuse['prefix_cache_hit_rate'])}")
    if report["mixed"]["vision_batches"]:
        lines.append(f"watch windows per vision call: {report['mixed']['windows_per_vision_batch']:.2f} "
                     f"({report['mixed']['vision_batches']:.0f} calls)")
    return "\n".join(lines)


def _level_line(level: dict) -> str:
    batch, tokens, peak = level.get("mean_decode_batch"), level.get("decode_tokens_per_s"), level.get("peak_memory_bytes")
    return (f"{level['concurrency']!s:>11}  {level['requests']:8d}  {level['errors']:6d}  {level['requests_per_s']:5.2f}"
            f"   {_pair(level['ttft_s'])}   {_pair(level['e2e_s'])}  {'-' if batch is None else f'{batch:12.2f}'}"
            f"  {'-' if tokens is None else f'{tokens:8.1f}'}  {_share(level.get('prefix_cache_hit_rate')):>11}"
            f"  {'-' if peak is None else f'{peak / 2**30:8.2f}'}")


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _pair(p: dict) -> str:
    return "-" if p["p50"] is None else f"{p['p50']:6.2f} / {p['p99']:6.2f}"


def write_serve_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    return write_report(report, out, "serve", _plot)


def _plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    levels = report["completions"]
    xs = [level["concurrency"] for level in levels]
    for key, style in (("ttft_s", "o-"), ("e2e_s", "s-")):
        left.plot(xs, [level[key]["p50"] for level in levels], style, label=f"{key[:-2]} p50")
        left.plot(xs, [level[key]["p99"] for level in levels], style, alpha=0.4, label=f"{key[:-2]} p99")
    left.set_xlabel("concurrent chat completions")
    left.set_ylabel("seconds")
    left.set_title("chat completions")
    left.legend()
    for k, watch in enumerate(report["mixed"]["watches"]):
        right.bar(k, watch["realtime_factor"] or 0, color="tab:green")
    right.axhline(1.0, color="grey", linestyle="--")
    right.set_xlabel("watch")
    right.set_ylabel("real-time factor")
    right.set_title(f"{len(report['mixed']['watches'])} real-time watches beside "
                    f"{report['mixed']['completions']['concurrency']} completions")
    return save_figure(fig, path)
