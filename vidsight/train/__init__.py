"""Training vidsight's small task model on generated videos with known answers."""

from vidsight.train.loop import train
from vidsight.train.recipe import TrainConfig

__all__ = ["TrainConfig", "train"]
