"""`llamacy serve`: an OpenAI-compatible HTTP API and the job API over one continuous-batching scheduler.

    app = create_app(scheduler, template, ServerSettings(...))    # an ASGI app (Starlette)
    with ServerThread(app, port=0) as srv: ...                   # serve it in the background (tests)

See app.py for the guards, openai_routes.py and jobs.py for the endpoints, llamacy/scheduler.py for the
engine underneath.
"""

from __future__ import annotations

from llamacy.server.app import ServerSettings, create_app
from llamacy.server.runner import ServerThread, bind, serve_forever

__all__ = ["ServerSettings", "ServerThread", "bind", "create_app", "serve_forever"]
