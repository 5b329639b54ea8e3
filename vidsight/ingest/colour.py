"""Frames in the colours of an SDR picture: HDR (PQ, HLG) and wide-gamut (BT.2020) video mapped to BT.709.

Phones record HDR by default (an iPhone's HEVC is HLG, as are many Android phones' HDR videos),
streaming masters and graded exports are PQ. Their code values stand for light up to 1,000-10,000
nits in BT.2020's wider primaries; read as SDR BT.709 (FFmpeg's RGB conversion applies the
matrix, not the light), an HLG picture looks flat and grey, a PQ one dark, both washed out. The
models learnt from SDR pictures, so every such frame is shown as a player shows HDR on an SDR
display (BT.2408's display-light conversion):

1. its light in nits: PQ's EOTF; HLG's inverse OETF and its OOTF at a 1,000-nit display; an SDR
   transfer's gamma 2.4 (BT.1886) with white at `REFERENCE_WHITE_NITS`;
2. highlights above the SDR range compressed by BT.2390's EETF, from the content's peak (its
   MaxCLL, else its mastering display's peak, else `DEFAULT_PEAK_NITS`) down to HDR reference
   white, which SDR white stands for (BT.2408), on each pixel's largest component so hues keep;
3. BT.2020 primaries to BT.709's (colours outside BT.709 clipped);
4. BT.709 code values at gamma 2.4, 8 bits.

An SDR picture placed in an HDR stream as BT.2408 places it (its white at 203 nits) comes back as
it was below the EETF's knee (about 100 nits, 74 % code value, for a 1,000-nit peak).
"""

from __future__ import annotations

import dataclasses
import functools
import struct

import av
import numpy as np

# FFmpeg's AVColorTransferCharacteristic and AVColorPrimaries values, as PyAV gives them.
TRC_PQ, TRC_HLG, PRIMARIES_BT2020 = 16, 18, 9
TRANSFERS = {TRC_PQ: "pq", TRC_HLG: "hlg"}

REFERENCE_WHITE_NITS = 203.0   # BT.2408's HDR reference white, where SDR white is placed
DEFAULT_PEAK_NITS = 1000.0     # BT.2408's usual mastering peak; HLG's nominal display (BT.2100)
SDR_GAMMA = 2.4                # BT.1886

# PQ (SMPTE ST 2084) and HLG (BT.2100) constants.
_M1, _M2 = 2610 / 16384, 2523 / 4096 * 128
_C1, _C2, _C3 = 3424 / 4096, 2413 / 4096 * 32, 2392 / 4096 * 32
HLG_A = 0.17883277
HLG_B, HLG_C = 1 - 4 * HLG_A, 0.5 - HLG_A * np.log(4 * HLG_A)
HLG_SYSTEM_GAMMA = 1.2   # its OOTF's at a 1,000-nit display
BT2020_LUMA = np.array([0.2627, 0.6780, 0.0593], dtype=np.float32)


def _rgb_to_xyz(primaries: list[tuple[float, float]], white: tuple[float, float]) -> np.ndarray:
    """The linear RGB -> CIE XYZ matrix of primaries and white point given as CIE xy."""
    columns = np.array([[x / y, 1.0, (1 - x - y) / y] for x, y in primaries]).T
    white_xyz = np.array([white[0] / white[1], 1.0, (1 - white[0] - white[1]) / white[1]])
    return columns * np.linalg.solve(columns, white_xyz)


_D65 = (0.3127, 0.3290)
BT2020_TO_BT709 = (np.linalg.inv(_rgb_to_xyz([(0.64, 0.33), (0.30, 0.60), (0.15, 0.06)], _D65))
                   @ _rgb_to_xyz([(0.708, 0.292), (0.170, 0.797), (0.131, 0.046)], _D65)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class ColourMapping:
    """How one frame's colours reach BT.709 SDR.

    Attributes:
        transfer: ``"pq"``, ``"hlg"`` or ``"sdr"`` (every other transfer).
        wide_gamut: Whether its primaries are BT.2020's.
        peak_nits: The brightest light its content holds, which the EETF brings to SDR white.
    """

    transfer: str
    wide_gamut: bool
    peak_nits: float = DEFAULT_PEAK_NITS


def mapping_of(frame: av.VideoFrame | av.video.codeccontext.VideoCodecContext) -> ColourMapping | None:
    """How ``frame`` is mapped to SDR BT.709; None for a frame already in it (or near enough: the
    SD and HD primaries players leave as they are). A decoder's context, before any frame, tells
    what its parameter sets declare (no peak: that is frame metadata)."""
    transfer = TRANSFERS.get(frame.color_trc, "sdr")
    wide = frame.color_primaries == PRIMARIES_BT2020
    if transfer == "sdr" and not wide:
        return None
    if transfer == "pq":
        peak = content_peak(frame)
    else:   # HLG's nominal display; an SDR transfer's white, which the EETF leaves as it is
        peak = DEFAULT_PEAK_NITS if transfer == "hlg" else REFERENCE_WHITE_NITS
    return ColourMapping(transfer, wide, peak)


def content_peak(frame: av.VideoFrame) -> float:
    """The peak a PQ frame's metadata declares: its content light level (MaxCLL), else its mastering
    display's, else `DEFAULT_PEAK_NITS`; within reference white..10,000 nits."""
    declared = {data.type.name: bytes(data) for data in getattr(frame, "side_data", ())}
    peak = 0.0
    if len(light := declared.get("CONTENT_LIGHT_LEVEL", b"")) >= 4:
        peak = float(struct.unpack_from("<I", light)[0])    # AVContentLightMetadata.MaxCLL
    if not peak and len(display := declared.get("MASTERING_DISPLAY_METADATA", b"")) >= 88:
        # AVMasteringDisplayMetadata: 8 rationals of primaries and white point, min and max
        # luminance, then has_primaries and has_luminance.
        numerator, denominator = struct.unpack_from("<ii", display, 72)
        if struct.unpack_from("<i", display, 84)[0] and denominator > 0:
            peak = numerator / denominator
    return float(np.clip(peak or DEFAULT_PEAK_NITS, REFERENCE_WHITE_NITS, 10000.0))


def is_hdr(frame: av.VideoFrame) -> bool:
    """Whether ``frame``'s transfer is PQ or HLG."""
    return frame.color_trc in TRANSFERS


def sdr_luma(frame: av.VideoFrame) -> np.ndarray:
    """``frame``'s luma, 8-bit full range ``(H, W)`` (FFmpeg's conversion), an HDR frame's as its
    SDR picture's (`luma_codes`)."""
    luma = frame.to_ndarray(format="gray")
    return np.take(_hdr_luma_codes(mapping_of(frame), 8, True), luma) if is_hdr(frame) else luma


def luma_codes(frame: av.VideoFrame) -> np.ndarray | None:
    """A table reading each luma value of ``frame``'s planar 8- or 10-bit format as the 8-bit luma
    an SDR picture has in the same range: a 10-bit SDR frame's its top 8 bits; an HDR frame's, the
    luma of its grey's SDR picture (`to_sdr`), so the motion rule's thresholds, set on SDR
    pictures, hold for HDR (PQ puts SDR's whole range in 58 % of its code values). None where the
    values are that already (8-bit SDR)."""
    bits = 10 if frame.format.name.endswith("p10le") else 8
    if not is_hdr(frame):
        return None if bits == 8 else _TOP_EIGHT_OF_TEN
    return _hdr_luma_codes(mapping_of(frame), bits, frame.color_range == av.video.reformatter.ColorRange.JPEG)


_TOP_EIGHT_OF_TEN = (np.arange(1024) >> 2).astype(np.uint8)


@functools.lru_cache(maxsize=16)
def _hdr_luma_codes(mapping: ColourMapping, bits: int, full_range: bool) -> np.ndarray:
    """`luma_codes` of an HDR mapping, for ``bits``-bit luma in full or limited range."""
    codes, scale = np.arange(2**bits), 2 ** (bits - 8)
    signal = codes / (2**bits - 1) if full_range else (codes - 16 * scale) / (219 * scale)
    grey = np.rint(np.clip(signal, 0.0, 1.0) * 65535).astype(np.uint16)
    shown = to_sdr(np.repeat(grey[:, None, None], 3, axis=2), dataclasses.replace(mapping, wide_gamut=False))[:, 0, 0]
    return shown if full_range else np.rint(16 + shown * (219 / 255)).astype(np.uint8)


# Rows are mapped in blocks of about this many pixels, so that each step's float intermediates stay
# in the CPU's caches rather than streaming a whole frame through memory once a step (a 3840x2160
# frame's are 100 MB each): 1.7x faster at 1280x720, 1.9x at 1920x1080, 2.5-3x at 3840x2160
# (docs/benchmarks.md, "HDR video").
_BLOCK_PIXELS = 1 << 16


def to_sdr(signal: np.ndarray, mapping: ColourMapping) -> np.ndarray:
    """``signal``, ``(H, W, 3)`` uint16 R'G'B' in ``mapping``'s transfer and primaries, as uint8
    BT.709 SDR R'G'B' (the module's steps 1-4). Each step that is a function of one value reads a
    table (`_Tables`), a block of rows at a time."""
    tables, shown = _tables(mapping), np.empty(signal.shape, np.uint8)
    rows = max(1, _BLOCK_PIXELS // max(1, signal.shape[1]))
    for top in range(0, len(signal), rows):
        shown[top : top + rows] = _mapped(signal[top : top + rows], mapping, tables)
    return shown


def _mapped(signal: np.ndarray, mapping: ColourMapping, tables: _Tables) -> np.ndarray:
    """`to_sdr` of a few rows."""
    light = np.take(tables.light, signal)                 # (H, W, 3) float32: nits; HLG's scene light
    if mapping.transfer == "hlg":
        light = hlg_ootf(light)
    if tables.gain is not None:
        # (numpy's max over a last axis of 3 is an order slower than two maximums)
        position = np.maximum(np.maximum(light[..., 0], light[..., 1]), light[..., 2]) * (_STEPS / mapping.peak_nits)
        gain = np.take(tables.gain, np.minimum(position, _STEPS).astype(np.int32))
        if position.max() > _STEPS:   # light above the declared peak: brought to the target as the peak is
            gain *= np.minimum(1.0, _STEPS / np.maximum(position, 1.0))
        light *= gain[..., None]
    if mapping.wide_gamut:
        light = (light.reshape(-1, 3) @ BT2020_TO_BT709.T).reshape(light.shape)   # one BLAS product
    relative = np.clip(light, 0.0, REFERENCE_WHITE_NITS, out=light)
    return np.take(tables.code, np.rint(np.sqrt(relative * (1 / REFERENCE_WHITE_NITS)) * _STEPS).astype(np.int32))


_STEPS = 65535


@dataclasses.dataclass(frozen=True)
class _Tables:
    """`to_sdr`'s one-value steps for one mapping, each tabulated at 65,536 points.

    Attributes:
        light: Each 16-bit code value's light per channel (`channel_light`).
        gain: The EETF's factor on light at ``i / 65535`` of the peak (exactly 1 below its knee,
            where the steps are 0.015 nits at a 1,000-nit peak); None where nothing is above SDR.
        code: The 8-bit gamma-2.4 code of light at ``(i / 65535) ** 2`` of reference white: the
            square root spreads the dark end, where a code value spans the least light.
    """

    light: np.ndarray
    gain: np.ndarray | None
    code: np.ndarray


@functools.lru_cache(maxsize=16)
def _tables(mapping: ColourMapping) -> _Tables:
    steps = np.arange(_STEPS + 1, dtype=np.float64) / _STEPS
    gain = None
    if mapping.peak_nits > REFERENCE_WHITE_NITS:
        nits = steps * mapping.peak_nits
        gain = eetf(nits, mapping.peak_nits, REFERENCE_WHITE_NITS) / np.maximum(nits, 1e-12)
        gain[0] = 1.0
        gain = gain.astype(np.float32)
    code = np.rint(steps ** (2 / SDR_GAMMA) * 255).astype(np.uint8)
    return _Tables(channel_light(steps, mapping.transfer).astype(np.float32), gain, code)


def channel_light(signal: np.ndarray, transfer: str) -> np.ndarray:
    """Each channel's light from its non-linear code value (0..1): PQ's nits, HLG's scene light
    (0..1, which `hlg_ootf` shows on a display), an SDR transfer's nits with white at reference white."""
    if transfer == "pq":
        return pq_eotf(signal)
    if transfer == "hlg":
        return hlg_inverse_oetf(signal)
    return REFERENCE_WHITE_NITS * np.clip(signal, 0.0, 1.0) ** SDR_GAMMA


def hlg_ootf(scene: np.ndarray) -> np.ndarray:
    """BT.2100's HLG OOTF at a 1,000-nit display: scene light ``(..., 3)`` (BT.2020) to nits, system
    gamma 1.2 applied on the scene's luminance."""
    luminance = (scene.reshape(-1, 3) @ BT2020_LUMA).reshape(scene.shape[:-1])
    return DEFAULT_PEAK_NITS * luminance[..., None] ** (HLG_SYSTEM_GAMMA - 1) * scene


def pq_eotf(signal: np.ndarray) -> np.ndarray:
    """SMPTE ST 2084: PQ code values (0..1) to nits."""
    power = np.clip(signal, 0.0, 1.0) ** (1 / _M2)
    return 10000.0 * (np.maximum(power - _C1, 0.0) / (_C2 - _C3 * power)) ** (1 / _M1)


def pq_inverse_eotf(nits: np.ndarray) -> np.ndarray:
    """SMPTE ST 2084: nits to PQ code values (0..1)."""
    power = (np.clip(nits, 0.0, 10000.0) / 10000.0) ** _M1
    return ((_C1 + _C2 * power) / (1 + _C3 * power)) ** _M2


def hlg_inverse_oetf(signal: np.ndarray) -> np.ndarray:
    """BT.2100: HLG code values (0..1) to scene light (0..1)."""
    signal = np.clip(signal, 0.0, 1.0)
    upper = (np.exp((np.maximum(signal, 0.5) - HLG_C) / HLG_A) + HLG_B) / 12
    return np.where(signal <= 0.5, signal * signal / 3, upper).astype(signal.dtype)


def eetf(nits: np.ndarray, source_peak: float, target_peak: float) -> np.ndarray:
    """BT.2390's EETF: light up to ``source_peak`` nits brought within ``target_peak``, unchanged
    below its knee, rolled off above it by a Hermite spline in PQ code values (black at 0 nits)."""
    if source_peak <= target_peak:
        return np.minimum(nits, target_peak)
    source_top = pq_inverse_eotf(np.float32(source_peak))
    top = pq_inverse_eotf(np.float32(target_peak)) / source_top
    knee = 1.5 * top - 0.5
    code = np.minimum(pq_inverse_eotf(nits) / source_top, 1.0)
    t = np.clip((code - knee) / (1 - knee), 0.0, 1.0)
    rolled = ((2 * t ** 3 - 3 * t ** 2 + 1) * knee + (t ** 3 - 2 * t ** 2 + t) * (1 - knee)
              + (-2 * t ** 3 + 3 * t ** 2) * top)
    return np.minimum(pq_eotf(np.where(code < knee, code, rolled) * source_top), target_peak)
