"""What the command line reads video from besides a file: standard input (``-``) and, for a whole
video, an http(s) URL.

A shell pipeline feeds a camera or a download through standard input (``ffmpeg -i rtsp://cam ...
-f mpegts - | vidsight watch - ...``; a named pipe as ``vidsight watch - < cam.fifo``, the shell
waiting for its writer). A pipe can be read once, front to back: `watch` and `chat` read it as a
live stream (`StreamSource` takes it; a URL they open as a network stream). `ask` and `probe`,
which probe a file, seek it and decode its intervals in parallel, read standard input or download
a URL whole into a temporary file first.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import stat
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from vidsight.errors import VideoError
from vidsight.ingest.container import NETWORK_SCHEMES

STDIN = "-"
DOWNLOAD_TIMEOUT_S = 30.0   # a connection or a read that waits longer has failed
_CHUNK_BYTES = 1 << 20


def live_source(source: str) -> str | BinaryIO:
    """``source`` as `StreamSource` reads it: standard input's bytes for ``-``, anything else as given."""
    if source != STDIN:
        return source
    if sys.stdin is None or sys.stdin.isatty():
        raise VideoError("-: standard input is a terminal, not a pipe: pipe a video into it "
                         "(... | vidsight COMMAND - ...) or name a file")
    return sys.stdin.buffer


@contextlib.contextmanager
def whole_file(source: str) -> Iterator[str]:
    """A path holding ``source``'s whole video: ``source`` itself; for standard input redirected
    from a file, that file; else a temporary file (removed afterwards) that standard input was read
    into or an http(s) URL downloaded to.

    Raises:
        VideoError: a live stream's URL (it has no end), another scheme, standard input that gave no bytes,
            a download that failed, or bytes that could not be written (a full disk).
    """
    if source.startswith(("http://", "https://")):
        name, fill = Path(urllib.parse.urlparse(source).path).name or "video", _download
    elif source.startswith(NETWORK_SCHEMES):
        raise VideoError(f"{source}: a live stream has no end to answer about: watch it (vidsight watch) or "
                         "chat about it (vidsight chat), or record a part of it to a file")
    elif "://" in source:
        raise VideoError(f"{source}: unsupported URL scheme (a file, - for standard input, or an http(s) URL)")
    elif source == STDIN and (redirected := _redirected_file()) is not None:
        yield redirected
        return
    elif source == STDIN:
        name, fill = "stdin", _read_stdin
    else:
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="vidsight-input-") as scratch:
        target = Path(scratch) / name   # what FFmpeg's messages, and ours, call it
        try:
            fill(source, target)
        except OSError as exc:   # the scratch file: a full disk, a read-only $TMPDIR
            raise VideoError(f"{source}: could not be written to a temporary file in {scratch} "
                             f"({exc.strerror or exc})") from None
        yield str(target)


def _redirected_file() -> str | None:
    """The path of the regular file standard input was redirected from (``< clip.mp4``), read in
    place rather than copied: where the system names it (Linux's ``/proc``) and that name is still
    the same file; else None."""
    try:
        opened = os.fstat(sys.stdin.fileno())
        if not stat.S_ISREG(opened.st_mode):
            return None
        path = os.readlink(f"/proc/self/fd/{sys.stdin.fileno()}")
        named = os.stat(path)
    except (AttributeError, OSError, ValueError):   # no descriptor (a test's stand-in), no /proc
        return None
    return path if (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino) else None


def _read_stdin(source: str, target: Path) -> None:
    with open(target, "wb") as out:
        shutil.copyfileobj(live_source(source), out, _CHUNK_BYTES)
    if target.stat().st_size == 0:
        raise VideoError("<stdin>: the pipe gave no bytes")


def _download(url: str, target: Path) -> None:
    """``url``'s body into ``target``, with a progress bar on a terminal (proxies from the environment)."""
    from tqdm import tqdm

    request = urllib.request.Request(url, headers={"User-Agent": "vidsight"})
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response, open(target, "wb") as out:
            length = response.headers.get("Content-Length", "")
            with tqdm(total=int(length) if length.isdigit() else None, unit="B", unit_scale=True, desc="download",
                      disable=not sys.stderr.isatty(), leave=False) as bar:
                while chunk := response.read(_CHUNK_BYTES):
                    out.write(chunk)
                    bar.update(len(chunk))
    except urllib.error.HTTPError as exc:
        raise VideoError(f"{url}: the server answered {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise VideoError(f"{url}: cannot fetch ({exc.reason})") from None
    except TimeoutError:
        raise VideoError(f"{url}: no answer within {DOWNLOAD_TIMEOUT_S:g} s") from None
    except (ConnectionError, http.client.HTTPException) as exc:   # cut off partway
        raise VideoError(f"{url}: the download failed ({type(exc).__name__}: {exc})") from None
    if target.stat().st_size == 0:
        raise VideoError(f"{url}: the server sent no bytes")
