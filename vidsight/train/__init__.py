"""Training vidsight's small task model on generated videos with known answers."""

from vidsight.train.loop import export_checkpoint, train
from vidsight.train.recipe import TrainConfig

__all__ = ["TrainConfig", "export_checkpoint", "train"]
