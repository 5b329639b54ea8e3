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

import logging
import math
from collections import defaultdict

import torch

from vidsight.errors import ConfigError
from vidsight.kv.policies.base import STEP_KINDS, Selection, Step
from vidsight.kv.policies.common import NewVideo, video_mask, window_mask
from vidsight.kv.policies.configs import ReSVConfig
from vidsight.kv.policies.resv_tables import HashClusters, hamming, hash_bits, row_scores, wicsum
from vidsight.kv.store import KVStore

log = logging.getLogger(__name__)


class ReSVPolicy:
    """Per-head retrieval over hash-bit clusters at every step (see the module docstring)."""

    name = "resv"

    def __init__(self, config: ReSVConfig = ReSVConfig()):
        self.config = config
        self._planes: torch.Tensor | None = None
        self._tables: dict[int, list[HashClusters]] = {}
        self._new = NewVideo()
        self._ratios: dict[tuple[str, int, int], list[float]] = defaultdict(list)  # (kind, layer, head) -> shares
        self._predicted: dict[int, torch.Tensor] = {}   # layer -> (kv_heads, slots) its previous layer predicted
        self._prefetch_hits = self._prefetch_wanted = 0

    def start(self, cache: KVStore) -> "ReSVPolicy":
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

    def select(self, layer: int, cache: KVStore, q: torch.Tensor, step: Step) -> Selection:
        tables = self._index(layer, cache)
        filled = cache.filled[layer]
        video = video_mask(cache, layer)
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

    def _pick(self, layer: int, cache: KVStore, tables: list[HashClusters], queries: torch.Tensor, pooling: str,
              video: torch.Tensor) -> torch.Tensor:
        """``(kv_heads, filled)`` bool: the video slots each key head's rows select at ``layer``."""
        picked = torch.zeros((len(tables), len(video)), dtype=torch.bool)
        for head, table in enumerate(tables):
            if self.config.clustering:
                # Scores against Key_cluster (the sum over the count), divided after the product: rows are few.
                chosen = self._choose(row_scores(queries[head], table.key_sum, pooling) / table.count.clamp(min=1),
                                      table.count)
                picked[head] = torch.cat([chosen, torch.zeros(1, dtype=torch.bool)])[table.owner]   # -1 owns nothing
            else:   # the ablation: every video token is its own cluster
                slots = torch.nonzero(video).flatten()
                keys = cache.read(layer, slots)[0][0, head].float().cpu()
                picked[head, slots] = self._choose(row_scores(queries[head], keys, pooling), torch.ones(len(keys)))
        return picked

    def _prefetch_next(self, layer: int, cache: KVStore, queries: torch.Tensor, pooling: str) -> None:
        """V-Rex's KV prediction: this layer's rows choose the next layer's clusters, whose blocks
        below the device start moving up while this layer computes. The next layer's own rows
        decide what it attends; hits are counted. Nothing to do when its KV is all on the device."""
        following = layer + 1
        if not (self.config.prefetch and self.config.clustering and following < len(cache.filled)):
            return
        offload = cache.offload
        video = video_mask(cache, following)
        if offload is None or offload.resident(following, torch.nonzero(video).flatten()):
            return
        predicted = self._pick(following, cache, self._index(following, cache), queries, pooling, video)
        self._predicted[following] = predicted
        slots = torch.nonzero(predicted.any(dim=0)).flatten()
        offload.prefetch(following, slots, predicted[:, slots])

    def _lay_out(self, cache: KVStore) -> None:
        """V-Rex's cluster-wise memory mapping: offloaded KV laid out by cluster, per key head, so a
        selected cluster is one block (one read); without it, offloaded KV stays in patch blocks."""
        if cache.offload is None:
            return
        try:
            cache.offload.set_layout(self._group_of, per_head=True)
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
    def _index(self, layer: int, cache: KVStore) -> list[HashClusters]:
        """The layer's tables per key head, with the video slots written since they were last read."""
        filled = cache.filled[layer]
        kv_heads, dim = cache.shape
        if self._planes is None:
            generator = torch.Generator().manual_seed(self.config.seed)
            self._planes = torch.randn((dim, self.config.hyperplanes), generator=generator)
        tables = self._tables.setdefault(layer, [HashClusters(dim) for _ in range(kv_heads)])
        for table in tables:
            table.cover(filled)
        new = self._new.take(cache, layer)
        if len(new) and self.config.clustering:
            keys = cache.read(layer, new)[0][0].float().cpu()   # (kv_heads, n, head_dim)
            for head, table in enumerate(tables):
                self._cluster(table, new, keys[head])
        return tables

    def _cluster(self, table: HashClusters, slots: torch.Tensor, keys: torch.Tensor) -> None:
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
