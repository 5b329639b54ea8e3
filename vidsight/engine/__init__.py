"""The workloads as long-lived objects, the prefill and decode loops, stage timers."""

from vidsight._lazy import lazy_exports

_EXPORTS = {
    "AskResult": "vidsight.engine.ask",
    "Asker": "vidsight.engine.ask",
    "ask": "vidsight.engine.ask",
    "DEFAULT_MODEL": "vidsight.engine.config",
    "FeedConfig": "vidsight.engine.config",
    "GenerationConfig": "vidsight.engine.config",
    "PrefillConfig": "vidsight.engine.config",
    "AskStats": "vidsight.engine.stats",
    "PruneConfig": "vidsight.kv.config",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
