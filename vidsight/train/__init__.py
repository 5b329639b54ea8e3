"""Training vidsight's small task model on generated videos with known answers."""

from vidsight._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "vidsight.train.loop": ("export_checkpoint", "train"),
    "vidsight.train.config": ("TrainConfig",),
})
