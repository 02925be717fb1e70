"""GET /metrics in the Prometheus text format, and the middleware that counts requests.

Hand-written rather than prometheus_client: a dozen lines of text do not justify a dependency.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from llamacy.server.app import ServerState

_EXACT = {"/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions", "/jobs"}


def endpoint_label(path: str) -> str:
    """A bounded set of labels: ids in paths are folded, unknown paths share one label."""
    if path in _EXACT:
        return path
    if path.startswith("/jobs/status/"):
        return "/jobs/status/{id}"
    if path.startswith("/jobs/"):
        return "/jobs/{id}"
    return "other"


class RequestCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}

    def add(self, endpoint: str, status: int) -> None:
        with self._lock:
            key = (endpoint, str(status))
            self.counts[key] = self.counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self.counts)


class CountRequests:
    """ASGI middleware: count every HTTP response by endpoint and status (outermost, so 401/413 count)."""

    def __init__(self, app: ASGIApp, counter: RequestCounter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception before the response started

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.counter.add(endpoint_label(scope["path"]), status)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(state: ServerState) -> str:
    sched = state.scheduler
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(
                f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}"
            )

    reqs = sorted(state.requests.snapshot().items())
    metric(
        "llamacy_requests_total",
        "counter",
        "HTTP requests by endpoint and status code.",
        [(f'{{endpoint="{_esc(e)}",status="{s}"}}', n) for (e, s), n in reqs],
    )
    metric(
        "llamacy_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        [("", sched.prompt_tokens_total)],
    )
    metric(
        "llamacy_prompt_tokens_evaluated_total",
        "counter",
        "Prompt tokens evaluated (the others were reused from a slot's KV cache).",
        [("", sched.prompt_evaluated_total)],
    )
    metric(
        "llamacy_generated_tokens_total", "counter", "Tokens generated.", [("", sched.generated_tokens_total)]
    )
    metric(
        "llamacy_requests_finished_total",
        "counter",
        "Generations finished, by reason.",
        [(f'{{reason="{r}"}}', n) for r, n in sorted(sched.finished_total.items())],
    )
    metric(
        "llamacy_queue_depth",
        "gauge",
        "Requests waiting for a free sequence slot.",
        [("", sched.queue_depth)],
    )
    metric("llamacy_active_sequences", "gauge", "Sequences prefilling or generating.", [("", sched.n_active)])
    metric("llamacy_parallel_sequences", "gauge", "Sequence slots (--parallel).", [("", sched.n_parallel)])
    metric(
        "llamacy_generation_tokens_per_second",
        "gauge",
        "Tokens generated per second, all sequences together, over the last 10 s.",
        [("", round(sched.tokens_per_second(), 3))],
    )
    metric(
        "llamacy_jobs",
        "gauge",
        "Jobs held by the job API, by status.",
        [(f'{{status="{s}"}}', n) for s, n in state.jobs.counts().items()],
    )
    return "\n".join(lines) + "\n"


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.llamacy
    return Response(render(state), media_type="text/plain; version=0.0.4; charset=utf-8")
