"""GET /health and GET /metrics (the Prometheus text format).

Hand-written rather than prometheus_client: a few dozen lines of text do not justify a dependency.
Request counts are labelled with the registered routes' own paths (middleware.endpoint_label).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from llamacy.server.state import ServerState, state_of

PUBLIC_PATHS = frozenset({"/health"})  # load balancers probe it without credentials


async def health(request: Request) -> JSONResponse:
    scheds = [m.scheduler for m in state_of(request).models.loaded()]
    # 503 when generation cannot happen (a stopped or crashed scheduler): a load balancer stops routing here.
    alive = all(s.alive for s in scheds)
    return JSONResponse(
        {
            "status": "ok" if alive else "unavailable",
            "slots_idle": sum(s.n_parallel - s.n_active for s in scheds),
            "slots_processing": sum(s.n_active for s in scheds),
            "queue_depth": sum(s.queue_depth for s in scheds),
        },
        status_code=200 if alive else 503,
    )


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(state: ServerState) -> str:
    lines: list[str] = []
    loaded = state.models.loaded()

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(
                f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}"
            )

    def per_model(name: str, kind: str, help_: str, attr: str) -> None:
        samples = [(f'{{model="{_esc(m.name)}"}}', getattr(m.scheduler, attr)) for m in loaded]
        metric(name, kind, help_, samples)

    metric(
        "llamacy_model_loaded",
        "gauge",
        "1 for a model loaded now, 0 for one loaded on its next request.",
        [(f'{{model="{_esc(n)}"}}', int(state.models.is_loaded(n))) for n in state.models.names()],
    )
    reqs = sorted(state.requests.snapshot().items())
    metric(
        "llamacy_requests_total",
        "counter",
        "HTTP requests by endpoint and status code.",
        [(f'{{endpoint="{_esc(e)}",status="{s}"}}', n) for (e, s), n in reqs],
    )
    per_model(
        "llamacy_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", "prompt_tokens_total"
    )
    per_model(
        "llamacy_prompt_tokens_evaluated_total",
        "counter",
        "Prompt tokens evaluated (the others were reused from a slot's KV cache).",
        "prompt_evaluated_total",
    )
    per_model("llamacy_generated_tokens_total", "counter", "Tokens generated.", "generated_tokens_total")
    per_model(
        "llamacy_draft_tokens_total",
        "counter",
        "Speculative decoding: tokens drafted and verified.",
        "draft_tokens_total",
    )
    per_model(
        "llamacy_draft_accepted_total",
        "counter",
        "Speculative decoding: drafted tokens accepted.",
        "draft_accepted_total",
    )
    metric(
        "llamacy_requests_finished_total",
        "counter",
        "Generations finished, by reason.",
        [
            (f'{{model="{_esc(m.name)}",reason="{r}"}}', n)
            for m in loaded
            for r, n in sorted(m.scheduler.finished_total.items())
        ],
    )
    per_model("llamacy_queue_depth", "gauge", "Requests waiting for a free sequence slot.", "queue_depth")
    per_model("llamacy_active_sequences", "gauge", "Sequences prefilling or generating.", "n_active")
    per_model("llamacy_parallel_sequences", "gauge", "Sequence slots (--parallel).", "n_parallel")
    metric(
        "llamacy_generation_tokens_per_second",
        "gauge",
        "Tokens generated per second, all sequences together, over the last 10 s.",
        [(f'{{model="{_esc(m.name)}"}}', round(m.scheduler.tokens_per_second(), 3)) for m in loaded],
    )
    metric(
        "llamacy_jobs",
        "gauge",
        "Jobs held by the job API, by status.",
        [(f'{{status="{s}"}}', n) for s, n in state.jobs.counts().items()],
    )
    return "\n".join(lines) + "\n"


async def metrics(request: Request) -> Response:
    return Response(render(state_of(request)), media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
