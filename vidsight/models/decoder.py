"""The language-model side shared by families whose decoder is Qwen2's (Qwen2.5-VL, LLaVA-OneVision, InternVL3)
or Qwen3's (Qwen3-VL):
prompt building through the checkpoint's chat template, embeddings, per-layer projections and
norms, and key re-rotation. Each family adds its vision tower and its rotary positions."""

from __future__ import annotations

import functools

import torch

from vidsight.errors import ConfigError, ModelError
from vidsight.models.base import PromptLayout, VisionSpec
from vidsight.models.conversation import THINK_TAGS, Conversation
from vidsight.models.typed_text import plain_ids, prompt_ids, special_strings


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate ``(1, heads, L, D)`` by ``cos, sin`` of shape ``(1, L, D)``."""
    cos, sin = (r.unsqueeze(1) for r in rotary)
    return x * cos + rotate_half(x) * sin


# The checkpoint's generation_config.json settings a server takes as its requests' defaults, as
# vLLM's ``--generation-config auto`` does (repetition_penalty is the adapter's own, everywhere).
SAMPLING_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "max_new_tokens")


def sampling_defaults(generation_config) -> dict:
    """The `SAMPLING_DEFAULTS` a checkpoint's generation config sets (not transformers' own defaults)."""
    given = generation_config.to_diff_dict() if generation_config is not None else {}
    return {name: given[name] for name in SAMPLING_DEFAULTS if given.get(name) is not None}


class Qwen2DecoderAdapter:
    """Engine primitives of a Qwen2-style decoder inside a transformers VLM.

    Args:
        name: The id or directory the model came from.
        model: The transformers model, in eval mode; ``model.model.language_model`` is its decoder
            and ``model.lm_head`` its output head.
        tokenizer: Its tokenizer.
        chat_template: Jinja chat template (the checkpoint's).
        vision: Frame preprocessing settings.
        eos_token_ids: Tokens that end generation.
    """

    family: str

    def __init__(self, name, model, tokenizer, chat_template: str, vision: VisionSpec, eos_token_ids):
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.vision = vision
        self.eos_token_ids = frozenset(eos_token_ids)
        self.repetition_penalty = float(getattr(model.generation_config, "repetition_penalty", None) or 1.0)
        self.sampling_defaults = sampling_defaults(model.generation_config)
        text = model.config.text_config
        self.num_layers = text.num_hidden_layers
        self.num_heads = text.num_attention_heads
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        self.context_window = text.max_position_embeddings
        # The token the model fills with a video's encoder outputs (InternVL fills its image token).
        self.video_token_id = getattr(model.config, "video_token_id", None) or model.config.image_token_id
        # The chat template's mark for a video, replaced by the span (the placeholder itself, unless
        # the family's template writes another token there).
        self.template_video_id = self.video_token_id
        # A still image's mark in the template and in its span (`still_vision`; the loader sets it).
        self.image_token_id = model.config.image_token_id
        self.still_vision: VisionSpec | None = None
        self._lm = model.model.language_model

    @classmethod
    def still_spec(cls, vision: VisionSpec, image_processor: dict) -> VisionSpec | None:
        """How the family shows a still image (`VLMAdapter.still_vision`): not at all, unless it says."""
        return None

    @property
    def dtype(self) -> torch.dtype:
        return self._lm.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self._lm.embed_tokens.weight.device

    # -- text ----------------------------------------------------------------------------------
    def build_prompt(self, question: str | Conversation, video_tokens: int) -> PromptLayout:
        """The chat-formatted prompt of a conversation (a question: one user turn holding the
        video, then the question), ready for the answer; a conversation without a video or image
        is its text alone (``video_tokens`` 0, the span's place the prompt's end)."""
        from jinja2 import TemplateError

        conversation = Conversation.of(question)

        def render(conversation: Conversation) -> str:
            continues = conversation.continues_final
            try:
                text = self.tokenizer.apply_chat_template(conversation.template_form(), chat_template=self.chat_template,
                                                          add_generation_prompt=not continues,
                                                          continue_final_message=continues, tokenize=False,
                                                          tools=list(conversation.tools) or None,
                                                          **conversation.template_kwargs)
            except TemplateError as exc:   # the template's own rules (roles alternating, a system turn first ...)
                raise ConfigError(f"{self.name}'s chat template refuses the conversation: {exc}") from exc
            except ValueError as exc:   # a template that drops the final message's text: nothing to continue
                if not continues:
                    raise
                raise ConfigError(f"{self.name}'s chat template cannot continue the final message: {exc}") from exc
            return self._closed_thinking(text) if conversation.closes_thinking else text

        ids = torch.tensor(prompt_ids(self.tokenizer, self._special_strings, render, conversation), dtype=torch.long)
        if conversation.visual is None:   # text alone: no span, its place the prompt's end
            if video_tokens:
                raise ConfigError(f"a conversation without a video or image part has no place for {video_tokens} "
                                  "video tokens")
            return PromptLayout(ids, len(ids), 0)
        mark, placeholder = ((self.image_token_id, self.image_token_id) if conversation.still
                             else (self.template_video_id, self.video_token_id))
        slots = torch.nonzero(ids == mark).flatten()
        if len(slots) != 1:
            raise ModelError(f"{self.name}: chat template yields {len(slots)} {conversation.visual.template_type} "
                             "placeholders, expected 1")
        # A still keeps the template's own marks around its span; a video's patches may bring theirs.
        slot = int(slots[0])
        start, end = (slot, slot + 1) if conversation.still else self._template_video(ids, slot)
        video = torch.full((video_tokens,), placeholder, dtype=torch.long)
        return PromptLayout(torch.cat([ids[:start], video, ids[end:]]), start, video_tokens)

    def _closed_thinking(self, text: str) -> str:
        """``text`` with a thinking block it leaves open closed, empty (``<think>\\n`` becomes
        ``<think>\\n\\n</think>\\n\\n``, Qwen3's form with thinking off); unchanged for a model
        without the two tokens, or a prompt that leaves none open."""
        start, end = THINK_TAGS
        if not self._thinks or text.rfind(start) <= text.rfind(end):
            return text
        return f"{text}\n{end}\n\n"

    @functools.cached_property
    def _thinks(self) -> bool:
        """The vocabulary holds both thinking tags as tokens (a reasoning model's)."""
        unknown = (None, self.tokenizer.unk_token_id)
        return all(self.tokenizer.convert_tokens_to_ids(tag) not in unknown for tag in THINK_TAGS)

    def _template_video(self, ids: torch.Tensor, slot: int) -> tuple[int, int]:
        """The template's tokens the video span replaces: its video mark alone."""
        return slot, slot + 1

    def still_text(self) -> tuple[list[int], list[int]]:
        """No text around a still's tokens (the template's own marks stay around them)."""
        return [], []

    def patch_text(self, index: int, time_s: float) -> tuple[list[int], list[int]]:
        """No text around a video's patches (the span is the patches' tokens alone)."""
        return [], []

    def video_suffix(self) -> torch.Tensor:
        """No suffix after the last patch."""
        return self._no_tokens()

    def _no_tokens(self) -> torch.Tensor:
        """Language-model inputs of no tokens: a video part with nothing in it."""
        return self.embed_tokens(torch.empty(0, dtype=torch.long))

    @functools.cached_property
    def _special_strings(self) -> tuple[str, ...]:
        """What a client's text may not turn into tokens (`typed_text`): the special tokens, and
        the video and image marks should a checkpoint not list them as special."""
        marks = self.tokenizer.convert_ids_to_tokens([self.video_token_id, self.template_video_id, self.image_token_id])
        return tuple(sorted({*special_strings(self.tokenizer), *marks}, key=len, reverse=True))

    def text_ids(self, text: str) -> list[int]:
        return plain_ids(self.tokenizer, text)

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self._lm.embed_tokens(ids.to(self.device))

    # -- language model ------------------------------------------------------------------------
    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, L)`` positions to ``cos, sin`` of shape ``(1, L, head_dim)``."""
        raise NotImplementedError

    def rerotate_keys(self, keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor
                      ) -> torch.Tensor:
        """Keys ``(1, KVH, n, D)`` rotated at ``old_positions`` ``(3, n)``, moved to ``new_positions``.

        Rotations compose (per axis, for M-RoPE), so one rotation by the difference is enough.
        """
        return apply_rotary(keys, self.rotary(new_positions - old_positions))

    def qkv(self, layer: int, hidden: torch.Tensor, rotary):
        """Rotated queries ``(1, H, L, D)``, keys and values ``(1, KVH, L, D)`` of one layer."""
        block = self._lm.layers[layer]
        attn = block.self_attn
        x = block.input_layernorm(hidden)
        length = x.shape[1]
        q = attn.q_proj(x).view(1, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(q, rotary), apply_rotary(k, rotary), v

    def finish_layer(self, layer: int, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Output projection, residual, MLP: ``attn`` is ``(1, H, L, D)``."""
        block = self._lm.layers[layer]
        length = attn.shape[2]
        hidden = residual + block.self_attn.o_proj(attn.transpose(1, 2).reshape(1, length, -1))
        return hidden + block.mlp(block.post_attention_layernorm(hidden))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self._lm.norm(hidden)).float()


class WholeFrameAdapter(Qwen2DecoderAdapter):
    """A Qwen2 decoder with 1-D rotary positions behind a tower that encodes every frame alone at
    one square size (LLaVA-OneVision, InternVL): subclasses add `_encode_frames` and their suffix."""

    def encode_video(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int],
                     keep: torch.Tensor | None = None) -> torch.Tensor:
        """The tower, its folding and projector: ``(T, 3, h, w)`` frames to ``(T * tokens, hidden)``.

        Args:
            pixel_values: The video's normalised frames (`preprocess_video`).
            grid_thw: Frames and patch rows/columns.
            keep: ``(T, tokens rows, tokens columns)`` bool: the merge groups to encode (all if
                None), for a `VisionSpec.prunable` family. The tower then sees only their patches
                (after its absolute position embeddings are added), so with full attention every
                kept token's output changes with what was dropped: an approximation, measured in
                `docs/benchmarks.md`, not an equality.
        """
        pixels = pixel_values.to(device=self.device, dtype=self.model.model.vision_tower.dtype)
        if keep is None or bool(keep.all()):
            return self._encode_frames(pixels).to(self.dtype)
        if not self.vision.prunable:
            raise ModelError(f"{self.name}: the {self.family} encoder pools patches across groups; it cannot skip them")
        if not bool(keep.any()):
            return self._no_tokens()
        return self._encode_kept(pixels, keep.to(self.device)).to(self.dtype)

    def _encode_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """``(T, 3, h, w)`` frames in the tower's dtype to ``(T * tokens, hidden)``."""
        raise NotImplementedError

    def _encode_kept(self, pixels: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """The tokens of the ``keep`` merge groups, the tower seeing only their patches."""
        raise NotImplementedError

    def encode_videos(self, videos: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """Several videos in one call: every frame is encoded alone, so one batch of all frames is exact."""
        frames = torch.cat([p for p, _ in videos])
        tokens = [t * self._tokens_per_frame(h, w) for _, (t, h, w) in videos]
        return list(self.encode_video(frames, (len(frames), *videos[0][1][1:])).split(tokens))

    def _tokens_per_frame(self, h: int, w: int) -> int:
        rows, columns = self.vision.token_hw((h, w))
        return rows * columns

    def video_positions(self, grid_thw: tuple[int, int, int], second_per_grid_t: float, start: int) -> torch.Tensor:
        """1-D positions, one per patch token, on all three rows (a suffix follows as text does)."""
        return (torch.arange(grid_thw[0] * self._tokens_per_frame(*grid_thw[1:])) + start).expand(3, -1)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The first row of ``(3, L)`` positions to ``cos, sin`` of shape ``(1, L, head_dim)``."""
        probe = self._lm.embed_tokens.weight[:1]
        return self._lm.rotary_emb(probe, positions[0].to(self.device)[None])
