"""An example of a new retrieval policy: one file, one `register` line (see test_registry.py).

``strided`` attends to the text, the local window and every ``stride``-th temporal patch.
"""

import dataclasses

import torch

from vidsight.errors import ConfigError
from vidsight.kv.policies.common import video_mask, window_mask
from vidsight.kv.policies.configs import flag


@dataclasses.dataclass(frozen=True)
class StridedConfig:
    stride: int = flag("--stride", 2, "attend every this many temporal patches")
    local_tokens: int = flag("--local-tokens", 40, "local window in tokens every step attends to")

    def __post_init__(self):
        if self.stride < 1:
            raise ConfigError(f"stride must be positive, got {self.stride}")


class StridedPolicy:
    name = "strided"

    def __init__(self, config: StridedConfig = StridedConfig()):
        self.config = config

    def start(self, cache):
        return self

    def report(self):
        return {}

    def select(self, layer, cache, q, step):
        video = video_mask(cache, layer)
        frames = cache.layer_tokens(layer).frame_index
        _, patch = torch.unique(frames, return_inverse=True)   # 0, 1, ... per temporal patch, text included
        chosen = ~video | window_mask(cache.filled[layer], self.config.local_tokens) | (patch % self.config.stride == 0)
        return torch.nonzero(chosen).flatten()
