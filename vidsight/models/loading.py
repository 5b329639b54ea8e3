"""Loading a VLM from a Hugging Face id or a local directory, through one path for every checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError

from vidsight.errors import ConfigError, ModelError
from vidsight.models.internvl import InternVLAdapter
from vidsight.models.llava_onevision import LlavaOnevisionAdapter
from vidsight.models.packed_linear import pack_linear_weights
from vidsight.models.qwen2_5_vl import (CLIP_MEAN, CLIP_STD, VIDEO_MAX_PIXELS, VIDEO_MIN_PIXELS,  # noqa: F401
                                        VIDEO_TOTAL_PIXELS, Qwen25VLAdapter)
from vidsight.models.qwen3_vl import Qwen3VLAdapter

log = logging.getLogger(__name__)

# Each family's adapter, by the ``model_type`` of a checkpoint's config.json.
ADAPTERS = {"qwen2_5_vl": Qwen25VLAdapter, "qwen3_vl": Qwen3VLAdapter, "llava_onevision": LlavaOnevisionAdapter,
            "internvl": InternVLAdapter}


def _looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or Path(name).exists() or name.count("/") > 1


def _find_file(source: str, filename: str) -> Path | None:
    """``filename`` from a checkpoint directory or the hub cache, or None if it has none."""
    from transformers.utils import cached_file

    try:
        found = cached_file(source, filename, _raise_exceptions_for_missing_entries=False)
    except OSError:
        return None
    return Path(found) if found else None


def _read_json(source: str, filename: str) -> dict:
    found = _find_file(source, filename)
    return json.loads(found.read_text()) if found else {}


def _chat_template(source: str, tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if template:
        return template
    found = _find_file(source, "chat_template.jinja")
    if found:
        return found.read_text()
    template = _read_json(source, "chat_template.json").get("chat_template")
    if template:
        return template
    raise ModelError(f"{source}: no chat template (chat_template.jinja, chat_template.json or tokenizer_config)")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The requested device, or CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(f"device {device!r} is not a device name (try cpu, cuda or cuda:0)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} requested but no CUDA device is available")
    return device


# `shape:qwen2.5-vl-7b`: a random-weight model of a published shape (`models.shapes`), for timing
# the real architecture where no weights can be downloaded (the server and every bench take it).
SHAPE_PREFIX = "shape:"


def load_model(name: str | Path, device: str | torch.device | None = None, dtype: torch.dtype | None = None,
               packed_weights: bool = False, chat_template: str | None = None, max_model_len: int | None = None):
    """Load a supported VLM and wrap it in its family's adapter.

    Args:
        name: A Hugging Face model id, a local checkpoint directory, or ``shape:NAME`` for a
            random-weight model of a benchmark shape.
        device: Where to run; CUDA when available, else CPU.
        dtype: Weight dtype; bfloat16 on CUDA, float32 on CPU by default.
        packed_weights: On a CPU in float32, reorder the linear weights into oneDNN's blocked
            layout (`packed_linear`: for decode steps of several answers, as a server runs them);
            elsewhere nothing changes.
        chat_template: A Jinja chat template to use instead of the checkpoint's (vLLM's
            ``--chat-template``: one that lists tools, say); it must place the family's video mark.
        max_model_len: Tokens of prompt and answer to allow, below the checkpoint's
            ``max_position_embeddings`` (vLLM's ``--max-model-len``): where an answer without a
            length limit ends (`VLMAdapter.context_window`).

    Raises:
        ModelError: the directory is missing or not a checkpoint, the id cannot be fetched, or the
            model family is not supported.
        ConfigError: ``chat_template`` does not render a question about a video, or
            ``max_model_len`` is not a positive number within the checkpoint's context window.
    """
    adapter = _load(name, device, dtype)
    if max_model_len is not None:
        if not isinstance(max_model_len, int) or not 1 <= max_model_len <= adapter.context_window:
            raise ConfigError(f"--max-model-len must be between 1 and {name}'s context window of "
                              f"{adapter.context_window} tokens (its max_position_embeddings), got {max_model_len}")
        adapter.context_window = max_model_len
    if chat_template is not None:
        adapter.chat_template = chat_template
        try:
            adapter.build_prompt("What happens?", 1)
        except (ConfigError, ModelError) as exc:
            raise ConfigError(f"--chat-template: it does not render a question about a video ({exc})") from None
    if packed_weights:
        pack_linear_weights(adapter.model)
    return adapter


def _load(name: str | Path, device: str | torch.device | None, dtype: torch.dtype | None):
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer, GenerationConfig

    source = str(name)
    if source.startswith(SHAPE_PREFIX):
        from vidsight.models.shapes import build_shape

        device = resolve_device(device)
        return build_shape(source[len(SHAPE_PREFIX):], device,
                           dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32))
    if _looks_like_path(source):
        path = Path(source).expanduser()
        if not path.is_dir():
            raise ModelError(f"{name}: no such model directory")
        if not (path / "config.json").is_file():
            raise ModelError(f"{name}: not a model directory (no config.json)")
        source = str(path)
    try:
        config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError, KeyError) as exc:
        hint = "" if Path(source).is_dir() else "; without network access, pass a local checkpoint directory"
        raise ModelError(f"{name}: cannot load model config ({str(exc).splitlines()[0]}){hint}") from exc
    adapter_cls = ADAPTERS.get(config.model_type)
    if adapter_cls is None:
        raise ModelError(f"{name}: model type '{config.model_type}' is not supported (supported: {', '.join(ADAPTERS)})")
    device = resolve_device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForImageTextToText.from_pretrained(source, dtype=dtype, attn_implementation="sdpa")
    except (OSError, ValueError, SafetensorError) as exc:  # missing, truncated or corrupt files
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ModelError(f"{name}: cannot load weights or tokenizer ({first_line})") from exc
    model.to(device).eval()
    eos = set()
    try:
        generation = GenerationConfig.from_pretrained(source)
        eos.update(_as_ids(generation.eos_token_id))
    except OSError:
        log.debug("%s: no generation_config.json", name)
    eos.update(_as_ids(config.text_config.eos_token_id))
    eos.update(_as_ids(tokenizer.eos_token_id))
    image_processor = _read_json(source, "preprocessor_config.json")
    vision = adapter_cls.vision_spec(config, image_processor, _read_json(source, "video_preprocessor_config.json"))
    adapter = adapter_cls(str(name), model, tokenizer, _chat_template(source, tokenizer), vision, eos)
    adapter.still_vision = adapter_cls.still_spec(vision, image_processor)
    return adapter


def _as_ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
