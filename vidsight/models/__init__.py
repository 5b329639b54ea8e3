"""One adapter per VLM family, over the transformers classes and weights."""

from vidsight.models.base import PromptLayout, VisionSpec, VLMAdapter
from vidsight.models.loading import TASK_MODEL, load_model
from vidsight.models.tiny import write_tiny_model

__all__ = ["PromptLayout", "VLMAdapter", "VisionSpec", "TASK_MODEL", "load_model", "write_tiny_model"]
