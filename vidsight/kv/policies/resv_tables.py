"""ReSV's hash-cluster tables (V-Rex, seed 003): hash bits, Hamming distances, WiCSum, per-head tables."""

from __future__ import annotations

import torch

EARLY_EXIT_CLUSTERS = 32   # clusters ranked per row before WiCSum ranks more


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
        weights = (scores - scores.max(dim=1, keepdim=True).values).exp_().mul_(counts)
    else:
        weights = scores.clamp(min=0).mul_(counts)
    need = ratio * weights.sum(dim=1)
    chosen = torch.zeros(scores.shape[1], dtype=torch.bool)
    k = min(EARLY_EXIT_CLUSTERS, scores.shape[1])
    # V-Rex's early exit: rank only the best k per row, and rank further only rows not yet past the
    # threshold (kept as they shrink: every row at first, so the first ranking copies nothing).
    while True:
        order = torch.topk(scores, k, dim=1).indices
        ranked = torch.gather(weights, 1, order)
        reached = ranked.cumsum(dim=1)
        # The minimal prefix: clusters before the one whose weight carries the sum past the threshold, and it.
        take = reached - ranked < need[:, None]
        take[:, 0] = True
        chosen[order[take]] = True
        short = reached[:, -1] < need
        if k == scores.shape[1] or not short.any():
            return chosen
        scores, weights, need = scores[short], weights[short], need[short]
        k = min(4 * k, scores.shape[1])


def row_scores(queries: torch.Tensor, keys: torch.Tensor, rows: str) -> torch.Tensor:
    """``(group, tokens, dim)`` queries against ``(n, dim)`` keys as WiCSum's ``(rows, n)`` scores (see `ReSVConfig.rows`)."""
    if rows == "mean":
        return queries.mean(dim=1) @ keys.T
    scores = queries.reshape(-1, queries.shape[-1]) @ keys.T
    return scores.reshape(*queries.shape[:2], -1).amax(dim=1) if rows == "max" else scores


def grown(buffer: torch.Tensor, rows: int, fill: float = 0) -> torch.Tensor:
    """``buffer`` with room for at least ``rows`` rows, doubling (a stream adds to it at every step)."""
    if len(buffer) >= rows:
        return buffer
    bigger = buffer.new_full((max(rows, 2 * len(buffer), 64), *buffer.shape[1:]), fill)
    bigger[: len(buffer)] = buffer
    return bigger


class HashClusters:
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
        self._owner = grown(self._owner, slots, -1)
        self._owner[self.slots : slots] = -1
        self.slots = slots

    def add(self, clusters: int) -> None:
        """Make room for ``clusters`` new, empty clusters."""
        size = self.size + clusters
        self._key_sum, self._count = grown(self._key_sum, size), grown(self._count, size)
        self._bits = grown(self._bits, size)
        self._key_sum[self.size : size], self._count[self.size : size] = 0, 0
        self.size = size
