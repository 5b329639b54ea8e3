"""vidsight as an lmms-eval model: the real lmms-eval command on a local task, and the model's arguments."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vidsight.api.lmms.cli import lmms_eval_command
from vidsight.api.lmms.model import VidsightLMM
from vidsight.api.lmms.settings import parse_model_args
from vidsight.api.lmms.task import task_name, write_task
from vidsight.api.settings import ask_configs
from vidsight.bench.accuracy import run_accuracy
from vidsight.engine import Asker, GenerationConfig
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig
from vidsight.ingest.stream import StreamSource
from vidsight.kv.policies.registry import make_policy
from vidsight.models.paths import TASK_MODEL
from vidsight.tasks.families import answer_choices

OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
VIDEO = dict(width=320, height=240, fps=24, duration_s=6.0, gop=12, bframes=True)


@pytest.fixture
def synthetic_video(make_test_video):
    return str(make_test_video(**VIDEO)[0])


def test_lmms_eval_answers_the_local_task_as_bench_accuracy_does(tmp_path):
    """The generated task answered by generating, and its multiple-choice form (one lmms-eval run,
    both tasks): the first as `vidsight bench accuracy` answers it, the second by `Asker.score`."""
    folder, fps = write_task("smoke", tmp_path / "suites", tmp_path / "tasks")
    write_task("smoke", tmp_path / "suites", tmp_path / "tasks", multiple_choice=True)
    command = lmms_eval_command(f"{task_name('smoke')},{task_name('smoke', multiple_choice=True)}",
                                str(folder.parent), str(TASK_MODEL), fps)
    command[command.index("--model_args") + 1] += f",device=cpu,stats_path={tmp_path / 'stats.jsonl'}"
    lmms_eval = Path(sys.executable).with_name("lmms-eval")
    run = subprocess.run([str(lmms_eval), *command[1:], "--log_samples", "--output_path", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600, env={**os.environ, **OFFLINE}, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"\|vidsight_smoke *\|.*\|accuracy", run.stdout)   # lmms-eval's table
    assert re.search(r"\|vidsight_smoke_mc *\|.*\|acc ", run.stdout)

    (samples,) = (tmp_path / "out").rglob("*_samples_vidsight_smoke.jsonl")
    answered = {s["doc_id"]: s for s in map(json.loads, samples.read_text().splitlines())}
    reference = run_accuracy(str(TASK_MODEL), "smoke", tmp_path / "suites")["answers"]
    assert len(answered) == len(reference) == 20
    for doc_id, expected in enumerate(reference):
        assert answered[doc_id]["filtered_resps"] == expected["answer"], (doc_id, expected)
        assert answered[doc_id]["accuracy"] == float(expected["correct"])
    # A value the run must reach: the task model answers at least 90 % of the smoke suite (98 % of
    # the default suite's 250 clips in docs/benchmarks.md).
    assert sum(expected["correct"] for expected in reference) >= 18
    # Each request's costs are kept: token counts for lmms-eval, stage times in the stats file.
    assert answered[0]["token_counts"][0]["output_tokens"] >= 1
    records = [json.loads(line) for line in (tmp_path / "stats.jsonl").read_text().splitlines()]
    answers = [r for r in records if "answer" in r]
    assert len(answers) == 20 and set(answers[0]["stats"]["stages_s"]) >= {"decode", "vision", "prefill", "generate"}

    # Multiple choice: each question's choices ranked by the mean negative log-likelihood of each.
    (samples,) = (tmp_path / "out").rglob("*_samples_vidsight_smoke_mc.jsonl")
    chosen = {s["doc_id"]: s for s in map(json.loads, samples.read_text().splitlines())}
    assert len(chosen) == 20 and len(records) == 40   # one record per question: its choices share a prefill
    asker = Asker(str(TASK_MODEL), device="cpu")
    right = 0
    for doc_id, doc in enumerate(json.loads(line) for line in (folder / "documents.jsonl").read_text().splitlines()):
        choices = answer_choices(doc["question"])
        scores = asker.score(doc["video"], doc["question"], choices, sampling=SamplingConfig(fps=fps)).scores
        losses = [-s.logprob / len(s.tokens) for s in scores]
        assert [float(loss) for loss, _ in chosen[doc_id]["filtered_resps"]] == pytest.approx(losses, abs=1e-5)
        assert chosen[doc_id]["acc"] == float(choices[losses.index(min(losses))] == doc["answer"])
        right += chosen[doc_id]["acc"]
    assert right >= 18   # the task model knows the answers it was trained to give


def test_model_arguments_are_the_command_lines_flags():
    settings = parse_model_args({"rho": 0.5, "kv_score": "value-norm", "prune_tau": 0.25, "dedup_patches": True,
                                 "fps": 1, "max_frames": 64}).settings
    sampling, _, prefill = ask_configs(settings)
    assert (sampling.fps, sampling.max_frames) == (1.0, 64)
    assert (prefill.prune.rho, prefill.prune.scorer, prefill.motion.tau, prefill.dedup_patches) == \
        (0.5, "value-norm", 0.25, True)
    chat = parse_model_args({"policy": "rekv", "kv_device_budget": 1000})
    assert chat.mode == "chat" and chat.settings["kv_device_budget"] == 1000
    for bad, named in [({"rhoo": 1}, "rhoo"), ({"rho": "x"}, "rho"), ({"kv_score": "nope"}, "kv_score"),
                       ({"policy": "zzz"}, "policy"), ({"json": True}, "json")]:
        with pytest.raises(ConfigError, match=named):
            parse_model_args(bad)


class _Request(SimpleNamespace):
    pass


def _requests(video: str, questions: list[str], gen_kwargs: dict):
    docs = [{"video": video} for _ in questions]
    requests = [_Request(args=(q, gen_kwargs, lambda doc: [doc["video"]], i, "task", "test"))
                for i, q in enumerate(questions)]
    return {"task": {"test": docs}}, requests


def test_ask_mode_answers_as_asker_and_cuts_at_the_tasks_stop_strings(tiny_model_dir, synthetic_video):
    model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", rho=0.5, fps=2)
    model.task_dict, requests = _requests(synthetic_video, ["What happens?", "Which colour?"],
                                          {"max_new_tokens": 5, "do_sample": False})
    results = model.generate_until(requests)
    asker = Asker(model.asker.adapter)
    _, _, prefill = ask_configs({"rho": 0.5})
    for request, result, record in zip(requests, results, model.request_stats):
        expected = asker.ask(synthetic_video, request.args[0], sampling=SamplingConfig(fps=2),
                             generation=GenerationConfig(max_new_tokens=5), prefill=prefill)
        assert result.text == expected.answer
        assert result.token_counts.input_tokens == expected.stats.prompt_tokens == record["prompt_tokens"]
        assert record["stats"]["kept_visual_tokens"] < record["stats"]["visual_tokens"]   # rho reached the prefill
    stop = results[0].text[1:3]
    model.task_dict, requests = _requests(synthetic_video, ["What happens?"],
                                          {"max_new_tokens": 5, "until": [stop]})
    assert model.generate_until(requests)[0].text == results[0].text.split(stop, 1)[0]


def test_an_image_tasks_picture_is_answered_and_scored_as_ask_shows_the_image(tiny_model_dir, picture):
    """An image task hands lmms-eval's model a PIL image: generated and scored as `Asker` answers
    that picture shown as an image (written once to a file); two pictures are refused by name."""
    from PIL import Image

    from vidsight.models.conversation import IMAGE_PART, Conversation

    model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu")
    image = Image.open(picture).convert("RGB")
    questions = ["What colour is the square?", "Where is it?"]
    model.task_dict = {"task": {"test": [{"image": image} for _ in questions]}}
    requests = [_Request(args=(q, {"max_new_tokens": 5, "do_sample": False}, lambda doc: [doc["image"]], i, "task",
                               "test")) for i, q in enumerate(questions)]
    asker = Asker(model.asker.adapter)
    for question, result in zip(questions, model.generate_until(requests)):
        expected = asker.ask(picture, Conversation.of(question, visual=IMAGE_PART),
                             generation=GenerationConfig(max_new_tokens=5))
        assert (result.text, result.token_counts.input_tokens) == (expected.answer, expected.stats.prompt_tokens)
    scored = model.loglikelihood([_Request(args=(questions[0], "red", lambda doc: [doc["image"]], 0, "task", "test"))])
    want = asker.score(picture, Conversation.of(questions[0], visual=IMAGE_PART), ["red"]).scores[0]
    assert scored[0].text[0] == pytest.approx(-want.logprob / len(want.tokens), abs=1e-5)
    model.task_dict["task"]["test"][0]["image"] = [image, image]
    with pytest.raises(ConfigError, match="one video file or one picture per request"):
        model.generate_until(requests[:1])


def test_the_prompt_arguments_reach_the_prompt(tiny_model_dir, synthetic_video, tmp_path):
    """``system``, ``chat_template`` and ``chat_template_kwargs`` (as `ask`'s flags of those names)
    shape the prompt of generated and scored answers alike; before, they were taken and ignored."""
    from vidsight.models.conversation import Conversation

    system = "You watch a shop's camera."
    plain = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", fps=2)
    template = plain.asker.adapter.chat_template
    (tmp_path / "shop.jinja").write_text(template.replace("You are a helpful assistant.", system))
    gen_kwargs = {"max_new_tokens": 6, "do_sample": False}
    asker = Asker(plain.asker.adapter)
    expected = asker.ask(synthetic_video, Conversation.of("What happens?", system), sampling=SamplingConfig(fps=2),
                         generation=GenerationConfig(max_new_tokens=6))
    choices = asker.score(synthetic_video, Conversation.of("What happens?", system), ["red"],
                          sampling=SamplingConfig(fps=2)).scores[0]
    answers = []
    for arguments in ({}, {"system": system}, {"chat_template": str(tmp_path / "shop.jinja")},
                      {"system": system, "chat_template_kwargs": '{"unused_by_this_template": 1}'}):
        model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", fps=2, **arguments)
        model.task_dict, requests = _requests(synthetic_video, ["What happens?"], gen_kwargs)
        answers.append(model.generate_until(requests)[0].text)
        scored = model.loglikelihood([_Request(args=("What happens?", "red", lambda doc: [doc["video"]], 0, "task",
                                                     "test"))])[0].text
        assert (scored == (-choices.logprob / len(choices.tokens), choices.greedy)) == bool(arguments)
    assert answers[1:] == [expected.answer] * 3 != answers[:1]


def test_loglikelihood_scores_each_choice_as_asker_does_one_prefill_per_question(tiny_model_dir, synthetic_video):
    model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", rho=0.5, fps=2)
    docs = [{"video": synthetic_video, "choice": "blue"}]
    questions = ["What colour is the square?", "How many squares are there?"]
    choices = ["red", "blue", lambda doc: doc["choice"]]   # lmms-eval's doc_to_target: a string or a function
    model.task_dict = {"task": {"test": docs}}
    requests = [_Request(args=(question, choice, lambda doc: [doc["video"]], 0, "task", "test"))
                for choice in choices for question in questions]   # a question's choices apart, as may come
    results = model.loglikelihood(requests)
    _, _, prefill = ask_configs({"rho": 0.5})
    for question in questions:
        expected = Asker(model.asker.adapter).score(synthetic_video, question, ["red", "blue", "blue"],
                                                    sampling=SamplingConfig(fps=2), prefill=prefill).scores
        mine = [result for request, result in zip(requests, results) if request.args[0] == question]
        assert [result.text for result in mine] == [(-s.logprob / len(s.tokens), s.greedy) for s in expected]
    assert len(model.request_stats) == 2 and all(len(r["scores"]) == 3 for r in model.request_stats)
    assert model.request_stats[0]["stats"]["kept_visual_tokens"] < model.request_stats[0]["stats"]["visual_tokens"]
    # With a policy: the video streamed into a session, as its questions are answered.
    model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", policy="rekv", fps=2)
    model.task_dict = {"task": {"test": docs}}
    results = model.loglikelihood(requests[:2])
    with ChatSession(model.asker.adapter, make_policy("rekv"), ChatConfig(fps=2)) as session:
        for frame in StreamSource(synthetic_video, fps=2):
            session.push([frame])
        expected = [session.score(question, ["red"]).scores[0] for question in questions]
    assert [result.text for result in results] == [(-s.logprob / len(s.tokens), s.greedy) for s in expected]


def test_acc_mutual_infos_requests_without_a_video_are_refused_by_name(tiny_model_dir, synthetic_video):
    model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", fps=2)
    model.task_dict = {"task": {"test": [{"video": synthetic_video}]}}
    requests = [_Request(args=("What colour?", "red", lambda doc: [doc["video"]], 0, "task", "test")),
                _Request(args=("", "red"))]   # what lmms-eval adds for acc_mutual_info
    with pytest.raises(ConfigError, match="leave acc_mutual_info out of the task's metric_list"):
        model.loglikelihood(requests)


def test_policy_mode_streams_the_video_into_a_chat_session(tiny_model_dir, synthetic_video):
    model = VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", policy="rekv", fps=2)
    model.task_dict, requests = _requests(synthetic_video, ["What happened first?"], {"max_new_tokens": 4})
    (result,) = model.generate_until(requests)
    with ChatSession(model.asker.adapter, make_policy("rekv"), ChatConfig(fps=2)) as session:
        for frame in StreamSource(synthetic_video, fps=2):
            session.push([frame])
        expected = session.ask("What happened first?", GenerationConfig(max_new_tokens=4))
    assert result.text == expected.answer
    assert model.request_stats[0]["stats"]["retrieved_tokens"] == expected.stats.retrieved_tokens
    with pytest.raises(ConfigError, match="do not apply"):
        VidsightLMM(pretrained=str(tiny_model_dir), device="cpu", policy="full", visual_tau=0.5)
    assert result.token_counts.output_tokens == len(expected.token_ids)
