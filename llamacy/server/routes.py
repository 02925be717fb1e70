"""Every endpoint of the server, registered in one place. A new endpoint module exposes
`ROUTES: list[Route]` (and `PUBLIC_PATHS` if some need no API key) and is added here, nowhere else:
the app, the API-key guard and the metrics' endpoint labels all read these lists."""

from __future__ import annotations

from starlette.routing import BaseRoute

from llamacy.server.anthropic_routes import ERROR_SHAPES as ANTHROPIC_ERROR_SHAPES
from llamacy.server.anthropic_routes import ROUTES as ANTHROPIC_ROUTES
from llamacy.server.errors import ErrorShape
from llamacy.server.jobs import ROUTES as JOB_ROUTES
from llamacy.server.metrics import PUBLIC_PATHS as METRICS_PUBLIC_PATHS
from llamacy.server.metrics import ROUTES as METRICS_ROUTES
from llamacy.server.ollama_routes import ERROR_SHAPES as OLLAMA_ERROR_SHAPES
from llamacy.server.ollama_routes import ROUTES as OLLAMA_ROUTES
from llamacy.server.openai_embeddings import ROUTES as EMBEDDING_ROUTES
from llamacy.server.openai_routes import ROUTES as OPENAI_ROUTES
from llamacy.server.responses_routes import ROUTES as RESPONSES_ROUTES
from llamacy.server.slot_routes import ROUTES as SLOT_ROUTES
from llamacy.server.tokenize_routes import ROUTES as TOKENIZE_ROUTES

ROUTES: list[BaseRoute] = [
    *METRICS_ROUTES,
    *OPENAI_ROUTES,
    *RESPONSES_ROUTES,
    *EMBEDDING_ROUTES,
    *TOKENIZE_ROUTES,
    *OLLAMA_ROUTES,
    *ANTHROPIC_ROUTES,
    *JOB_ROUTES,
    *SLOT_ROUTES,
]
PUBLIC_PATHS: frozenset[str] = METRICS_PUBLIC_PATHS
# Paths answering errors in another dialect's shape than OpenAI's (errors.render_error), by prefix.
ERROR_SHAPES: dict[str, ErrorShape] = {**OLLAMA_ERROR_SHAPES, **ANTHROPIC_ERROR_SHAPES}
