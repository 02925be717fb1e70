"""What every route reads: the settings, the models, the jobs, the request counts. A leaf module (it
imports no route module), so that any route can import it without a cycle.

    state = state_of(request)
    served = await state.models.acquire(body.model)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

from llamacy.server.job_store import JobStore
from llamacy.server.middleware import RequestCounter
from llamacy.server.models import ModelRegistry
from llamacy.server.responses_store import DEFAULT_MAX_ITEMS, DEFAULT_TTL_S, ResponseStore

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB: far more than any context we run holds in text


@dataclass
class ServerSettings:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    job_ttl_s: float = 3600.0
    max_finished_jobs: int = 1000
    model_name: str = "llamacy"  # the name of the model when create_app is given one scheduler
    replica_name: str | None = None  # one replica of several: named in each response's X-Llamacy-Replica
    response_ttl_s: float = DEFAULT_TTL_S  # stored Responses API responses: how long each is kept
    max_stored_responses: int = DEFAULT_MAX_ITEMS  # and how many at most (the oldest go first)
    context_shift: bool = False  # --context-shift: fit prompts longer than the context (context_shift.py)
    keep: int = 0  # --keep: a plain prompt's first tokens that a shift keeps (-1: as many as can be)
    slot_save_path: str | None = None  # --slot-save-path: where POST /slots/{id}?action=save|restore work


@dataclass
class ServerState:
    models: ModelRegistry
    settings: ServerSettings
    jobs: JobStore
    requests: RequestCounter = field(default_factory=RequestCounter)
    responses: ResponseStore = field(default_factory=ResponseStore)
    created: int = field(default_factory=lambda: int(time.time()))


def state_of(request: Request) -> ServerState:
    return request.app.state.llamacy
