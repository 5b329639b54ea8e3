"""`vidsight bench chat --accuracy`: the chat suite (`tasks.chat`) answered under each policy.

Every policy sees the same streams and questions: one session per stream and policy; the
stream is pushed up to each question's time, the question is asked (its turn then dropped, as
chat does by default) and the stream goes on. The first answer word is scored against the truth;
with ``choices``, the question's possible answers (`tasks.families.answer_choices`) are also
ranked by likelihood (`ChatSession.score`) after the answer, and the likeliest is scored too.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vidsight.bench.accuracy import normalise
from vidsight.bench.intervals import mcnemar, wilson
from vidsight.engine.chat import ChatConfig, ChatSession
from vidsight.engine.config import GenerationConfig
from vidsight.errors import ConfigError
from vidsight.ingest.stream import SampledFrame
from vidsight.ingest.types import CodecInfo
from vidsight.kv.policies.registry import make_policy
from vidsight.kv.store import traffic_of
from vidsight.kv.tiers import TierConfig
from vidsight.models.base import VLMAdapter
from vidsight.tasks.chat import CHAT_FAMILIES, ChatStream, make_chat_stream
from vidsight.tasks.families import SAMPLE_FPS, answer_choices, order_shapes
from vidsight.tasks.splits import split_seed, split_seeds

CHAT_STREAMS = 20
CHAT_STREAM_FRAMES = 512
ANSWER_TOKENS = 2
# Order questions are split by how far apart their two events began: under this (20 temporal
# patches), rotary positions differ little between the two, and that is where order answers fail.
CLOSE_PAIR_S = 40.0


def stream_frames(stream: ChatStream) -> list[SampledFrame]:
    """The stream's frames as a sampler would give them."""
    pictures = stream.render()
    return [SampledFrame(i, i, float(t), torch.from_numpy(pictures[i]), CodecInfo("generated", 0))
            for i, t in enumerate(stream.times_s)]


def answer_stream(adapter: VLMAdapter, stream: ChatStream, frames: list[SampledFrame], policy_name: str,
                  settings: dict, tiers: TierConfig | None = None, choices: bool = False) -> list[dict]:
    """One session over ``stream`` under one policy: each question asked at its time (and with
    ``choices``, its possible answers scored)."""
    rows = []
    with ChatSession(adapter, make_policy(policy_name, **settings), ChatConfig(fps=SAMPLE_FPS), tiers) as chat:
        for question in stream.questions:
            chat.push(frames[chat.frames_seen : question.frames_seen])
            if chat.cache.offload is not None:
                chat.cache.offload.reset_peak()
            answer = chat.ask(question.question, GenerationConfig(max_new_tokens=ANSWER_TOKENS))
            rows.append({"seed": stream.seed, "time_s": question.time_s, "family": question.family,
                         "question": question.question, "truth": question.answer, "answer": answer.answer,
                         "correct": normalise(answer.answer) == question.answer,
                         "seconds_back": round(question.time_s - question.event_s, 1),
                         **_order_traits(stream, question.question),
                         "attended_share": answer.stats.attended_tokens / answer.stats.cached_tokens,
                         "retrieved_share": answer.stats.retrieved_tokens / answer.stats.cached_tokens,
                         "ttft_s": answer.stats.ttft_s, "policy_report": chat.policy.report(),
                         "device_peak_tokens": traffic_of(chat.cache).device_peak_tokens if tiers is not None else None,
                         "bytes_moved": sum(answer.stats.bytes_moved.values()),
                         "question_bytes_moved": sum(answer.stats.question_bytes_moved.values()),
                         "read_bytes": sum(answer.stats.read_bytes.values()),
                         "whole_read_bytes": sum(answer.stats.whole_read_bytes.values())})
            if choices:   # after the answer's figures: scoring is a second question to the policy
                scored = chat.score(question.question, answer_choices(question.question))
                rows[-1]["choice"] = scored.scores[scored.best].text
                rows[-1]["choice_correct"] = normalise(rows[-1]["choice"]) == question.answer
    return rows


def run_chat_accuracy(adapter: VLMAdapter, streams: int = CHAT_STREAMS, frames: int = CHAT_STREAM_FRAMES,
                      policies: tuple[str, ...] = ("full", "recent", "rekv"), settings: dict[str, dict] | None = None,
                      progress: bool = False, tiers: TierConfig | None = None, split: str = "validation",
                      choices: bool = False) -> dict:
    """Answer every question of ``streams`` chat-suite streams under each policy.

    Args:
        adapter: The model (vidsight's task model reads these questions).
        streams: Generated streams of ``split`` (`tasks.splits`: validation, where the policies'
            defaults were chosen, or test), never trained on.
        frames: Sampled frames per stream, at the task families' 2 fps (even, at least 64).
        policies: Policy names.
        settings: Per policy name, its config's fields to change from the defaults.
        progress: Print each stream's answers.
        tiers: KV tiers for every session (the device's peak during each question is reported).
        choices: Also rank each question's possible answers by likelihood (``choice_accuracy``).

    Returns:
        ``{"streams", "frames", "settings", "accuracy": {policy: share}, "by_family": {policy:
        {family: share}}, "attended_share": {policy: mean}, "questions": [...]}``.
    """
    if streams < 1 or frames < 64 or frames % 2:
        raise ConfigError("streams must be positive and frames even, at least 64")
    split_seeds("chat", split)   # an unknown split fails before the long work
    settings = settings or {}
    for name in policies:
        make_policy(name, **settings.get(name.partition(":")[0], {}))  # a bad name or setting fails before the long work
    questions = []
    for k in range(streams):
        stream = make_chat_stream(split_seed("chat", split, k), frames)
        pictures = stream_frames(stream)
        for name in policies:
            for row in answer_stream(adapter, stream, pictures, name, settings.get(name.partition(":")[0], {}), tiers,
                                     choices):
                questions.append({"policy": name, **row})
                if progress:
                    print(f"stream {k} t={row['time_s']:6.1f} s {name:<6} {row['question']} -> {row['answer']!r} "
                          f"(truth {row['truth']})", flush=True)

    def share(rows: list[dict], key: str = "correct") -> float:
        return float(np.mean([r[key] for r in rows])) if rows else float("nan")

    def mine(name: str, family: str | None = None) -> list[dict]:
        return [q for q in questions if q["policy"] == name and family in (None, q["family"])]

    return {"split": split, "streams": streams, "frames": frames, "questions_per_policy": len(mine(policies[0])),
            "settings": {n: settings.get(n.partition(":")[0], {}) for n in policies},
            "accuracy": {n: share(mine(n)) for n in policies},
            "accuracy_interval": {n: wilson(sum(q["correct"] for q in mine(n)), len(mine(n))) for n in policies},
            "against_first": {n: _paired(mine(policies[0]), mine(n)) for n in policies[1:]},
            "by_family": {n: {f: share(mine(n, f)) for f in CHAT_FAMILIES} for n in policies},
            "order_breakdown": {n: _order_breakdown(mine(n, "order")) for n in policies},
            "attended_share": {n: share(mine(n), "attended_share") for n in policies},
            "retrieved_share": {n: share(mine(n), "retrieved_share") for n in policies},
            "ttft_s": {n: share(mine(n), "ttft_s") for n in policies},
            "policy_reports": {n: _mean_report([q["policy_report"] for q in mine(n)]) for n in policies},
            "device_peak_tokens": {n: max((q["device_peak_tokens"] or 0) for q in mine(n)) if tiers else None
                                   for n in policies},
            "bytes_moved": {n: share(mine(n), "bytes_moved") for n in policies},
            "question_bytes_moved": {n: share(mine(n), "question_bytes_moved") for n in policies},
            **_reads(questions, policies),
            **({"choice_accuracy": {n: share(mine(n), "choice_correct") for n in policies},
                "choice_accuracy_interval": {n: wilson(sum(q["choice_correct"] for q in mine(n)), len(mine(n)))
                                             for n in policies}} if choices else {}),
            "questions": questions}


def _order_traits(stream: ChatStream, question: str) -> dict:
    """For an order question: whether the earlier event is the shape named first, how far apart
    the two events began, and whether another event began between them (it is over by the time
    the later one is, events being shorter than their gaps) (nothing for other questions)."""
    named = order_shapes(question)
    if named is None:
        return {}
    first, second = named
    starts = {o.shape: o.t_in for o in stream.scene.objects}
    early, late = sorted((starts[first], starts[second]))
    return {"earlier_named_first": starts[first] < starts[second], "gap_s": round(late - early, 1),
            "event_between": any(early < t < late for t in starts.values())}


def _order_breakdown(rows: list[dict]) -> dict:
    """``[right, asked]`` of the order questions ``rows`` by which shape was named first, how far
    apart the events began and whether another began between them: where a model's order answers fail."""
    cells = {"earlier named first": lambda q: q["earlier_named_first"],
             "earlier named second": lambda q: not q["earlier_named_first"],
             f"under {CLOSE_PAIR_S:.0f} s apart": lambda q: q["gap_s"] < CLOSE_PAIR_S,
             f"{CLOSE_PAIR_S:.0f} s or more apart": lambda q: q["gap_s"] >= CLOSE_PAIR_S,
             "an event between them": lambda q: q["event_between"],
             "none between them": lambda q: not q["event_between"]}
    return {name: [sum(q["correct"] for q in rows if test(q)), sum(1 for q in rows if test(q))]
            for name, test in cells.items()}


def _paired(first: list[dict], other: list[dict]) -> dict:
    """McNemar's exact test of ``other``'s answers against ``first``'s, question by question."""
    def key(q):
        return q["seed"], q["time_s"], q["question"]

    if [key(q) for q in first] != [key(q) for q in other]:
        raise ValueError("the policies did not answer the same questions in the same order")
    return mcnemar([q["correct"] for q in first], [q["correct"] for q in other])


def _reads(questions: list[dict], policies) -> dict:
    """Per policy: bytes read up from host and disk per stream, and the share of them read as
    whole blocks (each question's counts run from its stream's start: the last one's are the stream's)."""
    read, whole = {}, {}
    for name in policies:
        last = {q["seed"]: q for q in questions if q["policy"] == name}
        total = sum(q["read_bytes"] for q in last.values())
        read[name] = total / max(len(last), 1)
        whole[name] = sum(q["whole_read_bytes"] for q in last.values()) / total if total else math.nan
    return {"read_bytes_per_stream": read, "whole_read_share": whole}


def _mean_report(reports: list[dict]) -> dict:
    """Each numeric field of the policies' reports, averaged over the questions where it is defined
    (a prefetch hit rate is not when nothing was predicted: NaN then); a nested list (a share per
    layer and head) is averaged element by element."""
    fields = reports[0].keys() if reports else ()
    out = {}
    for field in fields:
        values = [r[field] for r in reports]
        if isinstance(values[0], list):
            out[field] = np.nanmean(np.array(values, dtype=float), axis=0).tolist()
            continue
        defined = [v for v in values if not math.isnan(v)]
        out[field] = float(np.mean(defined)) if defined else math.nan
    return out


def layer_head_lines(policy_report: dict) -> list[str]:
    """Per step kind with a ``[layer][head]`` share table: each layer's shares over its heads."""
    lines = []
    for field, table in policy_report.items():
        if field.endswith("_ratio_by_layer_head"):
            kind = field.removesuffix("_ratio_by_layer_head")
            lines.append(f"  {kind} steps, share per layer [heads]: "
                         + "; ".join(f"L{layer} [" + " ".join(f"{share:.1%}" for share in heads) + "]"
                                     for layer, heads in enumerate(table)))
    return lines


def format_chat_accuracy(report: dict) -> str:
    lines = [f"{report['streams']} streams of {report['frames']} sampled frames, "
             f"{report['questions_per_policy']} questions at several times",
             f"{'policy':<28} {'accuracy [95 % Wilson]':>22} " + " ".join(f"{f:>7}" for f in CHAT_FAMILIES)
             + f" {'attended':>8} {'retrieved':>9} {'TTFT ms':>8}  settings"]
    for name, accuracy in report["accuracy"].items():
        families = " ".join(f"{report['by_family'][name][f]:7.1%}" for f in CHAT_FAMILIES)
        low, high = report["accuracy_interval"][name]
        lines.append(f"{name:<28} {accuracy:6.1%} [{low:5.1%}-{high:6.1%}] {families} {report['attended_share'][name]:8.1%} "
                     f"{report['retrieved_share'][name]:9.1%} {report['ttft_s'][name] * 1000:8.0f}  "
                     f"{report['settings'][name] or ''}")
    for name, accuracy in report.get("choice_accuracy", {}).items():
        low, high = report["choice_accuracy_interval"][name]
        lines.append(f"{name}: the likeliest of each question's choices right {accuracy:.1%} [{low:.1%}-{high:.1%}]")
    for name, cells in report["order_breakdown"].items():
        lines.append(f"{name} order questions right: " + ", ".join(f"{cell} {right}/{asked}"
                                                                    for cell, (right, asked) in cells.items()))
    first = next(iter(report["accuracy"]))
    for name, test in report["against_first"].items():
        lines.append(f"{name} against {first} on the same questions (McNemar): right where {first} was wrong "
                     f"{test['only_second']}, wrong where it was right {test['only_first']}, p {test['p_value']:.3g}")
    if any(v is not None for v in report["device_peak_tokens"].values()):
        lines.append("device peak (tokens summed over layers, during a question); bytes moved by the answer, "
                     "and while answering (means): "
                     + "; ".join(f"{n} {report['device_peak_tokens'][n]}, {report['bytes_moved'][n] / 2**20:.1f} MiB, "
                                 f"{report['question_bytes_moved'][n] / 2**20:.1f} MiB" for n in report["accuracy"]))
        lines.append("read up from host and disk per stream, and the share read as whole blocks (every token "
                     "of the block attended): "
                     + "; ".join(f"{n} {report['read_bytes_per_stream'][n] / 2**20:.1f} MiB, "
                                 f"{report['whole_read_share'][n]:.1%}" for n in report["accuracy"]))
    for name, policy_report in report["policy_reports"].items():
        if policy_report:
            lines.append(f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in policy_report.items()
                                                 if not isinstance(v, list)))
            lines += layer_head_lines(policy_report)
    return "\n".join(lines)
