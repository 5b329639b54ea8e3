"""The KV cache as data, and the policies that decide what it keeps."""

from vidsight.kv.cache import TEXT, VIDEO, KVCache, TokenTable
from vidsight.kv.prune import SCORERS, GroupPruner, LayerHook, PruneConfig, QueryRecorder

__all__ = ["GroupPruner", "KVCache", "LayerHook", "PruneConfig", "QueryRecorder", "SCORERS", "TEXT", "TokenTable",
           "VIDEO"]
