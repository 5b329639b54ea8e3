"""What one request carries through the engine beside its inputs."""

from __future__ import annotations

import dataclasses

from vidsight.engine.cores import CoreSplit
from vidsight.engine.stats import StageClock


@dataclasses.dataclass
class Request:
    """One request's clock, progress display and share of the CPU.

    Attributes:
        clock: Its stage timers and the stats they fill.
        progress: Whether to show progress bars.
        cores: The model's share of the cores while decoders run (None: left alone).
    """

    clock: StageClock
    progress: bool = False
    cores: CoreSplit | None = None
