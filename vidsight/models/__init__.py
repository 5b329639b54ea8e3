"""One adapter per VLM family, over the transformers classes and weights."""

from vidsight.models.base import PromptLayout, VisionSpec, VLMAdapter
from vidsight.models.loading import load_model
from vidsight.models.tiny import write_tiny_model

__all__ = ["PromptLayout", "VLMAdapter", "VisionSpec", "load_model", "write_tiny_model"]
