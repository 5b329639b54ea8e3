"""The KV store protocol is the whole contract: both caches satisfy it, and every caller outside the
caches uses only what `KVStore` and its `Offload` capability declare."""

import ast
from pathlib import Path

import torch

import vidsight
from vidsight.kv import KVCache
from vidsight.kv.store import KVStore, Offload
from vidsight.kv.tiers import TierConfig, TieredKVCache

PACKAGE = Path(vidsight.__file__).parent
IMPLEMENTATIONS = {"kv/cache.py", "kv/store.py"}   # and kv/tiers/, the tiered cache's own modules
CACHE_NAMES = {"cache", "old"}


def declared(protocol) -> set[str]:
    members = set(getattr(protocol, "__annotations__", {}))
    return members | {name for name, value in vars(protocol).items()
                      if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def store_uses(path: Path) -> tuple[set[str], set[str]]:
    """Attributes read off caches (``cache``, ``old``, ``x.cache``) and off their ``offload``, in a module."""
    on_store, on_offload = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id in CACHE_NAMES) or \
                (isinstance(owner, ast.Attribute) and owner.attr == "cache"):
            on_store.add(node.attr)
        elif isinstance(owner, ast.Attribute) and owner.attr == "offload":
            on_offload.add(node.attr)
    return on_store, on_offload


def test_both_caches_satisfy_the_protocol(tmp_path):
    plain = KVCache(2, 2, 4, 8, torch.float32, torch.device("cpu"))
    tiered = TieredKVCache(2, 2, 4, torch.float32, torch.device("cpu"), TierConfig(device_tokens=4, disk_dir=tmp_path))
    for cache in (plain, tiered):
        assert isinstance(cache, KVStore) and all(hasattr(cache, name) for name in declared(KVStore))
        assert cache.shape == (2, 4)
    assert plain.offload is None
    assert isinstance(tiered.offload, Offload) and all(hasattr(tiered.offload, n) for n in declared(Offload))
    tiered.close()


def test_callers_use_only_what_the_protocols_declare():
    undeclared = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in IMPLEMENTATIONS or relative.startswith("kv/tiers/"):
            continue
        on_store, on_offload = store_uses(path)
        extra = (on_store - declared(KVStore)) | {f"offload.{name}" for name in on_offload - declared(Offload)}
        if extra:
            undeclared[relative] = sorted(extra)
    assert undeclared == {}


def test_the_scan_finds_an_undeclared_member(tmp_path):
    module = tmp_path / "caller.py"
    module.write_text("def f(session):\n    return session.cache.slot_rows, session.cache.offload.blocks\n")
    assert store_uses(module) == ({"slot_rows", "offload"}, {"blocks"})
