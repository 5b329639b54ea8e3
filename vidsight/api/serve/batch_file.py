"""A file of chat-completion requests answered offline, in OpenAI's batch format (as
``vllm run-batch`` reads and writes it): one request per input line, ``{"custom_id", "method":
"POST", "url": "/v1/chat/completions", "body": {...}}``; one result per output line, in input
order, ``{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}``.

Each request goes to the server's own app in this process (no socket), so it is read, refused and
answered exactly as ``vidsight serve`` would: a line the server refuses gets its status and error
body, and the other lines go on. Requests run ``concurrency`` at a time, so their answers are
decoded together and a video asked about on several lines is prefilled once (the prefix cache).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass

from vidsight.errors import ConfigError

URL = "/v1/chat/completions"


@dataclass
class BatchLine:
    """One input line: its request, or why it cannot be sent (``problem``)."""

    number: int
    custom_id: str | None
    body: dict | None = None
    problem: str | None = None


def read_batch(text: str, name: str) -> list[BatchLine]:
    """The lines of a batch file; a malformed line is kept with its problem (answered 400)."""
    lines, seen = [], set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            lines.append(BatchLine(number, None, problem=f"{name}:{number}: not JSON ({exc})"))
            continue
        custom_id = record.get("custom_id") if isinstance(record, dict) else None
        problem = _problem(record, custom_id, seen)
        lines.append(BatchLine(number, custom_id if isinstance(custom_id, str) else None,
                               None if problem else record["body"],
                               f"{name}:{number}: {problem}" if problem else None))
        seen.add(custom_id)
    if not lines:
        raise ConfigError(f"{name}: no requests (one JSON object per line)")
    return lines


def _problem(record, custom_id, seen: set) -> str | None:
    if not isinstance(record, dict):
        return "a line is a JSON object"
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id must be a non-empty string"
    if custom_id in seen:
        return f"custom_id {custom_id!r} is given twice"
    if record.get("method", "POST") != "POST" or record.get("url") != URL:
        return f"only POST {URL} is answered, not {record.get('method')} {record.get('url')}"
    if not isinstance(record.get("body"), dict):
        return "body must be a JSON object (the chat completion request)"
    if record["body"].get("stream"):
        return "stream is not answered in a batch; leave it out"
    return None


async def answer_batch(app, lines: list[BatchLine], concurrency: int, on_done=lambda: None) -> list[dict]:
    """Every line's result, in input order, from ``app`` (the server's), ``concurrency`` at a time."""
    import httpx

    places = asyncio.Semaphore(concurrency)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://batch",
                                                                   timeout=None) as client:
        async def one(line: BatchLine) -> dict:
            if line.problem:
                result = _result(line, 400, {"error": {"message": line.problem, "type": "invalid_request_error",
                                                       "code": 400}})
            else:
                async with places:
                    response = await client.post(URL, json=line.body)
                result = _result(line, response.status_code, response.json())
            on_done()
            return result

        return list(await asyncio.gather(*(one(line) for line in lines)))


def _result(line: BatchLine, status: int, body: dict) -> dict:
    request_id = body.get("id") if status == 200 else None
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
            "response": {"status_code": status, "request_id": request_id or f"req_{uuid.uuid4().hex}", "body": body},
            "error": None}
