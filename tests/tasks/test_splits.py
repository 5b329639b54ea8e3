"""The seed ranges: training, the trainer's checks and every suite's validation and test splits never overlap."""

import itertools
import json

import pytest

from vidsight.bench.suite import anomaly_video_scene, build_suite
from vidsight.errors import ConfigError
from vidsight.tasks.splits import SPLITS, SUITES, TRAINER_CHECKS, TRAINING, split_seed, split_seeds
from vidsight.train.loop import HELD_OUT_SEED


def _ranges() -> dict[str, range]:
    ranges = {"training": TRAINING, "trainer checks": TRAINER_CHECKS}
    ranges.update({f"{suite} {split}": split_seeds(suite, split) for suite in SUITES for split in SPLITS})
    return ranges


def test_every_range_is_disjoint_from_every_other():
    for (a, first), (b, second) in itertools.combinations(_ranges().items(), 2):
        assert first.stop <= second.start or second.stop <= first.start, (a, b)


def test_training_draws_below_the_trainers_checks():
    # The trainer's clips are seeds modulo HELD_OUT_SEED (minus a batch): inside TRAINING.
    assert HELD_OUT_SEED == TRAINER_CHECKS.start == TRAINING.stop


def test_the_validation_seeds_are_the_ones_the_suites_always_used():
    assert split_seed("families", "validation", 0) == 2_000_000_000
    assert split_seed("anomaly", "validation", 3) == 2_000_500_003
    assert split_seed("chat", "validation", 0) == 3_000_000_000


def test_a_suites_test_split_is_generated_from_its_test_seeds(tmp_path):
    validation = json.loads(build_suite("smoke", tmp_path).read_text())
    test = json.loads(build_suite("smoke", tmp_path, split="test").read_text())
    assert (validation["split"], test["split"]) == ("validation", "test")
    seeds = split_seeds("families", "test")
    assert all(clip["scene"]["seed"] in seeds for clip in test["clips"])
    assert not {c["scene"]["seed"] for c in test["clips"]} & {c["scene"]["seed"] for c in validation["clips"]}
    assert anomaly_video_scene(0, "test")[1] in split_seeds("anomaly", "test")


@pytest.mark.parametrize("suite, split, index", [("nope", "test", 0), ("chat", "train", 0), ("chat", "test", -1),
                                                 ("chat", "test", 100_000)])
def test_unknown_suites_splits_and_indices_are_refused(suite, split, index):
    with pytest.raises(ConfigError):
        split_seed(suite, split, index)
