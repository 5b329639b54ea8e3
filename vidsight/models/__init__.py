"""One adapter per VLM family, over the transformers classes and weights."""

from vidsight._lazy import lazy_exports

_EXPORTS = {
    "PromptLayout": "vidsight.models.base",
    "VisionSpec": "vidsight.models.base",
    "VLMAdapter": "vidsight.models.base",
    "TASK_MODEL": "vidsight.models.paths",
    "load_model": "vidsight.models.loading",
    "write_tiny_model": "vidsight.models.tiny",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
