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

from vidsight.kv.policies.base import Selection, Step
from vidsight.kv.policies.clusters import ClusterTable, cosine_variance, split_in_two, unit
from vidsight.kv.policies.common import NewVideo, QuestionChoice, sink_mask, video_mask, window_mask
from vidsight.kv.policies.configs import MosaicConfig
from vidsight.kv.store import KVStore


@dataclasses.dataclass(frozen=True)
class Clustering:
    """How memory is organised: Mosaic's two levels, or an ablation with one or none.

    Attributes:
        by_frames: Temporal patches form visual partitions by what they look like (else one partition).
        by_keys: Within a partition, tokens form semantic clusters by their keys (else the
            partition is one cluster, never split).
    """

    by_frames: bool
    by_keys: bool

    @property
    def clusters(self) -> bool:
        """Whether there are clusters at all (else retrieval is token-level top-k)."""
        return self.by_frames or self.by_keys

    @property
    def two_stage(self) -> bool:
        """Retrieval picks partitions first, then clusters within them."""
        return self.by_frames and self.by_keys


CLUSTERINGS = {"nested": Clustering(by_frames=True, by_keys=True), "visual": Clustering(by_frames=True, by_keys=False),
               "semantic": Clustering(by_frames=False, by_keys=True), "none": Clustering(by_frames=False, by_keys=False)}


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
        self.clustering = CLUSTERINGS[config.clustering]
        self.stats = MosaicStats()
        self.visual = ClusterTable()                 # temporal patches, by pooled visual embedding
        self._frame_partition: dict[int, int] = {}   # frame index -> visual cluster
        self._layers: dict[int, ClusterTable] = {}
        self._frames: dict[int, set[int]] = {}       # layer -> frames indexed (for the token budget)
        self._new = NewVideo()
        self._chosen = QuestionChoice()
        self._predicted: dict[int, set[int]] = {}

    def start(self, cache: KVStore) -> "MosaicPolicy":
        fresh = MosaicPolicy(self.config)
        if cache.offload is not None:
            cache.offload.set_layout(fresh._group_of)  # offloaded KV stays cluster-contiguous
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
    def select(self, layer: int, cache: KVStore, q: torch.Tensor, step: Step) -> Selection:
        self._unrotate = step.unrotate
        if layer == 0:
            for frame_index, embeds in step.patches:
                self._place_frame(frame_index, embeds)
        table = self._index(layer, cache)
        filled = cache.filled[layer]
        recalled = self._chosen.recall(layer, filled) if step.kind == "answer" else None
        if recalled is not None:
            chosen, summaries = recalled
            return Selection(torch.nonzero(chosen).flatten(), *summaries)
        keep = self._kept(cache, layer)
        query = _query(q if self.config.rotated else step.unrotate(q, step.positions.to(q.device)), cache.shape[0])
        chosen = self._retrieve(layer, cache, table, query, keep)
        if layer in self._predicted:
            self.stats.prefetch_hits += len(self._predicted.pop(layer) & set(chosen))
            self.stats.prefetch_wanted += len(chosen)
        if self.config.prefetch and layer + 1 < len(cache.filled):
            self._prefetch(layer + 1, cache, query, keep)
        retrieved = torch.zeros(filled, dtype=torch.bool)
        if not self.clustering.clusters:
            retrieved[torch.tensor(chosen, dtype=torch.long)] = True
        else:
            for cluster in chosen:
                if table.lazy[cluster]:   # Algorithm 1, lines 12-17: fetched now, so split now
                    self._split(layer, table, cluster, cache, fetched=True)
            retrieved[: len(table.owner)] = torch.isin(table.owner, torch.tensor(chosen, dtype=torch.long))
        step.retrieved += int((retrieved & ~keep).sum())
        summaries = self._summaries(table, keep | retrieved, cache.shape)
        if step.kind == "question":
            self._chosen.remember(layer, torch.nonzero(keep | retrieved).flatten(), filled, *summaries)
        return Selection(torch.nonzero(keep | retrieved).flatten(), *summaries)

    def _prefetch(self, following: int, cache: KVStore, query: torch.Tensor, keep: torch.Tensor) -> None:
        """Predict the next layer's clusters from this layer's query, and start moving them up."""
        table = self._index(following, cache)
        predicted = self._retrieve(following, cache, table, query, keep)
        self._predicted[following] = set(predicted)
        if predicted and self.clustering.clusters and cache.offload is not None:
            cache.offload.prefetch(following, torch.nonzero(torch.isin(table.owner, torch.tensor(predicted))).flatten())

    def _group_of(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """The cluster of each of ``slots`` of ``layer`` (-1: none yet), for the tiers' layout."""
        table = self._layers.get(layer)
        if table is None:
            return torch.full((len(slots),), -1, dtype=torch.long)
        known = slots < len(table.owner)
        out = torch.full((len(slots),), -1, dtype=torch.long)
        out[known] = table.owner[slots[known]]
        return out

    def _kept(self, cache: KVStore, layer: int) -> torch.Tensor:
        """Slots every step attends to: text (the system prompt, kept dialogue) and the local window."""
        filled = cache.filled[layer]
        return (sink_mask(cache, layer, first_frame=False) | window_mask(filled, self.config.local_tokens)
                | ~video_mask(cache, layer))

    def _resident(self, cache: KVStore, layer: int, slots: torch.Tensor) -> bool:
        return cache.offload is None or cache.offload.resident(layer, slots)

    # -- building and keeping the clusters ---------------------------------------------------------
    def _place_frame(self, frame_index: int, embeds: torch.Tensor) -> None:
        """Put a temporal patch in the visual cluster it looks most like, or a new one (or, without
        visual partitions, in the one partition)."""
        vector = unit(embeds.float().mean(dim=0).cpu())[None]
        if not self.clustering.by_frames:
            partition = 0 if self.visual.size else self.visual.add(vector, vector, vector, vector, visual=0,
                                                                   first=frame_index)
        else:
            partition = self.visual.assign(vector, lambda n: self.config.visual_tau, first=frame_index)
        self._frame_partition[frame_index] = partition

    def _index(self, layer: int, cache: KVStore) -> ClusterTable:
        """The layer's clusters, with the video slots written since it was last read assigned."""
        table = self._layers.setdefault(layer, ClusterTable())
        filled = cache.filled[layer]
        if filled < len(table.owner):  # a question's slots were dropped
            table.owner = table.owner[:filled]
        table.owner = torch.cat([table.owner, torch.full((filled - len(table.owner),), -1, dtype=torch.long)])
        new = self._new.take(cache, layer)
        if len(new) == 0:
            return table
        frames = cache.layer_tokens(layer, new).frame_index
        self._frames.setdefault(layer, set()).update(frames.tolist())
        if not self.clustering.clusters:
            return table
        scores, keys, values = self._read(layer, cache, new)
        partition = torch.tensor([self._frame_partition.get(f, 0) for f in frames.tolist()])
        for group in torch.unique(partition).tolist():
            mine = partition == group
            self._absorb(layer, table, cache, new[mine], scores[mine], keys[mine], values[mine], group)
        return table

    def _read(self, layer: int, cache: KVStore, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(n, kv_heads * head_dim)`` float32 rows of ``slots``: the keys as scored, the keys, the values."""
        keys, values = cache.read(layer, slots)
        scores = keys if self.config.rotated else self._unrotate(
            keys, cache.layer_tokens(layer, slots).position.T.to(keys.device))
        return _flat(scores), _flat(keys), _flat(values)

    def _absorb(self, layer: int, table: ClusterTable, cache: KVStore, slots, scores, keys, values, group: int
                ) -> None:
        """Assign one visual partition's new tokens; split, or defer splitting, the clusters they make invalid."""
        units = unit(scores)
        candidates = table.candidates(group)
        if len(candidates) == 0:
            table.owner[slots] = table.add(units, scores, keys, values, visual=group, first=int(slots[0]))
            if self.clustering.by_keys:
                self._check(layer, table, table.size - 1, cache)
            return
        if not self.clustering.by_keys:  # one cluster per partition: never split
            table.extend(int(candidates[0]), slots, units, scores, keys, values)
            return
        best = candidates[(units @ unit(table.unit_sum[candidates]).T).argmax(dim=1)]
        clusters, groups = torch.unique(best, return_inverse=True)
        sizes = table.count[clusters] + torch.bincount(groups, minlength=len(clusters))
        fits = cosine_variance(table.unit_sum[clusters].index_add(0, groups, units), sizes) \
            <= size_threshold(sizes.double(), self.config)   # in double, as the threshold of one size is
        # Most clusters take their newcomers and stay cohesive: those are extended together (a loop over
        # clusters was most of a frame step's upkeep). A split in the loop below only fills the
        # partition towards its cap, which can make a cluster unsplittable, never splittable.
        settled = (fits | ~self._splittable(table, group, sizes)) & ~table.lazy[clusters]
        joining = settled[groups]
        table.extend_rows(best[joining], slots[joining], units[joining], scores[joining], keys[joining],
                          values[joining])
        for index in torch.nonzero(~settled).flatten().tolist():   # ascending cluster ids, as they were made
            cluster, mine = int(clusters[index]), groups == index
            if table.lazy[cluster]:   # already waiting for its split: newcomers wait beside it
                self._wait(table, cluster, slots[mine], units[mine], scores[mine], keys[mine], values[mine])
                continue
            cohesive = bool(fits[index] | ~self._splittable(table, group, sizes[index]))
            if cohesive or self.config.split == "eager" or self._resident(cache, layer, table.members(cluster)):
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

    def _splittable(self, table: ClusterTable, visual: int, sizes: torch.Tensor) -> torch.Tensor:
        """Per size (of a cluster of partition ``visual``), large enough to split, with the partition
        below its cluster cap (both bound the upkeep)."""
        return (sizes >= self.config.min_split_size) & (len(table.candidates(visual)) < self.config.max_clusters)

    def _check(self, layer: int, table: ClusterTable, cluster: int, cache: KVStore) -> None:
        size = table.count[cluster]
        if bool(self._splittable(table, int(table.visual[cluster]), size)) \
                and table.variance(cluster) > size_threshold(int(size), self.config):
            self._split(layer, table, cluster, cache, fetched=False)

    def _split(self, layer: int, table: ClusterTable, cluster: int, cache: KVStore, fetched: bool) -> None:
        """Split ``cluster``, with the newcomers waiting on it, in two by its members' keys."""
        table.merge_waiting(cluster)
        table.lazy[cluster] = False
        members = table.members(cluster)
        if not fetched and not self._resident(cache, layer, members):
            self.stats.maintenance_transfers += 1
        scores, keys, values = self._read(layer, cache, members)
        second = split_in_two(unit(scores))
        if second is not None:
            table.replace(cluster, members, second, unit(scores), scores, keys, values)
            self.stats.splits += 1

    # -- retrieval -----------------------------------------------------------------------------------
    def _retrieve(self, layer: int, cache: KVStore, table: ClusterTable, query: torch.Tensor,
                  keep: torch.Tensor) -> list[int]:
        """The clusters (for ``none``: the token slots) the query retrieves within the budget."""
        frames = max(len(self._frames.get(layer, ())), 1)
        video = int(video_mask(cache, layer).sum())
        budget = self.config.top_frames * max(1, video // frames)
        if not self.clustering.clusters:
            return self._top_tokens(layer, cache, query, keep, budget)
        if table.size == 0:
            return []
        outside = table.outside(keep)
        live = torch.nonzero(outside > 0).flatten()
        if len(live) == 0:
            return []
        scores = table.mean_scores(live) @ query
        if self.clustering.two_stage:   # stage 1: the best visual partitions
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

    def _top_tokens(self, layer: int, cache: KVStore, query: torch.Tensor, keep: torch.Tensor, budget: int
                    ) -> list[int]:
        """The ablation without clusters: the ``budget`` video tokens whose keys best match the query."""
        candidates = torch.nonzero(video_mask(cache, layer) & ~keep).flatten()
        if len(candidates) == 0:
            return []
        scores = self._read(layer, cache, candidates)[0] @ query
        return candidates[torch.topk(scores, min(budget, len(candidates))).indices].tolist()

    def _summaries(self, table: ClusterTable, attended: torch.Tensor, shape: tuple[int, int]
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, kv_heads, m, head_dim)`` representatives of the clusters left out, in temporal order."""
        heads, dim = shape
        if not self.config.summaries or table.size == 0 or not self.clustering.clusters:
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
