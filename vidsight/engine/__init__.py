"""The workloads as long-lived objects, the prefill and decode loops, stage timers."""

from vidsight.engine.ask import DEFAULT_MODEL, AskResult, Asker, FeedConfig, ask
from vidsight.engine.forward import PrefillConfig
from vidsight.engine.generate import GenerationConfig
from vidsight.engine.stats import AskStats
from vidsight.kv import PruneConfig

__all__ = ["AskResult", "AskStats", "Asker", "DEFAULT_MODEL", "FeedConfig", "GenerationConfig", "PrefillConfig",
           "PruneConfig", "ask"]
