"""The workloads as long-lived objects, the prefill and decode loops, stage timers."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.engine.ask": ("AskResult", "Asker", "ask"),
    "vidsight.engine.chat": ("ChatConfig", "ChatSession"),
    "vidsight.engine.chat_turn": ("ChatAnswer",),
    "vidsight.engine.config": ("DEFAULT_MODEL", "AnswerFormat", "GenerationConfig"),
    "vidsight.engine.generate": ("generate_together",),
    "vidsight.engine.prefill.config": ("PrefillConfig",),
    "vidsight.engine.score": ("ContinuationScore", "ScoreResult"),
    "vidsight.engine.stats": ("AskStats", "WindowStats"),
    "vidsight.engine.watch": ("WatchConfig", "Watcher", "WindowVerdict"),
    "vidsight.kv.config": ("PruneConfig",),
})
