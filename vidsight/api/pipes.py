"""Video from a pipe on the command line: standard input (``-``) or a named pipe (FIFO).

A shell pipeline feeds a camera or a download through a pipe (``ffmpeg -i rtsp://cam ... -f
mpegts - | vidsight watch - ...``, ``curl URL | vidsight ask - ...``). A pipe can be read once,
front to back: `watch` and `chat` read it as a live stream (`StreamSource` takes the open pipe);
`ask`, which probes a file, seeks it and decodes its intervals in parallel, reads it whole into a
temporary file first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from vidsight.errors import VideoError

STDIN = "-"
_CHUNK_BYTES = 1 << 20


def is_pipe(source: str) -> bool:
    """Whether ``source`` names standard input or a named pipe."""
    if source == STDIN:
        return True
    try:
        return stat.S_ISFIFO(os.stat(source).st_mode)
    except (OSError, ValueError):   # not a path at all (a URL): FFmpeg's to open
        return False


@contextlib.contextmanager
def live_source(source: str) -> Iterator[str | BinaryIO]:
    """``source`` as `StreamSource` reads it: a pipe opened for reading (standard input as it is),
    anything else as given."""
    if not is_pipe(source):
        yield source
    elif source == STDIN:
        if sys.stdin is None or sys.stdin.isatty():
            raise VideoError("-: standard input is a terminal, not a pipe: pipe a video into it "
                             "(... | vidsight COMMAND - ...) or name a file")
        yield sys.stdin.buffer
    else:
        with open(source, "rb") as pipe:   # waits for a writer, as reading a FIFO does
            yield pipe


@contextlib.contextmanager
def whole_file(source: str) -> Iterator[str]:
    """A path holding ``source``'s video: ``source`` itself, or for a pipe a temporary file it was
    read into (removed afterwards).

    Raises:
        VideoError: the pipe gave no bytes, or its bytes could not be written (a full disk).
    """
    if not is_pipe(source):
        yield source
        return
    name = "<stdin>" if source == STDIN else source
    with tempfile.TemporaryDirectory(prefix="vidsight-pipe-") as scratch, \
            live_source(source) as pipe:
        target = Path(scratch) / ("stdin" if source == STDIN else Path(source).name)   # what messages name
        try:
            with open(target, "wb") as out:
                shutil.copyfileobj(pipe, out, _CHUNK_BYTES)
        except OSError as exc:
            raise VideoError(f"{name}: could not be read into a temporary file in {scratch} "
                             f"({exc.strerror or exc})") from None
        if target.stat().st_size == 0:
            raise VideoError(f"{name}: the pipe gave no bytes")
        yield str(target)
