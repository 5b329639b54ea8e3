"""Command-line options shared by `ask`, `watch`, `chat` and the benchmarks: prefill groups, KV and
motion pruning, decoding, answer formats."""

from __future__ import annotations

import argparse
from pathlib import Path


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
                                        "sampled frame stays under this many pixels")
    motion.add_argument("--dedup-patches", action="store_true",
                        help="with --prune-tau: also skip patches whose pixels stayed within the noise floor since "
                             "they were last encoded (a GOP's first frame then re-encodes only what changed)")


def add_motion_options(parser: argparse.ArgumentParser, what: str) -> argparse._ArgumentGroup:
    """``--prune-tau``, ``--prune-alpha``, ``--prune-rule``, ``--motion-source``: motion-guided patch pruning
    (`MotionPruneConfig`)."""
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
    add_motion_source_option(group)
    return group


def add_motion_source_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--motion-source``: where motion comes from (`MotionPruneConfig.source`)."""
    from vidsight.ingest.dynamic import SOURCES, MotionPruneConfig

    parser.add_argument("--motion-source", default=MotionPruneConfig.source, choices=SOURCES,
                        help="auto (default): the codec's motion vectors where FFmpeg exports them (H.264), vectors "
                             "estimated from decoded pixels elsewhere (HEVC, AV1, VP9 ...), none for intra-only codecs "
                             "(MJPEG, ProRes: every patch encoded); codec: the codec's only; pixels: pixels for every "
                             "codec, intra-only ones in groups of 250 frames")


def motion_note(source: str) -> str:
    """How a run's motion was judged, for its summary line (``source``: `judge.motion_source`'s)."""
    return {"codec": "motion from the codec's vectors", "pixels": "motion from the decoded pixels"}[source]


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


def add_policy_options(parser: argparse.ArgumentParser) -> None:
    """One flag per setting the registered policies' configs expose (their help and defaults from there)."""
    from vidsight.kv.policies.registry import policy_flags

    group = parser.add_argument_group("retrieval policies (chat)")
    for flag in policy_flags().values():
        if flag.switch is not None:
            group.add_argument(flag.flag, dest=flag.field, action="store_const", const=flag.switch, default=None,
                               help=flag.help)
        else:
            parse = _float if flag.kind is float else flag.kind
            group.add_argument(flag.flag, dest=flag.field, type=parse, default=None, help=flag.help)


def policy_settings(args) -> dict[str, dict]:
    """Per policy name, the config fields its flags set (flags not given are left out)."""
    from vidsight.kv.policies.registry import POLICIES, policy_flags

    settings = {name: {} for name in POLICIES}
    for flag in policy_flags().values():
        if getattr(args, flag.field, None) is not None:
            for name, _, _ in flag.policies:
                settings[name][flag.field] = getattr(args, flag.field)
    return settings


def foreign_policy_flags(args, policy: str) -> list[str]:
    """The flags given that do not apply to ``policy``."""
    from vidsight.kv.policies.registry import policy_flags

    return [flag.flag for flag in policy_flags().values()
            if getattr(args, flag.field, None) is not None and policy not in {name for name, _, _ in flag.policies}]


def add_tier_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tiered KV memory")
    group.add_argument("--kv-device-budget", type=int, default=None, metavar="TOKENS",
                       help="cached tokens (summed over layers) the device keeps; the rest moves to host memory")
    group.add_argument("--kv-host-budget", type=int, default=None, metavar="TOKENS",
                       help="cached tokens host memory keeps; the rest moves to --kv-disk, or is evicted")
    group.add_argument("--kv-disk", default=None, metavar="DIR", help="memory-mapped disk tier, a directory per session")
    group.add_argument("--keep-kv", action="store_true", help="leave the session's disk directory when it ends")


def add_generation_options(parser: argparse.ArgumentParser) -> None:
    """How answer tokens are chosen (`GenerationConfig`), for `ask` and `chat` alike; the answer's
    length limit is each command's own (their defaults differ)."""
    group = parser.add_argument_group("answer sampling and ending")
    group.add_argument("--temperature", type=_float, default=None,
                       help="0 is greedy; above 0 samples (default: the checkpoint's, as --generation-config says; "
                            "else 0)")
    group.add_argument("--top-p", type=_float, default=None, help="nucleus mass when sampling (default: the "
                                                                   "checkpoint's, else 1)")
    group.add_argument("--top-k", type=int, default=None,
                       help="when sampling, only among the K likeliest tokens (default: the checkpoint's, else 0: all)")
    group.add_argument("--min-p", type=_float, default=None,
                       help="when sampling, only tokens at least this share of the likeliest one's probability "
                            "(default: the checkpoint's, else 0: all)")
    add_generation_config_option(group, "the sampling flags not given", "temperature, top_p, top_k and min_p")
    group.add_argument("--seed", type=int, default=0, help="sampling seed")
    group.add_argument("--min-tokens", type=int, default=0,
                       help="no end token or stop string ends the answer before this many tokens (vLLM's min_tokens)")
    group.add_argument("--ignore-eos", action="store_true",
                       help="generate --max-new-tokens tokens whatever comes (vLLM's ignore_eos, for timing a "
                            "fixed answer length)")
    group.add_argument("--repetition-penalty", type=_float, default=None,
                       help="divide the logits of tokens already in the prompt or answer by this (1: none; "
                            "default: the checkpoint's generation_config.json, Qwen2.5-VL's 1.05)")
    group.add_argument("--frequency-penalty", type=_float, default=None,
                       help="lower each token's logit by this times its count in the answer (OpenAI's; -2 to 2)")
    group.add_argument("--presence-penalty", type=_float, default=None,
                       help="lower the logit of each token already in the answer by this (OpenAI's; -2 to 2)")
    group.add_argument("--stop", action="append", metavar="TEXT",
                       help="end the answer where it produces TEXT, which is left out (repeatable; OpenAI's stop)")
    group.add_argument("--include-stop-str-in-output", action="store_true",
                       help="the answer runs through the stop string that ended it (vLLM's include_stop_str_in_output)")
    group.add_argument("--stop-token-id", dest="stop_token_ids", action="append", type=int, metavar="ID",
                       help="end the answer where it produces token ID, beside the model's end tokens (repeatable; "
                            "vLLM's stop_token_ids)")
    group.add_argument("--logit-bias", action="append", type=_logit_bias, metavar="ID=BIAS",
                       help="add BIAS (-100 to 100) to token ID's logit before it is chosen (repeatable; OpenAI's "
                            "logit_bias)")
    add_answer_format_options(parser)


def _logit_bias(value: str) -> tuple[str, str]:
    token, equals, bias = value.partition("=")
    if not equals:
        raise argparse.ArgumentTypeError(f"{value!r}: give a token id and its bias as ID=BIAS")
    return token, bias   # checked with the config's other settings


def add_chat_template_option(parser: argparse.ArgumentParser) -> None:
    """vLLM's ``--chat-template``: a template in place of the checkpoint's."""
    parser.add_argument("--chat-template", default=None, metavar="FILE_OR_TEXT",
                        help="a Jinja chat template used instead of the checkpoint's (a file, or the template's "
                             "text), e.g. one that lists tools; it must place the model's video mark")


def add_server_answer_options(parser: argparse.ArgumentParser) -> None:
    """How a server (`serve`, `run-batch`) renders prompts and reads answers, with vLLM's flags."""
    add_chat_template_option(parser)
    parser.add_argument("--default-chat-template-kwargs", type=json_object, default={}, metavar="JSON",
                        help="chat template arguments every completion gets unless its own chat_template_kwargs set "
                             "them, as a JSON object (e.g. '{\"enable_thinking\": false}')")
    add_generation_config_option(parser, "requests' sampling fields not given",
                                 "temperature, top_p, top_k, min_p and max_new_tokens")
    parser.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                        help="tokens of prompt and answer to allow (default: the checkpoint's max_position_embeddings); "
                             "a completion without max_tokens answers until they are reached, as vLLM's do")
    add_reasoning_option(parser)
    add_tool_options(parser)


def server_answer_settings(args: argparse.Namespace) -> dict:
    """`add_server_answer_options`' flags as `ServeConfig` fields."""
    return {"chat_template": chat_template_of(args), "default_chat_template_kwargs": args.default_chat_template_kwargs,
            "reasoning_parser": args.reasoning_parser, "tool_call_parser": tool_call_parser(args),
            "max_model_len": args.max_model_len, "generation_config": args.generation_config}


def json_object(value: str) -> dict:
    """A flag's JSON object."""
    import json

    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, not {type(parsed).__name__}")
    return parsed


def chat_template_of(args: argparse.Namespace) -> str | None:
    """``--chat-template``'s template: its text, or the file's."""
    return _text_or_file(args.chat_template)


def add_reasoning_option(parser: argparse.ArgumentParser) -> None:
    """vLLM's ``--reasoning-parser``: a reasoning model's thinking given apart from its answer."""
    from vidsight.engine.reasoning import REASONING_PARSERS

    parser.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                        help="a reasoning model's thinking between <think> and </think> is given apart from the answer "
                             "(as `reasoning`), and an answer format holds the answer after it only (vLLM's parsers)")


def add_tool_options(parser: argparse.ArgumentParser) -> None:
    """vLLM's flags for ``"auto"`` tool choice (a request's named or required tool choice needs neither)."""
    group = parser.add_argument_group("tool calls (OpenAI's tools; see the README)")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='let requests leave the choice of calling their tools to the model ("auto", the default '
                            "when tools are given); needs --tool-call-parser")
    group.add_argument("--tool-call-parser", choices=("hermes",), default=None,
                       help="how the model writes a call: hermes, <tool_call>{\"name\": ..., \"arguments\": ...}"
                            "</tool_call> (Qwen's templates)")


def tool_call_parser(args: argparse.Namespace) -> str | None:
    """The parser of the "auto" tool choice, given both its flags (as vLLM wants them)."""
    from vidsight.errors import ConfigError

    if args.enable_auto_tool_choice != (args.tool_call_parser is not None):
        raise ConfigError("--enable-auto-tool-choice and --tool-call-parser go together")
    return args.tool_call_parser


def add_answer_format_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("answer format (vLLM's structured outputs; one at most)")
    group.add_argument("--answer-schema", metavar="SCHEMA",
                       help="the answer is JSON valid under this JSON schema (its text, or a file holding it)")
    group.add_argument("--answer-regex", metavar="PATTERN", help="the answer matches this regular expression whole")
    group.add_argument("--answer-grammar", metavar="GRAMMAR",
                       help="the answer is a sentence of this grammar, Lark or GBNF (its text, or a file holding it)")
    group.add_argument("--compact-json", action="store_true",
                       help="with --answer-schema: no white space between JSON's tokens (vLLM's disable_any_whitespace)")


def add_generation_config_option(parser, what: str, settings: str) -> None:
    """vLLM's ``--generation-config``: where ``what`` comes from."""
    from vidsight.engine.config import GENERATION_CONFIGS

    parser.add_argument("--generation-config", choices=GENERATION_CONFIGS, default="auto",
                        help=f"{what}: auto, the checkpoint's generation_config.json {settings} where it sets them (as "
                             "transformers' generate and vLLM take them); vllm, vidsight's own (greedy)")


def with_checkpoint_sampling(settings: dict, args: argparse.Namespace, adapter) -> dict:
    """``settings`` (`answer_format_settings`) with the sampling settings they leave out taken from
    ``adapter``'s checkpoint under ``--generation-config auto`` (its length limit stays the flag's),
    the checkpoint's said on standard error."""
    import sys

    if args.generation_config != "auto":
        return settings
    taken = {name: value for name, value in adapter.sampling_defaults.items()
             if name != "max_new_tokens" and settings.get(name) is None}
    if taken:
        print(f"vidsight: sampling as {adapter.name}'s generation_config.json says: "
              f"{', '.join(f'{name} {value}' for name, value in taken.items())} (--generation-config vllm: greedy)",
              file=sys.stderr)
    return {**settings, **taken}


def answer_format_settings(args: argparse.Namespace) -> dict:
    """``args`` as named settings, a schema or grammar given as a file read in."""
    return {**vars(args), "answer_schema": _text_or_file(args.answer_schema),
            "answer_grammar": _text_or_file(args.answer_grammar)}


def _text_or_file(value: str | None) -> str | None:
    """A format given on the command line: its text, or the file holding it (a name that exists)."""
    from vidsight.errors import ConfigError

    if value is None or "\n" in value or len(value) > 4096 or not Path(value).is_file():
        return value
    try:
        return Path(value).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{value}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
