"""Videos stored again the ways real files store pictures: wide pixels, 10 bits, HDR.

Each copy holds the same pictures in a layout a reader must undo (scale to square pixels, map HDR
light to SDR), so `bench accuracy` on a copy of the suite against the plain suite measures whether
vidsight undoes it, and the motion bench's static scenes stored so whether the rule still judges
them alike. The copies are made by the definitions (BT.2408's SDR-in-HDR placement, BT.2087's
primaries, BT.2100's HLG OETF), not by vidsight's reading code, but for the PQ curve, which the
tests hold to its published values.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from vidsight.ingest.colour import (BT2020_LUMA, DEFAULT_PEAK_NITS, HLG_A, HLG_B, HLG_C, HLG_SYSTEM_GAMMA,
                                    REFERENCE_WHITE_NITS, SDR_GAMMA, pq_inverse_eotf)

# BT.2087's linear BT.709 -> BT.2020 matrix, as published (four places).
BT709_TO_BT2020 = np.array([[0.6274, 0.3293, 0.0433], [0.0691, 0.9195, 0.0114], [0.0164, 0.0880, 0.8956]])
_X265_TRANSFER = {"pq": "smpte2084", "hlg": "arib-std-b67"}


def store_in_wide_pixels(source: str | Path, target: str | Path, aspect: Fraction = Fraction(4, 3)) -> Path:
    """Copy the built suite at ``source`` into ``target`` with every video stored in pixels
    ``aspect`` as wide as high (HDV's 1440x1080 for 1920x1080: 4:3), each frame scaled to ``1 /
    aspect`` of its width by FFmpeg's bicubic scaler and written by x264 at CRF 18: the same
    pictures, shown at their size only by a reader that applies the pixel aspect. Returns the
    copy's manifest."""
    def setup(stream: av.video.stream.VideoStream, original: av.video.stream.VideoStream) -> None:
        stream.width, stream.height, stream.pix_fmt = round(original.width / aspect), original.height, "yuv420p"
        stream.codec_context.sample_aspect_ratio = aspect

    def convert(frame: av.VideoFrame, stream: av.video.stream.VideoStream) -> av.VideoFrame:
        return frame.reformat(width=stream.width, height=stream.height, format="yuv420p", interpolation="BICUBIC")

    return _copy_suite(source, target, lambda video, path: _write_again(
        video, path, "libx264", {"g": "8", "crf": "18", "preset": "fast"}, setup, convert))


def store_in_hdr(source: str | Path, target: str | Path, transfer: str) -> Path:
    """Copy the built suite at ``source`` into ``target`` with every video stored as 10-bit HDR
    (`video_in_ten_bits`): what a reader that maps HDR to SDR shows as the original, and one that
    does not shows darker (PQ) or greyer (HLG), desaturated. Returns the copy's manifest."""
    return _copy_suite(source, target, lambda video, path: video_in_ten_bits(video, path, transfer))


def video_in_ten_bits(source: str | Path, target: str | Path, transfer: str | None = None, crf: int = 12,
                      keyint: int = 8, max_cll: int | None = None) -> None:
    """``source``'s pictures at ``target`` as 10-bit HEVC written by x265 at ``crf`` with a keyframe
    every ``keyint`` frames: HDR in ``transfer`` (``"pq"`` or ``"hlg"``, BT.2020 primaries), each
    picture placed as BT.2408 places SDR in HDR (`hdr_signal`), or SDR BT.709 when None; with
    ``max_cll``, HDR's content light level and a 4,000-nit mastering display declared too."""
    if transfer is None:
        tags, colorspace = "colorprim=bt709:transfer=bt709:colormatrix=bt709", av.video.reformatter.Colorspace.ITU709
    else:
        tags = f"colorprim=bt2020:transfer={_X265_TRANSFER[transfer]}:colormatrix=bt2020nc"
        colorspace = av.video.reformatter.Colorspace.BT2020
    if max_cll is not None:
        tags += (f":max-cll={max_cll},400:master-display=G(13250,34500)B(7500,3000)R(34000,16000)"
                 "WP(15635,16450)L(40000000,50)")

    def setup(stream: av.video.stream.VideoStream, original: av.video.stream.VideoStream) -> None:
        stream.width, stream.height, stream.pix_fmt = original.width, original.height, "yuv420p10le"

    def convert(frame: av.VideoFrame, stream: av.video.stream.VideoStream) -> av.VideoFrame:
        rgb = frame.to_ndarray(format="rgb24")
        signal = rgb.astype(np.uint16) * 257 if transfer is None else hdr_signal(rgb, transfer)
        return av.VideoFrame.from_ndarray(signal, format="rgb48le").reformat(
            format="yuv420p10le", dst_colorspace=colorspace, dst_color_range=av.video.reformatter.ColorRange.MPEG)

    _write_again(Path(source), Path(target), "libx265", {
        "crf": str(crf), "preset": "fast",
        "x265-params": f"log-level=error:keyint={keyint}:{tags}:range=limited"},
        setup, convert)


def hdr_signal(rgb: np.ndarray, transfer: str) -> np.ndarray:
    """``rgb``, ``(H, W, 3)`` uint8 BT.709 SDR at gamma 2.4, as uint16 BT.2020 R'G'B' in
    ``transfer`` (``"pq"``, ``"hlg"``) placed by BT.2408: SDR white at 203 nits of display light
    (for HLG, the scene light a 1,000-nit display shows at that light)."""
    nits = REFERENCE_WHITE_NITS * (rgb / 255.0) ** SDR_GAMMA @ BT709_TO_BT2020.T
    if transfer == "pq":
        code = pq_inverse_eotf(nits)
    elif transfer == "hlg":
        relative = nits / DEFAULT_PEAK_NITS   # on HLG's nominal 1,000-nit display
        luminance = np.maximum(relative @ BT2020_LUMA.astype(np.float64), 1e-12)[..., None]
        scene = relative * luminance ** ((1 - HLG_SYSTEM_GAMMA) / HLG_SYSTEM_GAMMA)   # the OOTF undone
        code = np.where(scene <= 1 / 12, np.sqrt(3 * scene),
                        HLG_A * np.log(np.maximum(12 * scene - HLG_B, 1e-12)) + HLG_C)   # BT.2100's OETF
    else:
        raise ValueError(f"unknown HDR transfer {transfer!r} (pq, hlg)")
    return np.rint(np.clip(code, 0.0, 1.0) * 65535).astype(np.uint16)


def _copy_suite(source: str | Path, target: str | Path, store: Callable[[Path, Path], None]) -> Path:
    """The suite at ``source`` copied into ``target``: its manifest, and each ``.mp4`` as ``store``
    writes it. Returns the copy's manifest."""
    source, target = Path(source), Path(target)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(source / "manifest.json", target / "manifest.json")
    for video in sorted(source.glob("*.mp4")):
        store(video, target / video.name)
    return target / "manifest.json"


def _write_again(video: Path, target: Path, codec: str, options: dict[str, str],
                 setup: Callable[[av.video.stream.VideoStream, av.video.stream.VideoStream], None],
                 convert: Callable[[av.VideoFrame, av.video.stream.VideoStream], av.VideoFrame]) -> None:
    """``video``'s frames ``convert``-ed and written at ``target`` by ``codec`` on a stream ``setup``
    shapes, at their times."""
    with av.open(str(video)) as original, av.open(str(target), "w") as out:
        stream = original.streams.video[0]
        written = out.add_stream(codec, rate=stream.average_rate, options=options)
        setup(written, stream)
        written.time_base = stream.time_base
        for frame in original.decode(stream):
            stored = convert(frame, written)
            stored.pts, stored.time_base = frame.pts, frame.time_base
            for packet in written.encode(stored):
                out.mux(packet)
        for packet in written.encode():
            out.mux(packet)
