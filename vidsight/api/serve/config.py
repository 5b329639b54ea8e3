"""`vidsight serve`'s settings (torch-free, so `--help` starts fast)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from vidsight.api.serve.egress import EgressRules, parse_networks
from vidsight.api.serve.tenants import ApiKey, Tenant, check_keys
from vidsight.errors import ConfigError

API_KEY_ENV = "VIDSIGHT_API_KEY"
# vLLM's defaults where it has one: no local media unless allowed, a fetch timeout of seconds.
DEFAULT_MAX_VIDEO_BYTES = 512 * 2**20
DEFAULT_FETCH_TIMEOUT_S = 30.0
DEFAULT_MAX_CONCURRENT = 64
# Videos' KV kept for repeated questions: a 7B's 2-minute video at 1 fps and 448x448 is about
# 0.5 GiB in bfloat16, so a few such videos.
DEFAULT_PREFIX_CACHE_BYTES = 2 * 2**30
# Host memory for prefixes past the device's budget on a CUDA device: vLLM's --swap-space default.
DEFAULT_PREFIX_CACHE_HOST_BYTES = 4 * 2**30
# Prompt tokens of prefill chunks in one turn beside the decode step (a longer group goes over
# several turns), on a GPU and on a CPU (0: one whole group a turn). A CPU's pass takes time in
# proportion to its tokens and packing saves it no arithmetic (eight 230-token groups of the small
# shape in one turn held a watch's windows 14 s for 4 % more completions, docs/benchmarks.md): one
# group per turn there.
DEFAULT_MAX_PREFILL_TOKENS = {"cuda": 8192, "cpu": 0}
# A network source that does not come back: tries in a row, and seconds of failing, before it ends.
DEFAULT_SOURCE_RETRIES = 5
DEFAULT_SOURCE_RETRY_WINDOW_S = 60.0
# A request body holds JSON and at most a base64 video: 4/3 of the video cap, plus the text.
BODY_OVERHEAD_BYTES = 2**20


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/vidsight/serve.db`` (``~/.local/share`` when unset)."""
    root = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(root) / "vidsight" / "serve.db"


def absolute_model(name: str) -> str:
    """A local checkpoint directory as an absolute path (Ray's replicas run in other working
    directories, maybe on other hosts); a Hugging Face id as it is."""
    return str(Path(name).resolve()) if Path(name).exists() else name


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """How the server runs.

    Attributes:
        model: Hugging Face id or checkpoint directory, loaded once for every request and stream.
        device: Where the model runs (None: CUDA when available).
        api_key: Required as ``Authorization: Bearer KEY`` on every ``/v1`` call (None: open).
        allowed_local_media_path: Local videos (paths, ``file://``) must lie under it, links
            resolved; None refuses every local path, as vLLM does.
        db: Where watches, verdicts and alerts live: a SQLite file, or a database URL
            (``postgresql://user@host/name``) that several servers share.
        max_video_bytes: Largest video accepted, uploaded (base64) or fetched.
        fetch_timeout_s: Longest an ``http(s)`` video may take to arrive.
        max_concurrent: Requests admitted at once (queued or running); more get 429.
        model_name: The id ``/v1/models`` lists and requests name (default: the model's).
        allowed_media_domains: Video fetches go only to these hosts (and their subdomains), at
            whatever address they resolve to (vLLM's ``--allowed-media-domains``); None: any host
            whose addresses are all public (`egress`).
        allowed_stream_networks: Networks (CIDR) watch and session sources may reach although
            private, loopback or link-local (cameras on a LAN).
        allowed_webhook_networks: The same for webhooks.
        api_keys: Keys per tenant (`tenants`, from ``--api-keys FILE``), beside ``api_key``.
        source_retries: A watch's or session's network source that fails to open (or drops) this
            many times in a row ends ``failed`` with the last error.
        source_retry_window_s: ...or that fails for this long without a frame.
        kv_disk: Where sessions with KV budgets keep their disk tier (a directory per session,
            removed when it closes); None: past the host budget the oldest KV is evicted.
        batch_answers: Generate concurrent completions' and session questions' answers together
            (`Scheduler`); False runs each whole in its turn (the comparison `bench serve --unbatched` makes).
        prefix_cache_bytes: KV bytes of videos kept for later completions about the same video
            (`PrefixCache`); 0 turns the cache off.
        prefix_cache_host_bytes: KV bytes of prefixes kept in host memory past that budget (None:
            ``DEFAULT_PREFIX_CACHE_HOST_BYTES`` on a CUDA device, 0 on the CPU, whose memory is the host's).
        max_prefill_tokens: Prompt tokens of prefill chunks in one model turn, a longer group going
            in parts over later turns (`Scheduler`); 0: one whole group a turn (None:
            ``DEFAULT_MAX_PREFILL_TOKENS`` for the device).
        packed_weights: On a CPU in float32, reorder the loaded model's large linear weights once
            into oneDNN's blocked layout (`models.packed_linear`): decode steps of 8 answers about
            1.6x faster, one answer's about 13 % slower. Ignored elsewhere, and for a model handed
            to the server already loaded.
        reasoning_parser: A reasoning model's thinking tags (`engine.reasoning`, vLLM's
            ``--reasoning-parser``): each answer's thinking is given as ``reasoning``, its content as
            ``content``, and an answer format holds the content only; None: answers as generated.
        chat_template: A chat template used instead of the checkpoint's (its text; vLLM's
            ``--chat-template``), for a model the server loads.
        generation_config: Where requests' sampling defaults come from (vLLM's
            ``--generation-config``): ``auto``, the checkpoint's generation_config.json (its
            temperature, top_p, top_k, min_p and max_new_tokens, where it sets them), or ``vllm``,
            vidsight's own (greedy; answers until the context is full). A request's own fields win.
        max_model_len: Tokens of prompt and answer to allow, for a model the server loads (vLLM's
            ``--max-model-len``; None: the checkpoint's ``max_position_embeddings``). A completion
            that gives no ``max_tokens`` answers until they are reached, as vLLM's do.
        default_chat_template_kwargs: Chat template arguments every completion gets unless its own
            ``chat_template_kwargs`` set them (vLLM's ``--default-chat-template-kwargs``), e.g.
            ``{"enable_thinking": false}``.
        tool_call_parser: How the model writes tool calls, for requests that leave the choice of
            calling to it (``tool_choice: "auto"``; `tools`); None refuses that choice, as vLLM
            without ``--enable-auto-tool-choice`` does.
    """

    model: str
    device: str | None = None
    api_key: str | None = None
    allowed_local_media_path: Path | None = None
    db: str | Path = dataclasses.field(default_factory=default_db_path)
    max_video_bytes: int = DEFAULT_MAX_VIDEO_BYTES
    fetch_timeout_s: float = DEFAULT_FETCH_TIMEOUT_S
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    model_name: str | None = None
    allowed_media_domains: tuple[str, ...] | None = None
    allowed_stream_networks: tuple[str, ...] = ()
    allowed_webhook_networks: tuple[str, ...] = ()
    api_keys: tuple[ApiKey, ...] = ()
    source_retries: int = DEFAULT_SOURCE_RETRIES
    source_retry_window_s: float = DEFAULT_SOURCE_RETRY_WINDOW_S
    kv_disk: Path | None = None
    batch_answers: bool = True
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    prefix_cache_host_bytes: int | None = None
    max_prefill_tokens: int | None = None
    packed_weights: bool = True
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    chat_template: str | None = None
    max_model_len: int | None = None
    generation_config: str = "auto"
    default_chat_template_kwargs: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        from vidsight.models.conversation import check_template_kwargs

        check_template_kwargs(self.default_chat_template_kwargs)
        from vidsight.api.serve.tools import TOOL_CALL_PARSERS
        from vidsight.engine.reasoning import REASONING_PARSERS

        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ConfigError(f"unknown tool call parser {self.tool_call_parser!r}; known: {', '.join(TOOL_CALL_PARSERS)}")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"unknown reasoning parser {self.reasoning_parser!r}; known: {', '.join(REASONING_PARSERS)}")
        from vidsight.engine.config import GENERATION_CONFIGS

        if self.generation_config not in GENERATION_CONFIGS:
            raise ConfigError(f"--generation-config is one of {', '.join(GENERATION_CONFIGS)}, not {self.generation_config!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ConfigError(f"--max-model-len must be a positive number of tokens, got {self.max_model_len}")
        if self.source_retries < 0 or not self.source_retry_window_s > 0:
            raise ConfigError("--source-retries must be 0 or more and --source-retry-window positive")
        check_keys(self.keys, "the API keys")
        parse_networks(self.allowed_stream_networks, "--allowed-stream-networks")
        parse_networks(self.allowed_webhook_networks, "--allowed-webhook-networks")
        if self.allowed_media_domains is not None and not all(d.strip(". ") for d in self.allowed_media_domains):
            raise ConfigError("--allowed-media-domains: an empty domain")
        if self.max_video_bytes < 1:
            raise ConfigError(f"max_video_bytes must be positive, got {self.max_video_bytes}")
        if not self.fetch_timeout_s > 0:
            raise ConfigError(f"fetch_timeout_s must be positive, got {self.fetch_timeout_s}")
        if self.max_concurrent < 1:
            raise ConfigError(f"max_concurrent must be at least 1, got {self.max_concurrent}")
        if self.prefix_cache_bytes < 0:
            raise ConfigError(f"--prefix-cache-bytes must be 0 (off) or more, got {self.prefix_cache_bytes}")
        if self.prefix_cache_host_bytes is not None and self.prefix_cache_host_bytes < 0:
            raise ConfigError(f"--prefix-cache-host-bytes must be 0 (none) or more, got {self.prefix_cache_host_bytes}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 0:
            raise ConfigError(f"--max-prefill-tokens must be 0 (a whole group a turn) or more, "
                              f"got {self.max_prefill_tokens}")
        if self.allowed_local_media_path is not None and not Path(self.allowed_local_media_path).is_dir():
            raise ConfigError(f"{self.allowed_local_media_path}: --allowed-local-media-path is not a directory")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("the API key is empty")

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """Every key the server takes: ``api_key`` as the admin tenant ``default``, then ``api_keys``."""
        single = () if self.api_key is None else (ApiKey(Tenant("default", admin=True), self.api_key),)
        return single + tuple(self.api_keys)

    def egress(self, kind: str) -> EgressRules:
        """The outbound rules for ``kind``: ``media`` (video fetches), ``stream`` or ``webhook``."""
        if kind == "media":
            domains = None if self.allowed_media_domains is None else tuple(
                d.lower().strip(". ") for d in self.allowed_media_domains)
            return EgressRules("video fetch", domains=domains, flag="--allowed-media-domains")
        flag = f"--allowed-{kind}-networks"
        networks = self.allowed_stream_networks if kind == "stream" else self.allowed_webhook_networks
        return EgressRules(f"{kind} source" if kind == "stream" else kind, parse_networks(networks, flag), flag=flag)

    def prefix_host_budget(self, device_type: str) -> int:
        """The prefix cache's host budget on a ``device_type`` device (the default resolved)."""
        if self.prefix_cache_host_bytes is not None:
            return self.prefix_cache_host_bytes
        return DEFAULT_PREFIX_CACHE_HOST_BYTES if device_type == "cuda" else 0

    def prefill_budget(self, device_type: str) -> int:
        """Prompt tokens of prefill chunks a turn on a ``device_type`` device (the default resolved)."""
        if self.max_prefill_tokens is not None:
            return self.max_prefill_tokens
        return DEFAULT_MAX_PREFILL_TOKENS["cuda" if device_type == "cuda" else "cpu"]

    @property
    def served_name(self) -> str:
        return self.model_name or str(self.model)

    @property
    def max_body_bytes(self) -> int:
        return self.max_video_bytes * 4 // 3 + BODY_OVERHEAD_BYTES


# A replica beats every second; one silent for this long is taken for dead and its watches move.
DEFAULT_REPLICA_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class RayConfig:
    """How `vidsight serve --ray` deploys on Ray Serve.

    Attributes:
        address: The Ray cluster to join (``ray://host:10001``, ``host:6379``, ``auto``); None
            starts a Ray instance on this machine.
        replicas: Model replicas, fixed; ignored when ``autoscale`` is given.
        autoscale: ``(min, max)`` replicas, scaled by Ray Serve on requests in flight.
        replica_cpus: CPUs each replica reserves (its torch threads).
        replica_gpus: GPUs each replica reserves (0 on a CPU cluster; 1 for one model per GPU).
        replica_timeout_s: A replica whose heartbeat is older than this is taken for dead.
    """

    address: str | None = None
    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    replica_cpus: float = 1.0
    replica_gpus: float = 0.0
    replica_timeout_s: float = DEFAULT_REPLICA_TIMEOUT_S

    def __post_init__(self):
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be at least 1, got {self.replicas}")
        if self.autoscale is not None and not 1 <= self.autoscale[0] <= self.autoscale[1]:
            raise ConfigError(f"--autoscale MIN MAX needs 1 <= MIN <= MAX, got {self.autoscale}")
        if self.replica_cpus < 0 or self.replica_gpus < 0:
            raise ConfigError("--replica-cpus and --replica-gpus must be non-negative")
        if not self.replica_timeout_s > 1:
            raise ConfigError(f"--replica-timeout must be over a second (the heartbeat), got {self.replica_timeout_s}")

    def describe(self) -> str:
        replicas = f"{self.autoscale[0]}-{self.autoscale[1]} replicas" if self.autoscale else f"{self.replicas} replica(s)"
        return f"{replicas}, {self.replica_cpus:g} CPU and {self.replica_gpus:g} GPU each"

    def deployment_options(self) -> dict:
        """Ray Serve's options for the model deployment."""
        scale = ({"autoscaling_config": {"min_replicas": self.autoscale[0], "max_replicas": self.autoscale[1]}}
                 if self.autoscale else {"num_replicas": self.replicas})
        return {**scale, "ray_actor_options": {"num_cpus": self.replica_cpus, "num_gpus": self.replica_gpus}}
