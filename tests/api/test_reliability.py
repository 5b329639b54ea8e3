"""One test per bug of the reliability review: each failed before its fix."""

import json
import logging
import os

import av
import numpy as np
import pytest

from vidsight.api.cli import main
from vidsight.ingest import probe
from vidsight.ingest.writer import write_video


def ask_json(capsys, path, model, *flags):
    code = main(["ask", str(path), "What?", "--model", str(model), "--max-new-tokens", "2", "--json", *flags])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if code == 0 else None), captured.err


@pytest.fixture(scope="module")
def one_frame_inputs(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("one-frame")
    image = np.random.default_rng(0).integers(0, 256, size=(64, 96, 3), dtype=np.uint8)
    write_video(root / "one.mp4", [image], [0.0], 25)
    Image.fromarray(image).save(root / "still.png")
    with av.open(str(root / "one.y4m"), "w") as out:
        stream = out.add_stream("rawvideo", rate=25)
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        for packet in [*stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")), *stream.encode()]:
            out.mux(packet)
    return root


@pytest.mark.parametrize("name", ["one.mp4", "still.png", "one.y4m"])
def test_a_one_frame_video_or_an_image_is_answered(one_frame_inputs, tiny_model_dir, capsys, name):
    path = one_frame_inputs / name
    info = probe(path)
    assert info.frame_count == 1 and info.duration_s > 0
    code, report, err = ask_json(capsys, path, tiny_model_dir)
    assert code == 0, err
    assert report["stats"]["frames"] == 1 and report["stats"]["frames_lost"] == 0


@pytest.mark.parametrize("suffix,codec", [(".ts", "h264"), (".mpg", "mpeg2video")])
def test_ask_on_an_undamaged_mpeg_ts_or_ps_file_loses_no_frame(make_test_video, tiny_model_dir, capsys, caplog,
                                                               suffix, codec):
    path, _ = make_test_video(suffix=suffix, codec=codec, bframes=True, duration_s=10.0, fps=25, gop=32)
    for flags in ([], ["--no-overlap"]):
        code, report, err = ask_json(capsys, path, tiny_model_dir, "--fps", "2", *flags)
        assert code == 0, err
        assert report["stats"]["frames"] == 20 and report["stats"]["frames_lost"] == 0
    assert "could not be decoded" not in caplog.text


def test_truncated_weights_are_refused(tiny_model_dir, tmp_path, make_test_video, capsys):
    import shutil

    model = tmp_path / "truncated-model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, _, err = ask_json(capsys, make_test_video(duration_s=1.0)[0], model)
    assert code == 2 and str(model) in err and "cannot load weights" in err and "Traceback" not in err


def test_model_tiny_refuses_a_path_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("mine")
    assert main(["model", "tiny", str(target)]) == 2
    err = capsys.readouterr().err
    assert str(target) in err and "not a directory" in err and target.read_text() == "mine"


def test_a_prune_start_layer_past_the_last_layer_is_refused(make_test_video, tiny_model_dir, capsys):
    code, _, err = ask_json(capsys, make_test_video(duration_s=1.0)[0], tiny_model_dir, "--prune-start-layer", "99")
    assert code == 2 and "past the model's last layer" in err


def test_more_decoders_than_cpus_are_clamped_and_said(make_test_video, tiny_model_dir, capsys, caplog):
    cpus = os.cpu_count() or 1
    with caplog.at_level(logging.WARNING):
        code, report, _ = ask_json(capsys, make_test_video(duration_s=1.0)[0], tiny_model_dir,
                                   "--decode-workers", str(cpus + 62))
    assert code == 0 and report["stats"]["decode_workers"] == cpus
    assert f"{cpus + 62} decoders asked for on {cpus} CPUs" in caplog.text


def test_watch_refuses_a_negative_follow_time(make_test_video, capsys):
    path, _ = make_test_video(duration_s=1.0)
    assert main(["watch", str(path), "--query", "Yes?", "--follow", "-1"]) == 2
    assert "follow" in capsys.readouterr().err


def test_a_huge_declared_frame_and_a_fifo_get_messages_that_say_so(tmp_path, capsys):
    huge = tmp_path / "huge.y4m"
    huge.write_bytes(b"YUV4MPEG2 W60000 H60000 F25:1 Ip A1:1 C420jpeg\nFRAME\n" + bytes(1000))
    wide = tmp_path / "wide.y4m"
    wide.write_bytes(b"YUV4MPEG2 W9000 H4000 F25:1 Ip A1:1 C420jpeg\nFRAME\n" + bytes(1000))
    fifo = tmp_path / "pipe.mp4"
    os.mkfifo(fifo)
    messages = {}
    for path in (huge, wide, fifo):
        assert main(["probe", str(path)]) == 2
        messages[path] = capsys.readouterr().err
    assert "declares values FFmpeg rejects" in messages[huge] and "busy" not in messages[huge].split("(")[0]
    assert "declares a 9000x4000 frame" in messages[wide]
    assert "FIFO" in messages[fifo] and "empty" not in messages[fifo]
    assert f"standard input: vidsight COMMAND - ... < {fifo}" in messages[fifo]


def test_watch_names_the_nearest_workable_stride(make_test_video, tiny_model_dir, capsys):
    path, _ = make_test_video(duration_s=1.0)
    code = main(["watch", str(path), "--query", "Yes?", "--model", str(tiny_model_dir), "--window", "2",
                 "--fps", "2", "--stride", "0.2", "--refresh", "anchors"])
    err = capsys.readouterr().err
    assert code == 2 and "--stride 0.5 (2 frames)" in err


def test_a_window_reports_its_real_span(make_test_video, tiny_model_dir, capsys):
    path, _ = make_test_video(width=224, height=168, duration_s=8.0, fps=25, gop=25)
    assert main(["watch", str(path), "--query", "Yes?", "--model", str(tiny_model_dir), "--window", "4",
                 "--stride", "0.5", "--fps", "2", "--json"]) == 0
    windows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    windows = [w for w in windows if w["type"] == "window"]
    assert windows and all(w["end_s"] - w["start_s"] == pytest.approx(4.0) for w in windows)


def test_prefill_peak_memory_is_metered_on_request_and_null_otherwise(make_test_video, tiny_model_dir, capsys):
    path, _ = make_test_video(duration_s=1.0)
    _, plain, _ = ask_json(capsys, path, tiny_model_dir)
    _, metered, _ = ask_json(capsys, path, tiny_model_dir, "--meter-memory")
    assert plain["stats"]["prefill_peak_bytes"] is None
    assert metered["stats"]["prefill_peak_bytes"] > 0
