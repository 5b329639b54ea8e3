"""Mosaic's cross-modal cluster memory (seed 002) as a retrieval policy.

Frames are clustered by what they look like (the vision tower's merged output, pooled per
temporal patch); within each visual cluster, and per layer, cached tokens are clustered by their
keys. Both levels use cosine similarity: vectors are L2-normalised, a cluster's variance is the
mean squared distance of its members to their mean, ``1 - |mean|^2``. New entries join the most
similar cluster greedily, updating the statistics without revisiting old entries; a cluster
whose variance passes the size-adaptive threshold (`size_threshold`) is split in two (cosine
2-means) at once when its tokens are on the device, otherwise later (`MosaicConfig.split`).

A step's retrieval is two-stage: the query (the mean of the step's queries, per key head) is
matched against each visual partition's representative key (the mean key of its tokens in that
layer), then against the semantic clusters of the best ``visual_top`` partitions, which are taken
in order of score while they fit the token budget. The step attends to the retrieved clusters,
the text, the local window and, as summary entries, the representative (mean key, mean value)
of every cluster not retrieved, in temporal order (`Selection`). A question's selection is kept
for its answer's tokens, as ReKV does.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import VIDEO, KVCache
from vidsight.kv.clusters import ClusterTable, split_in_two, unit
from vidsight.kv.retrieval import Selection, Step, sink_mask, window_mask

CLUSTERINGS = ("nested", "visual", "semantic", "none")
SPLITS = ("deferred", "eager")


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Mosaic's settings. The paper's thresholds did not survive extraction; ours are named here,
    chosen from the task model's keys: one temporal patch of background has a cosine variance
    of 0.006 (layer 0) to 0.07 (layer 3), a patch with an object 0.25 to 0.39.

    Attributes:
        local_tokens: The most recent cached tokens every step attends to (ReKV's window, so the
            two compare at the same one).
        top_frames: The retrieval budget, in temporal patches' worth of tokens (ReKV's 64 frames).
        visual_top: Visual partitions searched at the second stage.
        tau_small: Variance threshold of a one-token cluster (the stricter one).
        tau_large: Variance threshold of a large cluster (the looser one).
        tau_rate: Cluster size over which the threshold moves from ``tau_small`` to ``tau_large``.
        visual_tau: Variance threshold of a visual cluster. Pooled frame embeddings vary far
            less than keys (consecutive frames of one shot are nearly identical); at 0.002 the
            chat suite's streams (two to four shots, three brief objects each) form about five
            visual clusters, at 0.01 under three, merging the frames that show an object into
            their shot (the sweep: docs/benchmarks.md).
        min_split_size: Clusters smaller than this are never split (the paper: small clusters are
            unstable and should not be split aggressively).
        max_clusters: Semantic clusters per visual partition and layer past which none is split:
            a split reads every member, so without a cap keys that are all far apart (random
            weights) would split on every patch.
        clustering: ``nested`` (Mosaic), or an ablation: ``visual`` (frames only), ``semantic``
            (keys only, one partition), ``none`` (token-level top-k over every video key).
        split: ``deferred`` (Algorithm 1: wait until the cluster is fetched) or ``eager``.
        summaries: Attend to the representatives of the clusters not retrieved.
        prefetch: Predict layer l+1's clusters from layer l's query and count the hits.
        rotated: Cluster and score keys and queries as the cache holds them, after the rotary
            embedding (Mosaic does not say which). False compares them before it, as ReKV's code
            scores; the thresholds above were chosen on rotated keys, and before rotation the same
            thresholds leave a few large clusters (measured in docs/benchmarks.md), so the default
            stays rotated. Summaries are rotated keys either way.
    """

    local_tokens: int = 15000
    top_frames: int = 64
    visual_top: int = 4
    tau_small: float = 0.05
    tau_large: float = 0.15
    tau_rate: float = 16.0
    visual_tau: float = 0.002
    min_split_size: int = 32
    max_clusters: int = 64
    clustering: str = "nested"
    split: str = "deferred"
    summaries: bool = True
    prefetch: bool = True
    rotated: bool = True

    def __post_init__(self):
        if min(self.local_tokens, self.top_frames, self.visual_top, self.min_split_size, self.max_clusters) < 1 \
                or self.tau_rate <= 0:
            raise ConfigError("local_tokens, top_frames, visual_top, min_split_size, max_clusters and tau_rate "
                              "must be positive")
        if not 0 < self.tau_small <= self.tau_large <= 2 or not 0 < self.visual_tau <= 2:
            raise ConfigError("need 0 < tau_small <= tau_large <= 2 (cosine variances lie in [0, 2])")
        if self.clustering not in CLUSTERINGS or self.split not in SPLITS:
            raise ConfigError(f"clustering must be one of {CLUSTERINGS} and split one of {SPLITS}")


def size_threshold(size: int | torch.Tensor, config: MosaicConfig):
    """Mosaic's eq. 5 as we read it: ``tau_large + (tau_small - tau_large) * exp(-(size - 1) / tau_rate)``."""
    if isinstance(size, torch.Tensor):
        return config.tau_large + (config.tau_small - config.tau_large) * torch.exp(-(size - 1) / config.tau_rate)
    return config.tau_large + (config.tau_small - config.tau_large) * math.exp(-(size - 1) / config.tau_rate)


@dataclasses.dataclass
class MosaicStats:
    """What maintenance and prefetch did, summed over layers."""

    splits: int = 0
    deferred_splits: int = 0
    maintenance_transfers: int = 0
    prefetch_hits: int = 0
    prefetch_wanted: int = 0

    @property
    def prefetch_hit_rate(self) -> float:
        return self.prefetch_hits / self.prefetch_wanted if self.prefetch_wanted else float("nan")


class MosaicPolicy:
    """Cluster-level retrieval over a stream's KV (see the module docstring)."""

    name = "mosaic"

    def __init__(self, config: MosaicConfig = MosaicConfig()):
        self.config = config
        self.stats = MosaicStats()
        self.visual = ClusterTable()                 # temporal patches, by pooled visual embedding
        self._frame_partition: dict[int, int] = {}   # frame index -> visual cluster
        self._layers: dict[int, ClusterTable] = {}
        self._frames: dict[int, set[int]] = {}       # layer -> frames indexed (for the token budget)
        self._answer: dict[int, Selection] = {}      # layer -> its question's selection
        self._question_start: dict[int, int] = {}
        self._predicted: dict[int, set[int]] = {}
        self._shape = (0, 0)

    def start(self, cache: KVCache) -> "MosaicPolicy":
        fresh = MosaicPolicy(self.config)
        cache.set_layout(fresh._group_of)  # offloaded KV stays cluster-contiguous
        return fresh

    def report(self) -> dict:
        """Live clusters (visual; semantic per layer on average), splits, transfers, prefetch hits."""
        layers = [t.live() for t in self._layers.values()]
        tables = [self.visual, *self._layers.values()]
        index = sum(x.nbytes for t in tables for name in ClusterTable.SUMS if (x := getattr(t, name)) is not None)
        return {"visual_clusters": self.visual.live(), "semantic_clusters_per_layer": sum(layers) / max(len(layers), 1),
                **dataclasses.asdict(self.stats), "prefetch_hit_rate": self.stats.prefetch_hit_rate,
                "index_bytes": index}

    # -- the seam --------------------------------------------------------------------------------
    def select(self, layer: int, cache: KVCache, q: torch.Tensor, step: Step) -> Selection:
        self._unrotate = step.unrotate
        if layer == 0:
            for frame_index, embeds in step.patches:
                self._place_frame(frame_index, embeds)
        self._shape = cache.read(layer, torch.empty(0, dtype=torch.long))[0].shape[1::2]  # (kv_heads, head_dim)
        table = self._index(layer, cache)
        filled = cache.filled[layer]
        if step.kind == "answer" and layer in self._answer:
            chosen = self._answer[layer]
            slots = torch.cat([chosen.slots, torch.arange(self._question_start[layer], filled)])
            return Selection(slots, chosen.keys, chosen.values)
        keep = self._kept(cache, layer)
        query = _query(q if self.config.rotated else step.unrotate(q, step.positions.to(q.device)), self._shape[0])
        chosen = self._retrieve(layer, cache, table, query, keep)
        if layer in self._predicted:
            self.stats.prefetch_hits += len(self._predicted.pop(layer) & set(chosen))
            self.stats.prefetch_wanted += len(chosen)
        if self.config.prefetch and layer + 1 < len(cache.filled):
            following = self._index(layer + 1, cache)
            predicted = self._retrieve(layer + 1, cache, following, query, keep)
            self._predicted[layer + 1] = set(predicted)
            if predicted and self.config.clustering != "none":
                cache.prefetch(layer + 1, torch.nonzero(torch.isin(following.owner, torch.tensor(predicted))).flatten())
        retrieved = torch.zeros(filled, dtype=torch.bool)
        if self.config.clustering == "none":
            retrieved[torch.tensor(chosen, dtype=torch.long)] = True
        else:
            for cluster in chosen:
                if table.lazy[cluster]:   # Algorithm 1, lines 12-17: fetched now, so split now
                    self._split(layer, table, cluster, cache, fetched=True)
            retrieved[: len(table.owner)] = torch.isin(table.owner, torch.tensor(chosen, dtype=torch.long))
        step.retrieved += int((retrieved & ~keep).sum())
        selection = Selection(torch.nonzero(keep | retrieved).flatten(), *self._summaries(table, keep | retrieved))
        if step.kind == "question":
            self._answer[layer], self._question_start[layer] = selection, filled
        return selection

    def _group_of(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """The cluster of each of ``slots`` of ``layer`` (-1: none yet), for the tiers' layout."""
        table = self._layers.get(layer)
        if table is None:
            return torch.full((len(slots),), -1, dtype=torch.long)
        known = slots < len(table.owner)
        out = torch.full((len(slots),), -1, dtype=torch.long)
        out[known] = table.owner[slots[known]]
        return out

    def _kept(self, cache: KVCache, layer: int) -> torch.Tensor:
        """Slots every step attends to: text (the system prompt, kept dialogue) and the local window."""
        filled, rows = cache.filled[layer], cache.rows(layer)
        return (sink_mask(cache, layer, first_frame=False) | window_mask(filled, self.config.local_tokens)
                | (cache.tokens.kind[rows] != VIDEO))

    # -- building and keeping the clusters ---------------------------------------------------------
    def _place_frame(self, frame_index: int, embeds: torch.Tensor) -> None:
        """Put a temporal patch in the visual cluster it looks most like, or a new one."""
        vector = unit(embeds.float().mean(dim=0).cpu())[None]
        if self.config.clustering in ("semantic", "none"):
            partition = 0 if self.visual.size else self.visual.add(vector, vector, vector, vector, visual=0,
                                                                   first=frame_index)
        else:
            partition = self.visual.assign(vector, lambda n: self.config.visual_tau, first=frame_index)
        self._frame_partition[frame_index] = partition

    def _index(self, layer: int, cache: KVCache) -> ClusterTable:
        """The layer's clusters, with the video slots written since it was last read assigned."""
        table = self._layers.setdefault(layer, ClusterTable())
        filled, rows = cache.filled[layer], cache.rows(layer)
        if filled < len(table.owner):  # a question's slots were dropped
            table.owner = table.owner[:filled]
            table.indexed = min(table.indexed, filled)
        table.owner = torch.cat([table.owner, torch.full((filled - len(table.owner),), -1, dtype=torch.long)])
        new = torch.nonzero(cache.tokens.kind[rows[table.indexed : filled]] == VIDEO).flatten() + table.indexed
        table.indexed = filled
        if len(new) == 0:
            return table
        frames = cache.tokens.frame_index[rows[new]]
        self._frames.setdefault(layer, set()).update(frames.tolist())
        if self.config.clustering == "none":
            return table
        scores, keys, values = self._read(layer, cache, new)
        partition = torch.tensor([self._frame_partition.get(f, 0) for f in frames.tolist()])
        for group in torch.unique(partition).tolist():
            mine = partition == group
            self._absorb(layer, table, cache, new[mine], scores[mine], keys[mine], values[mine], group)
        return table

    def _read(self, layer: int, cache: KVCache, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(n, kv_heads * head_dim)`` float32 rows of ``slots``: the keys as scored, the keys, the values."""
        keys, values = cache.read(layer, slots)
        scores = keys if self.config.rotated else self._unrotate(
            keys, cache.tokens.position[cache.rows(layer)[slots]].T.to(keys.device))
        return _flat(scores), _flat(keys), _flat(values)

    def _absorb(self, layer: int, table: ClusterTable, cache: KVCache, slots, scores, keys, values, group: int
                ) -> None:
        """Assign one visual partition's new tokens; split, or defer splitting, the clusters they make invalid."""
        units = unit(scores)
        candidates = table.candidates(group)
        if len(candidates) == 0:
            table.owner[slots] = table.add(units, scores, keys, values, visual=group, first=int(slots[0]))
            if self.config.clustering != "visual":
                self._check(layer, table, table.size - 1, cache)
            return
        if self.config.clustering == "visual":  # one cluster per visual partition: never split
            table.extend(int(candidates[0]), slots, units, scores, keys, values)
            return
        best = candidates[(units @ unit(table.unit_sum[candidates]).T).argmax(dim=1)]
        for cluster in torch.unique(best).tolist():
            mine = best == cluster
            if table.lazy[cluster]:   # already waiting for its split: newcomers wait beside it
                self._wait(table, cluster, slots[mine], units[mine], scores[mine], keys[mine], values[mine])
                continue
            size = int(table.count[cluster]) + int(mine.sum())
            cohesive = not self._splittable(table, cluster, size) or table.variance_with(
                cluster, units[mine]) <= size_threshold(size, self.config)
            if cohesive or self.config.split == "eager" or cache.resident(layer, table.members(cluster)):
                table.extend(cluster, slots[mine], units[mine], scores[mine], keys[mine], values[mine])
                if not cohesive:
                    self._split(layer, table, cluster, cache, fetched=False)
            else:   # Algorithm 1, lines 7-10: offloaded, so the newcomers wait as a cluster of their own
                table.lazy[cluster] = True
                self.stats.deferred_splits += 1
                self._wait(table, cluster, slots[mine], units[mine], scores[mine], keys[mine], values[mine])

    @staticmethod
    def _wait(table: ClusterTable, parent: int, slots, units, scores, keys, values) -> None:
        table.owner[slots] = table.add(units, scores, keys, values, visual=int(table.visual[parent]), first=int(slots[0]),
                                       parent=parent)

    def _splittable(self, table: ClusterTable, cluster: int, size: int) -> bool:
        """Large enough to split, and its partition below its cluster cap (both bound the upkeep)."""
        return size >= self.config.min_split_size and len(table.candidates(int(table.visual[cluster]))) \
            < self.config.max_clusters

    def _check(self, layer: int, table: ClusterTable, cluster: int, cache: KVCache) -> None:
        size = int(table.count[cluster])
        if self._splittable(table, cluster, size) and table.variance(cluster) > size_threshold(size, self.config):
            self._split(layer, table, cluster, cache, fetched=False)

    def _split(self, layer: int, table: ClusterTable, cluster: int, cache: KVCache, fetched: bool) -> None:
        """Split ``cluster``, with the newcomers waiting on it, in two by its members' keys."""
        table.merge_waiting(cluster)
        table.lazy[cluster] = False
        members = table.members(cluster)
        if not fetched and not cache.resident(layer, members):
            self.stats.maintenance_transfers += 1
        scores, keys, values = self._read(layer, cache, members)
        second = split_in_two(unit(scores))
        if second is not None:
            table.replace(cluster, members, second, unit(scores), scores, keys, values)
            self.stats.splits += 1

    # -- retrieval -----------------------------------------------------------------------------------
    def _retrieve(self, layer: int, cache: KVCache, table: ClusterTable, query: torch.Tensor,
                  keep: torch.Tensor) -> list[int]:
        """The clusters (for ``none``: the token slots) the query retrieves within the budget."""
        frames = max(len(self._frames.get(layer, ())), 1)
        video = int((cache.tokens.kind[cache.rows(layer)] == VIDEO).sum())
        budget = self.config.top_frames * max(1, video // frames)
        if self.config.clustering == "none":
            return self._top_tokens(layer, cache, query, keep, budget)
        if table.size == 0:
            return []
        outside = table.outside(keep)
        live = torch.nonzero(outside > 0).flatten()
        if len(live) == 0:
            return []
        scores = table.mean_scores(live) @ query
        if self.config.clustering == "nested":   # stage 1: the best visual partitions
            partitions = torch.unique(table.visual[live])
            best = torch.topk(table.partition_mean_scores(partitions) @ query, min(self.config.visual_top, len(partitions)))
            inside = torch.isin(table.visual[live], partitions[best.indices])
            live, scores = live[inside], scores[inside]
        taken, used = [], 0
        for cluster in live[torch.argsort(scores, descending=True)].tolist():  # stage 2, while they fit
            if used + int(outside[cluster]) <= budget:
                taken.append(cluster)
                used += int(outside[cluster])
        return taken

    def _top_tokens(self, layer: int, cache: KVCache, query: torch.Tensor, keep: torch.Tensor, budget: int
                    ) -> list[int]:
        """The ablation without clusters: the ``budget`` video tokens whose keys best match the query."""
        rows = cache.rows(layer)
        candidates = torch.nonzero((cache.tokens.kind[rows] == VIDEO) & ~keep).flatten()
        if len(candidates) == 0:
            return []
        scores = self._read(layer, cache, candidates)[0] @ query
        return candidates[torch.topk(scores, min(budget, len(candidates))).indices].tolist()

    def _summaries(self, table: ClusterTable, attended: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, kv_heads, m, head_dim)`` representatives of the clusters left out, in temporal order."""
        heads, dim = self._shape
        if not self.config.summaries or table.size == 0 or self.config.clustering == "none":
            empty = torch.zeros((1, heads, 0, dim))
            return empty, empty
        left = torch.nonzero(table.outside(attended) > 0).flatten()
        left = left[torch.argsort(table.first[left])]
        return tuple(x.reshape(len(left), heads, dim).permute(1, 0, 2)[None]
                     for x in (table.mean_keys(left), table.mean_values(left)))


def _flat(x: torch.Tensor) -> torch.Tensor:
    """``(1, kv_heads, n, head_dim)`` to ``(n, kv_heads * head_dim)`` float32 on the CPU."""
    return x[0].permute(1, 0, 2).reshape(x.shape[2], -1).float().cpu()


def _query(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """A step's queries ``(1, heads, L, head_dim)`` as one ``(kv_heads * head_dim,)`` vector: the mean
    over the step's tokens, summed over the query heads that share each key head (as ReKV scores)."""
    heads = q.shape[1]
    return q[0].float().cpu().mean(dim=1).reshape(kv_heads, heads // kv_heads, -1).sum(dim=1).reshape(-1)
