"""Splitting the CPU between overlapped decoders and a model on it."""

import pytest
import torch

from vidsight.engine.cores import CoreSplit


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_cpu_model_computes_with_the_cores_decoders_leave_until_they_finish(two_threads):
    with CoreSplit(torch.device("cpu"), decoders=1) as cores:
        cores.update(decoding=True)
        assert torch.get_num_threads() == 1
        cores.update(decoding=False)
        assert torch.get_num_threads() == 2
        cores.update(decoding=True)
    assert torch.get_num_threads() == 2  # restored on the way out


def test_the_model_keeps_one_thread_however_many_decoders(two_threads):
    with CoreSplit(torch.device("cpu"), decoders=8) as cores:
        cores.update(decoding=True)
        assert torch.get_num_threads() == 1


@pytest.mark.parametrize("device,enabled", [("cuda", True), ("cpu", False)])
def test_models_off_the_cpu_or_a_disabled_split_keep_their_threads(two_threads, device, enabled):
    with CoreSplit(torch.device(device), decoders=1, enabled=enabled) as cores:
        cores.update(decoding=True)
        assert torch.get_num_threads() == 2
