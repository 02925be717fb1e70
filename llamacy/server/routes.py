"""Every endpoint of the server, registered in one place. A new endpoint module exposes
`ROUTES: list[Route]` (and `PUBLIC_PATHS` if some need no API key) and is added here, nowhere else:
the app, the API-key guard and the metrics' endpoint labels all read these lists."""

from __future__ import annotations

from starlette.routing import BaseRoute

from llamacy.server.jobs import ROUTES as JOB_ROUTES
from llamacy.server.metrics import PUBLIC_PATHS as METRICS_PUBLIC_PATHS
from llamacy.server.metrics import ROUTES as METRICS_ROUTES
from llamacy.server.openai_routes import ROUTES as OPENAI_ROUTES
from llamacy.server.tokenize_routes import ROUTES as TOKENIZE_ROUTES

ROUTES: list[BaseRoute] = [*METRICS_ROUTES, *OPENAI_ROUTES, *TOKENIZE_ROUTES, *JOB_ROUTES]
PUBLIC_PATHS: frozenset[str] = METRICS_PUBLIC_PATHS
