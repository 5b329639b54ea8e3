"""V-Rex's ReSV retrieval (seed 003): hash-bit key clusters and WiCSum thresholds, per key head.

Every new video token's rotated key, per layer and key head, is projected on ``hyperplanes``
random hyperplanes (fixed by ``seed``) and binarised (> 0 is 1) into packed hash bits. A token
joins the cluster whose hash bits are nearest in Hamming distance (XOR and popcount) when that
distance is below ``hamming_threshold``; otherwise it starts a cluster. A cluster keeps its
members, its representative key (the mean of its members' keys), that key's hash bits and its
token count (V-Rex's hash-cluster table). New tokens are matched against the existing clusters
all at once; those that match none are clustered among themselves in order.

At every step (a temporal patch, a question, each generated token), per layer and key head, the
step's queries (every query head sharing the key head, every token of the step: the rows) score
the representative keys, and WiCSum (`wicsum`) keeps, per row, the clusters that carry
``ratio`` of the row's count-weighted score; the union over rows, mapped back to tokens, is what
that head attends to, with the text (system prompt, kept dialogue) and the step's own tokens.
The number of tokens therefore varies per layer and head; `report` gives its distribution.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import VIDEO, KVCache
from vidsight.kv.retrieval import STEP_KINDS, Selection, Step, window_mask

log = logging.getLogger(__name__)
SELECTIONS = ("wicsum", "topk")
WEIGHTS = ("score", "attention")
ROWS = ("tokens", "mean", "max")
EARLY_EXIT_CLUSTERS = 32   # clusters ranked per row before WiCSum ranks more


@dataclasses.dataclass(frozen=True)
class ReSVConfig:
    """ReSV's settings (the paper's: 32 hyperplanes, Th_hp 7, Th_r-wics 0.3).

    Attributes:
        hyperplanes: Random hyperplanes, so hash bits per key (at most 62).
        hamming_threshold: A token joins a cluster whose bits differ in fewer places.
        ratio: WiCSum's Th_r-wics: the share of each row's weighted score the kept clusters
            must pass; 1 or more keeps every cluster.
        seed: Seeds the hyperplanes (fixed per session).
        local_tokens: The most recent tokens every step attends to besides the selection (0:
            none, as in V-Rex).
        clustering: False attends the ablation without clusters: WiCSum over every token.
        selection: ``wicsum``, or the ablation ``topk``: the ``top_clusters`` best clusters per row.
        top_clusters: Clusters per row for ``topk``.
        weights: What WiCSum weighs a cluster by, times its count: ``score``, its score as eqs. 1-3
            write it (clamped at 0), or ``attention``, ``exp`` of its scaled score less the row's
            best, so the kept clusters carry ``ratio`` of the row's softmax attention mass.
        rows: WiCSum's rows: ``tokens``, every query of the step (each token, each query head of
            the key head's group: the paper's), ``mean``, one per query head, its queries' mean
            over the step's tokens (as ReKV scores a question), or ``max``, one per query head
            scoring each cluster by the step's best token for it. The union over ``tokens`` rows
            grows with the step's length; a ``mean`` row keeps what the step attends to as a whole,
            a ``max`` row what any token of it attends to most.
        mean_frame_rows: Frame steps score with ``mean`` rows whatever ``rows`` says: a temporal
            patch has hundreds of rows per key head on a real model (64 tokens x 7 query heads on
            Qwen2.5-0.5B's), and scoring and ranking every one against every cluster costs more
            than the attention it saves; a question keeps its ``rows``.
        prefetch: Each layer's rows also predict the next layer's clusters, whose offloaded
            blocks start moving up early (with tiered KV only; what is attended never changes).
        layout: Offloaded KV laid out by cluster, per key head (V-Rex's cluster-wise memory
            mapping), so a selected cluster moves as one block; False keeps the patch blocks.
    """

    hyperplanes: int = 32
    hamming_threshold: int = 7
    ratio: float = 0.3
    seed: int = 0
    local_tokens: int = 0
    clustering: bool = True
    selection: str = "wicsum"
    top_clusters: int = 8
    weights: str = "score"
    rows: str = "tokens"
    mean_frame_rows: bool = False
    prefetch: bool = True
    layout: bool = True

    def __post_init__(self):
        if not 1 <= self.hyperplanes <= 62 or self.hamming_threshold < 1 or self.ratio <= 0:
            raise ConfigError("hyperplanes must be in [1, 62], hamming_threshold at least 1 and ratio positive")
        if self.local_tokens < 0 or self.top_clusters < 1 or self.selection not in SELECTIONS:
            raise ConfigError(f"local_tokens must be >= 0, top_clusters >= 1, selection one of {SELECTIONS}")
        if self.weights not in WEIGHTS or self.rows not in ROWS:
            raise ConfigError(f"weights must be one of {WEIGHTS} and rows one of {ROWS}")


def hash_bits(keys: torch.Tensor, planes: torch.Tensor) -> torch.Tensor:
    """``(n, d)`` keys on ``(d, b)`` hyperplanes to ``(n,)`` int64: bit i set when projection i is > 0."""
    bits = (keys.float() @ planes > 0).long()
    return (bits << torch.arange(planes.shape[1])).sum(dim=1)


def bit_signs(bits: torch.Tensor, width: int) -> torch.Tensor:
    """``(n,)`` packed hash bits to ``(n, width)`` float: +1 where bit i is set, -1 where it is not."""
    return ((bits[:, None] >> torch.arange(width)) & 1).float() * 2 - 1


def hamming(a: torch.Tensor, b: torch.Tensor, width: int = 62) -> torch.Tensor:
    """``(n, m)`` Hamming distances between packed hash bits ``a`` ``(n,)`` and ``b`` ``(m,)`` below 2**width.

    XOR and popcount, as one matrix product: over ``width`` bits, agreeing ones add +1 to the signs'
    inner product and differing ones -1, so the distance is ``(width - inner) / 2``, exact in float32
    (small integers): one BLAS product instead of a dozen int64 passes over every pair.
    """
    inner = bit_signs(a, width) @ bit_signs(b, width).T
    return ((width - inner) / 2).round().long()


def wicsum(scores: torch.Tensor, counts: torch.Tensor, ratio: float, attention: bool = False) -> torch.Tensor:
    """ReSV's WiCSum threshold (eqs. 1-3): ``(rows, clusters)`` scores to a ``(clusters,)`` bool.

    Per row, clusters are taken in descending score until the count-weighted sum of their scores
    reaches ``ratio`` of the row's total; the union over rows is returned. The paper is silent on
    negative scores: here a cluster's weight is its score clamped at 0 times its count, so a
    negative score adds nothing to either sum (it cannot help pass the threshold, and cannot pull
    the total down so that fewer clusters are needed); a row whose scores are all <= 0 keeps its
    best cluster. ``ratio`` >= 1 keeps every cluster. With ``attention`` a cluster weighs
    ``exp(score - best score of the row)`` times its count instead, its share of the row's softmax
    attention when every member scores like the representative (``scores`` already scaled).
    """
    if ratio >= 1 or scores.shape[1] == 0:
        return torch.ones(scores.shape[1], dtype=torch.bool)
    if attention:
        weights = (scores - scores.max(dim=1, keepdim=True).values).exp() * counts[None]
    else:
        weights = scores.clamp(min=0) * counts[None]
    need = ratio * weights.sum(dim=1)
    chosen = torch.zeros(scores.shape[1], dtype=torch.bool)
    rows, k = torch.arange(len(scores)), min(EARLY_EXIT_CLUSTERS, scores.shape[1])
    # V-Rex's early exit: rank only the best k per row, and rank further only rows not yet past the threshold.
    while len(rows):
        order = torch.topk(scores[rows], k, dim=1).indices
        ranked = torch.gather(weights[rows], 1, order)
        reached = ranked.cumsum(dim=1)
        before = reached - ranked
        # The minimal prefix: clusters before the one whose weight carries the sum past the threshold, and it.
        take = (before < need[rows, None]) | (torch.arange(k) == 0)
        chosen[order[take]] = True
        if k == scores.shape[1]:
            break
        rows = rows[reached[:, -1] < need[rows]]
        k = min(4 * k, scores.shape[1])
    return chosen


def _row_scores(queries: torch.Tensor, keys: torch.Tensor, rows: str) -> torch.Tensor:
    """``(group, tokens, dim)`` queries against ``(n, dim)`` keys as WiCSum's ``(rows, n)`` scores (see `ROWS`)."""
    if rows == "mean":
        return queries.mean(dim=1) @ keys.T
    scores = queries.reshape(-1, queries.shape[-1]) @ keys.T
    return scores.reshape(*queries.shape[:2], -1).amax(dim=1) if rows == "max" else scores


def _grown(buffer: torch.Tensor, rows: int, fill: float = 0) -> torch.Tensor:
    """``buffer`` with room for at least ``rows`` rows, doubling (a stream adds to it at every step)."""
    if len(buffer) >= rows:
        return buffer
    bigger = buffer.new_full((max(rows, 2 * len(buffer), 64), *buffer.shape[1:]), fill)
    bigger[: len(buffer)] = buffer
    return bigger


class _Clusters:
    """One layer's and key head's hash-cluster table (V-Rex's), in buffers that grow by doubling.

    Attributes:
        key_sum: ``(C, head_dim)`` float32: Key_cluster times count.
        count: ``(C,)`` tokens per cluster.
        bits: ``(C,)`` int64 hash bits of Key_cluster.
        owner: ``(slots,)`` cluster of each cached slot, -1 for none (text, or not indexed).
        exact: Hash bits to cluster, kept when only identical bits join a cluster (a Hamming
            threshold of 1): then a cluster's bits never change (the mean of keys on one side of
            every hyperplane stays on that side) and no two clusters share bits, so a lookup
            finds a token's cluster.
    """

    def __init__(self, head_dim: int):
        self.size, self.slots = 0, 0
        self._key_sum, self._count = torch.zeros((0, head_dim)), torch.zeros(0)
        self._bits, self._owner = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
        self.exact: dict[int, int] = {}

    key_sum = property(lambda self: self._key_sum[: self.size])
    count = property(lambda self: self._count[: self.size])
    bits = property(lambda self: self._bits[: self.size])
    owner = property(lambda self: self._owner[: self.slots])

    def cover(self, slots: int) -> None:
        """Track ``slots`` cached slots; slots new to the table (or dropped and refilled) own nothing."""
        self._owner = _grown(self._owner, slots, -1)
        self._owner[self.slots : slots] = -1
        self.slots = slots

    def add(self, clusters: int) -> None:
        """Make room for ``clusters`` new, empty clusters."""
        size = self.size + clusters
        self._key_sum, self._count = _grown(self._key_sum, size), _grown(self._count, size)
        self._bits = _grown(self._bits, size)
        self._key_sum[self.size : size], self._count[self.size : size] = 0, 0
        self.size = size


class ReSVPolicy:
    """Per-head retrieval over hash-bit clusters at every step (see the module docstring)."""

    name = "resv"

    def __init__(self, config: ReSVConfig = ReSVConfig()):
        self.config = config
        self._planes: torch.Tensor | None = None
        self._tables: dict[int, list[_Clusters]] = {}
        self._indexed: dict[int, int] = {}
        self._ratios: dict[tuple[str, int, int], list[float]] = defaultdict(list)  # (kind, layer, head) -> shares
        self._predicted: dict[int, torch.Tensor] = {}   # layer -> (kv_heads, slots) its previous layer predicted
        self._prefetch_hits = self._prefetch_wanted = 0

    def start(self, cache: KVCache) -> "ReSVPolicy":
        fresh = ReSVPolicy(self.config)
        if self.config.clustering and self.config.layout:
            fresh._lay_out(cache)
        return fresh

    def report(self) -> dict:
        """Retrieval ratios (selected share of the cached video, per head) by step kind: their mean,
        their spread over layers and heads, and each ``[layer][head]`` (V-Rex's Fig. 20); the clusters' size."""
        out = {}
        for kind in STEP_KINDS:
            shares = self.ratios_by_layer_head(kind)
            if shares:
                values = torch.tensor(list(shares.values()), dtype=torch.float64)
                out[f"{kind}_ratio"] = float(values.mean())
                out[f"{kind}_ratio_min"], out[f"{kind}_ratio_max"] = float(values.min()), float(values.max())
                layers, heads = max(layer for layer, _ in shares) + 1, max(head for _, head in shares) + 1
                out[f"{kind}_ratio_by_layer_head"] = [[shares.get((layer, head), math.nan) for head in range(heads)]
                                                      for layer in range(layers)]
        # NaN until something was predicted (everything on the device, or prefetch off).
        out["prefetch_hit_rate"] = self._prefetch_hits / self._prefetch_wanted if self._prefetch_wanted else math.nan
        tables = [t for heads in self._tables.values() for t in heads]
        if tables:
            out["clusters_per_head"] = sum(len(t.count) for t in tables) / len(tables)
            out["tokens_per_cluster"] = float(sum(t.count.sum() for t in tables) / max(sum(len(t.count) for t in tables), 1))
        return out

    def ratios_by_layer_head(self, kind: str = "frame") -> dict[tuple[int, int], float]:
        """Mean selected share of the cached video per (layer, key head) for one step kind."""
        return {(layer, head): sum(v) / len(v) for (k, layer, head), v in self._ratios.items() if k == kind and v}

    def select(self, layer: int, cache: KVCache, q: torch.Tensor, step: Step) -> Selection:
        tables = self._index(layer, cache)
        filled, rows = cache.filled[layer], cache.rows(layer)
        video = cache.tokens.kind[rows] == VIDEO
        keep = ~video | window_mask(filled, self.config.local_tokens) if self.config.local_tokens else ~video
        kv_heads = len(tables)
        # The rows per key head, scaled as the model's attention logits are (``attention`` weights depend on it).
        queries = (q[0].float().cpu() * q.shape[-1] ** -0.5).unflatten(0, (kv_heads, -1))   # (kv_heads, group, tokens, dim)
        pooling = "mean" if self.config.mean_frame_rows and step.kind == "frame" else self.config.rows
        picked = self._pick(layer, cache, tables, queries, pooling, video)                  # (kv_heads, filled)
        predicted = self._predicted.pop(layer, None)
        if predicted is not None:
            self._prefetch_hits += int((predicted & picked[:, : predicted.shape[1]]).sum())
            self._prefetch_wanted += int(picked.sum())
        self._prefetch_next(layer, cache, queries, pooling)
        for head in range(kv_heads):
            if video.any():
                share = float((picked[head] & video).sum()) / int(video.sum())
                self._ratios[(step.kind, layer, head)].append(share)
                step.retrieved += float((picked[head] & ~keep).sum()) / kv_heads
        heads = keep | picked
        slots = torch.nonzero(heads.any(dim=0)).flatten()
        return Selection(slots, heads=heads[:, slots])

    def _pick(self, layer: int, cache: KVCache, tables: list[_Clusters], queries: torch.Tensor, pooling: str,
              video: torch.Tensor) -> torch.Tensor:
        """``(kv_heads, filled)`` bool: the video slots each key head's rows select at ``layer``."""
        picked = torch.zeros((len(tables), len(video)), dtype=torch.bool)
        for head, table in enumerate(tables):
            if self.config.clustering:
                # Scores against Key_cluster (the sum over the count), divided after the product: rows are few.
                chosen = self._choose(_row_scores(queries[head], table.key_sum, pooling) / table.count.clamp(min=1),
                                      table.count)
                picked[head] = torch.cat([chosen, torch.zeros(1, dtype=torch.bool)])[table.owner]   # -1 owns nothing
            else:   # the ablation: every video token is its own cluster
                slots = torch.nonzero(video).flatten()
                keys = cache.read(layer, slots)[0][0, head].float().cpu()
                picked[head, slots] = self._choose(_row_scores(queries[head], keys, pooling), torch.ones(len(keys)))
        return picked

    def _prefetch_next(self, layer: int, cache: KVCache, queries: torch.Tensor, pooling: str) -> None:
        """V-Rex's KV prediction: this layer's rows choose the next layer's clusters, whose blocks
        below the device start moving up while this layer computes. The next layer's own rows
        decide what it attends; hits are counted. Nothing to do when its KV is all on the device."""
        following = layer + 1
        if not (self.config.prefetch and self.config.clustering and following < len(cache.filled)):
            return
        rows = cache.rows(following)
        video = cache.tokens.kind[rows] == VIDEO
        if cache.resident(following, torch.nonzero(video).flatten()):
            return
        predicted = self._pick(following, cache, self._index(following, cache), queries, pooling, video)
        self._predicted[following] = predicted
        slots = torch.nonzero(predicted.any(dim=0)).flatten()
        cache.prefetch(following, slots, predicted[:, slots])

    def _lay_out(self, cache: KVCache) -> None:
        """V-Rex's cluster-wise memory mapping: offloaded KV laid out by cluster, per key head, so a
        selected cluster is one block (one read); without it, offloaded KV stays in patch blocks."""
        try:
            cache.set_layout(self._group_of, per_head=True)
        except ConfigError as exc:
            log.warning("resv: offloaded KV stays in patch blocks, not laid out by cluster: %s", exc)

    def _group_of(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """``(kv_heads, len(slots))``: each slot's cluster per key head (-1: none, or not indexed yet)."""
        tables = self._tables[layer]
        groups = torch.full((len(tables), len(slots)), -1, dtype=torch.long)
        for head, table in enumerate(tables):
            known = slots < table.slots
            groups[head, known] = table.owner[slots[known]]
        return groups

    def _choose(self, scores: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if self.config.selection == "wicsum":
            return wicsum(scores, counts, self.config.ratio, self.config.weights == "attention")
        top = torch.topk(scores, min(self.config.top_clusters, scores.shape[1]), dim=1).indices
        return torch.zeros(scores.shape[1], dtype=torch.bool).index_fill_(0, top.flatten(), True)

    # -- the hash-cluster tables -------------------------------------------------------------------
    def _index(self, layer: int, cache: KVCache) -> list[_Clusters]:
        """The layer's tables per key head, with the video slots written since they were last read."""
        filled, rows = cache.filled[layer], cache.rows(layer)
        keys_all = cache.read(layer, torch.empty(0, dtype=torch.long))[0]
        kv_heads, dim = keys_all.shape[1], keys_all.shape[3]
        if self._planes is None:
            generator = torch.Generator().manual_seed(self.config.seed)
            self._planes = torch.randn((dim, self.config.hyperplanes), generator=generator)
        tables = self._tables.setdefault(layer, [_Clusters(dim) for _ in range(kv_heads)])
        start = min(self._indexed.get(layer, 0), filled)  # a question's slots may have been dropped
        for table in tables:
            table.cover(filled)
        new = torch.nonzero(cache.tokens.kind[rows[start:filled]] == VIDEO).flatten() + start
        self._indexed[layer] = filled
        if len(new) and self.config.clustering:
            keys = cache.read(layer, new)[0][0].float().cpu()   # (kv_heads, n, head_dim)
            for head, table in enumerate(tables):
                self._cluster(table, new, keys[head])
        return tables

    def _cluster(self, table: _Clusters, slots: torch.Tensor, keys: torch.Tensor) -> None:
        """Assign new tokens: to the nearest existing cluster under the threshold, else among themselves."""
        threshold, width = self.config.hamming_threshold, self.config.hyperplanes
        bits = hash_bits(keys, self._planes)
        owner = torch.full((len(slots),), -1, dtype=torch.long)
        if threshold == 1:
            owner = torch.tensor([table.exact.get(b, -1) for b in bits.tolist()], dtype=torch.long)
        elif table.size:
            nearest = hamming(bits, table.bits, width).min(dim=1)
            joins = nearest.values < threshold
            owner[joins] = nearest.indices[joins]
        # The rest, in token order: each joins the nearest cluster begun before it in this step, if close
        # enough. One with no close token before it begins a cluster whatever came before.
        alone = torch.nonzero(owner < 0).flatten()
        among = hamming(bits[alone], bits[alone], width)
        begins = (~(among < threshold).tril(-1).any(dim=1)).tolist()
        among = among.tolist()
        leaders: list[int] = []   # positions in ``alone`` of the tokens that began a cluster
        assigned: list[int] = []
        for i in range(len(alone)):
            best = None if begins[i] else min(leaders, key=among[i].__getitem__)
            if best is not None and among[i][best] < threshold:
                assigned.append(assigned[best])
            else:
                assigned.append(table.size + len(leaders))
                leaders.append(i)
        owner[alone] = torch.tensor(assigned, dtype=torch.long)
        fresh = table.size
        table.add(len(leaders))
        table.key_sum.index_add_(0, owner, keys)
        table.count.index_add_(0, owner, torch.ones(len(owner)))
        touched = torch.unique(owner)
        table.bits[touched] = hash_bits(table.key_sum[touched] / table.count[touched, None], self._planes)
        if threshold == 1:
            table.exact.update(zip(table.bits[fresh:].tolist(), range(fresh, table.size)))
        table.owner[slots] = owner
