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
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import Any

from llamacy.scheduler import Done, Event, Failed, Handle, Piece
from llamacy.server.errors import APIError
from llamacy.server.generation import finish_reason


def _rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return (
        datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


class Job:
    """One job: its prompt, its request's handle, and the text so far (the answer while it runs)."""

    def __init__(self, job_id: str, prompt: str = "", model: str = "", load_ms: float = 0.0) -> None:
        self.id = job_id
        self.prompt = prompt
        self.model = model
        self.load_ms = load_ms  # time spent loading the model for this job (0: it was loaded)
        self.handle: Handle | None = None
        self.final: Done | Failed | None = None
        self._pieces: list[str] = []

    def on_event(self, ev: Event) -> None:  # on the scheduler thread
        if isinstance(ev, Piece):
            self._pieces.append(ev.text)
        else:
            self.final = ev

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
            "created_at": _rfc3339(h.created_at),
            "started_at": _rfc3339(h.started_at),
            "finished_at": _rfc3339(h.finished_at if self.final is not None else None),
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

    def __init__(self, ttl_s: float = 3600.0, max_finished: int = 1000) -> None:
        self.ttl_s = ttl_s
        self.max_finished = max_finished
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}

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
            self._jobs.pop(job_id, None)

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
