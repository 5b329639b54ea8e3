"""The KV cache as data."""

from vidsight.kv.cache import TEXT, VIDEO, KVCache, TokenTable

__all__ = ["KVCache", "TEXT", "TokenTable", "VIDEO"]
