"""The CLI as a user meets it: JSON output, exit statuses and messages for bad input."""

import json
import subprocess
import sys

import av
import numpy as np
import pytest

from vidsight.api.cli import main
from vidsight.engine import Asker, GenerationConfig
from vidsight.ingest import SamplingConfig
from vidsight.models.conversation import IMAGE_PART, Conversation

STAGES = {"decode", "preprocess", "vision", "prefill", "generate"}


def run_cli(*args):
    """Run the CLI in a fresh interpreter, as a user would."""
    return subprocess.run([sys.executable, "-m", "vidsight.api.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_ask_json_on_60_second_640x360_video(make_test_video, tiny_model_dir):
    path, _ = make_test_video(width=640, height=360, fps=24, duration_s=60.0, gop=16, bframes=True)
    done = run_cli("ask", path, "What colour is the square?", "--model", tiny_model_dir, "--fps", 2,
                   "--max-new-tokens", 8, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    stats = report["stats"]
    assert isinstance(report["answer"], str)
    assert stats["frames"] == 120
    assert set(stats["stages_s"]) == STAGES and all(v > 0 for v in stats["stages_s"].values())
    assert stats["visual_tokens"] > 0 and stats["prompt_tokens"] > stats["visual_tokens"]
    assert 1 <= stats["generated_tokens"] <= 8
    assert stats["peak_memory_bytes"] > 0 and stats["device"] == "cpu"


def test_a_picture_is_asked_about_as_an_image_where_the_family_has_an_image_path(picture, tiny_model_dir,
                                                                               llava_adapter, capsys, caplog):
    question = "What colour is the square?"
    assert main(["ask", str(picture), question, "--model", str(tiny_model_dir), "--max-new-tokens", "6",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    alone = Asker(tiny_model_dir).ask(picture, Conversation.of(question, visual=IMAGE_PART),
                                      generation=GenerationConfig(max_new_tokens=6))
    assert (report["answer"], report["stats"]["visual_tokens"]) == (alone.answer, alone.stats.visual_tokens)
    assert report["stats"]["still"] and alone.stats.still
    # A family whose image processor tiles pictures: a one-frame video, and a word saying so.
    assert main(["ask", str(picture), question, "--model", llava_adapter.model.name_or_path, "--max-new-tokens",
                 "2", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    assert stats["frames"] == 1 and not stats["still"]
    assert "as a video of one frame" in caplog.text


def test_several_questions_prefill_the_video_once_and_answer_as_each_alone(make_test_video, tiny_model_dir):
    path, _ = make_test_video(width=320, height=240, fps=8, duration_s=6.0, gop=16)
    questions = ["What colour is the square?", "Where is the square at the end?"]
    options = ("--model", tiny_model_dir, "--fps", 2, "--max-new-tokens", 6, "--json")
    together = run_cli("ask", path, *questions, *options)
    assert together.returncode == 0, together.stderr
    reports = [json.loads(line) for line in together.stdout.splitlines()]
    assert [r["question"] for r in reports] == questions
    assert reports[0]["stats"]["cached_tokens"] == 0 < reports[1]["stats"]["cached_tokens"]
    assert reports[1]["stats"]["stages_s"]["vision"] == 0   # the video was not encoded again
    asker = Asker(tiny_model_dir)
    for question, report in zip(questions, reports):
        alone = asker.ask(path, question, sampling=SamplingConfig(fps=2), generation=GenerationConfig(max_new_tokens=6))
        assert alone.answer == report["answer"]


def test_a_system_message_stop_strings_and_logprobs(make_test_video, tiny_model_dir, capsys):
    path, _ = make_test_video(duration_s=2.0)
    question, system, generation = "What colour is the square?", "Answer in one word.", GenerationConfig(max_new_tokens=6)
    code = main(["ask", str(path), question, "--system", system, "--model", str(tiny_model_dir), "--fps", "2",
                 "--max-new-tokens", "6", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    asker = Asker(tiny_model_dir)
    expected = asker.ask(path, Conversation.of(question, system), sampling=SamplingConfig(fps=2), generation=generation)
    plain = asker.ask(path, question, sampling=SamplingConfig(fps=2), generation=generation)
    assert report["answer"] == expected.answer
    assert report["stats"]["prompt_tokens"] == expected.stats.prompt_tokens != plain.stats.prompt_tokens
    stop = next(text for k in range(1, 5) if len(text := expected.answer[k:k + 2].strip()) == 2 and "\ufffd" not in text)
    assert main(["ask", str(path), question, "--system", system, "--stop", stop, "--stop", "never said",
                 "--logprobs", "2", "--model", str(tiny_model_dir), "--fps", "2", "--max-new-tokens", "6",
                 "--json"]) == 0
    stopped = json.loads(capsys.readouterr().out)
    assert stopped["answer"] == expected.answer.split(stop, 1)[0].strip() and stopped["finish_reason"] == "stop"
    assert len(stopped["logprobs"]) == stopped["stats"]["generated_tokens"]
    assert all(len(entry["top_logprobs"]) == 2 and entry["logprob"] <= 0 for entry in stopped["logprobs"])
    # An answer begun (vLLM's continue_final_message): the answer is what the model writes after it.
    assert main(["ask", str(path), question, "--system", system, "--answer-start", "The square is",
                 "--model", str(tiny_model_dir), "--fps", "2", "--max-new-tokens", "6", "--json"]) == 0
    begun = json.loads(capsys.readouterr().out)
    continued = asker.ask(path, Conversation.of(question, system).continued("The square is"),
                          sampling=SamplingConfig(fps=2), generation=generation)
    assert begun["answer"] == continued.answer and begun["stats"]["prompt_tokens"] == continued.stats.prompt_tokens
    assert continued.stats.prompt_tokens == expected.stats.prompt_tokens + len(asker.adapter.text_ids("The square is"))
    assert "logprobs" not in report


def test_choices_are_scored_instead_of_answered(make_test_video, tiny_model_dir, capsys):
    path, _ = make_test_video(duration_s=2.0)
    question, choices = "What colour is the square?", ["red", "blue", "a green square"]
    options = [str(path), question, "--choices", *choices, "--model", str(tiny_model_dir), "--fps", "2"]
    assert main(["ask", *options, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    expected = Asker(tiny_model_dir).score(path, question, choices, sampling=SamplingConfig(fps=2))
    assert [s["text"] for s in report["scores"]] == choices
    assert [s["logprob"] for s in report["scores"]] == pytest.approx([s.logprob for s in expected.scores], abs=1e-5)
    assert report["best"] == expected.best and report["stats"]["generated_tokens"] == 0
    assert main(["ask", *options]) == 0
    shown = capsys.readouterr()
    assert shown.out.strip() == choices[expected.best] and all(choice in shown.err for choice in choices)
    assert main(["ask", str(path), question, "--choices", "red", "", "--model", str(tiny_model_dir)]) == 2
    assert "no tokens to score" in capsys.readouterr().err
    assert main(["ask", *options, "--logprobs", "2"]) == 2 and "--logprobs, --stop" in capsys.readouterr().err
    assert main(["ask", *options, "--answer-regex", "a+"]) == 2 and "answer formats" in capsys.readouterr().err


def test_an_answer_format_from_text_or_a_file_holds_the_answer(make_test_video, tiny_model_dir, capsys, tmp_path):
    from vidsight.engine import Asker, GenerationConfig
    from vidsight.engine.config import AnswerFormat
    from vidsight.ingest import SamplingConfig

    path, _ = make_test_video(duration_s=2.0)
    schema = ('{"type": "object", "properties": {"moving": {"type": "boolean"}}, "required": ["moving"], '
              '"additionalProperties": false}')
    (tmp_path / "schema.json").write_text(schema)
    expected = Asker(tiny_model_dir).ask(path, "Does it move?", sampling=SamplingConfig(fps=2), generation=GenerationConfig(
        max_new_tokens=40, answer_format=AnswerFormat("json_schema", schema, any_whitespace=False)))
    assert set(json.loads(expected.answer)) == {"moving"}
    for given in (schema, str(tmp_path / "schema.json")):
        assert main(["ask", str(path), "Does it move?", "--model", str(tiny_model_dir), "--fps", "2",
                     "--max-new-tokens", "40", "--answer-schema", given, "--compact-json"]) == 0
        assert capsys.readouterr().out.strip() == expected.answer
    assert main(["ask", str(path), "q", "--model", str(tiny_model_dir), "--answer-regex", "[a-"]) == 2
    assert "regex is not valid" in capsys.readouterr().err


def test_a_reasoning_models_thinking_is_printed_apart_and_template_arguments_reach_its_template(
        make_test_video, thinking_adapter, capsys):
    path, _ = make_test_video(duration_s=2.0)
    end = thinking_adapter.tokenizer.convert_tokens_to_ids("</think>")
    sampled = dict(max_new_tokens=24, temperature=1.0, seed=4, logit_bias={end: 3}, reasoning_parser="qwen3")
    flags = ["--model", thinking_adapter.name, "--fps", "2", "--max-new-tokens", "24", "--temperature", "1",
             "--seed", "4", "--logit-bias", f"{end}=3", "--reasoning-parser", "qwen3"]
    for kwargs in (None, {"enable_thinking": False}):
        expected = Asker(thinking_adapter).ask(path, Conversation.of("What?", template_kwargs=kwargs),
                                               sampling=SamplingConfig(fps=2), generation=GenerationConfig(**sampled))
        given = ["--chat-template-kwargs", json.dumps(kwargs)] if kwargs else []
        assert main(["ask", str(path), "What?", *flags, *given, "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert (printed.get("reasoning"), printed["answer"]) == (expected.reasoning, expected.answer)
        assert main(["ask", str(path), "What?", *flags, *given]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == expected.answer and (expected.reasoning is None or expected.reasoning in err)
    assert expected.reasoning is None   # thinking off in the template
    for bad, said in (("[1]", "a JSON object is needed"), ("{", "not JSON")):
        with pytest.raises(SystemExit) as exit_info:
            main(["ask", str(path), "What?", *flags, "--chat-template-kwargs", bad])
        assert exit_info.value.code == 2 and said in capsys.readouterr().err
    assert main(["ask", str(path), "What?", *flags, "--chat-template-kwargs", '{"tools": []}']) == 2
    assert "may not set tools" in capsys.readouterr().err


def test_on_a_terminal_the_answer_is_printed_as_it_is_generated(make_test_video, tiny_model_dir, capsys, monkeypatch):
    """Standard output a terminal: the answer comes piece by piece (each flushed), and the pieces
    are the answer `ask` prints whole elsewhere."""
    path, _ = make_test_video(duration_s=2.0)
    flags = ["ask", str(path), "What?", "--model", str(tiny_model_dir), "--fps", "2", "--max-new-tokens", "10"]
    assert main(flags) == 0
    whole = capsys.readouterr().out
    writes = []
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    monkeypatch.setattr("sys.stdout.write", lambda text: writes.append(text) or len(text))
    assert main(flags) == 0
    pieces = [text for text in writes if text not in ("", "\n")]
    assert "".join(writes) == whole and len(pieces) > 1


def test_probe_json(make_test_video, capsys):
    path, _ = make_test_video(fps=24, duration_s=2.0, gop=12)
    assert main(["probe", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["frame_count"] == 48 and info["gop_sizes"] == [12, 12, 12, 12] and info["codec"] == "h264"


def test_model_tiny_writes_a_loadable_checkpoint(tmp_path, capsys):
    assert main(["model", "tiny", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "model.safetensors").is_file()


# -- bad input: VidsightError naming the input, exit status 2, no traceback ---------------------


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, make_test_video):
    root = tmp_path_factory.mktemp("bad")
    good, _ = make_test_video(duration_s=4.0, bframes=True)
    data = good.read_bytes()
    files = {"missing": root / "missing.mp4", "empty": root / "empty.mp4", "text": root / "notes.mp4",
             "truncated": root / "truncated.mp4", "audio": root / "audio.m4a"}
    files["empty"].write_bytes(b"")
    files["text"].write_text("this is not a video\n" * 20)
    files["truncated"].write_bytes(data[: len(data) // 2])
    with av.open(str(files["audio"]), "w") as out:
        stream = out.add_stream("aac", rate=16000)
        for i in range(20):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), dtype=np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return files


@pytest.mark.parametrize("kind,message", [
    ("missing", "no such file"), ("empty", "empty"), ("text", "not a readable video"),
    ("truncated", "not a readable video"), ("audio", "no video stream"),
])
def test_bad_video_files(bad_files, tiny_model_dir, capsys, kind, message):
    path = bad_files[kind]
    code = main(["ask", str(path), "What?", "--model", str(tiny_model_dir)])
    err = capsys.readouterr().err
    assert code == 2
    assert str(path) in err and message in err
    assert "Traceback" not in err


@pytest.mark.parametrize("flags,message", [
    (["--fps", "0"], "fps"), (["--fps", "-2"], "fps"), (["--max-frames", "0"], "max_frames"),
    (["--max-new-tokens", "0"], "max_new_tokens"), (["--group-frames", "-1"], "group_frames"),
    (["--device", "gpu"], "not a device name"), (["--temperature", "-1"], "temperature"),
    (["--rho", "0"], "rho"), (["--rho", "1.5"], "rho"), (["--prune-start-layer", "-1"], "start_layer"),
    (["--decode-workers", "-2"], "workers"), (["--rho", "0.5", "--group-frames", "0"], "group by group"),
])
def test_nonsensical_flags(make_test_video, tiny_model_dir, capsys, flags, message):
    path, _ = make_test_video(duration_s=1.0)
    code = main(["ask", str(path), "What?", "--model", str(tiny_model_dir), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_unknown_model_directory(make_test_video, tmp_path, capsys):
    path, _ = make_test_video(duration_s=1.0)
    code = main(["ask", str(path), "What?", "--model", str(tmp_path / "no-model")])
    err = capsys.readouterr().err
    assert code == 2 and "no-model" in err and "no such model directory" in err


def test_bench_ask_refuses_a_nonsensical_gop_before_generating_anything(tmp_path, capsys):
    code = main(["bench", "ask", "--gop", "0", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "gop" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())


def test_unparseable_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["ask", "x.mp4", "q", "--fps", "fast"])
    assert exit_info.value.code == 2


def test_debug_shows_the_traceback(bad_files):
    done = run_cli("--debug", "probe", bad_files["empty"])
    assert done.returncode != 0 and "Traceback" in done.stderr and "VideoError" in done.stderr


@pytest.mark.parametrize("flags,fills", [([], True), (["--no-overlap"], False), (["--decode-workers", "0"], False)])
def test_corrupt_middle_decodes_the_rest_and_counts_losses(tmp_path, make_test_video, tiny_model_dir, capsys, caplog,
                                                           flags, fills):
    good, _ = make_test_video(duration_s=4.0, bframes=True)
    data = bytearray(good.read_bytes())
    third = len(data) // 3
    data[third : third + 20000] = bytes(20000)
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(data))
    code = main(["ask", str(path), "What?", "--model", str(tiny_model_dir), "--fps", "24", "--max-new-tokens", "2",
                 "--json", *flags])
    captured = capsys.readouterr()
    assert code == 0
    stats = json.loads(captured.out)["stats"]
    # Overlapped decoding keeps one frame per sample time (lost ones repeat their predecessor);
    # decoding first drops them.
    assert stats["frames_lost"] > 0 and stats["frames"] + (0 if fills else stats["frames_lost"]) == 96
    assert str(path) in caplog.text and "could not be decoded" in caplog.text


def test_demo_writes_video_contact_sheet_and_reports_truth(tmp_path, tiny_model_dir, capsys):
    code = main(["demo", "--out", str(tmp_path), "--family", "count", "--seed", "3", "--model", str(tiny_model_dir),
                 "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["question"] and report["truth"] in {"1", "2", "3", "4"}
    assert report["correct"] == (report["answer"].strip().lower().startswith(report["truth"]))
    assert (tmp_path / "count_3.mp4").is_file() and (tmp_path / "count_3_frames.png").is_file()
    assert report["stats"]["frames"] == 16


def test_cli_silences_ffmpeg_without_pyav_log_callback(make_test_video, capsys):
    """PyAV's log callback takes the GIL from FFmpeg's decoder threads and can deadlock; keep it off."""
    av.logging.set_level(None)
    path, _ = make_test_video(duration_s=1.0)
    assert main(["probe", str(path)]) == 0
    assert av.logging.get_level() is None


def test_watch_prints_a_json_line_per_window_and_the_decode_count(make_test_video, tiny_model_dir, capsys):
    path, _ = make_test_video(width=224, height=168, duration_s=6.0, fps=8, gop=16, seed=6)
    code = main(["watch", str(path), "--query", "Is there a red object in the zone? Answer Yes or No.",
                 "--model", str(tiny_model_dir), "--window", "4", "--stride", "0.25", "--refresh", "anchors",
                 "--alert-after", "1", "--prune-tau", "0.25", "--prune-alpha", "0.004", "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    windows = [line for line in lines if line["type"] == "window"]
    assert len(windows) == 3 and windows[1]["reused_tokens"] > 0
    assert all(w["kept_tokens"] <= w["visual_tokens"] for w in windows)
    assert {"start_s", "end_s", "answer", "p_yes", "visual_tokens", "refreshed_tokens", "stages_s", "lag_s",
            "windows_skipped"} <= set(windows[0])
    assert all(w["windows_skipped"] == 0 and w["lag_s"] >= 0 for w in windows)   # a file: every window judged
    assert sum(line["type"] == "alert" for line in lines) == sum(w["yes"] for w in windows[:1]) + sum(
        w["yes"] and not prev["yes"] for prev, w in zip(windows, windows[1:]))
    assert lines[-1] == {"type": "end", "frames_decoded": 48, "damaged_packets": 0, "codec": "h264",
                         "motion_source": "codec", "windows_skipped": 0, "frames_dropped": 0}
    # The query as ask takes its question, in its place after the source: the same windows.
    assert main(["watch", str(path), "Is there a red object in the zone? Answer Yes or No.", "--model",
                 str(tiny_model_dir), "--window", "4", "--stride", "0.25", "--refresh", "anchors", "--alert-after", "1",
                 "--prune-tau", "0.25", "--prune-alpha", "0.004", "--json"]) == 0
    again = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(w["p_yes"], w["kept_tokens"]) for w in again if w["type"] == "window"] == [
        (w["p_yes"], w["kept_tokens"]) for w in windows]
    for twice in ([str(path)], [str(path), "Yes?", "--query", "No?"]):
        assert main(["watch", *twice, "--model", str(tiny_model_dir)]) == 2
        assert "give the watch's query once" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [(["--window", "0.1"], "fewer than 2 frames"), (["--stride", "2"], "stride"),
                                           (["--alert-after", "0"], "alert_after"), (["--prune-tau", "-1"], "tau"),
                                           (["--prune-tau", "0.25", "--prune-alpha", "-1"], "alpha"),
                                           (["--window", "8", "--refresh", "anchors"], "whole temporal patches"),
                                           (["--refresh", "anchors", "--refresh-share", "0.3"], "deviation refresh only"),
                                           (["--refresh", "deviation", "--refresh-share", "1.5"], "(0, 1]")])
def test_watch_rejects_bad_flags(make_test_video, tiny_model_dir, capsys, flags, message):
    path, _ = make_test_video(duration_s=1.0)
    code = main(["watch", str(path), "--query", "Yes?", "--model", str(tiny_model_dir), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_watch_judges_segments_joined_with_another_size_and_a_restarted_clock(tmp_path, tiny_model_dir, capsys):
    """Two MPEG-TS segments joined, 224x168 then 112x84, the second's clock starting over: `watch`
    skipped the second segment as past (3 windows), and with a clock that went on it stacked frames
    of two sizes (a torch traceback); now every window of the 6 s is judged, at the first's size."""
    from vidsight.ingest import SyntheticSpec, make_video

    parts = [tmp_path / f"{k}.ts" for k in range(2)]
    for path, (width, height), seed in zip(parts, ((224, 168), (112, 84)), (1, 2)):
        make_video(path, SyntheticSpec(width=width, height=height, duration_s=3.0, fps=8, gop=8, seed=seed))
    joined = tmp_path / "joined.ts"
    joined.write_bytes(b"".join(path.read_bytes() for path in parts))
    code = main(["watch", str(joined), "--query", "Yes?", "--model", str(tiny_model_dir), "--window", "2", "--json"])
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and "Traceback" not in err
    windows = [line for line in lines if line["type"] == "window"]
    assert len(windows) >= 4 and windows[-1]["end_s"] == pytest.approx(6.0, abs=0.5)
    assert len({w["visual_tokens"] for w in windows}) == 1   # one frame size throughout
    assert lines[-1]["frames_decoded"] == 48


def test_watch_missing_source(tmp_path, capsys):
    assert main(["watch", str(tmp_path / "nope.mp4"), "--query", "Yes?"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_ask_decoding_flags_set_the_feed():
    from vidsight.api.cli import build_parser
    from vidsight.api.settings import feed_config
    from vidsight.ingest import FeedConfig

    assert feed_config(vars(build_parser().parse_args(["ask", "v.mp4", "q"]))) == FeedConfig()
    args = build_parser().parse_args(["ask", "v.mp4", "q", "--decode-workers", "3", "--decode-all-frames",
                                      "--resize-after-decoding", "--oversubscribe"])
    assert feed_config(vars(args)) == FeedConfig(workers=3, trim_gops=False, resize_in_decoder=False, split_cores=False)


def test_a_chat_template_given_replaces_the_checkpoints(make_test_video, tiny_adapter, tmp_path, capsys):
    """``--chat-template``: the tiny template with another default system message answers as the
    checkpoint's template given that message; a template without the video mark is refused."""
    path, _ = make_test_video(duration_s=2.0)
    system = "You watch a shop's camera."
    default = "You are a helpful assistant."
    assert default in tiny_adapter.chat_template
    (tmp_path / "shop.jinja").write_text(tiny_adapter.chat_template.replace(default, system))
    flags = ["--model", tiny_adapter.name, "--fps", "2", "--max-new-tokens", "8", "--json"]
    assert main(["ask", str(path), "What?", *flags, "--system", system]) == 0
    expected = json.loads(capsys.readouterr().out)["answer"]
    assert main(["ask", str(path), "What?", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] != expected   # the system message matters
    assert main(["ask", str(path), "What?", *flags, "--chat-template", str(tmp_path / "shop.jinja")]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == expected
    no_video = "{% for m in messages %}{{ m['content'] if m['content'] is string else '' }}{% endfor %}"
    assert main(["ask", str(path), "What?", *flags, "--chat-template", no_video]) == 2
    err = capsys.readouterr().err
    assert "--chat-template: it does not render a question about a video" in err and "0 video placeholders" in err


def test_ask_samples_as_the_checkpoint_says_unless_told_otherwise(make_test_video, tiny_model_dir, tmp_path, capsys):
    """transformers' `generate` and vLLM take a checkpoint's generation_config.json sampling
    settings for those not given; so does `ask` (and `chat`), saying so, unless
    ``--generation-config vllm``; a flag given wins, and the length limit stays the flag's."""
    import shutil

    checkpoint = tmp_path / "sampling"
    shutil.copytree(tiny_model_dir, checkpoint)
    config_path = checkpoint / "generation_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "do_sample": True, "temperature": 1.3,
                                       "top_k": 20, "max_new_tokens": 3}))
    path, _ = make_test_video(duration_s=2.0)
    asker, sampling = Asker(str(checkpoint)), SamplingConfig(fps=2)
    sampled = asker.ask(path, "What colour is the square?", sampling=sampling,
                        generation=GenerationConfig(max_new_tokens=6, temperature=1.3, top_k=20))
    greedy = asker.ask(path, "What colour is the square?", sampling=sampling, generation=GenerationConfig(max_new_tokens=6))
    assert sampled.answer != greedy.answer
    base = ["ask", str(path), "What colour is the square?", "--model", str(checkpoint), "--fps", "2",
            "--max-new-tokens", "6", "--json"]
    for flags, want, said in (([], sampled, "temperature 1.3, top_k 20"), (["--generation-config", "vllm"], greedy, None),
                              (["--temperature", "0"], greedy, "top_k 20")):
        assert main([*base, *flags]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["answer"] == want.answer
        assert (f"sampling as {checkpoint}'s generation_config.json says: {said}" in err) if said else ("sampling as" not in err)
