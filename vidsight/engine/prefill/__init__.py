"""Group-wise prefill of a video prompt (QuickPrefill): its settings and the loop that applies them;
and a prompt of text alone."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.engine.prefill.config": ("PrefillConfig",),
    "vidsight.engine.prefill.groups": ("Prefilled", "VideoPrefix", "chunk_bounds", "prefill_prefix_steps", "prefill_question", "prefill_video",
                                          "prefill_video_steps"),
    "vidsight.engine.prefill.text": ("prefill_text",),
})
