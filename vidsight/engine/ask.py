"""The ask workload: one question about a whole video file, at full compute."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tqdm import tqdm

from vidsight.engine.forward import PrefillConfig, chunk_bounds, forward
from vidsight.engine.generate import GenerationConfig, generate
from vidsight.engine.stats import AskStats, StageClock
from vidsight.errors import ConfigError
from vidsight.ingest import DecodeConfig, FrameBatch, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.kv import VIDEO, KVCache, TokenTable
from vidsight.models import load_model
from vidsight.models.positions import prompt_positions
from vidsight.vision import VideoInput, preprocess_video

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
MAX_QUESTION_CHARS = 20000


@dataclasses.dataclass
class AskResult:
    """An answer and what it cost.

    Attributes:
        answer: The decoded answer text.
        token_ids: Generated ids, including a final end token when one was produced.
        stats: Frames, tokens, stage times and peak memory.
    """

    answer: str
    token_ids: list[int]
    stats: AskStats

    def to_dict(self) -> dict:
        return {"answer": self.answer, "stats": self.stats.to_dict()}


def video_rows(frames: FrameBatch, video: VideoInput, merge_size: int, positions: torch.Tensor) -> TokenTable:
    """Token-table rows for a video span: frame, time and grid cell of every token."""
    gt, gh, gw = video.grid_thw[0], video.grid_thw[1] // merge_size, video.grid_thw[2] // merge_size
    tp = video.frames // gt
    first_frame = torch.clamp(torch.arange(gt) * tp, max=len(frames) - 1)
    grid = torch.stack(torch.meshgrid(torch.arange(gt), torch.arange(gh), torch.arange(gw), indexing="ij"), -1)
    grid = grid.reshape(-1, 3)
    n = grid.shape[0]
    return TokenTable(
        kind=torch.full((n,), VIDEO, dtype=torch.int8),
        frame_index=frames.indices[first_frame][grid[:, 0]].long(),
        time_s=frames.pts_s[first_frame][grid[:, 0]].double(),
        grid=grid,
        position=positions.T.cpu().long(),
    )


@dataclasses.dataclass
class _Prefilled:
    cache: KVCache
    logits: torch.Tensor
    next_position: int


class Asker:
    """A loaded model that answers questions about video files.

    Args:
        model: A Hugging Face id, a checkpoint directory, or an already loaded adapter.
        device: Where to run (default: CUDA when available).
        dtype: Weight dtype (default: bfloat16 on CUDA, float32 on CPU).
    """

    def __init__(self, model=DEFAULT_MODEL, device: str | None = None, dtype: torch.dtype | None = None):
        self.adapter = load_model(model, device=device, dtype=dtype) if isinstance(model, (str, Path)) else model

    def ask(
        self,
        video: str | Path,
        question: str,
        sampling: SamplingConfig = SamplingConfig(),
        generation: GenerationConfig = GenerationConfig(),
        prefill: PrefillConfig = PrefillConfig(),
        progress: bool = False,
    ) -> AskResult:
        """Answer ``question`` about the video file ``video``."""
        _check_question(question)
        clock = StageClock(AskStats(), self.adapter.device)
        state = self._prefill(video, question, sampling, prefill, generation.max_new_tokens, clock, progress)
        return self._generate(state, generation, clock, progress)

    def ask_frames(
        self,
        frames: FrameBatch,
        question: str,
        fps: float,
        generation: GenerationConfig = GenerationConfig(),
        prefill: PrefillConfig = PrefillConfig(),
    ) -> AskResult:
        """Answer ``question`` about frames already decoded (e.g. one window of a stream).

        Args:
            frames: The frames, in order.
            question: The question.
            fps: The rate the frames were sampled at (sets the model's temporal positions).
        """
        _check_question(question)
        clock = StageClock(AskStats(), self.adapter.device)
        clock.stats.frames, clock.stats.frames_lost = len(frames), frames.frames_lost
        state = self._prefill_frames(frames, fps, question, prefill, generation.max_new_tokens, clock, False)
        return self._generate(state, generation, clock, False)

    def prefill_logits(
        self,
        video: str | Path,
        question: str,
        sampling: SamplingConfig = SamplingConfig(),
        prefill: PrefillConfig = PrefillConfig(),
    ) -> torch.Tensor:
        """``(vocab,)`` logits of the first answer token: what a Yes/No verdict is read from."""
        _check_question(question)
        clock = StageClock(AskStats(), self.adapter.device)
        return self._prefill(video, question, sampling, prefill, 1, clock, progress=False).logits

    def _generate(self, state: _Prefilled, generation: GenerationConfig, clock: StageClock, progress: bool
                  ) -> AskResult:
        with clock.stage("generate"):
            with tqdm(total=generation.max_new_tokens, desc="generate", unit="tok", disable=not progress,
                      leave=False) as bar:
                ids = generate(self.adapter, state.cache, state.logits, state.next_position, generation,
                               on_token=lambda n: bar.update(1))
        clock.stats.generated_tokens = len(ids)
        return AskResult(answer=self.adapter.decode_text(ids).strip(), token_ids=ids, stats=clock.finish())

    def _prefill(self, video, question, sampling, prefill, max_new_tokens, clock: StageClock, progress: bool
                 ) -> _Prefilled:
        """Decode, preprocess, encode and prefill; the cache has room for ``max_new_tokens`` more."""
        with clock.stage("decode"):
            info = probe(video)
            indices = sample_frames(info, sampling)
            with tqdm(total=len(indices), desc="decode", unit="frame", disable=not progress, leave=False) as bar:
                frames = decode_frames(video, indices, DecodeConfig(), info, on_frame=lambda n: bar.update(n - bar.n))
        clock.stats.frames, clock.stats.frames_lost = len(frames), frames.frames_lost
        return self._prefill_frames(frames, len(indices) / info.duration_s, question, prefill, max_new_tokens,
                                    clock, progress)

    def _prefill_frames(self, frames: FrameBatch, sampled_fps: float, question: str, prefill: PrefillConfig,
                        max_new_tokens: int, clock: StageClock, progress: bool) -> _Prefilled:
        adapter, stats = self.adapter, clock.stats
        with clock.stage("preprocess"):
            video_input = preprocess_video(frames.data.to(adapter.device), adapter.vision, adapter.dtype)
        with clock.stage("vision"), torch.inference_mode():
            video_embeds = adapter.encode_video(video_input.pixel_values, video_input.grid_thw)

        with clock.stage("prefill"):
            layout = adapter.build_prompt(question, video_embeds.shape[0])
            # The model's temporal positions count seconds between sampled frames.
            second_per_grid_t = adapter.vision.temporal_patch_size / sampled_fps
            vpos = adapter.video_positions(video_input.grid_thw, second_per_grid_t, layout.video_start)
            positions, next_position = prompt_positions(len(layout.input_ids), layout.video_start, vpos)
            video_end = layout.video_start + layout.video_tokens
            rows = TokenTable.concat([
                TokenTable.text(positions[:, : layout.video_start]),
                video_rows(frames, video_input, adapter.vision.merge_size, vpos),
                TokenTable.text(positions[:, video_end:]),
            ])
            cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim,
                            len(layout.input_ids) + max_new_tokens, adapter.dtype, adapter.device)
            with torch.inference_mode():
                embeds = adapter.embed_tokens(layout.input_ids[None])
                embeds[0, layout.video_start : video_end] = video_embeds
            tokens_per_frame = layout.video_tokens // video_input.frames
            chunk_tokens = tokens_per_frame * _round_up(prefill.chunk_frames, adapter.vision.temporal_patch_size)
            chunks = chunk_bounds(len(layout.input_ids), layout.video_start, layout.video_tokens, chunk_tokens)
            for lo, hi in tqdm(chunks, desc="prefill", unit="chunk", disable=not progress, leave=False):
                hidden = forward(adapter, cache, embeds[:, lo:hi], positions[:, lo:hi], rows[lo:hi])
            with torch.inference_mode():
                logits = adapter.logits(hidden[0, -1])
        stats.visual_tokens, stats.prompt_tokens = layout.video_tokens, len(layout.input_ids)
        return _Prefilled(cache, logits, next_position)


def _check_question(question: str) -> None:
    if not question or not question.strip():
        raise ConfigError("the question is empty")
    if len(question) > MAX_QUESTION_CHARS:
        raise ConfigError(f"the question is {len(question)} characters; at most {MAX_QUESTION_CHARS} are accepted")


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def ask(video: str | Path, question: str, model=DEFAULT_MODEL, **options) -> AskResult:
    """Answer one question about a video file, loading ``model`` for this call.

    Keyword options are those of `Asker.ask` (``sampling``, ``generation``, ``prefill``,
    ``progress``). To ask many questions, build one `Asker` and reuse it.
    """
    return Asker(model).ask(video, question, **options)
