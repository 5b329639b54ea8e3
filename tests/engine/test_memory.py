import torch

from vidsight.engine import Asker, GenerationConfig, PrefillConfig, PruneConfig
from vidsight.ingest import FeedConfig
from vidsight.engine.memory import TensorMemoryMeter
from vidsight.ingest import SamplingConfig

MIB = 1 << 20


def test_meter_counts_live_storages_created_inside_only():
    weights = torch.ones(MIB // 4)  # 1 MiB, made before: not counted
    with TensorMemoryMeter() as meter:
        a = torch.ones(MIB // 2)     # 2 MiB
        b = a * 2                    # 4 MiB alive
        view = weights[:10]          # a view of an outside storage costs nothing
        del a
        c = b + weights.repeat(2)    # b, the temporary repeat and c: 6 MiB at most
        del b
    assert meter.peak_bytes == 6 * MIB
    assert meter.live_bytes == c.untyped_storage().nbytes()
    del c, view


def test_grouped_pruned_prefill_needs_less_memory(tiny_adapter, make_test_video):
    path, _ = make_test_video(width=320, height=240, duration_s=8.0, fps=10, gop=10, seed=9)
    asker = Asker(tiny_adapter, meter_memory=True)
    args = (path, "What?")
    configs = dict(sampling=SamplingConfig(fps=4.0), generation=GenerationConfig(max_new_tokens=1))
    full = asker.ask(*args, **configs, prefill=PrefillConfig(group_frames=0), feed=FeedConfig(workers=0, overlap=False)).stats
    grouped = asker.ask(*args, **configs, prefill=PrefillConfig(group_frames=4, prune=PruneConfig(rho=0.5))).stats
    assert full.prefill_peak_bytes > 2 * grouped.prefill_peak_bytes > 0
