"""HDR (PQ, HLG) and BT.2020 video is shown in SDR BT.709: the transfer functions and matrices
against their published values, and an SDR picture stored as 10-bit HDR by BT.2408's placement
read back as it was, on every decoding path."""

from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from vidsight.bench.storage import BT709_TO_BT2020, hdr_signal
from vidsight.ingest import DecodeConfig, decode_frames, probe
from vidsight.ingest.colour import (BT2020_TO_BT709, REFERENCE_WHITE_NITS, ColourMapping, channel_light,
                                    content_peak, eetf, hlg_inverse_oetf, hlg_ootf, mapping_of, pq_eotf,
                                    pq_inverse_eotf, sdr_luma, to_sdr)
from vidsight.ingest.picture import to_rgb
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.stream import StreamSource

HEIGHT, WIDTH, FRAMES, FPS = 96, 128, 6, 10
PIXELS = "yuv444p10le"   # no chroma subsampling: colours stay the blocks' own
X265_TRANSFER = {"pq": "smpte2084", "hlg": "arib-std-b67"}


def picture() -> np.ndarray:
    """8x8 blocks of random colours over the full range above, a grey ramp below."""
    generator = np.random.default_rng(0)
    image = np.zeros((HEIGHT // 8, WIDTH // 8, 3), np.uint8)
    image[: HEIGHT // 16] = generator.integers(0, 256, (HEIGHT // 16, WIDTH // 8, 3))
    image[HEIGHT // 16 :] = np.linspace(0, 255, WIDTH // 8, dtype=np.uint8)[None, :, None]
    return np.repeat(np.repeat(image, 8, 0), 8, 1)


def store_hdr(path, transfer: str | None, images: np.ndarray, metadata: str = "", keyint: int = 3,
              sdr_pixels: str = "yuv444p") -> None:
    """``images`` (``(H, W, 3)``: that picture in `FRAMES` frames), 10-bit HEVC in ``transfer`` with
    BT.2020 primaries (`hdr_signal`); SDR BT.709 in ``sdr_pixels`` when ``transfer`` is None."""
    images = np.repeat(images[None], FRAMES, axis=0) if images.ndim == 3 else images
    tags = "colorprim=bt709:transfer=bt709:colormatrix=bt709:range=limited" if transfer is None else (
        f"colorprim=bt2020:transfer={X265_TRANSFER[transfer]}:colormatrix=bt2020nc:range=limited")
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx265", rate=FPS, options={
            "crf": "4", "x265-params": f"log-level=error:keyint={keyint}:bframes=0:{tags}{metadata}"})
        stream.width, stream.height = WIDTH, HEIGHT
        stream.pix_fmt = sdr_pixels if transfer is None else PIXELS
        for k, image in enumerate(images):
            if transfer is None:
                stored = av.VideoFrame.from_ndarray(image.astype(np.uint16) * 257, format="rgb48le").reformat(
                    format=sdr_pixels, dst_colorspace=av.video.reformatter.Colorspace.ITU709,
                    dst_color_range=av.video.reformatter.ColorRange.MPEG)
            else:
                stored = av.VideoFrame.from_ndarray(hdr_signal(image, transfer), format="rgb48le").reformat(
                    format=PIXELS, dst_colorspace=av.video.reformatter.Colorspace.BT2020,
                    dst_color_range=av.video.reformatter.ColorRange.MPEG)
            stored.pts, stored.time_base = k, Fraction(1, FPS)
            for packet in stream.encode(stored):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def block_centres() -> np.ndarray:
    """Pixels 2-5 of each 8x8 block: where 4:2:0 chroma is the block's own colour, not a blend."""
    inside = (np.arange(8) >= 2) & (np.arange(8) <= 5)
    return np.tile(inside, HEIGHT // 8)[:, None] & np.tile(inside, WIDTH // 8)[None, :]


def test_transfer_functions_and_matrices_match_their_published_values():
    # BT.2408, table 1: PQ code values of 100, 203 and 1,000 nits; 10,000 is full scale.
    assert pq_inverse_eotf(np.array([100.0, 203.0, 1000.0, 10000.0])) == pytest.approx([0.5081, 0.5807, 0.7518, 1.0],
                                                                                          abs=1e-4)
    assert pq_eotf(pq_inverse_eotf(np.array([0.1, 5.0, 203.0, 4000.0]))) == pytest.approx([0.1, 5.0, 203.0, 4000.0],
                                                                                         rel=1e-6)
    # BT.2408: HLG's 75 % signal is reference white, 203 nits on a 1,000-nit display; 100 % is the peak.
    grey = np.array([[0.75] * 3, [1.0] * 3])
    assert hlg_ootf(hlg_inverse_oetf(grey))[:, 0] == pytest.approx([203.0, 1000.0], rel=2e-3)
    # BT.2087: linear BT.709 -> BT.2020 (our BT.2020 -> BT.709 is derived from the primaries).
    assert np.linalg.inv(BT2020_TO_BT709) == pytest.approx(BT709_TO_BT2020, abs=6e-5)


@pytest.mark.parametrize("peak", [1000.0, 4000.0, 10000.0])
def test_the_eetf_keeps_the_sdr_range_and_rolls_highlights_off_into_it(peak):
    nits = np.geomspace(0.01, peak, 2000)
    mapped = eetf(nits, peak, REFERENCE_WHITE_NITS)
    # Rising (flat at the very top, where the spline meets the target with zero slope), to the target.
    assert np.all(np.diff(mapped) >= 0) and np.all(np.diff(mapped[nits < 0.9 * peak]) > 0)
    assert mapped[-1] == pytest.approx(REFERENCE_WHITE_NITS, rel=1e-4)
    # BT.2390's knee: at 1.5 times the target's share of the source's PQ range, less a half.
    top = pq_inverse_eotf(REFERENCE_WHITE_NITS) / pq_inverse_eotf(peak)
    knee = pq_eotf((1.5 * top - 0.5) * pq_inverse_eotf(peak))
    assert mapped[nits < knee] == pytest.approx(nits[nits < knee], rel=1e-4)
    assert np.all(mapped[nits > knee * 1.05] < nits[nits > knee * 1.05])
    assert np.all(mapped <= np.minimum(nits, REFERENCE_WHITE_NITS) * (1 + 1e-5))
    assert eetf(np.array([100.0, 500.0]), 150.0, REFERENCE_WHITE_NITS) == pytest.approx([100.0, REFERENCE_WHITE_NITS])


@pytest.mark.parametrize("mapping", [ColourMapping("pq", True, 1000.0), ColourMapping("pq", True, 4000.0),
                                     ColourMapping("hlg", True), ColourMapping("sdr", True, REFERENCE_WHITE_NITS)])
def test_the_tabulated_mapping_is_the_definition_computed_in_full(mapping):
    """`to_sdr` reads tables in float32; the same steps computed in float64 per pixel differ by at
    most one code value, at a rounding boundary, but in the darkest codes, where gamma 2.4 is
    steepest and a colour outside BT.709 leaves a channel as a difference of large terms. (300 rows
    of 500: mapped in three blocks of rows, the last one short.)"""
    signal = np.random.default_rng(2).integers(0, 65536, (300, 500, 3)).astype(np.uint16)
    light = channel_light(signal / 65535, mapping.transfer)
    light = hlg_ootf(light) if mapping.transfer == "hlg" else light
    largest = light.max(axis=-1, keepdims=True)
    light = light * eetf(largest, mapping.peak_nits, REFERENCE_WHITE_NITS) / np.maximum(largest, 1e-12)
    light = light @ np.linalg.inv(BT709_TO_BT2020).T   # BT.2087's matrix, inverted
    expected = np.rint(np.clip(light / REFERENCE_WHITE_NITS, 0, 1) ** (1 / 2.4) * 255)
    difference = np.abs(to_sdr(signal, mapping).astype(int) - expected)
    assert difference[expected > 4].max() <= 1 and difference.max() <= 4 and (difference > 0).mean() < 0.01


@pytest.mark.parametrize("transfer", ["pq", "hlg"])
def test_an_sdr_picture_stored_as_hdr_comes_back_on_every_path(tmp_path, transfer):
    image = picture()
    path = tmp_path / f"{transfer}.mp4"
    store_hdr(path, transfer, image)
    info = probe(path)
    assert (info.dynamic_range, info.wide_gamut) == (transfer, True)
    frames = decode_frames(path, None, DecodeConfig(), info).data
    shown = frames[0].numpy().astype(int)
    centres = block_centres() & (image.max(-1) <= 0.7 * 255)   # below the EETF's knee
    error = np.abs(shown - image)[centres]
    assert error.mean() < 0.5 and np.percentile(error, 99) <= 4
    bright = block_centres() & (image.max(-1) > 0.8 * 255)   # highlights: compressed, not clipped
    ratio = shown.max(-1)[bright] / image.max(-1)[bright]
    assert ratio.min() > 0.85 and ratio.max() < 1.05
    with av.open(str(path)) as container:   # what was shown before: the code values read as SDR
        as_sdr = next(container.decode(video=0)).to_ndarray(format="rgb24").astype(int)
    assert np.abs(as_sdr - image)[centres].mean() > max(5, 10 * error.mean())
    parallel = decode_parallel(path, np.arange(1, FRAMES, 2), DecodeConfig(trim_gops=True), info, workers=2)
    assert torch.equal(parallel.data, frames[1::2])
    resized = decode_frames(path, np.array([0]), DecodeConfig(size=(48, 64)), info).data[0]
    inside = np.tile(np.arange(4) % 3 != 0, HEIGHT // 8)[:, None] & np.tile(np.arange(4) % 3 != 0, WIDTH // 8)[None]
    halved = image[::2, ::2]   # each 8x8 block now 4x4, its middle 2x2 its own colour
    assert np.abs(resized.numpy().astype(int) - halved)[inside & (halved.max(-1) <= 0.7 * 255)].mean() < 1
    live = StreamSource(path, fps=float(FPS))
    assert torch.equal(torch.stack([f.rgb for f in live]), frames)


def test_the_peak_comes_from_the_content_light_level_else_the_mastering_display(tmp_path):
    image = picture()
    display = ":master-display=G(13250,34500)B(7500,3000)R(34000,16000)WP(15635,16450)L(40000000,50)"
    peaks = {}
    for name, metadata in [("both", f"{display}:max-cll=1500,400"), ("display", display), ("none", "")]:
        store_hdr(tmp_path / f"{name}.mp4", "pq", image, metadata)
        with av.open(str(tmp_path / f"{name}.mp4")) as container:
            peaks[name] = content_peak(next(container.decode(video=0)))
    assert peaks == {"both": 1500.0, "display": 4000.0, "none": 1000.0}


def test_sdr_frames_are_read_as_before_and_bt2020_sdr_is_only_reprimaried(make_test_video):
    video, _ = make_test_video(width=64, height=48, fps=8, duration_s=0.5)
    with av.open(str(video)) as container:
        frame = next(container.decode(video=0))
        assert mapping_of(frame) is None
        assert np.array_equal(to_rgb(frame), frame.to_ndarray(format="rgb24"))
        assert np.array_equal(to_rgb(frame, (24, 32)), frame.to_ndarray(format="rgb24", width=32, height=24,
                                                                         interpolation="BICUBIC"))
    assert probe(video).dynamic_range == "sdr" and not probe(video).wide_gamut
    colours = picture()
    colours = colours[(colours.max(-1) <= 0.7 * 255)][:, None, :][:200]   # within BT.709 and below the knee
    linear = ((colours / 255.0) ** 2.4) @ BT709_TO_BT2020.T
    signal = np.rint(linear ** (1 / 2.4) * 65535).astype(np.uint16)
    back = to_sdr(signal, ColourMapping("sdr", wide_gamut=True, peak_nits=REFERENCE_WHITE_NITS))
    assert np.abs(back.astype(int) - colours).max() <= 1


@pytest.mark.parametrize("transfer", ["pq", "hlg"])
def test_the_motion_rule_judges_hdr_as_its_sdr_picture(tmp_path, transfer):
    """Judged by pixels, a square crossing a noisy still scene stored as HDR moves the same blocks
    as stored as SDR: the rule reads the HDR luma as its SDR picture's (`sdr_luma`)."""
    generator = np.random.default_rng(1)
    scene = generator.integers(60, 160, (HEIGHT, WIDTH, 3)).astype(np.int16)
    texture = generator.integers(0, 256, (24, 24, 3))
    images = []
    for k in range(24):
        image = scene + generator.normal(0, 3, scene.shape)
        image[36:60, 4 + 4 * k : 28 + 4 * k] = texture
        images.append(np.clip(image, 0, 255).astype(np.uint8))
    images = np.stack(images)
    store_hdr(tmp_path / "sdr.mp4", None, images, keyint=24)
    store_hdr(tmp_path / "hdr.mp4", transfer, images, keyint=24)
    with av.open(str(tmp_path / "sdr.mp4")) as plain, av.open(str(tmp_path / "hdr.mp4")) as hdr:
        sdr_frame, hdr_frame = next(plain.decode(video=0)), next(hdr.decode(video=0))
        sdr_grey = sdr_frame.to_ndarray(format="gray").astype(int)
        mapped = np.abs(sdr_luma(hdr_frame).astype(int) - sdr_grey).mean()
        unmapped = np.abs(hdr_frame.to_ndarray(format="gray").astype(int) - sdr_grey).mean()
        # Within 8-bit steps of HDR luma (PQ spends 148 of them on SDR's range) and colour's share of it.
        assert mapped < 4 and unmapped > 2 * mapped and np.array_equal(sdr_luma(sdr_frame), sdr_grey)
    config = DecodeConfig(motion=MotionPruneConfig(tau=0.25, source="pixels"))
    maps = [[info.dynamic for info in decode_frames(tmp_path / f"{name}.mp4", None, config).codec]
            for name in ("sdr", "hdr")]
    judged = [(a, b) for a, b in zip(*maps) if a is not None and b is not None]
    assert len(judged) >= 20
    moved_in_sdr = sum(int(a.sum()) for a, _ in judged)
    moved_in_both = sum(int((a & b).sum()) for a, b in judged)
    moved_in_hdr = sum(int(b.sum()) for _, b in judged)
    assert moved_in_sdr > 0 and moved_in_both >= 0.9 * moved_in_sdr and moved_in_hdr <= 1.25 * moved_in_sdr


def test_the_pixel_rule_reads_10_bit_and_hdr_luma_in_place_as_8_bit_sdr(tmp_path):
    """`reduced_luma` samples a 10-bit plane where it lies and reads each sample as the 8-bit SDR
    picture's luma (`luma_codes`): the same picture stored in 8-bit SDR, 10-bit SDR, PQ and HLG
    gives the same reduced luma, to the rounding of an 8-bit level per sample."""
    from vidsight.ingest.pixel_motion import reduced_luma, reduction

    ramp = np.linspace(20, 235, WIDTH)[None, :, None] * np.linspace(0.5, 1.0, HEIGHT)[:, None, None]
    image = np.repeat(np.rint(ramp), 3, axis=2).astype(np.uint8)   # greys: luma is the picture itself
    for name, transfer, pixels in [("sdr8", None, "yuv444p"), ("sdr10", None, "yuv444p10le"), ("pq", "pq", None),
                                   ("hlg", "hlg", None)]:
        store_hdr(tmp_path / f"{name}.mp4", transfer, image, sdr_pixels=pixels or "yuv444p")
    reduced = {}
    for name in ("sdr8", "sdr10", "pq", "hlg"):
        with av.open(str(tmp_path / f"{name}.mp4")) as container:
            frame = next(container.decode(video=0))
            assert frame.format.name == ("yuv444p" if name == "sdr8" else "yuv444p10le")
            reduced[name] = reduced_luma(frame).astype(int)
    scale = reduction(WIDTH)
    low = image[::scale, ::scale, 0] <= 0.7 * 255   # below the EETF's knee
    for name in ("sdr10", "pq", "hlg"):
        difference = np.abs(reduced[name] - reduced["sdr8"])   # sums of four samples
        assert difference.mean() < 2.5 and difference[low].max() <= 6, name


@pytest.mark.parametrize("transfer", ["pq", "hlg"])
def test_a_large_hdr_frame_is_mapped_at_twice_the_size_it_is_resized_to(tmp_path, transfer):
    """`ask`'s decoder path (its resize given): an HDR frame over twice the model's size is scaled
    by FFmpeg to twice it before it is mapped (4K costs a twelfth), for final pixels close to
    mapping it whole; an SDR frame, and one not that large, are read whole as before."""
    from vidsight.ingest.picture import to_rgb_to_resize
    from vidsight.vision.preprocess import resize_frames

    path = tmp_path / f"{transfer}.mp4"
    store_hdr(path, transfer, picture())
    info = probe(path)
    with av.open(str(path)) as container:
        frame = next(container.decode(video=0))
    assert to_rgb_to_resize(frame, (24, 32)).shape == (48, 64, 3)
    assert np.array_equal(to_rgb_to_resize(frame, (48, 64)), to_rgb(frame))   # not over twice: whole
    decoded = decode_frames(path, np.array([0, 3]), DecodeConfig(size=(24, 32), resize=resize_frames), info).data
    whole = resize_frames(decode_frames(path, np.array([0, 3]), DecodeConfig(), info).data, (24, 32))
    error = (decoded.permute(0, 3, 1, 2).int() - whole.int()).abs().float()
    # The grey ramp below (each 8-pixel step now 2 pixels): within a level. The random blocks above
    # (8x8 of saturated colours, each now 2x1.5 pixels, so every pixel an edge): within 1.5 levels
    # on average; real footage, 0.23-0.35 (docs/benchmarks.md).
    assert error[..., 14:, :].max() <= 1 and 0 < error.mean() < 1.5
    sdr = tmp_path / "sdr.mp4"
    store_hdr(sdr, None, picture())
    with av.open(str(sdr)) as container:
        plain = next(container.decode(video=0))
    assert np.array_equal(to_rgb_to_resize(plain, (24, 32)), to_rgb(plain))
