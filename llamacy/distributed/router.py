"""The Ray Serve request router of the model replicas: prefix affinity (affinity.py) over the power of two
choices. Runs in the ingress replica, inside Serve's router; requests reach it as ForwardedRequests."""

from __future__ import annotations

import random

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from llamacy.distributed.affinity import PrefixMemory


def _hashes(pending: PendingRequest | None) -> tuple[str, ...]:
    if pending is None or not pending.args:
        return ()
    return getattr(pending.args[0], "prefix", ())


class PrefixAffinityRouter(RequestRouter):
    """The replica that last served the longest prefix of the prompt, unless its queue is longer than the
    shortest by more than `imbalance` requests; otherwise two random replicas, the less busy one chosen
    (Serve probes their queues). Serve skips a replica whose queue is full and tries the next rank."""

    def initialize_state(self, imbalance: int = 4) -> None:
        self.imbalance = imbalance
        self.memory = PrefixMemory()

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        hashes = _hashes(pending_request)
        owner = self.memory.best(hashes, set(by_id)) if hashes else None
        if owner is not None and not self._much_busier(by_id[owner], candidate_replicas):
            return [[by_id[owner]], [r for r in candidate_replicas if r is not by_id[owner]]]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    def _much_busier(self, replica: RunningReplica, candidates: list[RunningReplica]) -> bool:
        cache = self.replica_queue_len_cache
        mine = cache.get(replica.replica_id)
        if mine is None:
            return False
        others = [q for r in candidates if (q := cache.get(r.replica_id)) is not None]
        return bool(others) and mine - min(others) > self.imbalance

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: object
    ) -> None:
        hashes = _hashes(pending_request)
        if hashes:
            self.memory.remember(hashes, replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.memory.forget_replica(replica_id.unique_id)
