"""The writer keeps each frame's size (a 640-wide frame once came out 640x480 whatever its height)."""

import numpy as np
import pytest

from vidsight.ingest import probe
from vidsight.ingest.writer import write_video


@pytest.mark.parametrize("height, width", [(360, 640), (240, 320), (480, 640)])
def test_written_size_is_the_frames_size(tmp_path, height, width):
    frames = [np.full((height, width, 3), 40 * k, dtype=np.uint8) for k in range(3)]
    info = probe(write_video(tmp_path / "clip.mp4", frames, [0.0, 0.04, 0.08], 25))
    assert (info.height, info.width) == (height, width)
