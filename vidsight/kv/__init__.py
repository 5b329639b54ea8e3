"""The KV cache as data, and the policies that decide what it keeps."""

from vidsight._lazy import lazy_exports

_EXPORTS = {
    "TEXT": "vidsight.kv.cache",
    "VIDEO": "vidsight.kv.cache",
    "KVCache": "vidsight.kv.cache",
    "TokenTable": "vidsight.kv.cache",
    "SCORERS": "vidsight.kv.config",
    "PruneConfig": "vidsight.kv.config",
    "GroupPruner": "vidsight.kv.prune",
    "LayerHook": "vidsight.kv.prune",
    "QueryRecorder": "vidsight.kv.prune",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
