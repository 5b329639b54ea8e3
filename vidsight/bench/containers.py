"""Every decoding path against sequential decoding, frame for frame, on one video in many containers.

The video's own stream is copied unchanged into MP4, MKV and MPEG-TS (and, transcoded, into
MPEG-2 in MPEG-PS, what DVD and broadcast recorders write); each copy is decoded sequentially,
interval-parallel, by seeking and through the overlapped feed, and the frames are compared.
"""

from __future__ import annotations

import time
from pathlib import Path

import av
import torch

from vidsight.errors import VideoError
from vidsight.ingest.decode import DecodeConfig, decode_frames
from vidsight.ingest.feed import FrameFeed
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.probe import probe
from vidsight.ingest.sampling import SamplingConfig, sample_frames

# Containers the stream is copied into unchanged; MPEG-PS gets an MPEG-2 transcode.
REMUX = (".mp4", ".mkv", ".ts")


def remux(source: Path, target: Path) -> Path:
    """Copy ``source``'s video packets into ``target``'s container (from its suffix), unchanged."""
    with av.open(str(source)) as inp, av.open(str(target), "w") as out:
        stream = inp.streams.video[0]
        copy = out.add_stream_from_template(stream)
        for packet in inp.demux(stream):
            if packet.dts is None:
                continue
            packet.stream = copy
            out.mux(packet)
    return target


def transcode_mpeg2(source: Path, target: Path, gop: int = 15) -> Path:
    """Re-encode ``source`` as MPEG-2 with B-frames in an MPEG program stream (closed GOPs of ``gop``)."""
    with av.open(str(source)) as inp, av.open(str(target), "w", format="vob") as out:
        stream = inp.streams.video[0]
        rate = stream.average_rate or 25
        encoder = out.add_stream("mpeg2video", rate=rate)
        encoder.width, encoder.height, encoder.pix_fmt = stream.width, stream.height, "yuv420p"
        encoder.options = {"g": str(gop), "bf": "2", "qscale": "3", "flags": "+cgop", "sc_threshold": "1000000000"}
        for k, frame in enumerate(inp.decode(stream)):
            frame = frame.reformat(format="yuv420p")
            frame.pts, frame.time_base = k, 1 / rate
            for packet in encoder.encode(frame):
                out.mux(packet)
        for packet in encoder.encode():
            out.mux(packet)
    return target


def _same(a, b) -> bool:
    return len(a) == len(b) and torch.equal(a.indices, b.indices) and torch.equal(a.data, b.data)


def compare_paths(path: Path, fps: float, workers: int) -> dict:
    """Decode ``path``'s samples at ``fps`` every way; frames per path and whether each equals sequential."""
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=fps))
    started = time.perf_counter()
    sequential = decode_frames(path, indices, DecodeConfig(), info)
    row = {"container": path.suffix, "codec": info.codec, "frames": info.frame_count,
           "keyframes": len(info.keyframe_indices), "sampled": len(indices), "sequential": len(sequential)}
    for strategy in ("intervals", "seek"):
        batch = decode_parallel(path, indices, DecodeConfig(trim_gops=True), info, workers=workers, strategy=strategy)
        row[strategy] = {"frames": len(batch), "lost": batch.frames_lost, "equal": _same(sequential, batch)}
    with FrameFeed.background(path, indices, info, workers=workers) as feed:
        frames = feed.frames(0, len(feed)).clone()
        lost = feed.frames_lost
    row["overlapped"] = {"frames": len(frames) - lost, "lost": lost,
                         "equal": lost == 0 and torch.equal(frames, sequential.data)}
    row["seconds"] = time.perf_counter() - started
    return row


def run_container_check(video: str | Path, out: str | Path, fps: float = 2.0, workers: int = 2) -> list[dict]:
    """Copy ``video`` into every container and compare every decoding path there."""
    source, out = Path(video), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    probe(source)  # a clear error for a bad input before anything is written
    copies = []
    for suffix in REMUX:
        try:
            copies.append(remux(source, out / f"{source.stem}{suffix}"))
        except av.error.FFmpegError as exc:  # e.g. a codec MP4 cannot hold
            raise VideoError(f"{source}: cannot copy its stream into {suffix} ({exc})") from exc
    copies.append(transcode_mpeg2(source, out / f"{source.stem}-mpeg2.mpg"))
    return [compare_paths(path, fps, workers) for path in copies]


def format_container_report(rows: list[dict]) -> str:
    lines = [f"{'container':<10} {'codec':<11} {'frames':>6} {'keys':>5} {'sampled':>7} {'sequential':>10} "
             f"{'intervals':>12} {'seek':>12} {'overlapped':>12}"]
    for row in rows:
        cells = [f"{row[p]['frames']}{' =' if row[p]['equal'] else ' DIFF'}" for p in ("intervals", "seek", "overlapped")]
        lines.append(f"{row['container']:<10} {row['codec']:<11} {row['frames']:>6} {row['keyframes']:>5} "
                     f"{row['sampled']:>7} {row['sequential']:>10} " + " ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def all_equal(rows: list[dict]) -> bool:
    return all(row[p]["equal"] and row[p]["lost"] == 0 for row in rows for p in ("intervals", "seek", "overlapped"))
