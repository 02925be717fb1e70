"""The jobs of the job API (see jobs.py for its endpoints): each job's state and its answer's shape.

    POST /jobs                {"id": uuid (optional), "prompt": ..., "model"?, sampling fields}
                              -> 202 {"id", "status"}
    GET  /jobs/status/{id}    -> {"id", "status": pending|running|done|error, "created_at", "started_at",
                                  "finished_at"}   (RFC 3339 UTC; null until it happens)
    GET  /jobs/{id}           -> {"id", "status", "prompt", "response", "stats": {"load_time_ms",
                                  "prompt_time_ms", "predict_time_ms", "total_time_ms"}} (integer ms), plus
                                  the status times, "model", "finish_reason", "error" and more stats

Jobs run in the same scheduler as the OpenAI endpoints. A finished job is kept for `ttl_s` seconds, and
at most `max_finished` of them (the oldest go first), so a server that runs for months stays small.

A server that is one replica of several (`llamacy serve --ray`) is given a SharedJobs: ids are reserved
there (one id, one job, across replicas), each job's record is published there as it changes (submitted,
started, every second while it runs, finished), and a job this replica does not hold is read from there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol

from llamacy.scheduler import Done, Failed, Handle, Piece
from llamacy.server.answer import Encoder, drive
from llamacy.server.errors import APIError
from llamacy.server.generation import finish_reason


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return (
        datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


PUBLISH_EVERY_S = 1.0  # how fresh a running job's text is when another replica reads it
STATUS_FIELDS = ("id", "status", "created_at", "started_at", "finished_at")  # GET /jobs/status/{id}


class SharedJobs(Protocol):
    """The jobs of every replica of a server, in one place (see llamacy/distributed/job_store.py)."""

    async def reserve(self, job_id: str) -> bool:
        """Claim an id for a new job; False if any replica has a job with that id."""
        ...

    def publish(self, record: dict[str, Any]) -> None:
        """Store a job's result_dict (from any thread; must not block)."""
        ...

    def forget(self, job_id: str) -> None:
        """Free a reserved id whose job never ran (must not block)."""
        ...

    async def fetch(self, job_id: str) -> dict[str, Any] | None:
        """The last record published for a job (by any replica), or None."""
        ...


class Job(Encoder):
    """One job: its prompt, its request's handle, and its answer, which is the job API's encoder: the one
    event loop (answer.drive) feeds it the text as generated and the end, and the record it keeps is what
    GET /jobs/{id} answers (whole(), result_dict()) while it runs and after."""

    media_type = "application/json"

    def __init__(self, job_id: str, prompt: str = "", model: str = "", load_ms: float = 0.0) -> None:
        self.id = job_id
        self.prompt = prompt
        self.model = model
        self.load_ms = load_ms  # time spent loading the model for this job (0: it was loaded)
        self.handle: Handle | None = None
        self.final: Done | Failed | None = None
        self._pieces: list[str] = []
        self.on_change: Callable[[Job], None] | None = None  # publishes the job (a shared store)
        self._published_at = 0.0
        self._follower: asyncio.Task | None = None

    def follow(self, call: Any) -> None:
        """Feed this job the events of its generation call (server.generation.Generation), on the event loop,
        until it ends; no client waits on it, so nothing cancels it."""

        async def run() -> None:
            async for _ in drive(call, self):
                pass

        self._follower = asyncio.get_running_loop().create_task(run())

    # ---- the encoder: what each event does to the record (no wire lines: the record is polled) -------

    def delta(self, i: int, piece: Piece) -> list[str]:
        self._pieces.append(piece.text)
        self._changed(first=len(self._pieces) == 1)
        return []

    def closing(self, i: int, done: Done) -> list[str]:
        self.final = done
        self._changed()
        return []

    def error(self, failed: Failed) -> list[str]:
        self.final = failed
        self._changed()
        return []

    def whole(self, dones: list[Done], logprobs: list) -> dict[str, Any]:
        return self.result_dict()

    def _changed(self, first: bool = False) -> None:
        if self.on_change is not None and self.handle is not None:  # else JobStore.started publishes it
            now = time.monotonic()
            # The first piece means it started; the last event, that it ended; in between, now and then.
            if self.final is not None or first or now - self._published_at >= PUBLISH_EVERY_S:
                self._published_at = now
                self.on_change(self)

    @property
    def status(self) -> str:
        h = self.handle
        if isinstance(self.final, Failed) or (
            isinstance(self.final, Done) and self.final.finish_reason == "cancelled"
        ):
            return "error"
        if self.final is not None:
            return "done"
        return "running" if h is not None and h.started_at is not None else "pending"

    def status_dict(self) -> dict[str, Any]:
        h = self.handle
        assert h is not None
        return {
            "id": self.id,
            "status": self.status,
            "created_at": rfc3339(h.created_at),
            "started_at": rfc3339(h.started_at),
            "finished_at": rfc3339(h.finished_at if self.final is not None else None),
        }

    def result_dict(self) -> dict[str, Any]:
        """The seed document's shape, field for field and type for type (its Go client decodes `response`
        as a string and the four times as integers): {"id", "status", "prompt", "response", "stats":
        {"load_time_ms", "prompt_time_ms", "predict_time_ms", "total_time_ms"}}. Every value keeps its type
        in every state: before the end, `response` is the text so far and the unknown times are 0. The
        other fields are additions that a client may ignore."""
        final = self.final
        response = final.text if isinstance(final, Done) else "".join(self._pieces)
        stats: dict[str, Any] = {
            "load_time_ms": round(self.load_ms),
            "prompt_time_ms": 0,
            "predict_time_ms": 0,
            "total_time_ms": 0,
        }
        extra: dict[str, Any] = {"model": self.model, "finish_reason": None, "error": None}
        if isinstance(final, Failed):
            extra["error"] = final.message
        elif isinstance(final, Done):
            if final.finish_reason == "cancelled":
                extra["error"] = "cancelled"
            else:
                extra["finish_reason"] = finish_reason(final)
            t = final.timings
            stats.update(
                prompt_time_ms=round(t.prompt_ms),
                predict_time_ms=round(t.predict_ms),
                total_time_ms=round(self.load_ms + t.total_ms),
                queue_time_ms=round(t.queue_ms),
                prompt_tokens=final.usage.prompt_tokens,
                completion_tokens=final.usage.completion_tokens,
                tokens_per_second=round(t.tokens_per_second, 3),
            )
        return {
            **self.status_dict(),
            "prompt": self.prompt,
            "response": response,
            "stats": stats,
            **extra,
        }


class JobStore:
    """Jobs by id; finished ones expire. Thread-safe (the scheduler thread finishes jobs)."""

    def __init__(
        self, ttl_s: float = 3600.0, max_finished: int = 1000, shared: SharedJobs | None = None
    ) -> None:
        self.ttl_s = ttl_s
        self.max_finished = max_finished
        self.shared = shared
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}

    async def create(self, job_id: str, prompt: str = "", model: str = "", load_ms: float = 0.0) -> Job:
        """add(), with the id also claimed in the shared store when there is one (409 if taken there)."""
        if self.shared is not None and not await self.shared.reserve(job_id):
            raise APIError(409, f"a job with id {job_id!r} already exists", "duplicate_id", "id")
        job = self.add(job_id, prompt, model, load_ms)
        if self.shared is not None:
            job.on_change = self._publish
        return job

    def _publish(self, job: Job) -> None:
        assert self.shared is not None
        self.shared.publish(job.result_dict())

    def started(self, job: Job) -> None:
        """The job's handle is attached: publish it as submitted."""
        if job.on_change is not None:
            job.on_change(job)

    async def lookup(self, job_id: str) -> dict[str, Any]:
        """A job's result_dict: this server's own, else the shared store's (404 if neither has it)."""
        try:
            return self.get(job_id).result_dict()
        except APIError:
            record = await self.shared.fetch(job_id) if self.shared is not None else None
            if record is None:
                raise
            return record

    def add(self, job_id: str, prompt: str = "", model: str = "", load_ms: float = 0.0) -> Job:
        """Reserve an id (APIError 409 if taken); the caller attaches the handle or calls discard."""
        with self._lock:
            self._prune_locked()
            if job_id in self._jobs:
                raise APIError(409, f"a job with id {job_id!r} already exists", "duplicate_id", "id")
            job = self._jobs[job_id] = Job(job_id, prompt, model, load_ms)
            return job

    def discard(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
        if job is not None and job.on_change is not None and self.shared is not None:
            self.shared.forget(job_id)

    def get(self, job_id: str) -> Job:
        with self._lock:
            self._prune_locked()
            job = self._jobs.get(job_id)
        if job is None or job.handle is None:
            raise APIError(404, f"no job with id {job_id!r} (unknown, or expired)", "job_not_found")
        return job

    def counts(self) -> dict[str, int]:
        counts = {"pending": 0, "running": 0, "done": 0, "error": 0}
        with self._lock:
            for job in self._jobs.values():
                if job.handle is not None:
                    counts[job.status] += 1
        return counts

    def _prune_locked(self) -> None:
        finished = OrderedDict(
            sorted(
                (
                    (j.id, j.handle.finished_at or 0.0)
                    for j in self._jobs.values()
                    if j.final is not None and j.handle
                ),
                key=lambda kv: kv[1],
            )
        )
        cutoff = time.time() - self.ttl_s
        excess = len(finished) - self.max_finished
        for job_id, finished_at in finished.items():
            if finished_at < cutoff or excess > 0:
                del self._jobs[job_id]
                excess -= 1
