"""`llamacy serve`: an OpenAI-compatible HTTP API and the job API over continuous-batching schedulers,
one per served model.

    app = create_app(scheduler, template, ServerSettings(...))    # one model, run by the caller
    app = create_app(ModelRegistry(specs, ModelLoader(...)))      # several, loaded on first use
    with ServerThread(app, port=0) as srv: ...                   # serve it in the background (tests)

Modules, leaves first: errors, mailbox (scheduler events into the event loop), models (the registry:
name -> a loaded model, its scheduler and template), loading (how a model is loaded), job_store,
middleware (the guards), state (what routes read), generation (request -> scheduler); the endpoint
modules (metrics, openai_routes, tokenize_routes, jobs), each with its ROUTES; routes.py (all of them, in
one list); app.py (the Starlette app). llamacy/scheduler.py is the engine underneath.
"""

from __future__ import annotations

from llamacy.server.app import create_app
from llamacy.server.loading import ModelLoader
from llamacy.server.models import ModelRegistry, ModelSpec, ServedModel
from llamacy.server.runner import ServerThread, bind, serve_forever
from llamacy.server.state import ServerSettings

__all__ = [
    "ModelLoader",
    "ModelRegistry",
    "ModelSpec",
    "ServedModel",
    "ServerSettings",
    "ServerThread",
    "bind",
    "create_app",
    "serve_forever",
]
