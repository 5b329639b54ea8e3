"""Command-line options shared by `ask`, `watch` and the benchmarks: prefill groups, KV and motion pruning, decoding."""

from __future__ import annotations

import argparse


def _float(text: str) -> float:
    # Range checks live in the config dataclasses; this only parses.
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def add_prefill_options(parser: argparse.ArgumentParser) -> None:
    from vidsight.engine.prefill.config import PrefillConfig
    from vidsight.kv.config import SCORERS, PruneConfig

    group = parser.add_argument_group("prefill (QuickPrefill)")
    group.add_argument("--group-frames", type=int, default=PrefillConfig.group_frames,
                       help=f"video frames per prefill group (default: {PrefillConfig.group_frames}; 0: one group)")
    group.add_argument("--rho", type=_float, default=PruneConfig.rho,
                       help="share of each group's video KV every layer keeps (default: 1, lossless)")
    group.add_argument("--kv-score", default=PruneConfig.scorer, choices=SCORERS,
                       help=f"what pruning keeps (default: {PruneConfig.scorer}, QuickVideo's)")
    group.add_argument("--prune-start-layer", type=int, default=PruneConfig.start_layer,
                       help="layers below this keep all their KV (default: 0)")
    group.add_argument("--skip-pruned", action="store_true",
                       help="choose the kept tokens once, at the start layer, and let the pruned ones skip "
                            "the layers above it: saves their compute too (default: every layer scores its own)")
    motion = add_motion_options(parser, "skip the vision encoder for patches whose motion since their GOP's first "
                                        "sampled frame stays under this many pixels (H.264)")
    motion.add_argument("--dedup-patches", action="store_true",
                        help="with --prune-tau: also skip patches whose pixels stayed within the noise floor since "
                             "they were last encoded (a GOP's first frame then re-encodes only what changed)")


def add_motion_options(parser: argparse.ArgumentParser, what: str) -> argparse._ArgumentGroup:
    """``--prune-tau``, ``--prune-alpha``, ``--prune-rule``: motion-guided patch pruning (`MotionPruneConfig`)."""
    from vidsight.ingest.dynamic import RULES, SOFTWARE_ALPHA, MotionPruneConfig

    group = parser.add_argument_group("motion-guided patch pruning (CodecSight)")
    group.add_argument("--prune-tau", type=_float, default=None,
                       help=f"{what} (CodecSight's tau: {MotionPruneConfig.tau}; default: off, lossless)")
    group.add_argument("--prune-alpha", type=_float, default=MotionPruneConfig.alpha,
                       help="weight of the residual term per SAD level (default: 0, CodecSight's; "
                            f"{SOFTWARE_ALPHA:g} weighs a change of 4 levels per pixel like tau; residuals are "
                            "recomputed from decoded pixels)")
    group.add_argument("--prune-rule", default=MotionPruneConfig.rule, choices=RULES,
                       help="persistent (default): motion must persist over three frames above the stream's noise "
                            "floor; paper: CodecSight's eqs. 3-4 as written; max: any vector above tau or intra block")
    return group


def motion_config(args):
    """The `MotionPruneConfig` the flags ask for; None (off) unless ``--prune-tau`` is given."""
    from vidsight.ingest.dynamic import MotionPruneConfig

    if args.prune_tau is None:
        return None
    return MotionPruneConfig(tau=args.prune_tau, alpha=args.prune_alpha, rule=args.prune_rule)


def add_feed_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decoding (QuickCodec)")
    group.add_argument("--decode-workers", type=int, default=None,
                       help="parallel decoders (default: CPU count; 0: one decoder with FFmpeg's threads)")
    group.add_argument("--no-overlap", action="store_true",
                       help="decode the whole video before prefilling instead of group by group")
    group.add_argument("--decode-all-frames", action="store_true",
                       help="decode every frame instead of only the packets the sampled frames depend on")
    group.add_argument("--resize-after-decoding", action="store_true",
                       help="keep full-size frames and resize them during preprocessing (same pixels on the CPU, "
                            "far more memory; default: each decoder resizes its frames to the model's size)")
    group.add_argument("--oversubscribe", action="store_true",
                       help="let a model on the CPU keep all its threads while overlapped decoders run "
                            "(default: it uses the cores they leave, at least one, until decoding ends)")


def prefill_config(args):
    from vidsight.engine.prefill.config import PrefillConfig
    from vidsight.kv.config import PruneConfig

    prune = PruneConfig(rho=args.rho, scorer=args.kv_score, start_layer=args.prune_start_layer,
                        skip_pruned=args.skip_pruned)
    return PrefillConfig(group_frames=args.group_frames, prune=prune, motion=motion_config(args),
                         dedup_patches=args.dedup_patches)


def feed_config(args):
    from vidsight.ingest.feed.config import FeedConfig

    return FeedConfig(workers=args.decode_workers, overlap=not args.no_overlap and args.decode_workers != 0,
                      trim_gops=not args.decode_all_frames, resize_in_decoder=not args.resize_after_decoding,
                      split_cores=not args.oversubscribe)


POLICY_NAMES = ("full", "recent", "rekv", "mosaic", "resv")
# The retrieval policies' settings: flag -> (config field, parser, the policies it sets, help).
# A parser of True or False is a switch that sets the field to it.
POLICY_FLAGS = {
    "--window-tokens": ("window_tokens", int, ("recent",), "recent: local window in tokens (default: 4096)"),
    "--local-tokens": ("local_tokens", int, ("rekv", "mosaic", "resv"),
                       "rekv, mosaic, resv: local window in tokens (default: 15000, ReKV's; resv: 0, V-Rex's)"),
    "--top-frames": ("top_frames", int, ("rekv", "mosaic"),
                     "rekv: frame blocks retrieved; mosaic: its token budget in frame blocks (default: 64, ReKV's)"),
    "--visual-top": ("visual_top", int, ("mosaic",), "mosaic: visual partitions searched (default: 4)"),
    "--tau-small": ("tau_small", _float, ("mosaic",), "mosaic: variance threshold of small clusters (default: 0.05)"),
    "--tau-large": ("tau_large", _float, ("mosaic",), "mosaic: variance threshold of large clusters (default: 0.15)"),
    "--tau-rate": ("tau_rate", _float, ("mosaic",), "mosaic: cluster size of the threshold's transition (default: 16)"),
    "--visual-tau": ("visual_tau", _float, ("mosaic",), "mosaic: variance threshold of visual clusters (default: 0.002)"),
    "--min-split-size": ("min_split_size", int, ("mosaic",), "mosaic: clusters smaller than this never split (default: 32)"),
    "--max-clusters": ("max_clusters", int, ("mosaic",),
                       "mosaic: semantic clusters per visual partition and layer before splits stop (default: 64)"),
    "--hyperplanes": ("hyperplanes", int, ("resv",), "resv: random hyperplanes, bits per key hash (default: 32)"),
    "--hamming-threshold": ("hamming_threshold", int, ("resv",),
                            "resv: a key joins a cluster whose hash differs in fewer bits (default: 7)"),
    "--wics-ratio": ("ratio", _float, ("resv",), "resv: WiCSum's Th_r-wics (default: 0.3; 1 keeps everything)"),
    "--wics-weights": ("weights", str, ("resv",),
                       "resv: WiCSum weighs clusters by score (default, eqs. 1-3) or by attention (exp of the scaled score)"),
    "--wics-rows": ("rows", str, ("resv",),
                    "resv: WiCSum's rows: tokens (default: every query of a step), or one per query head: "
                    "mean (of its queries) or max (each cluster's best score over the step's tokens)"),
    "--mean-frame-rows": ("mean_frame_rows", True, ("resv",),
                          "resv: frame steps score one mean row per query head (questions keep --wics-rows)"),
    "--clustering": ("clustering", str, ("mosaic",),
                     "mosaic: nested (default), or an ablation: visual, semantic, none (token-level top-k)"),
    "--split": ("split", str, ("mosaic",), "mosaic: deferred (default, Algorithm 1) or eager"),
    "--no-summaries": ("summaries", False, ("mosaic",), "mosaic: no representatives of unretrieved clusters"),
    "--no-prefetch": ("prefetch", False, ("mosaic", "resv"), "mosaic, resv: no cross-layer prediction"),
}


def add_policy_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("retrieval policies (chat)")
    for flag, (field, parse, _, help_text) in POLICY_FLAGS.items():
        if isinstance(parse, bool):
            group.add_argument(flag, dest=field, action="store_const", const=parse, default=None, help=help_text)
        else:
            group.add_argument(flag, dest=field, type=parse, default=None, help=help_text)


def policy_settings(args) -> dict[str, dict]:
    """Per policy name, the config fields its flags set (flags not given are left out)."""
    settings = {name: {} for name in POLICY_NAMES}
    for field, _, names, _ in POLICY_FLAGS.values():
        if getattr(args, field) is not None:
            for name in names:
                settings[name][field] = getattr(args, field)
    return settings


def foreign_policy_flags(args, policy: str) -> list[str]:
    """The flags given that do not apply to ``policy``."""
    return [flag for flag, (field, _, names, _) in POLICY_FLAGS.items()
            if getattr(args, field) is not None and policy not in names]


def add_tier_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tiered KV memory")
    group.add_argument("--kv-device-budget", type=int, default=None, metavar="TOKENS",
                       help="cached tokens (summed over layers) the device keeps; the rest moves to host memory")
    group.add_argument("--kv-host-budget", type=int, default=None, metavar="TOKENS",
                       help="cached tokens host memory keeps; the rest moves to --kv-disk, or is evicted")
    group.add_argument("--kv-disk", default=None, metavar="DIR", help="memory-mapped disk tier, a directory per session")
    group.add_argument("--keep-kv", action="store_true", help="leave the session's disk directory when it ends")


def tier_config(args):
    """The tiers the flags ask for, or None (one device buffer) when none is set."""
    from pathlib import Path

    from vidsight.kv.tiers import TierConfig

    if args.kv_device_budget is None and args.kv_host_budget is None and args.kv_disk is None:
        return None
    return TierConfig(args.kv_device_budget, args.kv_host_budget, Path(args.kv_disk) if args.kv_disk else None,
                      args.keep_kv)
