"""Cosine clusters with running statistics, as Mosaic keeps them (`kv.policies.mosaic`).

A cluster keeps its size and the sums of its members' unit vectors, raw keys and values: the
centroid direction, the representative key and value and the variance all follow from the sums,
so adding members never revisits old ones, and the result equals recomputation from scratch.
For unit vectors the mean squared distance to the mean is ``1 - |mean|^2``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

SPLIT_ITERATIONS = 8


def unit(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to length one (float32)."""
    return F.normalize(x.float(), dim=-1)


def cosine_variance(unit_sum: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    """Mean squared distance of unit vectors to their mean, from their sum and count."""
    mean = unit_sum / count.clamp(min=1)[..., None]
    return 1 - (mean * mean).sum(dim=-1)


def split_in_two(units: torch.Tensor) -> torch.Tensor | None:
    """Cosine 2-means of unit rows: a bool per row (True: the second half), or None if it will not split.

    Seeds are the row farthest from the mean and the row farthest from that one, so the split
    is deterministic.
    """
    if len(units) < 2:
        return None
    first = units[(units @ units.mean(dim=0)).argmin()]
    second = units[(units @ first).argmin()]
    centres, before = torch.stack([first, second]), None
    for _ in range(SPLIT_ITERATIONS):
        side = (units @ centres.T).argmax(dim=1).bool()
        if side.all() or not side.any():
            return None
        if before is not None and torch.equal(side, before):
            return side   # the centres would come out as they went in: every later iteration repeats this one
        centres, before = unit(torch.stack([units[~side].mean(dim=0), units[side].mean(dim=0)])), side
    return side


class ClusterTable:
    """Clusters over one space (a layer's keys, or frames' visual embeddings).

    Attributes:
        count: ``(C,)`` members per cluster (0: merged away).
        unit_sum: ``(C, F)`` sum of members' unit vectors.
        score_sum: ``(C, F)`` sum of the vectors retrieval scores and clusters by (for keys: as cached,
            or before the rotary embedding).
        key_sum: ``(C, F)`` sum of members' raw vectors (keys: the representative key).
        value_sum: ``(C, F)`` sum of members' values (the representative value).
        visual: ``(C,)`` the visual partition a cluster belongs to.
        first: ``(C,)`` its first slot (or frame), for temporal order.
        lazy: ``(C,)`` a split is pending (deferred until the cluster is fetched).
        parent: ``(C,)`` for newcomers waiting on a pending split, the cluster they wait for; else -1.
        owner: ``(slots,)`` the cluster of each slot, -1 for none.
    """

    def __init__(self):
        self.count = torch.zeros(0)
        self.unit_sum = self.score_sum = self.key_sum = self.value_sum = None
        self.visual = torch.zeros(0, dtype=torch.long)
        self.first = torch.zeros(0, dtype=torch.long)
        self.lazy = torch.zeros(0, dtype=torch.bool)
        self.parent = torch.zeros(0, dtype=torch.long)
        self.owner = torch.zeros(0, dtype=torch.long)

    @property
    def size(self) -> int:
        return len(self.count)

    def live(self) -> int:
        return int((self.count > 0).sum())

    SUMS = ("unit_sum", "score_sum", "key_sum", "value_sum")

    def add(self, units, scores, keys, values, visual: int, first: int, parent: int = -1) -> int:
        """A new cluster of the given rows; its id."""
        for name, rows in zip(self.SUMS, (units, scores, keys, values)):
            new = rows.float().sum(dim=0, keepdim=True)
            old = getattr(self, name)
            setattr(self, name, new if old is None else torch.cat([old, new]))
        self.count = torch.cat([self.count, torch.tensor([float(len(units))])])
        self.visual = torch.cat([self.visual, torch.tensor([visual])])
        self.first = torch.cat([self.first, torch.tensor([first])])
        self.lazy = torch.cat([self.lazy, torch.tensor([False])])
        self.parent = torch.cat([self.parent, torch.tensor([parent])])
        return self.size - 1

    def extend(self, cluster: int, slots, units, scores, keys, values) -> None:
        """Add rows to ``cluster`` (eqs. 3-4: running sums, old members untouched)."""
        for name, rows in zip(self.SUMS, (units, scores, keys, values)):
            getattr(self, name)[cluster] += rows.float().sum(dim=0)
        self.count[cluster] += len(units)
        if slots is not None:
            self.owner[slots] = cluster

    def extend_rows(self, owners: torch.Tensor, slots, units, scores, keys, values) -> None:
        """Add each row to the cluster ``owners`` names for it (`extend`, for many clusters at once)."""
        for name, rows in zip(self.SUMS, (units, scores, keys, values)):
            getattr(self, name).index_add_(0, owners, rows.float())
        self.count.index_add_(0, owners, torch.ones(len(owners)))
        self.owner[slots] = owners

    def variance(self, cluster: int) -> float:
        return float(cosine_variance(self.unit_sum[cluster], self.count[cluster]))

    def variance_with(self, cluster: int, units: torch.Tensor) -> float:
        """The variance ``cluster`` would have with ``units`` added."""
        return float(cosine_variance(self.unit_sum[cluster] + units.sum(dim=0), self.count[cluster] + len(units)))

    def candidates(self, visual: int) -> torch.Tensor:
        """Clusters of a visual partition that new members may join (not waiting, not merged away)."""
        return torch.nonzero((self.visual == visual) & (self.parent < 0) & (self.count > 0)).flatten()

    def assign(self, vector: torch.Tensor, threshold: Callable[[int], float], first: int) -> int:
        """Put one unit row in the most similar cluster if it stays cohesive, else in a new one."""
        if self.size:
            best = int((unit(self.unit_sum) @ vector[0]).argmax())
            if self.variance_with(best, vector) <= threshold(int(self.count[best]) + 1):
                self.extend(best, None, vector, vector, vector, vector)
                return best
        return self.add(vector, vector, vector, vector, visual=self.size, first=first)

    def members(self, cluster: int) -> torch.Tensor:
        return torch.nonzero(self.owner == cluster).flatten()

    def merge_waiting(self, cluster: int) -> None:
        """Fold the newcomers waiting on ``cluster``'s split back into it."""
        for waiting in torch.nonzero(self.parent == cluster).flatten().tolist():
            for sums in (getattr(self, name) for name in self.SUMS):
                sums[cluster] += sums[waiting]
                sums[waiting] = 0
            self.count[cluster] += self.count[waiting]
            self.count[waiting], self.parent[waiting] = 0, -1
            self.owner[self.owner == waiting] = cluster

    def replace(self, cluster: int, members, second: torch.Tensor, units, scores, keys, values) -> int:
        """Split ``cluster``: its ``members`` where ``second`` is False stay, the rest form a new cluster."""
        stay = ~second
        for name, rows in zip(self.SUMS, (units, scores, keys, values)):
            getattr(self, name)[cluster] = rows[stay].float().sum(dim=0)
        self.count[cluster] = float(stay.sum())
        self.first[cluster] = int(members[stay][0])
        new = self.add(units[second], scores[second], keys[second], values[second],
                       visual=int(self.visual[cluster]), first=int(members[second][0]))
        self.owner[members[second]] = new
        return new

    def outside(self, keep: torch.Tensor) -> torch.Tensor:
        """``(C,)`` members of each cluster not already in ``keep`` (a bool per slot)."""
        owned = self.owner[~keep[: len(self.owner)]]
        return torch.bincount(owned[owned >= 0], minlength=self.size)

    def mean_scores(self, clusters: torch.Tensor) -> torch.Tensor:
        return self.score_sum[clusters] / self.count[clusters, None]

    def mean_keys(self, clusters: torch.Tensor) -> torch.Tensor:
        return self.key_sum[clusters] / self.count[clusters, None]

    def mean_values(self, clusters: torch.Tensor) -> torch.Tensor:
        return self.value_sum[clusters] / self.count[clusters, None]

    def partition_mean_scores(self, partitions: torch.Tensor) -> torch.Tensor:
        """``(P, F)`` the mean scored vector of each visual partition's members."""
        where = (self.visual[:, None] == partitions[None]).float()   # (C, P)
        return (where.T @ self.score_sum) / (where.T @ self.count).clamp(min=1)[:, None]
