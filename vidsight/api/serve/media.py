"""Where a request's video (or image) comes from: a local path inside the allow-list, an http(s)
URL fetched with a timeout and a size cap, or a ``data:`` URL. Fetched and uploaded files live in
a temporary directory of the request's own, removed when the request ends, whatever happens."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import re
import shutil
import tempfile
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from vidsight.api.serve.config import ServeConfig
from vidsight.api.serve.egress import EgressRefused, pinned, send_checked
from vidsight.api.serve.stream_proxy import proxy_for
from vidsight.errors import VidsightError
from vidsight.ingest.container import NETWORK_SCHEMES

# Live streams: a watch may follow one; a question needs a whole file (http(s) is fetched as one).
STREAM_SCHEMES = tuple(scheme for scheme in NETWORK_SCHEMES if not scheme.startswith("http"))
# A fetched or uploaded file's folder, of the request's own; the file is named after its part.
SCRATCH_PREFIX = "vidsight-media-"
_SCRATCH_FILE = re.compile(r"\S*/" + SCRATCH_PREFIX + r"[^/\s]+/(video_url|image_url)")


def public_message(message: str) -> str:
    """``message`` as a client reads it: a fetched or uploaded file named by the request's part
    (``the video_url``), not by the server's scratch path, which means nothing to the client and
    tells it about the server's disk."""
    return _SCRATCH_FILE.sub(r"the \1", message)


class RequestError(VidsightError):
    """A request the server refuses, with the HTTP status that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def local_path(url: str, config: ServeConfig) -> Path:
    """The file a path or ``file://`` URL names, if it lies inside the allow-list (links resolved)."""
    path = urllib.parse.unquote(urllib.parse.urlparse(url).path) if url.startswith("file://") else url
    if config.allowed_local_media_path is None:
        raise RequestError(403, f"{url}: local files are not served (start the server with --allowed-local-media-path)")
    root = Path(config.allowed_local_media_path).resolve()
    resolved = (root / path).resolve()   # an absolute path replaces root; `..` and links are resolved away
    if not resolved.is_relative_to(root):
        raise RequestError(403, f"{url}: outside the allowed media directory")
    if resolved.is_file() and resolved.stat().st_size > config.max_video_bytes:
        raise RequestError(413, f"{url}: {resolved.stat().st_size} bytes, over the {config.max_video_bytes}-byte cap")
    return resolved


def stream_source(url: str, config: ServeConfig) -> tuple[str, dict]:
    """What a watch or a session reads and FFmpeg's options for it: a local path through the
    allow-list, or a network URL whose host passes the stream rules (`egress`), checked at every
    open. RTSP, RTMP, SRT, UDP and TCP URLs are pinned to the checked address; http(s) sources
    (HLS playlists name further URLs) go through the checking proxy (`stream_proxy`)."""
    if not url.startswith(NETWORK_SCHEMES):
        return str(local_path(url, config)), {}
    rules = config.egress("stream")
    try:
        address = rules.resolve(url)
    except EgressRefused as exc:
        raise RequestError(403, str(exc)) from None
    if url.startswith(("http://", "https://")):
        return url, {"http_proxy": proxy_for(rules).url}
    return pinned(url, address), {}


@contextlib.asynccontextmanager
async def video_file(url: str | None, config: ServeConfig, still: bool = False) -> AsyncIterator[Path | None]:
    """A local file holding the video (with ``still``, the image) ``url`` names, for the length of
    the request (None for none)."""
    if url is None:
        yield None
    elif url.startswith(("http://", "https://", "data:")):
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        try:
            target = scratch / ("image_url" if still else "video_url")
            if url.startswith("data:"):
                _write_data_url(url, target, config.max_video_bytes, "image" if still else "video")
            else:
                await _fetch(url, target, config)
            yield target
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    elif url.startswith(STREAM_SCHEMES):
        raise RequestError(400, f"{url}: a live stream has no end to answer about; watch it (/v1/watches) instead")
    elif "://" in url and not url.startswith("file://"):
        raise RequestError(400, f"{url[:80]}: unsupported URL scheme (use a local path, file://, http(s):// or data:)")
    else:
        yield local_path(url, config)


def _write_data_url(url: str, target: Path, cap: int, kind: str) -> None:
    header, _, payload = url.partition(",")
    if not header.startswith(f"data:{kind}/") or not header.endswith(";base64"):
        raise RequestError(400, f"{header[:60]}: a data URL must be data:{kind}/...;base64,")
    if len(payload) * 3 // 4 > cap:
        raise RequestError(413, f"the uploaded {kind} is over the {cap}-byte cap")
    try:
        target.write_bytes(base64.b64decode(payload, validate=True))
    except (binascii.Error, ValueError):
        raise RequestError(400, "the data URL's payload is not valid base64") from None


async def _fetch(url: str, target: Path, config: ServeConfig) -> None:
    cap = config.max_video_bytes
    try:
        async with asyncio.timeout(config.fetch_timeout_s):
            async with httpx.AsyncClient(follow_redirects=False, timeout=config.fetch_timeout_s) as client:
                response = await send_checked(client, "GET", url, config.egress("media"))
                async with contextlib.aclosing(response):
                    if response.status_code != 200:
                        raise RequestError(400, f"{url}: the server answered {response.status_code}")
                    declared = response.headers.get("content-length")
                    if declared is not None and declared.isdigit() and int(declared) > cap:
                        raise RequestError(413, f"{url}: {declared} bytes, over the {cap}-byte cap")
                    received = 0
                    with target.open("wb") as out:
                        async for chunk in response.aiter_bytes():
                            received += len(chunk)
                            if received > cap:
                                raise RequestError(413, f"{url}: over the {cap}-byte cap")
                            out.write(chunk)
    except EgressRefused as exc:
        raise RequestError(403, str(exc)) from None
    except TimeoutError:
        raise RequestError(504, f"{url}: not fetched within {config.fetch_timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise RequestError(400, f"{url}: cannot fetch ({type(exc).__name__}: {exc})") from None
