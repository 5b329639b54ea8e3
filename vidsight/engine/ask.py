"""The ask workload: one question about a whole video file, decoded and prefilled group by group."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vidsight.engine.cores import CoreSplit
from vidsight.engine.config import DEFAULT_MODEL, GenerationConfig
from vidsight.engine.constrain import check_generation
from vidsight.engine.reasoning import REASONING_PARSERS
from vidsight.engine.generate import Answer, AnswerInProgress, TokenLogprob, token_logprobs
from vidsight.engine.prefill import (PrefillConfig, Prefilled, prefill_prefix_steps, prefill_question, prefill_text,
                                     prefill_video, prefill_video_steps)
from vidsight.engine.prefix_cache import PrefixCache, PrefixClaim, prefix_key
from vidsight.engine.prompt import plan_visual
from vidsight.engine.request import Request
from vidsight.engine.score import ScoreInProgress, ScoreResult, continuation_ids
from vidsight.engine.stats import AskStats, StageClock
from vidsight.engine.steps import Preemptible, run_to_end
from vidsight.engine.text_stream import TextStream, answer_text
from vidsight.errors import ConfigError
from vidsight.ingest import (DecodeConfig, FrameBatch, SamplingConfig, decode_frames, decode_parallel, is_still_image,
                             probe, sample_frames)
from vidsight.ingest.feed import FeedConfig, FrameFeed
from vidsight.ingest.judge import motion_source
from vidsight.models import load_model
from vidsight.models.conversation import IMAGE_PART, VIDEO_PART, Conversation
from vidsight.vision import resize_frames
from vidsight.vision.tiles import tile_picture


log = logging.getLogger(__name__)


@dataclasses.dataclass
class AskResult:
    """An answer and what it cost.

    Attributes:
        answer: The decoded answer text (up to a stop string, when one ended it).
        token_ids: Generated ids, including a final end token when one was produced.
        stats: Frames, tokens, stage times and peak memory.
        finish_reason: ``stop`` (an end token or a stop string) or ``length`` (``max_new_tokens``, or
            the context window's end), as OpenAI names them.
        logprobs: Each generated token's log probability (`TokenLogprob`; an end token left out),
            when ``GenerationConfig.logprobs`` asked for them; else None.
        reasoning: With ``GenerationConfig.reasoning_parser``, the thinking before the answer
            (`engine.reasoning`; ``answer`` is then what follows it); None when it held none.
    """

    answer: str
    token_ids: list[int]
    stats: AskStats
    finish_reason: str = "stop"
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None

    def to_dict(self) -> dict:
        logprobs = {} if self.logprobs is None else {"logprobs": [t.to_dict() for t in self.logprobs]}
        reasoning = {} if self.reasoning is None else {"reasoning": self.reasoning}
        return {**reasoning, "answer": self.answer, "finish_reason": self.finish_reason, **logprobs,
                "stats": self.stats.to_dict()}


class AskInProgress(AnswerInProgress):
    """A question whose video and question are prefilled and whose answer is being generated.

    The ``generate`` stage is the time from the prefill's end to `finish`, other answers' steps
    included when it shares the batch.
    """

    def __init__(self, adapter, state: Prefilled, generation: GenerationConfig, request: Request,
                 on_text: Callable[[str], None] | None = None):
        self.request = request
        self._stream = (TextStream(adapter, on_text, generation.stop, generation.include_stop_str_in_output)
                        if on_text is not None else None)
        # Text streamed out shows the answer's progress itself (and a bar would break its lines).
        limit = generation.answer_limit(adapter.context_window, state.cache.length)
        self._bar = tqdm(total=limit, desc="generate", unit="tok", disable=not request.progress or on_text is not None,
                         leave=False)
        super().__init__(adapter, Answer(state.cache, state.logits, state.next_position, generation,
                                         on_token=self._on_token, context=state.prompt_ids, limit=limit))
        self._since = request.clock.mark()

    def _on_token(self, ids: list[int]) -> None:
        self._bar.update(1)
        if self._stream is not None:
            self._stream(ids)

    def finish(self) -> AskResult:
        """The answer and its stats, once ``answer`` is done."""
        ids = self.answer.ids
        if self._stream is not None:
            self._stream.finish(ids)
        self._bar.close()
        clock = self.request.clock
        clock.charge("generate", self._since)
        clock.stats.generated_tokens = len(ids)
        answer = self.answer
        reasoning = None
        text = answer_text(self.adapter.decode_text(ids), answer.config.stop,
                           keep_stop=answer.config.include_stop_str_in_output)
        if answer.config.reasoning_parser is not None:
            reasoning, text = REASONING_PARSERS[answer.config.reasoning_parser].split(text, bool(answer.starts_thinking))
        return AskResult(answer=text, token_ids=ids, stats=clock.finish(), reasoning=reasoning,
                         finish_reason="stop" if answer.stopped else "length",
                         logprobs=None if answer.config.logprobs is None else token_logprobs(self.adapter, answer))


class Asker:
    """A loaded model that answers questions about video files.

    Args:
        model: A Hugging Face id, a checkpoint directory, or an already loaded adapter.
        device: Where to run (default: CUDA when available).
        dtype: Weight dtype (default: bfloat16 on CUDA, float32 on CPU).
        meter_memory: Record each request's peak prefill memory (``prefill_peak_bytes``). The
            default meters on CUDA, where the allocator counts for free, and not on the CPU,
            where it watches every tensor operation and so slows prefill (benchmarks turn it on).
        prefix_cache: Keeps each video's prefilled KV for later questions about the same video
            (None: every question prefills its video).
    """

    def __init__(self, model=DEFAULT_MODEL, device: str | None = None, dtype: torch.dtype | None = None,
                 meter_memory: bool | None = None, prefix_cache: PrefixCache | None = None):
        self.adapter = load_model(model, device=device, dtype=dtype) if isinstance(model, (str, Path)) else model
        self.meter_memory = self.adapter.device.type == "cuda" if meter_memory is None else meter_memory
        self.prefix_cache = prefix_cache

    def visual_of(self, path: str | Path):
        """How `ask` shows the file at ``path``: `IMAGE_PART` for a picture (`is_still_image`) where
        the model's family has an image path (`VLMAdapter.still_vision`), else `VIDEO_PART` (a
        picture then as a video of one frame, which the log says)."""
        if not is_still_image(path):
            return VIDEO_PART
        if self.adapter.still_vision is None:
            log.warning("%s is a still image; vidsight shows it to a %s model as a video of one frame (it does not "
                        "tile pictures as the family's image processor does)", path, self.adapter.family)
            return VIDEO_PART
        return IMAGE_PART

    def ask(self, video: str | Path | None, question: str | Conversation, **options) -> AskResult:
        """Answer ``question`` (or the last message of a conversation, `Conversation`) about the
        video file ``video`` (None for a conversation of text alone); ``options`` are `begin`'s (sampling,
        generation, prefill and feed settings, ``progress``, ``on_text``)."""
        return self.begin(video, question, **options).generate_alone()

    def begin(
        self,
        video: str | Path | None,
        question: str | Conversation,
        *,
        sampling: SamplingConfig = SamplingConfig(),
        generation: GenerationConfig = GenerationConfig(),
        prefill: PrefillConfig = PrefillConfig(),
        feed: FeedConfig = FeedConfig(),
        progress: bool = False,
        on_text: Callable[[str], None] | None = None,
    ) -> AskInProgress:
        """`ask` up to its answer: decode and prefill, then hand back the answer to generate (a
        server steps several together).

        ``on_text`` is called with each new piece of the answer's text as it is generated (the
        pieces join to ``answer``).
        """
        return run_to_end(self.begin_steps(video, question, sampling=sampling, generation=generation, prefill=prefill,
                                           feed=feed, progress=progress, on_text=on_text), self.adapter)

    def begin_steps(self, video: str | Path | None, question: str | Conversation, *,
                    sampling: SamplingConfig = SamplingConfig(),
                    generation: GenerationConfig = GenerationConfig(), prefill: PrefillConfig = PrefillConfig(),
                    feed: FeedConfig = FeedConfig(), progress: bool = False,
                    on_text: Callable[[str], None] | None = None) -> Preemptible[AskInProgress]:
        """`begin` as preemptible work (`steps.Preemptible`): it pauses between prefill groups, so a
        server runs other clients' work there and a long video holds the model for one group at a
        time. Memory metering on the CPU (``meter_memory``) would count the work run in between."""
        question = Conversation.of(question)
        check_generation(self.adapter, generation)
        request = Request(StageClock(AskStats(), self.adapter.device, self.meter_memory), progress)

        def steps():
            state = yield from self._prefill(video, question, sampling, prefill, feed, generation.answer_room,
                                             request)
            return AskInProgress(self.adapter, state, generation, request, on_text)

        return steps()

    def ask_frames(
        self,
        frames: FrameBatch,
        question: str | Conversation,
        fps: float,
        *,
        generation: GenerationConfig = GenerationConfig(),
        prefill: PrefillConfig = PrefillConfig(),
    ) -> AskResult:
        """Answer ``question`` about frames already decoded (e.g. one window of a stream).

        Args:
            frames: The frames, in order.
            question: The question, or a conversation (`Conversation`).
            fps: The rate the frames were sampled at (sets the model's temporal positions).
        """
        question = Conversation.of(question)
        check_generation(self.adapter, generation)
        request = Request(StageClock(AskStats(), self.adapter.device, self.meter_memory))
        request.clock.stats.frames, request.clock.stats.frames_lost = len(frames), frames.frames_lost
        state = prefill_video(self.adapter, FrameFeed.decoded(frames), question, fps, prefill,
                              generation.answer_room, request)
        return AskInProgress(self.adapter, state, generation, request).generate_alone()

    def prefill_logits(
        self,
        video: str | Path | None,
        question: str | Conversation,
        *,
        sampling: SamplingConfig = SamplingConfig(),
        prefill: PrefillConfig = PrefillConfig(),
        feed: FeedConfig = FeedConfig(),
    ) -> torch.Tensor:
        """``(vocab,)`` logits of the first answer token: what a Yes/No verdict is read from."""
        question = Conversation.of(question)
        request = Request(StageClock(AskStats(), self.adapter.device, self.meter_memory))
        return run_to_end(self._prefill(video, question, sampling, prefill, feed, 1, request), self.adapter).logits

    def score(
        self,
        video: str | Path | None,
        question: str | Conversation,
        continuations: Sequence[str],
        *,
        sampling: SamplingConfig = SamplingConfig(),
        prefill: PrefillConfig = PrefillConfig(),
        feed: FeedConfig = FeedConfig(),
        progress: bool = False,
    ) -> ScoreResult:
        """How likely each of ``continuations`` is as the answer to ``question`` about ``video``
        (`vidsight.engine.score`): the video and question are prefilled once, as `ask` prefills
        them, and each continuation is scored after them instead of generating an answer."""
        return run_to_end(self.score_steps(video, question, continuations, sampling=sampling, prefill=prefill,
                                           feed=feed, progress=progress), self.adapter).finish()

    def score_steps(self, video: str | Path | None, question: str | Conversation, continuations: Sequence[str], *,
                    sampling: SamplingConfig = SamplingConfig(), prefill: PrefillConfig = PrefillConfig(),
                    feed: FeedConfig = FeedConfig(), progress: bool = False) -> Preemptible[ScoreInProgress]:
        """`score` as preemptible work up to its scoring, as `begin_steps` is `ask`'s: a server
        runs other clients' work between its prefill groups, then scores it in its decode batch."""
        # A bad continuation fails here, before the video is decoded.
        longest = max(len(ids) for ids in continuation_ids(self.adapter, continuations))
        question = Conversation.of(question).scored()
        request = Request(StageClock(AskStats(), self.adapter.device, self.meter_memory), progress)

        def steps():
            state = yield from self._prefill(video, question, sampling, prefill, feed, longest, request)
            return ScoreInProgress(self.adapter, state, continuations, request.clock)

        return steps()

    def _prefill(self, video, question: Conversation, sampling: SamplingConfig, prefill: PrefillConfig,
                 feed_config: FeedConfig, answer_room: int, request: Request) -> Preemptible[Prefilled]:
        """Decode (or start decoding), then prefill group by group; room for ``answer_room`` tokens after.
        A conversation without a video part is its text alone, prefilled at once (``video`` None)."""
        if (question.visual is not None) != (video is not None):
            raise ConfigError("a video (or image) file goes with a conversation holding a video or image part, and "
                              "only with one: " + ("the conversation has none" if video is not None
                                                   else "no file was given"))
        if video is None:
            return prefill_text(self.adapter, question, answer_room, request)
        request.clock.stats.still = question.still
        key = None
        if self.prefix_cache is not None:
            layout = self.adapter.build_prompt(question, 0)
            key = prefix_key(video, sampling, prefill, feed_config, layout.input_ids[:layout.video_start],
                             question.still)
        if key is None:
            return (yield from self._decode_and(lambda feed, plan, fps: prefill_video_steps(
                self.adapter, feed, question, fps, prefill, answer_room, request, plan),
                video, question, sampling, prefill, feed_config, request))
        waited = False
        while (found := self.prefix_cache.get_or_claim(key, waited)) is None:
            waited = True
            yield None   # another request is prefilling this video: its prefix, not a second prefill
        if isinstance(found, PrefixClaim):
            with found:
                prefix = yield from self._decode_and(lambda feed, plan, fps: prefill_prefix_steps(
                    self.adapter, feed, question, fps, prefill, request, plan),
                    video, question, sampling, prefill, feed_config, request)
                found.fill(prefix)
        else:
            prefix = found
            request.clock.stats.cached_tokens = prefix.tokens
        return prefill_question(self.adapter, prefix, question, answer_room, request)

    def _decode_and(self, fill, video, question: Conversation, sampling: SamplingConfig, prefill: PrefillConfig,
                    feed_config: FeedConfig, request: Request):
        """Probe and sample ``video``, start decoding it, and run ``fill(feed, plan, sampled_fps)`` (preemptible
        work) from its frames; a still image (`Conversation.still`) is the file's first frame."""
        clock = request.clock
        stats = clock.stats
        with clock.stage("decode"):
            info = probe(video)
            indices = np.zeros(1, dtype=np.int64) if question.still else sample_frames(info, sampling)
        stats.motion_source = motion_source(prefill.motion, info.codec, info.intra_only)
        cpus = os.cpu_count() or 1
        workers = feed_config.workers
        if workers is not None and workers > cpus:
            # Single-threaded decoders beyond the cores only add decoder state and contention.
            log.warning("%d decoders asked for on %d CPUs; using %d", workers, cpus, cpus)
            workers = cpus
        decoders = cpus if workers is None else workers
        decoding = DecodeConfig(trim_gops=feed_config.trim_gops, motion=prefill.motion)
        plan = plan_visual(self.adapter, question, len(indices), info.height, info.width, sampling.pixel_bounds)
        tiled = plan.frames != len(indices)   # a picture the family cuts into tiles, decoded whole first
        if feed_config.resize_in_decoder and not tiled:
            decoding = dataclasses.replace(decoding, size=plan.size, resize=resize_frames)
        request.cores = cores = CoreSplit(self.adapter.device, decoders, feed_config.overlap and feed_config.split_cores)
        with cores, tqdm(total=len(indices), desc="decode", unit="frame", disable=not request.progress,
                         leave=False) as bar:
            def on_frame(n):
                bar.update(n - bar.n)

            if feed_config.overlap and not tiled:
                # Split before the decoders start: a thread takes torch's thread count at its first operation.
                cores.update(decoding=True)
                feed = FrameFeed.background(video, indices, info, decoding, workers, on_frame)
            else:
                with clock.stage("decode"):
                    batch = (decode_frames(video, indices, decoding, info, on_frame) if workers == 0 else
                             decode_parallel(video, indices, decoding, info, workers, on_frame=on_frame))
                if tiled:
                    with clock.stage("preprocess"):
                        batch = _tiles_of(batch, self.adapter.still_vision)
                feed = FrameFeed.decoded(batch, clock.stats.stages_s["decode"])
            with feed:
                # A still has no time: its one temporal patch is at time zero whatever the rate.
                fps = 1.0 if question.still else len(indices) / sampling.clip(info)[1]
                state = yield from fill(feed, plan, fps)
        stats.frames, stats.frames_lost = len(feed), feed.frames_lost
        stats.decode_strategy, stats.overlap, stats.decode_busy_s = feed.strategy, feed_config.overlap, feed.decode_s
        stats.decode_workers = decoders
        return state


def _tiles_of(picture: FrameBatch, spec) -> FrameBatch:
    """A decoded picture as the frames of its tiles (`vidsight.vision.tiles`), each at its time and index."""
    tiles = tile_picture(picture.data[0], spec)
    return dataclasses.replace(picture, data=tiles, pts_s=picture.pts_s[:1].repeat(len(tiles)),
                               indices=picture.indices[:1].repeat(len(tiles)), codec=[])


def ask(video: str | Path | None, question: str | Conversation, model=DEFAULT_MODEL, **options) -> AskResult:
    """Answer one question about a video file, loading ``model`` for this call.

    Keyword options are those of `Asker.begin` (``sampling``, ``generation``, ``prefill``, ``feed``,
    ``progress``, ``on_text``). To ask many questions, build one `Asker` and reuse it.
    """
    return Asker(model).ask(video, question, **options)
