"""The ASGI application: the registered routes, behind the middleware, over the shared state.

    app = create_app(scheduler, template, ServerSettings(api_key="secret"))   # one model
    app = create_app(ModelRegistry([...]), settings=ServerSettings())        # several
    app = create_app(registry, settings=ServerSettings(replica_name="r1"), shared_jobs=store)  # a replica

Whoever runs the app starts and stops the schedulers of the models handed in loaded (see runner.py),
and closes the registry (which shuts down those it loaded itself).
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware

from llamacy.scheduler import Scheduler
from llamacy.server.errors import APIError, handle_api_error, handle_http_exception, handle_unexpected
from llamacy.server.job_store import JobStore, SharedJobs
from llamacy.server.middleware import CountRequests, HoldModels, LimitBody, NameReplica, RequireAPIKey
from llamacy.server.models import ModelRegistry
from llamacy.server.responses_store import ResponseStore
from llamacy.server.routes import ERROR_SHAPES, PUBLIC_PATHS, ROUTES
from llamacy.server.state import ServerSettings, ServerState


def create_app(
    models: Scheduler | ModelRegistry,
    template: Any = None,
    settings: ServerSettings | None = None,
    shared_jobs: SharedJobs | None = None,
) -> Starlette:
    """`models`: the registry of served models, or the scheduler of the one model (named
    settings.model_name, chatting with `template`). `shared_jobs`: where the replicas of one server keep
    their jobs (see job_store.py)."""
    settings = settings or ServerSettings()
    if isinstance(models, Scheduler):
        models = ModelRegistry.single(settings.model_name, models, template)
    jobs = JobStore(settings.job_ttl_s, settings.max_finished_jobs, shared_jobs)
    responses = ResponseStore(settings.max_stored_responses, settings.response_ttl_s)
    state = ServerState(models=models, settings=settings, jobs=jobs, responses=responses)
    middleware = []
    if settings.replica_name:
        middleware.append(Middleware(NameReplica, name=settings.replica_name))
    middleware.append(Middleware(CountRequests, counter=state.requests, routes=ROUTES))
    if settings.api_key:
        middleware.append(Middleware(RequireAPIKey, api_key=settings.api_key, public_paths=PUBLIC_PATHS))
    middleware.append(Middleware(LimitBody, limit=settings.max_body_bytes))
    middleware.append(Middleware(HoldModels))
    app = Starlette(
        routes=ROUTES,
        middleware=middleware,
        exception_handlers={
            APIError: handle_api_error,
            HTTPException: handle_http_exception,
            Exception: handle_unexpected,
        },
    )
    app.state.llamacy = state
    app.state.error_shapes = ERROR_SHAPES  # errors.render_error: each dialect's paths, its own shape
    return app
