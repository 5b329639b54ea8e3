"""A fixed-seed sample of the fuzz corpus: every damaged or hostile input ends in exit 0 or 2."""

import collections
import os
from pathlib import Path

import numpy as np
import pytest

from vidsight.bench.damage import DAMAGE, make_case, make_sources
from vidsight.bench.fuzz import COMMANDS, MEMORY_LIMIT_BYTES, pipeable, run_fuzz, summarise

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def test_a_fixed_seed_sample_exits_0_or_2_naming_the_input(fuzz_root, tiny_model_dir):
    # (A replay in real time takes each input's length: a smaller sample of its own, below.)
    outcomes = run_fuzz(48, seed=20261123, model=tiny_model_dir, root=fuzz_root, workers=2, time_limit_s=120,
                        commands=tuple(c for c in COMMANDS if c != "watch-live"))
    report = summarise(outcomes)
    files = sum(o.command == "probe" and pipeable(o.case.path) for o in outcomes)
    # probe, ask and watch each input, and watch each file piped in
    assert report["runs"] == 48 * 3 + files and files >= 36 and not report["failures"], report["failures"]
    assert {o.command for o in outcomes} == {"probe", "ask", "watch", "watch-stdin"}
    kinds = collections.Counter(o.case.kind for o in outcomes)
    assert len(kinds) >= 8  # the sample covers many kinds of damage, not one
    assert report["verdicts"].get("exit 0", 0) > 0 and report["verdicts"].get("exit 2", 0) > 0


def test_a_watch_replaying_damaged_inputs_in_real_time_exits_0_or_2(fuzz_root, tiny_model_dir):
    outcomes = run_fuzz(10, seed=20261129, model=tiny_model_dir, root=fuzz_root, workers=2, time_limit_s=120,
                        commands=("watch-live",))
    report = summarise(outcomes)
    assert report["runs"] == 10 and not report["failures"], report["failures"]
    assert report["verdicts"].get("exit 0", 0) > 0 and report["verdicts"].get("exit 2", 0) > 0


def test_the_same_seed_makes_the_same_damage(tmp_path):
    import numpy as np

    sources = make_sources(tmp_path / "sources")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a_rng, b_rng = np.random.default_rng(5), np.random.default_rng(5)
    for k in range(12):
        a, b = make_case(k, tmp_path / "a", sources, a_rng), make_case(k, tmp_path / "b", sources, b_rng)
        assert a.kind == b.kind
        if a.kind in DAMAGE:
            assert open(a.path, "rb").read() == open(b.path, "rb").read()


def test_a_traceback_and_a_hang_are_caught_and_the_callers_memory_is_not_counted(fuzz_root, tiny_model_dir,
                                                                                  monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # The children are forked from a fresh process: a caller holding more than the memory limit (as
    # a test process holding models does) is not measured in them.
    held = np.ones(MEMORY_LIMIT_BYTES + 2**27, np.uint8)
    outcomes = run_fuzz(2, seed=1, model=tiny_model_dir, root=fuzz_root, workers=2, commands=("probe", "ask"),
                        time_limit_s=3, main="tests.bench.fuzz_doubles:main")
    assert held.sum() > MEMORY_LIMIT_BYTES
    assert len(outcomes) == 4
    assert {(o.command, o.verdict) for o in outcomes} == {("probe", "traceback"), ("ask", "hang")}
    assert all(0 < o.peak_rss_bytes < MEMORY_LIMIT_BYTES / 2 for o in outcomes)


def test_the_shaped_sources_are_shaped_as_named(tmp_path):
    """The trimmed MP4 holds packets FFmpeg drops after decoding, the Matroska file lists a picture
    first, the HDR file is PQ with its peak declared, the MPEG-2 file interlaced, the pictures are
    stills and the JPEG is turned upright as its EXIF orientation says."""
    import av

    from vidsight.bench.damage import SHAPED, TRIMMED_FRAMES

    sources = {path.name: path for path in make_sources(tmp_path / "sources")}
    assert set(SHAPED) <= set(sources)
    with av.open(str(sources["h264-trimmed.mp4"])) as container:
        assert sum(packet.is_discard for packet in container.demux(video=0)) == TRIMMED_FRAMES
    with av.open(str(sources["h264-picture-first.mkv"])) as container:
        assert [s.codec_context.name for s in container.streams.video] == ["mjpeg", "h264"]
    from vidsight.ingest import probe
    from vidsight.ingest.colour import content_peak

    assert (probe(sources["hevc-pq.mp4"]).dynamic_range, probe(sources["hevc-pq.mp4"]).codec) == ("pq", "hevc")
    with av.open(str(sources["hevc-pq.mp4"])) as container:
        assert content_peak(next(container.decode(video=0))) == 1500.0
    assert probe(sources["mpeg2-interlaced.mpg"]).interlaced
    turned = probe(sources["picture-turned.jpg"])
    assert (turned.width, turned.height, turned.rotation) == (120, 160, 270)


def test_a_file_whose_timestamps_outlast_the_time_limit_is_not_replayed(make_test_video, tmp_path, monkeypatch):
    """A bit flipped in an AVI's header put its 18 frames 45 minutes apart (fuzz seed 61): replayed
    in real time that takes 13.6 hours, as long as the file says, so it is left out of real-time
    replays rather than counted as a hang; a file that cannot be probed still runs (it fails fast)."""
    import vidsight.ingest as ingest
    from vidsight.bench.fuzz import replayable

    path, _ = make_test_video(duration_s=2.0)
    assert replayable(str(path), 60) and replayable(str(tmp_path / "missing.mp4"), 60)
    stretched = ingest.probe(path)
    monkeypatch.setattr(ingest, "probe", lambda _: type(stretched)(**{**vars(stretched), "duration_s": 49153.5}))
    assert not replayable(str(path), 60)
