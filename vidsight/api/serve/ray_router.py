"""How the gateway's requests find a replica: Ray Serve's request-router hook (`RequestRouter`).

A request names where it must go in two keyword arguments the replica ignores:

- ``pin``: the id of the replica holding the stream (its watch thread, its chat session's KV);
  only that replica is chosen while it is among the running ones, and any replica after it died.
- ``loads``: replica id -> streams it runs (from the store's heartbeats); the least loaded replica
  first, so new streams spread evenly.

Everything else (stateless chat completions, reads of the store) goes to the less busy of two
random replicas, Ray Serve's default ("power of two choices").
"""

from __future__ import annotations

import random

from ray.serve.request_router import FIFOMixin, RequestRouter

ROUTER_CLASS = f"{__name__}:StreamRouter"


class StreamRouter(FIFOMixin, RequestRouter):
    """Pins streams to their replica, places new ones on the least loaded, balances the rest."""

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        kwargs = pending_request.kwargs if pending_request is not None else {}
        pin, loads = kwargs.get("pin"), kwargs.get("loads")
        if pin is not None:
            pinned = [r for r in candidate_replicas if r.replica_id.unique_id == pin]
            if pinned:
                return [pinned]
        if loads is not None:
            return [[r] for r in sorted(candidate_replicas,
                                        key=lambda r: (loads.get(r.replica_id.unique_id, 0), r.replica_id.unique_id))]
        # One rank of two: Ray Serve asks both for their queue length and takes the shorter.
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
