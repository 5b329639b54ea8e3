"""Opening a video file with every failure turned into a `VideoError` that names the file."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import av

from vidsight.errors import VideoError


def check_readable(path: str | Path) -> Path:
    """Reject paths that cannot hold a video before FFmpeg sees them."""
    path = Path(path)
    if not path.exists():
        raise VideoError(f"{path}: no such file")
    if path.is_dir():
        raise VideoError(f"{path}: is a directory, not a video file")
    if path.stat().st_size == 0:
        raise VideoError(f"{path}: file is empty (0 bytes)")
    return path


@contextlib.contextmanager
def open_video(path: str | Path) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    """Open ``path`` and yield its container and first video stream.

    Raises:
        VideoError: the file is missing, empty, not a media file FFmpeg understands, or has no
            video stream.
    """
    path = check_readable(path)
    try:
        container = av.open(str(path), mode="r")
    except av.error.FFmpegError as exc:
        raise VideoError(f"{path}: not a readable video file ({exc.strerror or exc})") from exc
    try:
        if not container.streams.video:
            kinds = sorted({s.type for s in container.streams}) or ["nothing"]
            raise VideoError(f"{path}: no video stream (the file holds {', '.join(kinds)})")
        stream = container.streams.video[0]
        if stream.codec_context is None or stream.codec_context.name is None:
            raise VideoError(f"{path}: video stream uses a codec FFmpeg cannot decode")
        yield container, stream
    finally:
        container.close()
