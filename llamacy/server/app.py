"""The ASGI application: routes, the shared state they use, and the guards in front of them.

    app = create_app(scheduler, template, ServerSettings(api_key="secret"))

Middleware, outermost first: count requests (so that refusals count too) -> API key -> body size. The
scheduler is started and stopped by whoever runs the app (see runner.py), not by the app itself.
"""

from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llamacy.scheduler import Scheduler
from llamacy.server.errors import (
    APIError,
    error_response,
    handle_api_error,
    handle_http_exception,
    handle_unexpected,
)
from llamacy.server.jobs import JobStore
from llamacy.server.metrics import CountRequests, RequestCounter

DEFAULT_MAX_BODY = 1 << 20  # 1 MiB: far more than any context we run holds in text
PUBLIC_PATHS = frozenset({"/health"})  # load balancers probe it without credentials


@dataclass
class ServerSettings:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY
    job_ttl_s: float = 3600.0
    max_finished_jobs: int = 1000
    model_name: str = "llamacy"


@dataclass
class ServerState:
    scheduler: Scheduler
    template: Any  # llamacy.chat_template.ChatTemplate, or None: chat completions answer 501
    settings: ServerSettings
    jobs: JobStore
    requests: RequestCounter = field(default_factory=RequestCounter)
    created: int = field(default_factory=lambda: int(time.time()))
    mailbox: Any = None  # generation.LoopMailbox of the loop serving requests (made on first use)

    @property
    def tokenizer(self) -> Any:
        return self.scheduler.tokenizer

    @property
    def model_name(self) -> str:
        return self.settings.model_name


class RequireAPIKey:
    """`Authorization: Bearer <key>` on every path but /health."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PUBLIC_PATHS:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):  # constant time: no key guessing by timing
                message = (
                    "missing API key (send Authorization: Bearer <key>)" if not given else "invalid API key"
                )
                resp = error_response(401, message, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await resp(scope, receive, send)
                return
        await self.app(scope, receive, send)


class LimitBody:
    """Refuse bodies over `limit` bytes with 413: by Content-Length up front, else while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._too_large()(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # chunked upload without a length
                    raise APIError(413, self._message(), "body_too_large")
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"the request body is larger than {self.limit} bytes"

    def _too_large(self) -> JSONResponse:
        return error_response(413, self._message(), "body_too_large")


async def read_body(request: Request) -> bytes:
    return await request.body()


async def health(request: Request) -> JSONResponse:
    sched = request.app.state.llamacy.scheduler
    # 503 when generation cannot happen (stopped or crashed scheduler): a load balancer stops routing here.
    return JSONResponse(
        {
            "status": "ok" if sched.alive else "unavailable",
            "slots_idle": sched.n_parallel - sched.n_active,
            "slots_processing": sched.n_active,
            "queue_depth": sched.queue_depth,
        },
        status_code=200 if sched.alive else 503,
    )


def create_app(
    scheduler: Scheduler, template: Any = None, settings: ServerSettings | None = None
) -> Starlette:
    from llamacy.server import jobs, metrics, openai_routes

    settings = settings or ServerSettings()
    state = ServerState(
        scheduler=scheduler,
        template=template,
        settings=settings,
        jobs=JobStore(settings.job_ttl_s, settings.max_finished_jobs),
    )
    middleware = [Middleware(CountRequests, counter=state.requests)]
    if settings.api_key:
        middleware.append(Middleware(RequireAPIKey, api_key=settings.api_key))
    middleware.append(Middleware(LimitBody, limit=settings.max_body_bytes))
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics.metrics, methods=["GET"]),
        *openai_routes.routes,
        *jobs.routes,
    ]
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            APIError: handle_api_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
    )
    app.state.llamacy = state
    return app
