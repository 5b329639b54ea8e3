"""The KV cache as data (`KVStore`: one device buffer, or tiers), and the policies that decide what it keeps."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.kv.cache": ("TEXT", "VIDEO", "KVCache", "TokenTable"),
    "vidsight.kv.config": ("SCORERS", "PruneConfig"),
    "vidsight.kv.prune": ("GroupPruner", "LayerHook", "QueryRecorder"),
    "vidsight.kv.store": ("KVStore", "KVTraffic", "Offload"),
    "vidsight.kv.policies": ("KVPolicy", "Step", "make_policy"),
})
