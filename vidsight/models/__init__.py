"""One adapter per VLM family, over the transformers classes and weights."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.models.base": ("PromptLayout", "VisionSpec", "VLMAdapter"),
    "vidsight.models.conversation": ("Conversation", "Message", "VIDEO_PART", "check_question"),
    "vidsight.models.paths": ("TASK_MODEL",),
    "vidsight.models.loading": ("load_model",),
    "vidsight.models.tiny": ("write_tiny_model",),
})
