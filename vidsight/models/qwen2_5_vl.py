"""Qwen2.5-VL over the transformers classes and weights."""

from __future__ import annotations

import torch

from vidsight.errors import ModelError
from vidsight.models.base import PromptLayout, VisionSpec, VLMAdapter
from vidsight.models.positions import video_grid_positions


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotate ``(1, heads, L, D)`` by ``cos, sin`` of shape ``(1, L, D)``."""
    cos, sin = (r.unsqueeze(1) for r in rotary)
    return x * cos + rotate_half(x) * sin


class Qwen25VLAdapter(VLMAdapter):
    """Engine primitives for a loaded ``Qwen2_5_VLForConditionalGeneration``.

    Args:
        name: The id or directory the model came from.
        model: The transformers model, in eval mode.
        tokenizer: Its tokenizer.
        chat_template: Jinja chat template (the checkpoint's).
        vision: Frame preprocessing settings.
        eos_token_ids: Tokens that end generation.
    """

    family = "qwen2_5_vl"

    def __init__(self, name, model, tokenizer, chat_template: str, vision: VisionSpec, eos_token_ids):
        self.name = name
        self.model = model
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.vision = vision
        self.eos_token_ids = frozenset(eos_token_ids)
        text = model.config.text_config
        self.num_layers = text.num_hidden_layers
        self.num_heads = text.num_attention_heads
        self.num_kv_heads = text.num_key_value_heads
        self.head_dim = text.hidden_size // text.num_attention_heads
        self.video_token_id = model.config.video_token_id
        self._lm = model.model.language_model
        self._visual = model.model.visual

    @property
    def dtype(self) -> torch.dtype:
        return self._lm.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self._lm.embed_tokens.weight.device

    # -- text ----------------------------------------------------------------------------------
    def build_prompt(self, question: str, video_tokens: int) -> PromptLayout:
        """The chat-formatted prompt: one user turn holding the video, then the question."""
        messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": question}]}]
        text = self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, add_generation_prompt=True, tokenize=False
        )
        ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        slots = torch.nonzero(ids == self.video_token_id).flatten()
        if len(slots) != 1:
            raise ModelError(f"{self.name}: chat template yields {len(slots)} video placeholders, expected 1")
        start = int(slots[0])
        video = torch.full((video_tokens,), self.video_token_id, dtype=torch.long)
        return PromptLayout(torch.cat([ids[:start], video, ids[start + 1 :]]), start, video_tokens)

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self._lm.embed_tokens(ids.to(self.device))

    # -- vision --------------------------------------------------------------------------------
    def encode_video(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int],
                     keep: torch.Tensor | None = None) -> torch.Tensor:
        """Vision encoder + merger: ``(patches, dim)`` to ``(tokens, hidden)``.

        Args:
            pixel_values: The video's patches (`preprocess_video`).
            grid_thw: Temporal patches and patch rows/columns.
            keep: ``(T, H/m, W/m)`` bool: the merge groups to encode (all if None). The encoder then
                runs on those patches only, each window and frame attending within its kept part,
                and the result holds the kept groups' tokens in (t, h, w) order.
        """
        grid = torch.tensor([grid_thw], dtype=torch.long, device=self.device)
        pixels = pixel_values.to(device=self.device, dtype=self._visual.dtype)
        if keep is None or bool(keep.all()):
            return self._visual(pixels, grid_thw=grid).pooler_output.to(self.dtype)
        if not bool(keep.any()):
            return torch.empty((0, self.model.config.text_config.hidden_size), dtype=self.dtype, device=self.device)
        subset = self._kept_patches(grid, keep.to(self.device).reshape(-1))
        unit = self.vision.merge_size ** 2
        pixels = pixels.view(-1, unit, pixels.shape[-1])[subset.pop("units")].reshape(-1, pixels.shape[-1])
        return self._visual(pixels, grid_thw=grid, **subset).pooler_output.to(self.dtype)

    def encode_videos(self, videos: list[tuple[torch.Tensor, tuple[int, int, int]]]) -> list[torch.Tensor]:
        """Several videos through the encoder in one call (each attends within itself, as alone).

        Args:
            videos: ``(pixel_values, grid_thw)`` of each, as `encode_video` takes them.

        Returns:
            Each video's ``(tokens, hidden)``, in order.
        """
        grid = torch.tensor([g for _, g in videos], dtype=torch.long, device=self.device)
        pixels = torch.cat([p for p, _ in videos]).to(device=self.device, dtype=self._visual.dtype)
        tokens = [t * h * w // self.vision.merge_size ** 2 for _, (t, h, w) in videos]
        return list(self._visual(pixels, grid_thw=grid).pooler_output.to(self.dtype).split(tokens))

    def _kept_patches(self, grid: torch.Tensor, keep: torch.Tensor) -> dict:
        """Positions and attention boundaries of the encoder restricted to the kept merge groups."""
        from transformers.vision_utils import get_vision_position_ids, get_vision_window_index

        visual, unit = self._visual, self.vision.merge_size ** 2
        units = torch.nonzero(keep).flatten()
        local = torch.full_like(keep, -1, dtype=torch.long)
        local[units] = torch.arange(len(units), device=keep.device)
        positions = get_vision_position_ids(grid, visual.spatial_merge_size)
        positions = positions.view(-1, unit, positions.shape[-1])[units].reshape(-1, positions.shape[-1])
        window_index, cu_windows = get_vision_window_index(grid, visual.spatial_merge_size, visual.window_size,
                                                           visual.patch_size)
        window_index, cu_windows = window_index.to(keep.device), cu_windows.to(keep.device)
        window_of = torch.searchsorted(cu_windows[1:], torch.arange(len(window_index), device=keep.device) * unit,
                                       right=True)
        kept_in_order = keep[window_index]
        per_window = torch.bincount(window_of[kept_in_order], minlength=len(cu_windows) - 1) * unit
        per_frame = keep.view(int(grid[0, 0]), -1).sum(dim=1) * unit

        def boundaries(lengths: torch.Tensor) -> torch.Tensor:
            cumulative = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
            return torch.unique_consecutive(cumulative)

        return {"units": units, "position_ids": positions, "cu_seqlens": boundaries(per_frame),
                "window_index": local[window_index[kept_in_order]], "cu_window_seqlens": boundaries(per_window)}

    def video_positions(self, grid_thw: tuple[int, int, int], second_per_grid_t: float, start: int) -> torch.Tensor:
        return video_grid_positions(
            grid_thw, self.vision.merge_size, second_per_grid_t, self.vision.tokens_per_second, start
        )

    # -- language model ------------------------------------------------------------------------
    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(3, L)`` M-RoPE positions to ``cos, sin`` of shape ``(1, L, head_dim)``."""
        probe = self._lm.embed_tokens.weight[:1]
        return self._lm.rotary_emb(probe, positions.to(self.device)[:, None, :])

    def rerotate_keys(self, keys: torch.Tensor, old_positions: torch.Tensor, new_positions: torch.Tensor
                      ) -> torch.Tensor:
        """Keys ``(1, KVH, n, D)`` rotated at ``old_positions`` ``(3, n)``, moved to ``new_positions``.

        Rotations compose, so one rotation by the difference (per M-RoPE axis) is enough.
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
