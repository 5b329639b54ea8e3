"""Opening a video file with every failure turned into a `VideoError` that names the file."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import av

from vidsight.errors import VideoError

# The URLs a live source opens as a network stream (FFmpeg's protocols for them).
NETWORK_SCHEMES = ("rtsp://", "rtmp://", "http://", "https://", "udp://", "tcp://", "srt://")
# How an input is opened for reading: its tags (a title, an encoder's name) are text from the file,
# which need not be UTF-8 (a damaged or foreign-encoded tag made PyAV's open raise).
READ_OPTIONS = {"mode": "r", "metadata_errors": "replace"}

# The largest frame side decoded: 8K, the largest video FFmpeg's common decoders are used for; a
# larger header is damaged or hostile, and one frame of it would take gigabytes.
MAX_FRAME_SIDE = 8192


def check_readable(path: str | Path, allow_empty: bool = False) -> Path:
    """Reject paths that cannot hold a video before FFmpeg sees them.

    Args:
        path: The file.
        allow_empty: Accept a file of 0 bytes (one a recorder has just created, to be followed).
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise VideoError(f"{path}: no such file") from None
    except OSError as exc:
        raise VideoError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if stat.S_ISDIR(mode):
        raise VideoError(f"{path}: is a directory, not a video file")
    if not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        hint = (f" (a pipe's video can come on standard input: vidsight COMMAND - ... < {path})"
                if stat.S_ISFIFO(mode) else "")
        raise VideoError(f"{path}: is {kind}; vidsight reads a video file more than once, so it needs a regular "
                         f"file{hint}")
    if not os.access(path, os.R_OK):
        raise VideoError(f"{path}: permission denied")
    if path.stat().st_size == 0 and not allow_empty:
        raise VideoError(f"{path}: file is empty (0 bytes)")
    return path


def open_error(path: str | Path, exc: av.error.FFmpegError) -> VideoError:
    """A `VideoError` for a file FFmpeg would not open, saying what FFmpeg said."""
    if isinstance(exc, av.error.InvalidDataError):
        return VideoError(f"{path}: not a readable video file (FFmpeg does not recognise its format, or its "
                          "header is damaged)")
    # FFmpeg returns errno-like codes for headers it rejects (an impossible frame size comes back
    # as "Device or resource busy"), so the code's own text would mislead.
    return VideoError(f"{path}: FFmpeg cannot open it: its header is damaged or declares values FFmpeg "
                      f"rejects ({exc.strerror or exc})")


def codec_name(stream: av.video.stream.VideoStream) -> str:
    """The stream's codec as FFmpeg names the format (``av1``), not the decoder that reads it
    (``libdav1d``, which PyAV's wheels pick for AV1)."""
    return stream.codec_context.codec.canonical_name


@contextlib.contextmanager
def open_video(path: str | Path) -> Iterator[tuple[av.container.InputContainer, av.video.stream.VideoStream]]:
    """Open ``path`` and yield its container and first video stream.

    Raises:
        VideoError: the file is missing, empty, not a media file FFmpeg understands, or has no
            video stream.
    """
    path = check_readable(path)
    try:
        container = av.open(str(path), **READ_OPTIONS)
    except av.error.FFmpegError as exc:
        raise open_error(path, exc) from exc
    try:
        yield container, video_stream(container, path)
    finally:
        container.close()


def video_stream(container: av.container.InputContainer, source: str | Path) -> av.video.stream.VideoStream:
    """``container``'s video stream (FFmpeg's choice where it holds several: `main_video_stream`),
    one FFmpeg can decode at a size vidsight decodes.

    Raises:
        VideoError: naming ``source``: no video stream, a codec FFmpeg cannot decode, or an absurd size.
    """
    stream = main_video_stream(container, source)
    if stream.codec_context is None or stream.codec_context.name is None:
        raise VideoError(f"{source}: video stream uses a codec FFmpeg cannot decode")
    width, height = stream.codec_context.width, stream.codec_context.height
    if not (0 <= width <= MAX_FRAME_SIDE and 0 <= height <= MAX_FRAME_SIDE):
        raise VideoError(f"{source}: declares a {width}x{height} frame; vidsight decodes at most "
                         f"{MAX_FRAME_SIDE} pixels a side")
    return stream


def main_video_stream(container: av.container.InputContainer, source: str | Path) -> av.video.stream.VideoStream:
    """The video stream FFmpeg's tools would play (``av_find_best_stream``: the default one, with
    the most frames seen while opening, then the highest bitrate), never a picture attached to the
    file (an album's or a download's cover art, which FFmpeg lists as a one-frame video stream and a
    Matroska file may list first) nor a track of thumbnails.

    Raises:
        VideoError: naming ``source``: the file holds no video stream but such pictures.
    """
    videos = video_streams(container)
    if not videos:
        held = sorted({s.type for s in container.streams} - {"video"})
        if container.streams.video:
            held.insert(0, "a picture attached to it (cover art)")
        raise VideoError(f"{source}: no video stream (the file holds {' and '.join(held) or 'nothing'})")
    if len(videos) == 1:
        return videos[0]
    best = container.streams.best("video")
    return best if best in videos else videos[0]


def video_streams(container: av.container.InputContainer) -> list[av.video.stream.VideoStream]:
    """The streams of moving pictures in ``container`` (a dashcam's front and rear cameras, a
    broadcast's programs), leaving out attached pictures and thumbnails."""
    return [s for s in container.streams.video if not s.disposition & _NOT_THE_VIDEO]


# Streams FFmpeg lists as video that hold pictures beside the video, not the video itself.
_NOT_THE_VIDEO = av.stream.Disposition.attached_pic | av.stream.Disposition.timed_thumbnails
