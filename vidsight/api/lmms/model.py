"""The lmms-eval model: each request's video (or picture) and question answered by vidsight.

Without ``policy`` a request goes through `Asker.ask` (QuickVideo's pipeline, with whatever KV
and motion pruning the arguments ask for); with ``policy`` the video is streamed into a
`ChatSession` under that retrieval policy and the question asked at its end, as a streaming
benchmark would. Loglikelihood requests (multiple-choice tasks) are scored by `Asker.score`, or
with ``policy`` by the session's `ChatSession.score`. The task's ``generation_kwargs`` set each
answer's length and sampling; the model arguments set everything else (`vidsight.api.lmms.settings`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from pathlib import Path

from lmms_eval.api.instance import GenerationResult, TokenCounts
from lmms_eval.api.model import lmms
from tqdm import tqdm

from vidsight.api.chat import chat_policy
from vidsight.api.lmms.settings import parse_model_args
from vidsight.api.options import chat_template_of
from vidsight.api.settings import ask_configs, chat_configs, feed_config, generation_config
from vidsight.engine import Asker
from vidsight.engine.config import DEFAULT_MODEL
from vidsight.engine.score import ScoreResult
from vidsight.errors import ConfigError
from vidsight.models import load_model
from vidsight.models.conversation import Conversation


class VidsightLMM(lmms):
    """``lmms-eval --model vidsight --model_args pretrained=ID_OR_DIR[,setting=value...]``.

    Args:
        pretrained: A Hugging Face id or checkpoint directory, as ``vidsight ask --model`` takes.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (default: CUDA when available).
        stats_path: Also write each request's answer, token counts and stage times to this JSONL file.
        batch_size: Requests run one at a time; lmms-eval's default of 1 is the only one taken.
        **settings: ``vidsight ask``'s flags by name (``rho``, ``kv_score``, ``prune_tau``,
            ``dedup_patches``, ``fps``, ``max_frames`` ...), or with ``policy`` ``vidsight chat``'s
            (``policy``, its thresholds, ``kv_device_budget``, ``kv_host_budget`` ...).
    """

    is_simple = True

    def __init__(self, pretrained: str = DEFAULT_MODEL, device: str | None = None, stats_path: str | None = None,
                 batch_size: int | str = 1, max_batch_size: int | None = None, **settings):
        super().__init__()
        if int(batch_size) != 1:
            raise ConfigError(f"vidsight model_args: batch_size must be 1 (requests run one at a time), got {batch_size}")
        self.settings = parse_model_args(settings)
        if self.settings.mode == "chat":
            chat_policy(self.settings.namespace())   # a flag of another policy fails here, not at the first request
        namespace = self.settings.namespace()
        self.asker = Asker(load_model(str(pretrained), device=device, chat_template=chat_template_of(namespace)))
        self.stats_path = Path(stats_path) if stats_path else None
        # An image task's pictures, written as files for the request that shows them (removed at exit).
        self._scratch = tempfile.TemporaryDirectory(prefix="vidsight-lmms-")
        self.request_stats: list[dict] = []   # one record per answered request, in order

    def generate_until(self, requests) -> list[GenerationResult]:
        results = []
        for request in tqdm(requests, desc="vidsight", disable=self.rank != 0):
            context, gen_kwargs, doc_to_visual, doc_id, task, split = request.args
            video = self._video(doc_to_visual(self.task_dict[task][split][doc_id]), task, doc_id)
            record = self._answer(video, context, dict(gen_kwargs))
            record.update(task=task, doc_id=doc_id)
            self._keep(record)
            results.append(GenerationResult(record["answer"], TokenCounts(input_tokens=record["prompt_tokens"],
                                                                          output_tokens=record["generated_tokens"])))
        return results

    def loglikelihood(self, requests) -> list[GenerationResult]:
        """Each request's continuation scored after its video and context (`Asker.score`; with a
        ``policy``, after the video streamed into a session, `ChatSession.score`): the requests of
        one video and context (a multiple-choice question's choices) share one prefill.

        Returns, per request, what lmms-eval's models return and its multiple-choice scoring ranks
        by its smallest value: the continuation's mean negative log-likelihood per token (the
        cross-entropy "loss"), and whether greedy decoding would produce it. The pair comes as a
        `GenerationResult`'s ``text``: lmms-eval 0.7.3 turns any other reply into its ``str``
        (``unwrap_generation_output``), which its multiple-choice scoring cannot unpack.
        """
        prompts: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for number, request in enumerate(requests):
            if len(request.args) == 2:   # the unconditional requests of lmms-eval's acc_mutual_info
                raise ConfigError("acc_mutual_info scores each choice with no context and no video; vidsight "
                                  "scores an answer after a video, so leave acc_mutual_info out of the task's "
                                  f"metric_list (request {request.args!r:.80})")
            context, target, doc_to_visual, doc_id, task, split = request.args
            doc = self.task_dict[task][split][doc_id]
            video = self._video(doc_to_visual(doc), task, doc_id)
            prompts.setdefault((video, context), []).append((number, target if isinstance(target, str) else target(doc)))
        results: list[GenerationResult | None] = [None] * len(requests)
        for (video, context), members in tqdm(prompts.items(), desc="vidsight", disable=self.rank != 0):
            scored = self._score(video, context, [text for _, text in members])
            prompt_tokens = scored.stats.prompt_tokens if self.settings.mode == "ask" else scored.stats.cached_tokens
            for (number, _), score in zip(members, scored.scores):
                counts = TokenCounts(input_tokens=prompt_tokens + len(score.tokens), output_tokens=0)
                results[number] = GenerationResult((-score.logprob / len(score.tokens), score.greedy), counts)
            self._keep({"video": video, "question": context, "scores": [s.to_dict() for s in scored.scores],
                        "prompt_tokens": prompt_tokens, "stats": scored.stats.to_dict()})
        return results

    def generate_until_multi_round(self, requests):
        raise NotImplementedError("vidsight answers one round per request: multi-round tasks are not supported")

    def _video(self, visuals, task: str, doc_id) -> str:
        """The request's one video file, or its one picture (an image task's PIL image) as a PNG
        file written once (`Asker.visual_of` then shows it as an image)."""
        visuals = visuals if isinstance(visuals, (list, tuple)) else [visuals]
        if len(visuals) == 1 and hasattr(visuals[0], "save") and hasattr(visuals[0], "tobytes"):
            return self._picture_file(visuals[0])
        if len(visuals) != 1 or not isinstance(visuals[0], (str, Path)):
            raise ConfigError(f"{task} document {doc_id}: vidsight takes one video file or one picture per request, "
                              f"got {[type(v).__name__ for v in visuals]}")
        return str(visuals[0])

    def _picture_file(self, image) -> str:
        """``image`` (a PIL image) as a PNG in this model's scratch folder, named by its pixels."""
        digest = hashlib.blake2b(f"{image.mode} {image.size}".encode() + image.tobytes(), digest_size=16).hexdigest()
        path = Path(self._scratch.name) / f"{digest}.png"
        if not path.exists():
            image.save(path)
        return str(path)

    def _settings_for(self, gen_kwargs: dict) -> dict:
        """The model arguments' settings with the task's ``generation_kwargs`` (length, sampling) over them."""
        until = gen_kwargs.get("until")
        chosen = {"max_new_tokens": gen_kwargs.get("max_new_tokens"), "temperature": gen_kwargs.get("temperature"),
                  "top_p": gen_kwargs.get("top_p"), "top_k": gen_kwargs.get("top_k"), "min_p": gen_kwargs.get("min_p"),
                  "stop": [s for s in ([until] if isinstance(until, str) else until or ()) if s] or None}
        settings = {**self.settings.settings, **{k: v for k, v in chosen.items() if v is not None}}
        if not gen_kwargs.get("do_sample", True):
            settings["temperature"] = 0.0
        return settings

    def _conversation(self, video: str, question: str) -> Conversation:
        """``ask`` mode's prompt: the question about ``video`` (or the picture, `Asker.visual_of`)
        after the arguments' system message, with their chat template arguments (a session's
        system message is its config's)."""
        settings = self.settings.settings
        return Conversation.of(question, settings.get("system"), settings.get("chat_template_kwargs"),
                               visual=self.asker.visual_of(video))

    def _answer(self, video: str, question: str, gen_kwargs: dict) -> dict:
        settings = self._settings_for(gen_kwargs)
        if self.settings.mode == "ask":
            sampling, generation, prefill = ask_configs(settings)
            result = self.asker.ask(video, self._conversation(video, question), sampling=sampling,
                                    generation=generation, prefill=prefill, feed=feed_config(settings))
            stats = result.stats
            record = {"prompt_tokens": stats.prompt_tokens, "generated_tokens": stats.generated_tokens}
        else:
            result = self._chat(video, question, settings)
            stats = result.stats
            record = {"prompt_tokens": stats.cached_tokens, "generated_tokens": len(result.token_ids)}
        return {"video": video, "question": question, "answer": result.answer, **record, "stats": stats.to_dict()}

    def _chat(self, video: str, question: str, settings: dict):
        with self._streamed(video, settings) as session:
            return session.ask(question, generation_config(settings))

    def _score(self, video: str, question: str, continuations: list[str]) -> ScoreResult:
        settings = self.settings.settings
        if self.settings.mode == "ask":
            sampling, _, prefill = ask_configs(settings)
            return self.asker.score(video, self._conversation(video, question), continuations, sampling=sampling,
                                    prefill=prefill, feed=feed_config(settings))
        with self._streamed(video, settings) as session:
            return session.score(question, continuations)

    @contextlib.contextmanager
    def _streamed(self, video: str, settings: dict):
        """A chat session under the arguments' policy, ``video`` streamed into it."""
        from vidsight.engine.chat import ChatSession
        from vidsight.ingest.stream import StreamSource

        config, tiers = chat_configs(settings)
        # A session per request: each stream's memory and policy state are its own.
        policy = chat_policy(self.settings.namespace())
        with ChatSession(self.asker.adapter, policy, config, tiers) as session:
            for frame in StreamSource(video, fps=config.fps):
                session.push([frame])
            yield session

    def _keep(self, record: dict) -> None:
        self.request_stats.append(record)
        if self.stats_path is not None:
            self.stats_path.parent.mkdir(parents=True, exist_ok=True)
            with self.stats_path.open("a") as out:
                out.write(json.dumps(record, default=str) + "\n")
