"""H.264 NAL unit headers: which packets hold pictures that no other picture refers to.

A coded slice whose ``nal_ref_idc`` is zero belongs to a non-reference picture: no later picture
predicts from it, so a decoder that is never sent it produces every other frame bit for bit the
same. GOP trimming uses this to skip the unwanted ones (with B-frames, about half the frames).
"""

from __future__ import annotations

# nal_unit_type 1..5: coded slices (non-IDR, data partitions A-C, IDR).
_SLICE_TYPES = range(1, 6)
_START_CODE = b"\x00\x00\x01"


def nal_length_size(extradata: bytes | None) -> int | None:
    """Bytes in each NAL's length prefix for avcC-framed packets (MP4, MKV); None for Annex B start codes."""
    if extradata and len(extradata) >= 5 and extradata[0] == 1:
        return (extradata[4] & 3) + 1
    return None


def _nal_headers(data: bytes, length_size: int | None):
    """The first byte of every NAL unit in one packet."""
    if length_size is None:
        at = data.find(_START_CODE)
        while at != -1 and at + 3 < len(data):
            yield data[at + 3]
            at = data.find(_START_CODE, at + 3)
        return
    at = 0
    while at + length_size < len(data):
        size = int.from_bytes(data[at : at + length_size], "big")
        yield data[at + length_size]
        at += length_size + size


def is_non_reference(data: bytes, length_size: int | None) -> bool:
    """Whether an H.264 packet carries slices and every one of them has ``nal_ref_idc`` zero.

    Args:
        data: The packet's bytes.
        length_size: From `nal_length_size` for the stream's extradata.
    """
    slices = [header for header in _nal_headers(data, length_size) if header & 0x1F in _SLICE_TYPES]
    return bool(slices) and all(header & 0x60 == 0 for header in slices)
