"""The jobs of all the replicas of one `llamacy serve --ray`, in one Ray actor (0 CPUs), so that a job can
be read through the ingress whichever replica answers: each replica reserves ids and publishes its jobs'
records here (llamacy.server.job_store.SharedJobs), and reads here the jobs it does not hold.

The board watches the replicas that run unfinished jobs: when one dies (Serve replaces it, but its
scheduler and the jobs in it are gone), each of its unfinished jobs ends as `error`, saying why, instead
of staying `running` forever. Finished jobs expire as in a single server (ttl, max count).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import ray

from llamacy.server.job_store import rfc3339

WATCH_PERIOD_S = 1.0  # how soon a dead replica's jobs end
PING_TIMEOUT_S = 10.0  # a replica too busy to answer this long is slow, not dead


@ray.remote(num_cpus=0, max_restarts=-1)
class JobBoard:
    def __init__(self, ttl_s: float = 3600.0, max_finished: int = 1000) -> None:
        self.ttl_s = ttl_s
        self.max_finished = max_finished
        self.records: dict[str, dict[str, Any]] = {}
        self.owner: dict[str, str] = {}  # job id -> replica name
        self.finished: dict[str, float] = {}  # job id -> when it ended (insertion order: oldest first)
        self.replicas: dict[str, Any] = {}  # replica name -> its actor handle
        self._watcher: asyncio.Task | None = None

    async def register(self, replica: str, actor: Any) -> None:
        self.replicas[replica] = actor
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def reserve(self, job_id: str, replica: str) -> bool:
        self._prune()
        if job_id in self.owner:
            return False
        self.owner[job_id] = replica
        return True

    async def forget(self, job_id: str) -> None:
        """A reserved id whose job was refused (a full queue): free it."""
        if job_id not in self.records:
            self.owner.pop(job_id, None)

    async def put(self, replica: str, record: dict[str, Any]) -> None:
        job_id = record["id"]
        if self.owner.get(job_id) != replica or job_id in self.finished:
            return  # a late update of a job already ended (by its replica's death, say)
        old = self.records.get(job_id)
        if old is not None and _rank(record) < _rank(old):
            return  # updates from two threads of the replica may arrive out of order
        self.records[job_id] = record
        if record["status"] in ("done", "error"):
            self.finished[job_id] = time.time()

    async def get(self, job_id: str) -> dict[str, Any] | None:
        self._prune()
        return self.records.get(job_id)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_PERIOD_S)
            busy = {self.owner[j] for j in self.records if j not in self.finished and j in self.owner}
            for replica in busy:
                actor = self.replicas.get(replica)
                if actor is not None and not await _alive(actor):
                    self._replica_died(replica)

    def _replica_died(self, replica: str) -> None:
        self.replicas.pop(replica, None)
        now = time.time()
        for job_id, record in self.records.items():
            if self.owner.get(job_id) == replica and job_id not in self.finished:
                record.update(
                    status="error",
                    finished_at=rfc3339(now),
                    error=f"the replica that ran this job ({replica}) stopped; submit it again",
                )
                self.finished[job_id] = now

    def _prune(self) -> None:
        cutoff = time.time() - self.ttl_s
        excess = len(self.finished) - self.max_finished
        for job_id, ended in list(self.finished.items()):
            if ended >= cutoff and excess <= 0:
                break
            del self.finished[job_id]
            self.records.pop(job_id, None)
            self.owner.pop(job_id, None)
            excess -= 1


_RANKS = {"pending": 0, "running": 1, "done": 2, "error": 2}


def _rank(record: dict[str, Any]) -> tuple[int, int]:
    return _RANKS.get(record["status"], 0), len(record.get("response") or "")


async def _alive(actor: Any) -> bool:
    try:
        await asyncio.wait_for(actor.__ray_ready__.remote(), PING_TIMEOUT_S)
    except ray.exceptions.RayActorError:
        return False
    except (asyncio.TimeoutError, ray.exceptions.GetTimeoutError):
        return True
    return True


class BoardJobs:
    """The SharedJobs of one replica, over the board."""

    def __init__(self, board: Any, replica: str) -> None:
        self.board = board
        self.replica = replica

    async def reserve(self, job_id: str) -> bool:
        return await self.board.reserve.remote(job_id, self.replica)

    def publish(self, record: dict[str, Any]) -> None:
        self.board.put.remote(self.replica, record)  # not awaited: the scheduler thread must not wait

    def forget(self, job_id: str) -> None:
        self.board.forget.remote(job_id)

    async def fetch(self, job_id: str) -> dict[str, Any] | None:
        with contextlib.suppress(ray.exceptions.RayActorError):
            return await self.board.get.remote(job_id)
        return None
