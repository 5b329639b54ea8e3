"""User settings to configs, in one place.

The command line (each flag's destination), the server's completions (``mm_processor_kwargs``,
``media_io_kwargs``), watch bodies and session bodies name settings alike, ``prune_tau`` or
``kv_device_budget``; each name maps here to one config field, and the config validates it.
A setting given as None takes its config's default.
"""

from __future__ import annotations

from typing import Any

from vidsight.errors import ConfigError

# name -> (config, field)
ASK_SETTINGS = {
    "fps": ("sampling", "fps"), "max_frames": ("sampling", "max_frames"),
    "start_s": ("sampling", "start_s"), "end_s": ("sampling", "end_s"),
    "min_pixels": ("sampling", "min_pixels"), "max_pixels": ("sampling", "max_pixels"),
    "total_pixels": ("sampling", "total_pixels"),
    "group_frames": ("prefill", "group_frames"), "dedup_patches": ("prefill", "dedup_patches"),
    "rho": ("prune", "rho"), "kv_score": ("prune", "scorer"), "prune_start_layer": ("prune", "start_layer"),
    "skip_pruned": ("prune", "skip_pruned"),
    "prune_tau": ("motion", "tau"), "prune_alpha": ("motion", "alpha"), "prune_rule": ("motion", "rule"),
    "motion_source": ("motion", "source"),
    "max_new_tokens": ("generation", "max_new_tokens"), "temperature": ("generation", "temperature"),
    "top_p": ("generation", "top_p"), "top_k": ("generation", "top_k"), "min_p": ("generation", "min_p"),
    "seed": ("generation", "seed"), "min_tokens": ("generation", "min_tokens"),
    "ignore_eos": ("generation", "ignore_eos"), "stop": ("generation", "stop"),
    "stop_token_ids": ("generation", "stop_token_ids"),
    "include_stop_str_in_output": ("generation", "include_stop_str_in_output"),
    "repetition_penalty": ("generation", "repetition_penalty"), "logprobs": ("generation", "logprobs"),
    "frequency_penalty": ("generation", "frequency_penalty"), "presence_penalty": ("generation", "presence_penalty"),
    "logit_bias": ("generation", "logit_bias"), "reasoning_parser": ("generation", "reasoning_parser"),
}
WATCH_SETTINGS = {
    "window_s": ("windows", "window_s"), "stride": ("windows", "stride_fraction"), "fps": ("windows", "fps"),
    "align_windows": ("windows", "align_keyframes"), "refresh": ("watch", "refresh"),
    "refresh_share": ("watch", "deviation_ratio"),
    "alert_after": ("watch", "alert_after"), "catch_up": ("watch", "catch_up"),
    "prune_tau": ("motion", "tau"), "prune_alpha": ("motion", "alpha"), "prune_rule": ("motion", "rule"),
    "motion_source": ("motion", "source"),
}
CHAT_SETTINGS = {
    "fps": ("chat", "fps"), "batch_patches": ("chat", "batch_patches"), "keep_dialogue": ("chat", "keep_dialogue"),
    "system": ("chat", "system"),
}
TIER_SETTINGS = {
    "kv_device_budget": ("tiers", "device_tokens"), "kv_host_budget": ("tiers", "host_tokens"),
    "kv_disk": ("tiers", "disk_dir"), "keep_kv": ("tiers", "keep_files"),
}


def _grouped(settings: dict[str, Any], table: dict[str, tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """The given settings of ``table``, as config fields per config."""
    fields: dict[str, dict[str, Any]] = {config: {} for config, _ in table.values()}
    for name, value in settings.items():
        if name in table and value is not None:
            config, field = table[name]
            fields[config][field] = value
    return fields


def _build(config: type, fields: dict[str, Any], **parts):
    try:
        return config(**fields, **parts)
    except TypeError as exc:
        raise ConfigError(f"a {config.__name__} setting has the wrong type: {exc}") from None


def motion_config(fields: dict[str, Any]):
    """Motion-guided patch pruning, on when its ``tau`` is set (None otherwise)."""
    from vidsight.ingest.dynamic import MotionPruneConfig

    return _build(MotionPruneConfig, fields) if "tau" in fields else None


def prefill_config(settings: dict[str, Any]):
    """QuickVideo's prefill (groups, KV pruning, motion pruning) from named settings (`ASK_SETTINGS`)."""
    from vidsight.engine.prefill.config import PrefillConfig
    from vidsight.kv.config import PruneConfig

    fields = _grouped(settings, ASK_SETTINGS)
    return _build(PrefillConfig, fields["prefill"], prune=_build(PruneConfig, fields["prune"]),
                  motion=motion_config(fields["motion"]))


# The answer formats a request or the command line may give (one at most), by kind.
FORMAT_SETTINGS = {"answer_schema": "json_schema", "answer_regex": "regex", "answer_grammar": "grammar"}


def generation_config(settings: dict[str, Any], until_context: bool = False):
    """An answer's length, sampling and format (`GenerationConfig`) from named settings
    (`ASK_SETTINGS`, `FORMAT_SETTINGS` and ``compact_json``); with ``until_context``, an answer
    without ``max_new_tokens`` runs until the context window is full (vLLM's default for a
    request without ``max_tokens``) instead of `GenerationConfig`'s default length."""
    from vidsight.engine.config import AnswerFormat, GenerationConfig

    fields = _grouped(settings, ASK_SETTINGS)["generation"]
    if until_context:
        fields.setdefault("max_new_tokens", None)
    formats = [(kind, settings[name]) for name, kind in FORMAT_SETTINGS.items() if settings.get(name) is not None]
    if len(formats) > 1:
        raise ConfigError(f"give one answer format, not {len(formats)} ({', '.join(kind for kind, _ in formats)})")
    if formats:
        fields["answer_format"] = _build(AnswerFormat, {"kind": formats[0][0], "text": formats[0][1],
                                                        "any_whitespace": not settings.get("compact_json")})
    return _build(GenerationConfig, fields)


def ask_configs(settings: dict[str, Any], until_context: bool = False):
    """``(sampling, generation, prefill)`` for `Asker.ask` from named settings (`ASK_SETTINGS`;
    ``until_context`` as `generation_config` takes it)."""
    from vidsight.ingest import SamplingConfig

    fields = _grouped(settings, ASK_SETTINGS)
    return (_build(SamplingConfig, fields["sampling"]), generation_config(settings, until_context),
            prefill_config(settings))


def feed_config(settings: dict[str, Any]):
    """How frames are decoded (QuickCodec) from the command line's decoding settings."""
    from vidsight.ingest.feed.config import FeedConfig

    workers = settings.get("decode_workers")
    return _build(FeedConfig, {"workers": workers, "overlap": not settings.get("no_overlap") and workers != 0,
                               "trim_gops": not settings.get("decode_all_frames"),
                               "resize_in_decoder": not settings.get("resize_after_decoding"),
                               "split_cores": not settings.get("oversubscribe")})


def watch_config(settings: dict[str, Any]):
    """A `WatchConfig` from named settings (`WATCH_SETTINGS`)."""
    from vidsight.engine.watch import WatchConfig
    from vidsight.ingest.windows import WindowConfig

    fields = _grouped(settings, WATCH_SETTINGS)
    return _build(WatchConfig, fields["watch"], windows=_build(WindowConfig, fields["windows"]),
                  prune=motion_config(fields["motion"]))


def tier_config(settings: dict[str, Any]):
    """The KV tiers named settings ask for (`TIER_SETTINGS`); None (one device buffer) when no budget
    or disk is set."""
    from vidsight.kv.tiers.config import TierConfig

    fields = _grouped(settings, TIER_SETTINGS)["tiers"]
    if not fields.keys() & {"device_tokens", "host_tokens", "disk_dir"}:
        return None
    return _build(TierConfig, fields)


def chat_configs(settings: dict[str, Any]):
    """``(chat, tiers)`` from named settings (`CHAT_SETTINGS`, `TIER_SETTINGS`)."""
    from vidsight.engine.chat import ChatConfig

    return _build(ChatConfig, _grouped(settings, CHAT_SETTINGS)["chat"]), tier_config(settings)

