"""Training vidsight's small task model on generated videos with known answers."""

from vidsight._lazy import lazy_exports

_EXPORTS = {
    "export_checkpoint": "vidsight.train.loop",
    "train": "vidsight.train.loop",
    "TrainConfig": "vidsight.train.config",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
