"""Retrieval policies: which cached tokens each layer of a step attends to.

``full`` attends to everything (the exact reference); ``recent`` is a local window with sinks,
``rekv`` ReKV's frame retrieval, ``mosaic`` Mosaic's cluster memory, ``resv`` V-Rex's ReSV. The
registry (torch-free) names them; `make_policy` builds one from a label and settings.
"""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.kv.policies.base": ("STEP_KINDS", "KVPolicy", "Selection", "Step"),
    "vidsight.kv.policies.configs": ("MosaicConfig", "ReKVConfig", "ReSVConfig", "RecentConfig"),
    "vidsight.kv.policies.registry": ("POLICIES", "PolicySpec", "make_policy", "policy_config", "policy_flags",
                                      "register"),
    "vidsight.kv.policies.full": ("FullPolicy",),
    "vidsight.kv.policies.recent": ("RecentPolicy",),
    "vidsight.kv.policies.rekv": ("ReKVPolicy",),
    "vidsight.kv.policies.mosaic": ("MosaicPolicy",),
    "vidsight.kv.policies.resv": ("ReSVPolicy",),
})
