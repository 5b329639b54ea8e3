"""The chat workload: one stream, prefilled temporal patch by temporal patch, questions at any time.

The stream is one growing video prompt: the system prompt and the user turn's opening, then each
temporal patch as soon as its frames arrive (encoded by the vision tower and prefilled on top of
the cache with the M-RoPE positions `ask` would give the same frames), then, at a question, the
end of the video span, the question and the assistant's turn. The answer is generated and, by
default, the question and answer are dropped again so the cache holds only the video. Which
cached tokens each step attends to is the `KVPolicy`'s choice; ``full`` attends to all and so
answers exactly as `ask` on the same frames.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterable, Sequence

import torch

from vidsight.engine.config import GenerationConfig
from vidsight.engine.constrain import check_generation
from vidsight.engine.batch import Chunk
from vidsight.engine.forward import first_level, new_cache
from vidsight.engine.chat_turn import ChatAnswer, ChatInProgress
from vidsight.engine.prompt import interleave, patch_rows
from vidsight.engine.score import ScoreResult, continuation_ids
from vidsight.engine.stats import PatchStats, StageClock
from vidsight.engine.steps import EncodeRequest, Preemptible, Stepped, drive, run_to_end
from vidsight.errors import ConfigError, ModelError
from vidsight.ingest.stream import SampledFrame
from vidsight.kv import VIDEO, TokenTable
from vidsight.kv.policies import FullPolicy, KVPolicy, Step
from vidsight.kv.tiers import TierConfig
from vidsight.models.base import VLMAdapter
from vidsight.models.conversation import Conversation
from vidsight.vision import preprocess_video, video_size

# Cache slots allocated up front; the cache doubles as the stream grows.
INITIAL_CAPACITY = 4096
MAX_BATCH_PATCHES = 256   # temporal patches one prefill may take


@dataclasses.dataclass(frozen=True)
class ChatConfig:
    """How a chat session reads its stream.

    Attributes:
        fps: Frames per second the stream is sampled at (sets the temporal positions); 1 by
            default, as the chat issue asks (ReKV samples at 0.5).
        keep_dialogue: Keep each question and answer in the cache, as a chat would: the turn is
            closed, a new user turn opens and the stream goes on in it as a new video span
            (positions as Qwen gives a second video: from the position after the turn, time
            counted from the span's first frame). Off by default, so the memory holds only video.
        batch_patches: Temporal patches encoded and prefilled together (Mosaic's batched
            execution): one vision call and one causal chunk for all of them, with one retrieval
            for the chunk. A question first prefills the complete patches waiting. 1: each
            patch as soon as it is complete.
        system: A system message before the stream (None: the chat template's own), as
            ``ask --system`` puts one before a question.
    """

    fps: float = 1.0
    keep_dialogue: bool = False
    batch_patches: int = 1
    system: str | None = None

    def __post_init__(self):
        if not 0 < self.fps <= 120:
            raise ConfigError(f"fps must be in (0, 120], got {self.fps}")
        if not 1 <= self.batch_patches <= MAX_BATCH_PATCHES:
            raise ConfigError(f"batch_patches must be in [1, {MAX_BATCH_PATCHES}], got {self.batch_patches}")


class ChatSession:
    """One stream's memory and the questions asked about it.

    Args:
        adapter: A loaded model (`load_model`).
        policy: Which cached tokens each step attends to (default: `FullPolicy`, exact).
        config: Sampling rate of the stream.
        tiers: Budgets of the device, host and disk KV tiers (default: one device buffer). Close
            the session (or use it as a context manager) to remove its disk directory.

    Example:
        >>> session = ChatSession(load_model("Qwen/Qwen2.5-VL-7B-Instruct"))
        >>> session.push(StreamSource("cam.ts", fps=1.0))
        >>> session.ask("What colour was the car that parked?").answer
    """

    def __init__(self, adapter: VLMAdapter, policy: KVPolicy | None = None, config: ChatConfig = ChatConfig(),
                 tiers: TierConfig | None = None):
        self.adapter, self.config = adapter, config
        self.cache = new_cache(adapter, INITIAL_CAPACITY, tiers)
        # The session's own policy state (a policy object given to several sessions is shared by none).
        self.policy = (policy if policy is not None else FullPolicy()).start(self.cache)
        empty, one = (adapter.build_prompt(Conversation.of("?", self.config.system), tokens) for tokens in (0, 1))
        self._prefix = empty.input_ids[: empty.video_start]
        self._video_id = int(one.input_ids[one.video_start])   # the id `ask`'s prompt gives video tokens
        # Every token id of the stream's prompt so far (its video tokens by their placeholder id, as
        # `ask`'s prompt holds them): a repetition penalty counts them as transformers counts a
        # prompt's input ids, so a session's answer is `ask`'s on the same frames under it too.
        self._prompt_ids: set[int] = set()
        self._pending: list[SampledFrame] = []   # frames waiting for the rest of their temporal patch
        self._size: tuple[int, int] | None = None  # resized (height, width), fixed by the first frame
        self._input_hw: tuple[int, int] | None = None
        self._origin_s = 0.0
        self._patches = 0
        self._next_position = len(self._prefix)  # after the video so far
        # The video span the stream is in: its first position and first temporal patch (a kept
        # dialogue turn starts a new span).
        self._span_start, self._span_first_patch = len(self._prefix), 0
        self.frames_seen = 0
        self.time_s = 0.0
        self._answering: ChatInProgress | None = None   # a question begun, its answer not finished
        self.patches: list[PatchStats] = []       # per temporal patch: preprocess, vision and prefill

    # -- the stream ------------------------------------------------------------------------------
    def push(self, frames: Iterable[SampledFrame], batch_patches: int | None = None) -> None:
        """Add sampled frames; each completed batch of temporal patches is prefilled at once.

        Args:
            frames: The stream's next sampled frames.
            batch_patches: Patches prefilled together in this call (default: the session's
                `ChatConfig.batch_patches`), e.g. a history loaded in bulk before a stream's
                patches go one by one.
        """
        drive(self.pushing(frames, batch_patches), self.adapter)

    def pushing(self, frames: Iterable[SampledFrame], batch_patches: int | None = None) -> Stepped[None]:
        """`push` as stepped work (`steps`): it yields each batch of patches' encoding and then its
        chunk for the language model, so a server encodes and prefills them beside other work."""
        self._check_idle()
        batch = batch_patches or self.config.batch_patches
        if not 1 <= batch <= MAX_BATCH_PATCHES:
            raise ConfigError(f"batch_patches must be in [1, {MAX_BATCH_PATCHES}], got {batch}")
        for frame in frames:
            self._check_frame(frame)
            self._pending.append(frame)
            self.frames_seen += 1
            self.time_s = frame.pts_s
            # At or past: a larger batch of an earlier call may have left frames waiting.
            if len(self._pending) >= self.adapter.vision.temporal_patch_size * batch:
                yield from self._flushing()

    def _flushing(self) -> Stepped[None]:
        """Prefill the complete temporal patches waiting; a lone frame goes on waiting for its partner."""
        complete = len(self._pending) - len(self._pending) % self.adapter.vision.temporal_patch_size
        if complete:
            frames, self._pending = self._pending[:complete], self._pending[complete:]
            yield from self._prefilling_patches(frames)

    def _check_idle(self) -> None:
        if self._answering is not None:
            raise ConfigError(f"the answer to {self._answering.question!r} is not finished: its session takes no "
                              "frames or questions until it is (`finish`, or `generate_together`)")

    def _check_frame(self, frame: SampledFrame) -> None:
        hw = tuple(frame.rgb.shape[:2])
        if frame.rgb.ndim != 3 or frame.rgb.shape[2] != 3 or frame.rgb.dtype != torch.uint8:
            raise ConfigError(f"a frame must be (H, W, 3) uint8, got {tuple(frame.rgb.shape)} {frame.rgb.dtype}")
        if self._input_hw is None:
            self._input_hw, self._origin_s = hw, frame.pts_s  # the stream's times count from its first frame
            spec = self.adapter.vision
            # The stream has no known length, so no whole-video pixel budget: each frame gets
            # the per-frame bound (what `ask` gives a video short enough not to reach the budget).
            self._size = video_size(spec, spec.temporal_patch_size, *hw)
        elif hw != self._input_hw:
            raise ConfigError(f"frame size changed mid-stream from {self._input_hw} to {hw}")

    def _prefilling_patches(self, frames: list[SampledFrame]) -> Stepped[None]:
        adapter, spec = self.adapter, self.adapter.vision
        timing = PatchStats(0.0, 0, 0.0, len(frames) // spec.temporal_patch_size)
        clock = StageClock(timing, adapter.device, reset_peak=False)
        if self._patches == 0:
            with clock.stage("prefill"):
                yield self._text_chunk(self._prefix, torch.arange(len(self._prefix)).expand(3, -1), Step("frame"))
            self._prompt_ids.update(self._prefix.tolist())
        with clock.stage("preprocess"), torch.inference_mode():
            video = preprocess_video(torch.stack([f.rgb for f in frames]).to(adapter.device), spec, adapter.dtype,
                                     size=self._size)
        with clock.stage("vision"):   # with other streams' frames too when a scheduler encodes them together
            embeds = (yield EncodeRequest(video.pixel_values, video.grid_thw))[None]
        chunk = self._patch_chunk(frames, video.grid_thw, embeds)
        timing.cached_tokens = self.cache.length
        with clock.stage("prefill"):  # with other sequences' tokens too when a scheduler packs them
            yield chunk
        self._patches += video.grid_thw[0]
        self._next_position = int(chunk.positions.max()) + 1
        timing.latency_s, timing.attended_tokens = clock.elapsed(), chunk.step.attended / chunk.step.layers
        timing.policy_s = chunk.step.policy_s
        self.patches.append(timing)

    @torch.inference_mode()
    def _patch_chunk(self, frames: list[SampledFrame], grid_thw: tuple[int, int, int], embeds: torch.Tensor) -> Chunk:
        """The chunk of the encoded patches of ``frames`` (``embeds`` ``(1, n, hidden)``), with the
        family's text between patches, for the language model."""
        adapter, spec = self.adapter, self.adapter.vision
        patches, gh, gw = grid_thw
        count = embeds.shape[1]
        seconds_per_patch = spec.temporal_patch_size / self.config.fps
        firsts = frames[:: spec.temporal_patch_size]
        in_span = self._patches - self._span_first_patch  # the patches' places in the video span
        lasts = frames[spec.temporal_patch_size - 1 :: spec.temporal_patch_size]
        texts = [adapter.patch_text(in_span + k, (first.pts_s + last.pts_s) / 2 - self._origin_s)
                 for k, (first, last) in enumerate(zip(firsts, lasts))]
        self._prompt_ids.update([self._video_id, *(t for before, after in texts for t in before + after)])
        frame_index, time_s = torch.tensor([f.frame_index for f in firsts]), torch.tensor([f.pts_s for f in firsts])
        if any(before or after for before, after in texts):
            video_rows = patch_rows(self._patches, spec.token_hw((gh, gw)), frame_index, time_s,
                                    torch.zeros((3, count), dtype=torch.long))
            table, ids, _, positions = interleave(adapter, (gh, gw), texts, video_rows,
                                                  torch.ones(count, dtype=torch.bool), self._next_position, 0,
                                                  seconds_per_patch)
            rows = TokenTable.concat(table)
            inputs = adapter.embed_tokens(torch.cat(ids)[None])
            inputs[0, rows.kind == VIDEO] = embeds[0]
        else:
            # The positions of the whole span so far, as `ask` computes them; these patches' are the last.
            positions = adapter.video_positions((in_span + patches, gh, gw), seconds_per_patch,
                                                self._span_start)[:, -count:]
            rows = patch_rows(self._patches, spec.token_hw((gh, gw)), frame_index, time_s, positions)
            inputs = embeds
        self.cache.reserve(inputs.shape[1])
        per_patch = count // patches
        step = Step("frame", patches=[(f.frame_index, first_level(embeds[0, k * per_patch : (k + 1) * per_patch]))
                                      for k, f in enumerate(firsts)])
        return Chunk(self.cache, inputs, positions, rows, policy=self.policy, step=step)

    def _prefill_text(self, ids: torch.Tensor, positions: torch.Tensor, step: Step,
                      leading: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill text ``ids``, after ``leading`` ``(n, hidden)`` embeddings when given."""
        return self._text_chunk(ids, positions, step, leading).run(self.adapter)

    @torch.inference_mode()
    def _text_chunk(self, ids: torch.Tensor, positions: torch.Tensor, step: Step,
                    leading: torch.Tensor | None = None) -> Chunk:
        embeds = self.adapter.embed_tokens(ids[None])
        if leading is not None:
            embeds = torch.cat([leading[None], embeds], dim=1)
        self.cache.reserve(embeds.shape[1])
        return Chunk(self.cache, embeds, positions, TokenTable.text(positions), policy=self.policy, step=step)

    def close(self) -> None:
        """Release the session's disk tier, if it has one."""
        self.cache.close()

    def __enter__(self) -> "ChatSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fork(self, policy: KVPolicy | None = None) -> "ChatSession":
        """A session that shares this one's model and starts from a copy of its memory (tiers too).

        Args:
            policy: The fork's policy (default: this session's settings, started afresh on the fork's memory).
        """
        self._check_idle()
        fork = copy.copy(self)
        fork.cache = self.cache.clone()
        fork.policy = (self.policy if policy is None else policy).start(fork.cache)
        fork._pending, fork.patches, fork._prompt_ids = list(self._pending), [], set(self._prompt_ids)
        return fork

    # -- questions -------------------------------------------------------------------------------
    def ask(self, question: str, generation: GenerationConfig = GenerationConfig(),
            on_text: Callable[[str], None] | None = None) -> ChatAnswer:
        """Answer ``question`` from the video seen so far; the cache keeps only the video afterwards.

        A frame still waiting for its temporal patch's partner is not seen yet.

        Args:
            question: The question.
            generation: How answer tokens are chosen.
            on_text: Called with each new piece of the answer's text as it is generated.

        Raises:
            ConfigError: an empty or overlong question, or no complete temporal patch yet.
        """
        return self.begin(question, generation, on_text).generate_alone()

    def score(self, question: str, continuations: Sequence[str]) -> ScoreResult:
        """How likely each of ``continuations`` is as the answer to ``question`` about the video so
        far (`vidsight.engine.score`): the question is prefilled as for `ask`, each continuation
        is fed after it through the session's policy, and the cache keeps only the video afterwards.

        Raises:
            ConfigError: no continuations, one without tokens, or what `ask` refuses.
        """
        longest = max(len(ids) for ids in continuation_ids(self.adapter, continuations))
        return self.begin(question, GenerationConfig(max_new_tokens=longest), scored=True).score(continuations)

    def begin(self, question: str, generation: GenerationConfig = GenerationConfig(),
              on_text: Callable[[str], None] | None = None, scored: bool = False) -> ChatInProgress:
        """`ask` up to its answer: the question prefilled, the answer to generate (alone, or with
        others' by `generate_together`), or with ``scored`` given answers to score
        (`Conversation.closes_thinking`). The session takes no frames until it is finished."""
        return run_to_end(self.asking(question, generation, on_text, scored), self.adapter)

    def asking(self, question: str, generation: GenerationConfig = GenerationConfig(),
               on_text: Callable[[str], None] | None = None, scored: bool = False) -> Preemptible[ChatInProgress]:
        """`ask` as preemptible work (`steps`): it yields the question's chunk for the language
        model and gives the answer to generate, so a server prefills the question beside other
        sequences and generates the answer in its decode batch. The session takes no frames
        until the answer is finished."""
        conversation = Conversation.of(question, self.config.system)   # refused before anything is done
        conversation = conversation.scored() if scored else conversation
        check_generation(self.adapter, generation)
        self._check_idle()
        drive(self._flushing(), self.adapter)
        if self._patches == 0:
            raise ConfigError(f"no video yet: a question needs {self.adapter.vision.temporal_patch_size} frames "
                              f"first (one temporal patch); {self.frames_seen} arrived")
        layout = self.adapter.build_prompt(conversation, 0)
        if not torch.equal(layout.input_ids[: layout.video_start], self._prefix):
            raise ModelError(f"{self.adapter.name}: the chat template puts text that depends on the question "
                             "before the video; a stream cannot be prefilled ahead of its questions")
        # The video so far ends here: its suffix (LLaVA-OneVision's newline), then the question's text.
        question_ids = layout.input_ids[layout.video_start :]
        progress = self._answering = ChatInProgress(self, question, generation, on_text)
        try:
            with progress.clock.stage("prefill"):
                with torch.inference_mode():
                    video_suffix = self.adapter.video_suffix()
                length = video_suffix.shape[0] + len(question_ids)
                positions = (torch.arange(length) + self._next_position).expand(3, -1)
                hidden = yield self._text_chunk(question_ids, positions, progress.question_step, video_suffix)
                with torch.inference_mode():
                    logits = self.adapter.logits(hidden[0, -1])
        except BaseException:   # the pass failed, or a scheduler gave the question up
            progress.abandon()
            raise
        progress.start(logits, self._next_position + length,
                       torch.tensor(sorted(self._prompt_ids.union(question_ids.tolist()))))
        return progress

    def _keep_turn(self, pending: list[int], position: int, seen: list[int]) -> None:
        """Close the answered turn and open the next user turn's video span after it.

        ``pending``, the answer's tokens not in the cache yet (`generate` stops before writing its
        last), go in at ``position`` with the turn's end and the template's opening of a user turn
        with a video (the prompt's tokens after the system turn ends). ``seen``: the turn's ids,
        which a repetition penalty counts from now on.
        """
        end = next((t for t in self._prefix.tolist() if t in self.adapter.eos_token_ids), None)
        if end is None:
            raise ModelError(f"{self.adapter.name}: the chat template has no end-of-turn token before the video; "
                             "dialogue turns cannot be kept")
        prefix = self._prefix.tolist()
        reopen = prefix[prefix.index(end) + 1 :]
        closing = pending + ([] if pending and pending[-1] in self.adapter.eos_token_ids else [end])
        tokens = torch.tensor(closing + reopen)
        positions = (torch.arange(len(tokens)) + position).expand(3, -1)
        self._prefill_text(tokens, positions, Step("answer"))
        self._prompt_ids.update(seen + tokens.tolist())
        self._next_position = self._span_start = position + len(tokens)
        self._span_first_patch = self._patches
