"""The tiers' budgets: settings only, so the command line and the server read them without torch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vidsight.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TierConfig:
    """Budgets of the KV tiers, in cached tokens summed over layers.

    Attributes:
        device_tokens: The device's budget (None: unbounded, no offload).
        host_tokens: Host memory's budget (None: unbounded); pinned when the device is CUDA.
        disk_dir: Where a session's disk tier lives (None: no disk tier).
        keep_files: Leave the session's directory when it closes.
    """

    device_tokens: int | None = None
    host_tokens: int | None = None
    disk_dir: Path | None = None
    keep_files: bool = False

    def __post_init__(self):
        for name in ("device_tokens", "host_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be positive, got {value}")
        if self.disk_dir is not None and not isinstance(self.disk_dir, Path):
            object.__setattr__(self, "disk_dir", Path(self.disk_dir))
