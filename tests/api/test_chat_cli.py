"""`vidsight chat` as a user meets it: scheduled questions, JSON lines, bad input."""

import json

import pytest

from vidsight.api.cli import main


def write_questions(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_scheduled_questions_are_answered_at_their_stream_times(make_test_video, tiny_model_dir, tmp_path, capsys):
    video, _ = make_test_video(width=176, height=144, fps=24, duration_s=6.0, gop=12)
    questions = write_questions(tmp_path / "q.jsonl", [
        {"time_s": 0.0, "question": "Before any frame?"},      # waits for the first temporal patch
        {"time_s": 2.5, "question": "What colour is the square?"},
        {"time_s": 60.0, "question": "After the end?"},         # answered from everything seen
    ])
    code = main(["chat", str(video), "--model", str(tiny_model_dir), "--fps", "2", "--questions", str(questions),
                 "--policy", "rekv", "--top-frames", "2", "--local-tokens", "64", "--max-new-tokens", "3", "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    answers = [line for line in lines if line["type"] == "answer"]
    assert [a["question"] for a in answers] == ["Before any frame?", "What colour is the square?", "After the end?"]
    assert answers[0]["stats"]["frames_seen"] == 2
    assert answers[1]["stats"]["frames_seen"] == 6 and answers[2]["stats"]["frames_seen"] == 12
    assert answers[2]["stats"]["attended_tokens"] < answers[2]["stats"]["cached_tokens"]
    assert all(a["stats"]["frames_dropped"] == 0 for a in answers)  # a file waits while answers are made
    assert lines[-1] == {"type": "end", "frames_seen": 12, "frames_dropped": 0, "damaged_packets": 0}


def test_a_question_with_choices_is_scored_as_the_session_scores_it(make_test_video, tiny_model_dir, tmp_path,
                                                                   capsys):
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.ingest.stream import StreamSource
    from vidsight.models import load_model

    video, _ = make_test_video(width=176, height=144, fps=24, duration_s=6.0, gop=12)
    choices = ["red", "blue", "a green circle"]
    questions = write_questions(tmp_path / "q.jsonl", [
        {"time_s": 60.0, "question": "What colour is the square?", "choices": choices},
        {"time_s": 60.0, "question": "Where is it?"},
    ])
    code = main(["chat", str(video), "--model", str(tiny_model_dir), "--fps", "2", "--questions", str(questions),
                 "--max-new-tokens", "3", "--json"])
    assert code == 0
    scored, generated = [json.loads(line) for line in capsys.readouterr().out.splitlines()][:2]
    with ChatSession(load_model(tiny_model_dir, device="cpu"), config=ChatConfig(fps=2)) as session:
        for frame in StreamSource(str(video), fps=2):
            session.push([frame])
        expected = session.score("What colour is the square?", choices)
    assert [s["text"] for s in scored["scores"]] == choices
    assert [s["logprob"] for s in scored["scores"]] == pytest.approx([s.logprob for s in expected.scores], abs=1e-5)
    assert scored["answer"] == choices[expected.best] == choices[scored["best"]]
    assert scored["stats"]["frames_seen"] == 12 and "scores" not in generated and generated["answer"]


def test_an_answer_format_holds_the_sessions_answers(make_test_video, tiny_model_dir, tmp_path, capsys):
    import re

    from vidsight.engine import GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.engine.config import AnswerFormat
    from vidsight.ingest.stream import StreamSource
    from vidsight.models import load_model

    video, _ = make_test_video(width=176, height=144, fps=24, duration_s=6.0, gop=12)
    questions = write_questions(tmp_path / "q.jsonl", [{"time_s": 60.0, "question": "What colour is the square?"}])
    pattern = "(red|blue) at [0-9]{1,2}s"
    code = main(["chat", str(video), "--model", str(tiny_model_dir), "--fps", "2", "--questions", str(questions),
                 "--max-new-tokens", "20", "--answer-regex", pattern, "--json"])
    assert code == 0
    answer = json.loads(capsys.readouterr().out.splitlines()[0])["answer"]
    with ChatSession(load_model(tiny_model_dir, device="cpu"), config=ChatConfig(fps=2)) as session:
        for frame in StreamSource(str(video), fps=2):
            session.push([frame])
        expected = session.ask("What colour is the square?", GenerationConfig(
            max_new_tokens=20, answer_format=AnswerFormat("regex", pattern)))
    assert answer == expected.answer and re.fullmatch(pattern, answer)


def test_the_answers_sampling_flags_are_asks(make_test_video, tiny_model_dir, tmp_path, capsys):
    from vidsight.engine import GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.ingest.stream import StreamSource
    from vidsight.models import load_model

    video, _ = make_test_video(width=176, height=144, fps=24, duration_s=6.0, gop=12)
    questions = write_questions(tmp_path / "q.jsonl", [{"time_s": 60.0, "question": "What colour is the square?"}])
    flags = ["--temperature", "1.3", "--top-k", "40", "--seed", "3", "--frequency-penalty", "0.5"]
    assert main(["chat", str(video), "--model", str(tiny_model_dir), "--fps", "2", "--questions", str(questions),
                 "--max-new-tokens", "12", "--json", *flags]) == 0
    answer = json.loads(capsys.readouterr().out.splitlines()[0])["answer"]
    with ChatSession(load_model(tiny_model_dir, device="cpu"), config=ChatConfig(fps=2)) as session:
        for frame in StreamSource(str(video), fps=2):
            session.push([frame])
        generation = GenerationConfig(max_new_tokens=12, temperature=1.3, top_k=40, seed=3, frequency_penalty=0.5)
        expected = session.ask("What colour is the square?", generation)
        greedy = session.ask("What colour is the square?", GenerationConfig(max_new_tokens=12))
    assert answer == expected.answer != greedy.answer


def test_a_reasoning_models_thinking_is_printed_apart(make_test_video, thinking_adapter, tmp_path, capsys):
    """``chat --reasoning-parser``: the session's answer parted as `ChatSession.ask` parts it, the
    thinking on stderr (or ``reasoning`` with ``--json``), the content on stdout."""
    from vidsight.engine import GenerationConfig
    from vidsight.engine.chat import ChatConfig, ChatSession
    from vidsight.ingest.stream import StreamSource

    video, _ = make_test_video(width=176, height=144, fps=24, duration_s=6.0, gop=12)
    questions = write_questions(tmp_path / "q.jsonl", [{"time_s": 60.0, "question": "What colour is the square?"}])
    end = thinking_adapter.tokenizer.convert_tokens_to_ids("</think>")
    flags = ["chat", str(video), "--model", thinking_adapter.name, "--fps", "2", "--questions", str(questions),
             "--max-new-tokens", "24", "--temperature", "1", "--seed", "4", "--logit-bias", f"{end}=3",
             "--reasoning-parser", "qwen3"]
    with ChatSession(thinking_adapter, config=ChatConfig(fps=2)) as session:
        for frame in StreamSource(str(video), fps=2):
            session.push([frame])
        expected = session.ask("What colour is the square?", GenerationConfig(
            max_new_tokens=24, temperature=1.0, seed=4, logit_bias={end: 3}, reasoning_parser="qwen3"))
    assert expected.reasoning
    assert main([*flags, "--json"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (record["reasoning"], record["answer"]) == (expected.reasoning, expected.answer)
    assert main(flags) == 0
    out, err = capsys.readouterr()
    assert expected.answer and out.splitlines()[1] == expected.answer
    assert expected.reasoning in err


@pytest.mark.parametrize("content,message", [
    ('{"time_s": 1}\n', "q.jsonl:1"), ("not json\n", "q.jsonl:1"), ('{"time_s": -1, "question": "x"}\n', "time_s"),
    ('{"time_s": 1, "question": "x", "choices": ["a", ""]}\n', "choices"), ('[1]\n', "q.jsonl:1"),
])
def test_a_bad_questions_file_names_the_line(make_test_video, tiny_model_dir, tmp_path, capsys, content, message):
    video, _ = make_test_video(duration_s=1.0)
    (tmp_path / "q.jsonl").write_text(content)
    code = main(["chat", str(video), "--model", str(tiny_model_dir), "--questions", str(tmp_path / "q.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err


def test_settings_of_another_policy_are_refused(make_test_video, tiny_model_dir, capsys):
    video, _ = make_test_video(duration_s=1.0)
    assert main(["chat", str(video), "--model", str(tiny_model_dir), "--top-frames", "4"]) == 2
    assert "do not apply to the full policy" in capsys.readouterr().err


def test_tiered_memory_flags_report_tiers_and_clean_up(make_test_video, tiny_model_dir, tmp_path, capsys):
    video, _ = make_test_video(width=176, height=144, fps=24, duration_s=6.0, gop=12)
    questions = write_questions(tmp_path / "q.jsonl", [{"time_s": 60.0, "question": "What colour is the square?"}])
    disk = tmp_path / "kv"
    code = main(["chat", str(video), "--model", str(tiny_model_dir), "--fps", "2", "--questions", str(questions),
                 "--kv-device-budget", "100", "--kv-host-budget", "100", "--kv-disk", str(disk), "--json"])
    answer = json.loads(capsys.readouterr().out.splitlines()[0])
    assert code == 0
    tiers = answer["stats"]["tokens_by_tier"]
    assert tiers["device"] <= 100 and tiers["host"] <= 100 and tiers["disk"] > 0
    assert answer["stats"]["bytes_moved"]["down"] > 0 and not list(disk.iterdir())


def test_an_unusable_disk_tier_is_refused(make_test_video, tiny_model_dir, tmp_path, capsys):
    video, _ = make_test_video(duration_s=1.0)
    (tmp_path / "file").write_text("x")
    code = main(["chat", str(video), "--model", str(tiny_model_dir), "--kv-disk", str(tmp_path / "file" / "kv")])
    assert code == 2 and "cannot hold the KV disk tier" in capsys.readouterr().err
