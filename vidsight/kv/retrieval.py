"""The retrieval seam: which cached tokens each layer of a step attends to.

A `KVPolicy` is asked before each layer's attention in a step (a temporal patch prefilled into a
stream's cache, a question, a generated token); the engine gathers the slots it names and attends
over them and the step's own tokens, at the tokens' true positions. ``full`` names nothing and so
attends to everything: the exact reference. The baselines here are a StreamingLLM-style local
window with attention sinks (``recent``) and ReKV's frame retrieval (``rekv``; Di et al., ICLR
2025).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import VIDEO, KVCache

STEP_KINDS = ("frame", "question", "answer")


@dataclasses.dataclass
class Step:
    """One forward step, as policies see it, and what it attended (summed over layers).

    Attributes:
        kind: ``frame`` (a temporal patch prefilled), ``question`` or ``answer`` (a generated token).
        cached: Cached tokens the layers could have attended to.
        attended: Cached tokens they did attend to (averaged over key heads when a policy chooses per head).
        retrieved: Of those, tokens a retrieval chose (beyond sinks and the local window).
        layers: Layers run.
        patches: For temporal patches, each one's first frame index and visual embeddings
            ``(tokens, hidden)`` (the vision tower's merged output), for policies that organise
            memory by what frames look like.
        summaries: Summary entries attended beside the cached tokens (see `Selection`).
        positions: ``(3, L)`` rotary positions of the step's own tokens (set by the forward pass).
        unrotate: Set by the forward pass: takes ``(1, heads, n, head_dim)`` queries or keys rotated
            at ``(3, n)`` positions back to position 0 (what they were before the rotary embedding),
            for policies that compare content regardless of where tokens sit.
    """

    kind: str
    cached: int = 0
    attended: float = 0
    retrieved: int = 0
    layers: int = 0
    patches: list[tuple[int, torch.Tensor]] = dataclasses.field(default_factory=list)
    summaries: int = 0
    positions: torch.Tensor | None = None
    unrotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __post_init__(self):
        if self.kind not in STEP_KINDS:
            raise ConfigError(f"step kind must be one of {', '.join(STEP_KINDS)}, got {self.kind!r}")


@dataclasses.dataclass
class Selection:
    """Cached slots to attend to, maybe per key head, plus summary entries for cached tokens left out.

    Attributes:
        slots: Slots (ascending) among the layer's filled ones.
        keys: ``(1, kv_heads, m, head_dim)`` summary keys, already rotated (they are means of
            rotated keys), attended before the slots, each as one more key; None for none.
        values: ``(1, kv_heads, m, head_dim)`` their values.
        heads: ``(kv_heads, len(slots))`` bool: which of ``slots`` each key head's queries see
            (None: all of them, every head).
    """

    slots: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    heads: torch.Tensor | None = None


class KVPolicy(Protocol):
    """Chooses the cached slots a layer attends to in a step."""

    name: str

    def select(self, layer: int, cache: KVCache, q: torch.Tensor, step: Step) -> torch.Tensor | Selection | None:
        """Slots (ascending) among ``cache.filled[layer]`` that the step's queries ``q`` attend to
        (a `Selection` to add summary entries); None: all."""
        ...

    def report(self) -> dict:
        """What the policy's own upkeep did so far (cluster counts, splits, ...); empty for most."""
        ...

    def start(self, cache: KVCache) -> "KVPolicy":
        """The policy a session over ``cache`` uses: this one's settings with no per-stream state
        (a new object for a policy that keeps any), attached to the cache (its offload layout).
        A session owns what this returns; a fork starts another."""
        ...


class FullPolicy:
    """Every cached token: the exact reference the other policies are measured against."""

    name = "full"

    def report(self) -> dict:
        return {}

    def start(self, cache: KVCache) -> "FullPolicy":
        return self   # nothing kept per stream

    def select(self, layer, cache, q, step):
        return None


def sink_mask(cache: KVCache, layer: int, first_frame: bool) -> torch.Tensor:
    """``(filled,)`` bool: the slots of the text before the video (the system prompt) and, if asked,
    of the video's first temporal patch: the tokens every later one leans on (attention sinks)."""
    rows = cache.rows(layer)
    video = torch.nonzero(cache.tokens.kind == VIDEO).flatten()
    if len(video) == 0:
        return torch.ones(len(rows), dtype=torch.bool)
    sinks = rows < int(video[0])
    if first_frame:
        first = cache.tokens.frame_index[video[0]]
        sinks |= (cache.tokens.kind[rows] == VIDEO) & (cache.tokens.frame_index[rows] == first)
    return sinks


def window_mask(filled: int, tokens: int) -> torch.Tensor:
    return torch.arange(filled) >= filled - tokens


@dataclasses.dataclass(frozen=True)
class RecentConfig:
    """A local window with attention sinks (StreamingLLM, Xiao et al., ICLR 2024).

    Attributes:
        window_tokens: The most recent cached tokens every step attends to.
    """

    window_tokens: int = 4096

    def __post_init__(self):
        if self.window_tokens < 1:
            raise ConfigError(f"window_tokens must be positive, got {self.window_tokens}")


class RecentPolicy:
    """Sinks (the system prompt and the first temporal patch) plus the last ``window_tokens``."""

    name = "recent"

    def __init__(self, config: RecentConfig = RecentConfig()):
        self.config = config

    def report(self) -> dict:
        return {}

    def start(self, cache: KVCache) -> "RecentPolicy":
        return self   # nothing kept per stream

    def select(self, layer, cache, q, step):
        filled = cache.filled[layer]
        keep = sink_mask(cache, layer, first_frame=True) | window_mask(filled, self.config.window_tokens)
        return torch.nonzero(keep).flatten()


@dataclasses.dataclass(frozen=True)
class ReKVConfig:
    """ReKV's retrieval (its released defaults: a 15000-token local window, 64 retrieved frames).

    Attributes:
        local_tokens: The most recent cached tokens every step attends to (ReKV's ``n_local``).
        top_frames: Frame blocks retrieved per layer at a question (ReKV's ``retrieve_size``); a
            block here is one temporal patch (two frames for Qwen2.5-VL).
        rotated: Score blocks with keys and queries after the rotary embedding. ReKV's code
            scores them before it (its context memory keeps keys unrotated), so blocks are
            compared by content alone, wherever they sit in the stream; the default follows it.
    """

    local_tokens: int = 15000
    top_frames: int = 64
    rotated: bool = False

    def __post_init__(self):
        if self.local_tokens < 1 or self.top_frames < 1:
            raise ConfigError("local_tokens and top_frames must be positive")


@dataclasses.dataclass
class _BlockIndex:
    """One layer's frame blocks: the sum and count of each block's keys, over the slots indexed so far."""

    frames: torch.Tensor   # (blocks,) frame index of each block's first frame
    sums: torch.Tensor     # (kv_heads, blocks, head_dim) float32
    counts: torch.Tensor   # (blocks,)
    indexed: int = 0       # slots already read


class ReKVPolicy:
    """Streaming prefill sees the sinks and the local window; a question retrieves frame blocks.

    At a question, per layer, each temporal patch's block is represented by the mean of its keys
    and the question by the mean of its queries; the ``top_frames`` blocks with the largest inner
    product (over all heads, each query head against its key head) are attended to together with
    the sinks (the system prompt) and the local window, and stay chosen for the answer's tokens.
    The block means are kept as an index, updated at every frame step with the patch written in
    the step before (still on the device, as in ReKV, where a block's mean is taken while the
    block is in GPU memory), so a question reads no offloaded keys to score the blocks.
    """

    name = "rekv"

    def __init__(self, config: ReKVConfig = ReKVConfig()):
        self.config = config
        self._retrieved: dict[int, torch.Tensor] = {}   # layer -> slots chosen at the question
        self._question_start: dict[int, int] = {}       # layer -> first slot of the question
        self._index: dict[int, _BlockIndex] = {}

    def start(self, cache: KVCache) -> "ReKVPolicy":
        return ReKVPolicy(self.config)

    def report(self) -> dict:
        """The bytes of its block index (the device holds it)."""
        return {"index_bytes": sum(index.sums.nbytes for index in self._index.values())}

    def select(self, layer, cache, q, step):
        filled = cache.filled[layer]
        keep = sink_mask(cache, layer, first_frame=False) | window_mask(filled, self.config.local_tokens)
        if step.kind == "frame":
            self._update(layer, cache, step)
        elif step.kind == "question":
            self._retrieved[layer] = self._retrieve(layer, cache, q, step)
            self._question_start[layer] = filled
        if step.kind != "frame" and layer in self._retrieved:
            retrieved = torch.zeros(filled, dtype=torch.bool)
            retrieved[self._retrieved[layer]] = True
            retrieved[self._question_start[layer] :] = True  # the question and the answer so far
            step.retrieved += int((retrieved & ~keep).sum())
            keep |= retrieved
        return torch.nonzero(keep).flatten()

    def _content(self, x: torch.Tensor, positions: torch.Tensor, step: Step) -> torch.Tensor:
        """``(1, heads, n, head_dim)`` queries or keys as scored: unrotated unless ``rotated``."""
        return x if self.config.rotated else step.unrotate(x, positions.to(x.device))

    def _update(self, layer: int, cache: KVCache, step: Step) -> _BlockIndex:
        """The layer's index, with the video slots written since it was last read.

        A temporal patch is written whole in one step, so the slots since then form new blocks;
        a question's own slots lie past the video and are dropped again before the next patch.
        """
        filled, rows = cache.filled[layer], cache.rows(layer)
        index = self._index.get(layer)
        if index is None:
            kv_heads, head_dim = cache.read(layer, torch.empty(0, dtype=torch.long))[0].shape[1::2]
            index = self._index[layer] = _BlockIndex(torch.empty(0, dtype=torch.long),
                                                     torch.zeros((kv_heads, 0, head_dim)), torch.zeros(0))
        new = torch.nonzero(cache.tokens.kind[rows[index.indexed : filled]] == VIDEO).flatten() + index.indexed
        if len(new):
            frames, block_of = torch.unique(cache.tokens.frame_index[rows[new]], return_inverse=True)
            keys = self._content(cache.read(layer, new)[0], cache.tokens.position[rows[new]].T, step)
            keys = keys[0].float().cpu()                                          # (kv_heads, n, head_dim)
            sums = torch.zeros((keys.shape[0], len(frames), keys.shape[2]))
            sums.index_add_(1, block_of, keys)
            index.frames = torch.cat([index.frames, frames])
            index.sums = torch.cat([index.sums, sums], dim=1)
            index.counts = torch.cat([index.counts, torch.bincount(block_of, minlength=len(frames)).float()])
        index.indexed = filled
        return index

    def _retrieve(self, layer: int, cache: KVCache, q: torch.Tensor, step: Step) -> torch.Tensor:
        """Slots of the ``top_frames`` blocks whose mean key best matches the question's mean query."""
        index = self._update(layer, cache, step)
        q = self._content(q, step.positions, step)
        if len(index.frames) == 0:
            return torch.empty(0, dtype=torch.long)
        heads, kv_heads = q.shape[1], index.sums.shape[0]
        # (kv_heads, head_dim) mean query, summed over the query heads that share each key head.
        query = q[0].float().cpu().mean(dim=1).reshape(kv_heads, heads // kv_heads, -1).sum(dim=1)
        scores = torch.einsum("hd,hbd->b", query, index.sums / index.counts[None, :, None])
        top = index.frames[torch.topk(scores, min(self.config.top_frames, len(index.frames))).indices]
        rows = cache.rows(layer)
        video = torch.nonzero(cache.tokens.kind[rows] == VIDEO).flatten()
        return video[torch.isin(cache.tokens.frame_index[rows[video]], top)]


def _mosaic():
    from vidsight.kv.mosaic import MosaicConfig, MosaicPolicy  # it builds on this module

    return MosaicPolicy, MosaicConfig


def _resv():
    from vidsight.kv.resv import ReSVConfig, ReSVPolicy  # it builds on this module

    return ReSVPolicy, ReSVConfig


POLICIES = {"full": lambda: (FullPolicy, None), "recent": lambda: (RecentPolicy, RecentConfig),
            "rekv": lambda: (ReKVPolicy, ReKVConfig), "mosaic": _mosaic, "resv": _resv}


def make_policy(label: str, **settings) -> KVPolicy:
    """A policy by name, its config built from ``settings`` (the config's fields).

    ``label`` may fix settings itself, ``name:field=value,field=value`` (the benchmarks compare
    variants of one policy this way); those win over ``settings``.
    """
    name, _, fixed = label.partition(":")
    if name not in POLICIES:
        raise ConfigError(f"unknown KV policy {name!r}; choose one of {', '.join(POLICIES)}")
    policy, config = POLICIES[name]()
    if fixed:
        if config is None:
            raise ConfigError(f"the {name} policy takes no settings, got {fixed!r}")
        settings = {**settings, **_parse_settings(config, fixed, label)}
    if config is None:
        if settings:
            raise ConfigError(f"the {name} policy takes no settings, got {', '.join(settings)}")
        return policy()
    try:
        return policy(config(**settings))
    except TypeError as exc:
        raise ConfigError(f"{label}: {exc}") from None


def _parse_settings(config, text: str, label: str) -> dict:
    """``field=value,...`` into the config's field types."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    out = {}
    for item in text.split(","):
        field, _, value = item.partition("=")
        if field not in defaults or not value:
            raise ConfigError(f"{label}: expected field=value with a field of {', '.join(defaults)}; got {item!r}")
        kind = type(defaults[field])
        try:
            out[field] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
        except ValueError:
            raise ConfigError(f"{label}: {field} takes a {kind.__name__}, got {value!r}") from None
    return out
