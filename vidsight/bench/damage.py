"""Damaged and hostile inputs, made from small generated videos, for the fuzz benchmark.

Each case is a path to hand to the command line: a damaged copy of a good video (bit flips,
truncation, zeroed, shuffled or duplicated regions, a lost or doubled index, garbage around it),
a file that declares an absurd frame size, a file that is not video at all, or a path that is not
a file (a directory, a FIFO, a dangling link, an odd name).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np

from vidsight.bench.storage import video_in_ten_bits
from vidsight.ingest.synthetic import SyntheticSpec, make_video
from vidsight.ingest.writer import weave, write_video

# (file name, codec) of the good videos the damage starts from: the codecs and containers users bring.
SOURCES = (
    ("h264.mp4", "h264"), ("h264.mkv", "h264"), ("h264.ts", "h264"), ("mpeg2.mpg", "mpeg2video"),
    ("mpeg4.avi", "mpeg4"), ("mjpeg.avi", "mjpeg"), ("vp9.webm", "vp9"), ("hevc.mp4", "hevc"),
    ("hevc.hevc", "hevc"),   # a raw elementary stream, as cameras dump it: no container, no timestamps
)
# Files as editors, downloads and phones write them, made from the first source: an MP4 trimmed
# without re-encoding (an edit list starting after the GOP's first frames, which FFmpeg flags to be
# decoded and dropped), a Matroska file listing a one-frame picture track before the video (both
# its packets remuxed), 10-bit HEVC HDR in PQ with its light levels declared, and interlaced
# MPEG-2 as a DVD or a broadcast holds it, each frame woven from two (both re-encoded); and its
# first frame as the pictures `ask` shows a model as an image (a PNG, and a JPEG a phone turned).
SHAPED = ("h264-trimmed.mp4", "h264-picture-first.mkv", "hevc-pq.mp4", "mpeg2-interlaced.mpg", "picture.png",
          "picture-turned.jpg")
TRIMMED_FRAMES = 3
# Where each container keeps its index (or the header a demuxer leans on), as bytes to find.
INDEX_TAGS = (b"moov", b"idx1", b"\x1c\x53\xbb\x6b", b"\x11\x4d\x9b\x74")  # MP4, AVI, MKV Cues, MKV SeekHead


@dataclasses.dataclass(frozen=True)
class Case:
    """One fuzz input.

    Attributes:
        name: Unique within a run: ``NNNN-kind``.
        kind: The damage, e.g. ``bitflip`` or ``fifo``.
        source: The good video it came from (empty for inputs made from nothing).
        path: What the command line is given.
    """

    name: str
    kind: str
    source: str
    path: str


def make_sources(root: Path) -> list[Path]:
    """The good videos, generated once per root: 2 s of a moving square at 160x120 and 12 fps."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, codec in SOURCES:
        path = root / name
        if not path.exists():
            spec = SyntheticSpec(width=160, height=120, fps=12, duration_s=2.0, gop=6, bframes=codec == "h264",
                                 codec=codec, seed=len(paths))
            make_video(path, spec)
            path.with_suffix(".json").unlink(missing_ok=True)
        paths.append(path)
    for name in SHAPED:
        path = root / name
        if not path.exists() and name.startswith("hevc-pq"):
            video_in_ten_bits(paths[0], path, "pq", max_cll=1500)
        elif not path.exists() and name.startswith("mpeg2-interlaced"):
            _interlace(paths[0], path)
        elif not path.exists() and name.startswith("picture"):
            _picture(paths[0], path)
        elif not path.exists():
            _remux(paths[0], path)
        paths.append(path)
    return paths


def _interlace(source: Path, path: Path) -> None:
    """``source``'s frames two by two, woven into interlaced MPEG-2 frames at half its rate."""
    with av.open(str(source)) as original:
        stream = original.streams.video[0]
        rate = float(stream.average_rate or 12)
        frames = [frame.to_ndarray(format="rgb24") for frame in original.decode(stream)]
    woven = [weave(first, second) for first, second in zip(frames[0::2], frames[1::2])]
    write_video(path, woven, np.arange(len(woven)) * 2 / rate, rate / 2, gop=6, codec="mpeg2video", interlaced=True)


def _picture(source: Path, path: Path) -> None:
    """``source``'s first frame as a picture file; a JPEG's EXIF orientation says to turn it (6:
    90 degrees clockwise), as a phone held upright writes it."""
    with av.open(str(source)) as original:
        image = next(original.decode(video=0)).to_image()
    if path.suffix == ".jpg":
        exif = image.getexif()
        exif[0x0112] = 6
        image.save(path, exif=exif.tobytes())
    else:
        image.save(path)


def _remux(source: Path, path: Path) -> None:
    """``source``'s packets in ``path``, shaped as `SHAPED` names it."""
    with av.open(str(source)) as original, av.open(str(path), "w") as out:
        stream = original.streams.video[0]
        pictures = []
        if "picture-first" in path.name:
            picture = out.add_stream("mjpeg", rate=1)
            picture.width, picture.height, picture.pix_fmt = 64, 64, "yuvj420p"
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 128, np.uint8), format="rgb24")
            pictures = [*picture.encode(frame.reformat(format="yuvj420p")), *picture.encode()]
        copy = out.add_stream_from_template(stream)
        for packet in pictures:   # the header is written with the first packet, once every stream is added
            out.mux(packet)
        shift = round(TRIMMED_FRAMES / (float(stream.average_rate) * float(stream.time_base))) if "trimmed" in path.name else 0
        for packet in original.demux(stream):
            if packet.dts is not None:
                packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, copy
                out.mux(packet)


def _bitflip(data: bytearray, rng: np.random.Generator) -> bytearray:
    rate = float(rng.choice([1e-5, 1e-4, 1e-3, 1e-2]))
    count = max(1, int(len(data) * rate))
    positions = rng.integers(0, len(data), size=count)
    bits = rng.integers(0, 8, size=count)
    for position, bit in zip(positions, bits):
        data[position] ^= 1 << int(bit)
    return data


def _truncate(data: bytearray, rng: np.random.Generator) -> bytearray:
    return data[: int(rng.integers(1, len(data)))]


def _zero_region(data: bytearray, rng: np.random.Generator) -> bytearray:
    start = int(rng.integers(0, len(data)))
    length = int(rng.integers(1, max(2, len(data) // 4)))
    data[start : start + length] = bytes(len(data[start : start + length]))
    return data


def _shuffle_regions(data: bytearray, rng: np.random.Generator) -> bytearray:
    pieces = int(rng.integers(2, 16))
    cuts = np.sort(rng.integers(0, len(data), size=pieces - 1))
    chunks = np.split(np.frombuffer(bytes(data), dtype=np.uint8), cuts)
    order = rng.permutation(len(chunks))
    return bytearray(b"".join(chunks[k].tobytes() for k in order))


def _duplicate_region(data: bytearray, rng: np.random.Generator) -> bytearray:
    start = int(rng.integers(0, len(data)))
    piece = data[start : start + int(rng.integers(1, max(2, len(data) // 3)))]
    at = int(rng.integers(0, len(data)))
    return data[:at] + piece + data[at:]


def _index_tag(data: bytearray) -> int:
    for tag in INDEX_TAGS:
        at = data.find(tag)
        if at >= 0:
            return at
    return -1


def _drop_index(data: bytearray, rng: np.random.Generator) -> bytearray:
    """Rename the index so demuxers skip it (MP4's moov becomes free space)."""
    at = _index_tag(data)
    if at < 0:
        return _zero_region(data, rng)
    data[at : at + 4] = b"free"
    return data


def _double_index(data: bytearray, rng: np.random.Generator) -> bytearray:
    """A second copy of the index (from its tag to the end, or 4 KiB) appended to the file."""
    at = _index_tag(data)
    if at < 0:
        return _duplicate_region(data, rng)
    start = max(0, at - 4)  # MP4 boxes start with their size
    return data + data[start : start + max(4096, len(data) - start)]


def _garbage_around(data: bytearray, rng: np.random.Generator) -> bytearray:
    before = rng.integers(0, 256, size=int(rng.integers(0, 4096)), dtype=np.uint8).tobytes()
    after = rng.integers(0, 256, size=int(rng.integers(0, 65536)), dtype=np.uint8).tobytes()
    return bytearray(before) + data + bytearray(after)


DAMAGE: dict[str, Callable[[bytearray, np.random.Generator], bytearray]] = {
    "bitflip": _bitflip, "truncate": _truncate, "zero-region": _zero_region, "shuffle": _shuffle_regions,
    "duplicate-region": _duplicate_region, "drop-index": _drop_index, "double-index": _double_index,
    "garbage-around": _garbage_around,
}


def _absurd_y4m(path: Path, rng: np.random.Generator) -> None:
    side = lambda: int(rng.choice([0, 1, 3, 8193, 60000, 2**31 - 1, 2**32 + 2]))  # noqa: E731
    header = f"YUV4MPEG2 W{side()} H{side()} F{int(rng.choice([0, 1, 25, 10**9]))}:1 Ip A1:1 C420jpeg\n"
    path.write_bytes(header.encode() + b"FRAME\n" + bytes(int(rng.integers(0, 4096))))


def _not_video(path: Path, rng: np.random.Generator) -> None:
    choice = int(rng.integers(0, 4))
    if choice == 0:
        path.write_text("this is not a video\n" * int(rng.integers(1, 200)))
    elif choice == 1:
        path.write_bytes(rng.integers(0, 256, size=int(rng.integers(1, 200_000)), dtype=np.uint8).tobytes())
    elif choice == 2:
        path.write_bytes(b"")
    else:
        path.write_bytes(b'{"video": false}')


def _odd_path(root: Path, stem: str, source: Path, rng: np.random.Generator) -> Path:
    """A good or missing video behind a name shells and argument parsers trip on."""
    names = [f"{stem} with spaces.mp4", f"{stem}-ünïcødé-视频.mp4", f"-{stem}.mp4", f"{stem}\nnewline.mp4",
             f"{stem}" + "x" * 300 + ".mp4", f"{stem}.MP4", f"{stem}"]
    name = names[int(rng.integers(0, len(names)))]
    path = root / name
    try:
        if rng.random() < 0.8:
            shutil.copyfile(source, path)
    except OSError:  # a name too long for the file system: the tool must say so too
        pass
    return path


def make_case(number: int, root: Path, sources: list[Path], rng: np.random.Generator) -> Case:
    """The ``number``-th case: mostly damaged copies of a source, plus the other kinds."""
    kinds = [*DAMAGE, "absurd-size", "not-video", "directory", "fifo", "dangling-link", "missing", "odd-path"]
    weights = np.array([4.0] * len(DAMAGE) + [1.0] * (len(kinds) - len(DAMAGE)))
    kind = str(rng.choice(kinds, p=weights / weights.sum()))
    source = sources[int(rng.integers(0, len(sources)))]
    stem = f"{number:04d}-{kind}"
    path = root / f"{stem}{source.suffix}"
    if kind in DAMAGE:
        path.write_bytes(bytes(DAMAGE[kind](bytearray(source.read_bytes()), rng)))
    elif kind == "absurd-size":
        path = root / f"{stem}.y4m"
        _absurd_y4m(path, rng)
    elif kind == "not-video":
        _not_video(path, rng)
    elif kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dangling-link":
        path.symlink_to(root / f"{stem}-gone.mp4")
    elif kind == "odd-path":
        path = _odd_path(root, stem, source, rng)
    return Case(stem, kind, source.name if kind in DAMAGE or kind == "odd-path" else "", str(path))
