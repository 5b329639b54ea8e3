"""Where every generated video's seed comes from: training, and per suite a validation and a test split.

A figure chosen on a data set is not reported on it. Training draws its clips from `TRAINING`;
the trainer scores checkpoints on `TRAINER_CHECKS`. Each suite `bench` generates has a
``validation`` split, where models, thresholds and defaults are chosen (every suite vidsight had
before the splits: its figures in the docs are validation figures unless they say test), and a
``test`` split of fresh seeds, only reported. The ranges are disjoint (tested).
"""

from __future__ import annotations

from vidsight.errors import ConfigError

SPLITS = ("validation", "test")
TRAINING = range(0, 1_000_000_000)
TRAINER_CHECKS = range(1_000_000_000, 1_000_000_000 + 100_000)
SPLIT_SIZE = 100_000
# suite -> split -> first seed. The validation seeds are the ones the suites always used.
_FIRST_SEED = {
    "families": {"validation": 2_000_000_000, "test": 2_100_000_000},
    "anomaly": {"validation": 2_000_500_000, "test": 2_100_500_000},
    "watch-hard": {"validation": 2_000_700_000, "test": 2_100_700_000},
    "chat": {"validation": 3_000_000_000, "test": 3_100_000_000},
}
SUITES = tuple(_FIRST_SEED)


def split_seeds(suite: str, split: str) -> range:
    """The seeds of ``split`` of ``suite``."""
    if suite not in _FIRST_SEED:
        raise ConfigError(f"unknown suite {suite!r} (known: {', '.join(SUITES)})")
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}: validation (for choosing) or test (for reporting)")
    first = _FIRST_SEED[suite][split]
    return range(first, first + SPLIT_SIZE)


def split_seed(suite: str, split: str, index: int) -> int:
    """The ``index``-th seed of ``split`` of ``suite``."""
    seeds = split_seeds(suite, split)
    if not 0 <= index < len(seeds):
        raise ConfigError(f"{suite} {split}: index {index} outside 0..{len(seeds) - 1}")
    return seeds[index]
