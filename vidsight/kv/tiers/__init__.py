"""Tiered KV memory: a stream's KV in blocks on the device, in host memory and on disk.

`TieredKVCache` (cache.py) keeps the `KVStore` interface and decides where blocks go
(placement); `BlockTable` (blocks.py) is the bookkeeping, layout.py regroups blocks below the
device by a policy's clusters, and backends.py holds the tiers below the device behind one small
interface (`HostTier`, `DiskTier`), so another tier is one more class there.
"""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.kv.tiers.config": ("TierConfig",),
    "vidsight.kv.tiers.cache": ("TieredKVCache",),
})
