"""The workloads as long-lived objects, the prefill and decode loops, stage timers."""

from vidsight.engine.ask import DEFAULT_MODEL, AskResult, Asker, ask
from vidsight.engine.forward import PrefillConfig
from vidsight.engine.generate import GenerationConfig
from vidsight.engine.stats import AskStats

__all__ = ["AskResult", "AskStats", "Asker", "DEFAULT_MODEL", "GenerationConfig", "PrefillConfig", "ask"]
