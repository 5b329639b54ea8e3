"""The watch workload: decode once, sliding windows, verdicts, and KV reuse against Full-Comp."""

import threading
import time

import pytest
import torch

from vidsight.engine.steps import drive, encode_together
from vidsight.engine.watch import WatchConfig, Watcher
from vidsight.ingest.stream import StreamSource
from vidsight.ingest.windows import WindowConfig, sliding_windows

from tests.settings import (assert_input_matters, assert_logits_close, assert_same_answer, exact_answers,
                            logits_error)

QUERY = "Is there a red object in the zone? Answer Yes or No."
WINDOWS = WindowConfig(window_s=4.0, stride_fraction=0.25, fps=2.0)  # 8 frames, stride 2


@pytest.fixture(scope="module")
def stream_video(make_test_video):
    return make_test_video(width=224, height=168, duration_s=9.0, fps=8, gop=24, bframes=False, seed=3)[0]


def test_each_frame_is_decoded_once_however_many_windows_hold_it(stream_video):
    source = StreamSource(stream_video, fps=WINDOWS.fps)
    windows = list(sliding_windows(iter(source), WINDOWS))
    assert len(windows) == 6  # 18 samples, windows of 8 every 2
    assert source.frames_decoded == 72  # 9 s at 8 fps, each once
    held = sum(len(w) for w in windows)
    assert held > 18
    assert [w[0].index for w in windows] == [0, 2, 4, 6, 8, 10]
    assert all(w[k].index == w[0].index + k for w in windows for k in range(len(w)))


def test_sampled_frames_carry_the_motion_of_every_frame_since_the_last_sample(stream_video):
    from vidsight.vision.motion import MotionPruneConfig

    samples = list(StreamSource(stream_video, fps=2.0, motion=MotionPruneConfig()))
    moving = [s for s in samples[1:] if s.codec.frame_type != "I"]
    assert all(s.codec.motion is not None for s in samples)
    assert sum(float(s.codec.motion.max()) > 0 for s in moving) >= len(moving) * 0.8
    assert [round(s.pts_s * 2) for s in samples] == list(range(len(samples)))


@pytest.mark.device_check
def test_refreshing_every_token_equals_full_comp(family_adapter, stream_video):
    full = list(Watcher(family_adapter, QUERY, WatchConfig(WINDOWS)).watch(StreamSource(stream_video, 2.0)))
    every = list(Watcher(family_adapter, QUERY, WatchConfig(WINDOWS, refresh="all")).watch(StreamSource(stream_video,
                                                                                                        2.0)))
    assert all(v.reused_tokens > 0 for v in every[1:]) and every[0].reused_tokens == 0
    for a, b in zip(every, full, strict=True):
        assert_same_answer([a.answer], a.logits, [b.answer], b.logits)
        if exact_answers():
            assert a.p_yes == pytest.approx(b.p_yes, abs=1e-5)
    error = max(logits_error(a.logits, b.logits) for a, b in zip(every, full))
    # A window sharing none of its frames could fail the comparison (in bfloat16, the tiny models'
    # logits for windows sharing six of eight frames differ by about the tolerance).
    apart = round(1 / WINDOWS.stride_fraction)
    assert len(full) > apart
    for window, other in zip(full, full[apart:]):
        assert_input_matters(window.logits, other.logits, error)


@pytest.mark.parametrize("mode", ["anchors", "reuse", "deviation"])
def test_partial_refresh_reuses_most_tokens(family_adapter, stream_video, mode):
    verdicts = list(Watcher(family_adapter, QUERY, WatchConfig(WINDOWS, refresh=mode)).watch(
        StreamSource(stream_video, 2.0)))
    later = verdicts[1:]
    assert all(v.reused_tokens == v.visual_tokens * 6 // 8 for v in later)
    if mode == "reuse":
        assert all(v.refreshed_tokens == 0 for v in later)
    else:
        assert all(0 < v.refreshed_tokens < v.reused_tokens for v in later)
    assert all(0 <= v.p_yes <= 1 for v in verdicts)


def test_two_consecutive_yes_windows_raise_one_alert(tiny_adapter, stream_video):
    watcher = Watcher(tiny_adapter, QUERY, WatchConfig(WINDOWS))
    answers = iter([False, True, True, True, False, True])

    def judged(steps):
        verdict = drive(steps, tiny_adapter)
        verdict.yes = next(answers)
        return verdict

    alerts = [v.alert for v in watcher.watch(StreamSource(stream_video, 2.0), run=judged)]
    assert alerts == [False, False, True, False, False, False]


@pytest.mark.parametrize("bad", [dict(refresh="sometimes"), dict(alert_after=0),
                                 dict(refresh="deviation", deviation_ratio=0), dict(refresh="anchors", deviation_ratio=0.3)])
def test_watch_config_rejects_bad_values(bad):
    from vidsight.errors import ConfigError

    with pytest.raises(ConfigError):
        WatchConfig(**bad)


def test_the_refresh_share_sets_how_many_reused_tokens_deviation_recomputes(tiny_adapter, stream_video):
    def refreshed(share):
        config = WatchConfig(WINDOWS, refresh="deviation", deviation_ratio=share)
        return [(v.refreshed_tokens, v.reused_tokens) for v in Watcher(tiny_adapter, QUERY, config).watch(
            StreamSource(stream_video, 2.0))][1:]

    default = refreshed(None)   # CacheBlend's 15 %
    assert default and all(count == max(1, round(0.15 * reused)) for count, reused in default)
    assert all(count == max(1, round(0.5 * reused)) for count, reused in refreshed(0.5))


def test_motion_pruning_drops_static_patches_and_keeps_the_moving_square(tiny_adapter, make_test_video):
    import math

    from vidsight.engine.prompt import plan_video
    from vidsight.vision.motion import MotionPruneConfig

    path, truth = make_test_video(width=320, height=240, duration_s=8.0, fps=10, gop=40, bframes=False, seed=8,
                                  square_size=40)
    config = WatchConfig(WindowConfig(window_s=4.0, stride_fraction=0.5, fps=2.0), prune=MotionPruneConfig(tau=0.25))
    watcher = Watcher(tiny_adapter, QUERY, config)
    frames = list(config.open(path))
    windows = list(sliding_windows(iter(frames), config.windows))
    pruned_share = []
    for window in windows:
        verdict = watcher.judge(window)
        pruned_share.append(1 - verdict.kept_tokens / verdict.visual_tokens)
        plan = plan_video(tiny_adapter, len(window), 240, 320)
        keep = watcher._keep(window, plan.grid_thw)
        (height, width), (rows_h, cols_w) = plan.size, keep.shape[1:]
        sy, sx = height / 240, width / 320
        for k, frame in enumerate(window):
            x, y = truth["square_xy"][frame.frame_index]
            size = truth["square_size"]
            rows = range(int(y * sy) // 28, min(rows_h, math.ceil((y + size) * sy / 28)))
            cols = range(int(x * sx) // 28, min(cols_w, math.ceil((x + size) * sx / 28)))
            assert all(keep[k // 2, r, c] for r in rows for c in cols), (frame.index, rows, cols)
    # Windows after the first hold no GOP start: only the square's trail is encoded.
    assert min(pruned_share[1:]) >= 0.5, pruned_share


@pytest.mark.device_check
def test_pruning_with_every_token_refreshed_equals_pruned_full_comp(tiny_adapter, stream_video):
    from vidsight.vision.motion import MotionPruneConfig

    prune = MotionPruneConfig()
    full = list(Watcher(tiny_adapter, QUERY, WatchConfig(WINDOWS, prune=prune)).watch(
        StreamSource(stream_video, 2.0, motion=prune)))
    every = list(Watcher(tiny_adapter, QUERY, WatchConfig(WINDOWS, refresh="all", prune=prune)).watch(
        StreamSource(stream_video, 2.0, motion=prune)))
    assert any(v.kept_tokens < v.visual_tokens for v in full)
    assert any(v.reused_tokens > 0 for v in every)
    for a, b in zip(every, full):
        assert a.kept_tokens == b.kept_tokens
        assert_logits_close(a.logits, b.logits)


def test_a_source_that_disagrees_with_the_watch_is_refused(tiny_adapter, stream_video):
    from vidsight.errors import ConfigError
    from vidsight.vision.motion import MotionPruneConfig

    config = WatchConfig(WINDOWS, prune=MotionPruneConfig(tau=0.25))
    watcher = Watcher(tiny_adapter, QUERY, config)
    with pytest.raises(ConfigError, match="motion vectors"):
        watcher.watch(StreamSource(stream_video, fps=WINDOWS.fps))
    with pytest.raises(ConfigError, match="motion vectors"):  # judged by another rule
        watcher.watch(StreamSource(stream_video, fps=WINDOWS.fps, motion=MotionPruneConfig(tau=4.0)))
    with pytest.raises(ConfigError, match="fps"):
        watcher.watch(StreamSource(stream_video, fps=WINDOWS.fps / 2, motion=config.prune))
    source = config.open(stream_video)
    assert source.motion == config.prune and source.fps == WINDOWS.fps
    assert WatchConfig(WINDOWS).open(stream_video).motion is None


# With KV reuse a window's cache descends from every earlier window's; a resumed watch rebuilds
# it from the window before the first one judged, so its logits differ by that chain's drift.
@pytest.mark.parametrize("refresh,tau,tolerance", [("full-comp", None, 1e-5), ("anchors", 0.25, 1e-3)])
def test_a_resumed_watch_gives_the_verdicts_of_an_uninterrupted_one(tiny_adapter, stream_video, refresh, tau,
                                                                     tolerance):
    from vidsight.vision.motion import MotionPruneConfig

    config = WatchConfig(WINDOWS, refresh=refresh, alert_after=1,
                         prune=MotionPruneConfig(tau=tau) if tau is not None else None)
    whole = list(Watcher(tiny_adapter, QUERY, config).watch(config.open(stream_video)))
    judged = []
    tail = list(Watcher(tiny_adapter, QUERY, config).watch(config.open(stream_video), first_window=3, streak=0,
                                                           run=lambda steps: judged.append(1) or drive(steps, tiny_adapter)))
    assert [v.window for v in tail] == [3, 4, 5] and len(judged) == 3
    for a, b in zip(whole[3:], tail, strict=True):
        assert (a.answer, a.kept_tokens, a.reused_tokens, a.refreshed_tokens) == \
               (b.answer, b.kept_tokens, b.reused_tokens, b.refreshed_tokens)
        assert torch.allclose(a.logits, b.logits, atol=tolerance)


@pytest.mark.parametrize("refresh", ["full-comp", "anchors"])
def test_windows_of_several_watches_run_together_beside_an_answer_equal_each_judged_alone(
        tiny_adapter, stream_video, make_test_video, refresh):
    """Two watches' windows encoded in one vision call, then their new tokens in one language-model
    pass with a running answer's decode step (as the server's scheduler runs them): every verdict
    and the answer are what each gives alone."""
    from vidsight.engine import Asker, GenerationConfig
    from vidsight.engine.generate import DecodeBatch

    other = make_test_video(width=160, height=120, duration_s=9.0, fps=8, gop=24, bframes=True, seed=6)[0]
    config = WatchConfig(WINDOWS, refresh=refresh)
    alone = [list(Watcher(tiny_adapter, QUERY, config).watch(config.open(v))) for v in (stream_video, other)]
    generation = GenerationConfig(max_new_tokens=12)
    answer_alone = Asker(tiny_adapter).ask(other, QUERY, generation=generation)
    answer = Asker(tiny_adapter).begin(other, QUERY, generation=generation)
    batch = DecodeBatch(tiny_adapter)
    batch.add(answer.answer)
    watchers = [Watcher(tiny_adapter, QUERY, config) for _ in range(2)]
    windows = [list(sliding_windows(iter(config.open(v)), WINDOWS)) for v in (stream_video, other)]
    together = [[], []]
    for number in range(min(len(w) for w in windows)):
        steps = [w.judging(windows[k][number], number) for k, w in enumerate(watchers)]
        embeds = encode_together(tiny_adapter, [next(s) for s in steps])   # one vision call for both
        chunks = [s.send(e) for s, e in zip(steps, embeds)]                # each window's new tokens
        hidden = batch.step_beside(chunks)                                 # one pass, the answer's token too
        for k, (s, h) in enumerate(zip(steps, hidden)):
            with pytest.raises(StopIteration) as done:
                s.send(h)
            together[k].append(done.value.value)
    for mine, theirs in zip(together, alone):
        for a, b in zip(mine, theirs):
            assert a.answer == b.answer and torch.allclose(a.logits, b.logits, atol=1e-5)
    batch.run()   # what is left of the answer after the windows
    assert answer.finish().token_ids == answer_alone.token_ids


def test_every_refresh_mode_has_a_policy():
    from vidsight.engine.config import REFRESH_MODES
    from vidsight.engine.refresh import refresh_policy

    policies = {mode: refresh_policy(mode, 0.15) for mode in REFRESH_MODES}
    assert [mode for mode, policy in policies.items() if not policy.reuses] == ["full-comp"]


def test_anchor_refresh_picks_the_patches_of_gop_starts_only():
    from vidsight.engine.refresh import Overlap, refresh_policy

    # Three reused patches of two frames; a GOP starts at the overlap's fourth frame.
    overlap = Overlap(patch_tokens=[3, 2, 3], gop_starts=[False, False, False, True, False, False], temporal_patch=2)
    assert refresh_policy("anchors", 0.15).choose(overlap).tolist() == [3, 4]
    assert refresh_policy("all", 0.15).choose(overlap).tolist() == list(range(8))
    assert refresh_policy("reuse", 0.15).choose(overlap).tolist() == []


@pytest.mark.parametrize("align", [False, True])
def test_refreshed_tokens_are_those_of_the_overlaps_keyframes(tiny_adapter, make_test_video, align):
    # 8 fps, a keyframe every 12 frames; sampled at 2 fps (every 4th frame): samples 0, 3, 6, ...
    # start GOPs. Windows of 8 samples every 4, so an overlap holds 4 samples.
    path, _ = make_test_video(width=160, height=120, duration_s=10.0, fps=8, gop=12, bframes=False, seed=2)
    windows = WindowConfig(window_s=4.0, stride_fraction=0.5, fps=2.0, align_keyframes=align)
    config = WatchConfig(windows, refresh="anchors")
    frames = list(config.open(path))
    assert [f.index for f in frames if f.gop_start] == list(range(0, 20, 3))
    assert all(f.codec.frame_type == "I" for f in frames if f.gop_start)  # the sampled I-frames themselves
    starts = [w[0].index for w in sliding_windows(iter(frames), windows)]
    assert starts == ([0, 6, 9, 12] if align else [0, 4, 8, 12])  # aligned: the GOP start within a stride
    verdicts = list(Watcher(tiny_adapter, QUERY, config).watch(config.open(path)))
    checked = 0
    for start, end, verdict in zip(starts, starts[1:], verdicts[1:]):
        overlap = [f for f in frames if end <= f.index < start + windows.window_frames]
        if not verdict.reused_tokens:  # a shift of an odd number of samples cuts temporal patches
            assert align and (end - start) % 2
            continue
        expected = {overlap[k - k % 2].frame_index for k, f in enumerate(overlap) if f.gop_start}
        assert expected and set(verdict.refreshed_frames) == expected
        if align:
            assert overlap[0].gop_start and overlap[0].frame_index in verdict.refreshed_frames
        checked += 1
    assert checked == (1 if align else 3)


@pytest.mark.parametrize("refresh,tau", [("anchors", None), ("anchors", 0.25), ("deviation", None), ("reuse", 0.25)])
def test_reuse_in_place_equals_reuse_by_copy(tiny_adapter, stream_video, refresh, tau):
    import dataclasses

    from vidsight.vision.motion import MotionPruneConfig

    prune = MotionPruneConfig(tau=tau) if tau is not None else None
    in_place = WatchConfig(WINDOWS, refresh=refresh, prune=prune)
    by_copy = dataclasses.replace(in_place, reuse_in_place=False)
    a = list(Watcher(tiny_adapter, QUERY, in_place).watch(in_place.open(stream_video)))
    b = list(Watcher(tiny_adapter, QUERY, by_copy).watch(by_copy.open(stream_video)))
    assert sum(v.reused_tokens for v in a) > 0
    for x, y in zip(a, b, strict=True):
        assert (x.answer, x.kept_tokens, x.reused_tokens, x.refreshed_frames) == \
               (y.answer, y.kept_tokens, y.reused_tokens, y.refreshed_frames)
        assert torch.allclose(x.logits, y.logits, atol=1e-4)


class _Camera(StreamSource):
    """A file replayed at its own frame rate (a live source), saying when its last frame is out."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, realtime=True, **kwargs)
        self.finished = threading.Event()

    def __iter__(self):
        yield from super().__iter__()
        self.finished.set()


LIVE_WINDOWS = WindowConfig(window_s=2.0, stride_fraction=0.25, fps=2.0)  # 4 frames, stride 1


@pytest.mark.parametrize("refresh,tau,tolerance", [("full-comp", 0.25, 0.0), ("anchors", 0.25, 1e-3)])
def test_a_live_watch_behind_its_stream_judges_the_newest_window_as_an_uninterrupted_watch_does(
        tiny_adapter, make_test_video, refresh, tau, tolerance):
    """The model is slower than the camera: while window 0 is judged the whole 2.5-s stream arrives, so
    window 1 is passed over and window 2 (the newest) judged, with the motion of window 1's frames
    followed: its verdict is the one a watch judging every window gives it."""
    from vidsight.vision.motion import MotionPruneConfig

    path = make_test_video(width=224, height=168, duration_s=2.5, fps=8, gop=8, bframes=False, seed=5)[0]
    windows = WindowConfig(window_s=1.5, stride_fraction=1 / 3, fps=4.0)  # 6 frames, stride 2 (a temporal patch)
    config = WatchConfig(windows, refresh=refresh, prune=MotionPruneConfig(tau=tau))
    every = list(Watcher(tiny_adapter, QUERY, config).watch(config.open(path)))
    camera = _Camera(path, fps=windows.fps, motion=config.prune)
    watcher = Watcher(tiny_adapter, QUERY, config)
    live = list(watcher.watch(camera, run=lambda steps: camera.finished.wait(30) and drive(steps, tiny_adapter)))
    assert [v.window for v in every] == [0, 1, 2]
    assert [(v.window, v.windows_skipped) for v in live] == [(0, 0), (2, 1)]
    assert (watcher.windows_skipped, watcher.frames_dropped) == (1, 0)
    for a, b in zip((every[0], every[2]), live, strict=True):
        assert (a.answer, a.kept_tokens) == (b.answer, b.kept_tokens)
        assert torch.allclose(a.logits, b.logits, atol=tolerance, rtol=0)
    assert any(v.kept_tokens < v.visual_tokens for v in live)
    assert all(0 <= v.lag_s < 30 for v in live)


def test_a_live_watch_a_window_and_a_stride_behind_drops_the_oldest_frames(tiny_adapter, make_test_video):
    """While window 0 (two frames) is judged, the other four frames of the stream arrive for a
    backlog of three (a window and a stride): the oldest is dropped, the frame after it kept whole
    (its motion was judged against the dropped one), and the newest window judged as a watch of
    every window judges it."""
    from vidsight.vision.motion import MotionPruneConfig

    path = make_test_video(width=224, height=168, duration_s=1.5, fps=8, gop=40, bframes=False, seed=5)[0]
    windows = WindowConfig(window_s=0.5, stride_fraction=0.5, fps=4.0)  # 2 frames, stride 1
    every = list(Watcher(tiny_adapter, QUERY, WatchConfig(windows)).watch(StreamSource(path, windows.fps)))

    def watch_live(config):
        camera = _Camera(path, fps=windows.fps, motion=config.prune)
        watcher = Watcher(tiny_adapter, QUERY, config)
        seen, masks, keep = {}, {}, watcher._keep

        def followed(frames, grid):   # every frame's motion mask, as the watch follows it
            kept = keep(frames, grid)
            seen.update({f.index: f for f in frames})
            masks.update({f.index: watcher._masks[f.index] for f in frames if f.index in watcher._masks})
            return kept

        watcher._keep = followed
        live = list(watcher.watch(camera, run=lambda steps: camera.finished.wait(30) and drive(steps, tiny_adapter)))
        assert [(v.window, v.windows_skipped) for v in live] == [(0, 0), (len(every) - 1, len(every) - 2)]
        assert watcher.frames_dropped == 1
        return live, seen, masks

    live, _, _ = watch_live(WatchConfig(windows))
    assert torch.equal(live[-1].logits, every[-1].logits)
    _, seen, masks = watch_live(WatchConfig(windows, prune=MotionPruneConfig(tau=0.25)))
    assert sorted(seen) == [0, 1, 3, 4, 5] and seen[3].codec is None
    assert all(seen[i].codec is not None for i in (0, 1, 4, 5))
    assert bool(masks[3].all()) and not all(bool(masks[i].all()) for i in (1, 4, 5))


def test_a_live_watch_told_to_judge_every_window_waits_for_the_model(tiny_adapter, make_test_video):
    path = make_test_video(width=224, height=168, duration_s=1.5, fps=8, gop=40, bframes=False, seed=5)[0]
    windows = WindowConfig(window_s=0.5, stride_fraction=0.5, fps=4.0)
    every = list(Watcher(tiny_adapter, QUERY, WatchConfig(windows)).watch(StreamSource(path, windows.fps)))
    camera = _Camera(path, fps=windows.fps)
    watcher = Watcher(tiny_adapter, QUERY, WatchConfig(windows, catch_up=False))
    slower = 2 / windows.fps   # a window judged per two strides of the camera
    live = list(watcher.watch(camera, run=lambda steps: time.sleep(slower) or drive(steps, tiny_adapter)))
    assert [v.window for v in live] == [v.window for v in every] and (watcher.windows_skipped,
                                                                      watcher.frames_dropped) == (0, 0)
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(live, every))
