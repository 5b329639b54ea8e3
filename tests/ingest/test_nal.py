"""Non-reference H.264 pictures found from NAL headers, against FFmpeg's own notion of them."""

import av
import pytest

from vidsight.ingest import SyntheticSpec, make_video
from vidsight.ingest.nal import is_non_reference, nal_length_size


@pytest.mark.parametrize("suffix", [".mp4", ".ts"])  # length-prefixed NALs, and Annex B start codes
def test_non_reference_packets_are_those_ffmpeg_discards(tmp_path, suffix):
    path = tmp_path / f"video{suffix}"
    make_video(path, SyntheticSpec(duration_s=3.0, gop=12, bframes=True))
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        length_size = nal_length_size(stream.codec_context.extradata)
        flagged = {p.pts: is_non_reference(bytes(p), length_size) for p in container.demux(stream) if p.size}
    assert (length_size is None) == (suffix == ".ts")
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.codec_context.skip_frame = "NONREF"  # FFmpeg drops every picture with nal_ref_idc 0
        kept = {f.pts for p in container.demux(stream) for f in p.decode()}
    non_reference = {pts for pts, flag in flagged.items() if flag}
    assert non_reference and kept
    assert non_reference == set(flagged) - kept


def test_packets_without_slices_are_not_non_reference():
    sps_only = b"\x00\x00\x00\x04" + b"\x67\x42\x00\x1e"  # one length-prefixed SPS NAL
    assert not is_non_reference(sps_only, 4)
    assert not is_non_reference(b"", None)
    assert is_non_reference(b"\x00\x00\x01\x01\x88", None)  # nal_ref_idc 0, non-IDR slice
    assert not is_non_reference(b"\x00\x00\x01\x41\x88", None)  # nal_ref_idc 2
