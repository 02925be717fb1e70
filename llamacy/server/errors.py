"""Errors as HTTP responses in OpenAI's shape: {"error": {"message", "type", "code"}}, never a traceback;
on the paths of another dialect (Ollama's /api/, Anthropic's /v1/messages), in that dialect's shape."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from llamacy.errors import ContextOverflowError, LlamacyError, UsageError
from llamacy.scheduler import QueueFull, SchedulerClosed

log = logging.getLogger("llamacy.server")

# The `type` OpenAI uses for each status (clients branch on status; people read type and message).
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    501: "not_implemented_error",
    503: "server_error",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(
    status: int, message: str, code: str | None = None, param: str | None = None, headers: dict | None = None
) -> JSONResponse:
    return JSONResponse(error_body(status, message, code, param), status_code=status, headers=headers)


def from_engine_error(e: LlamacyError) -> APIError:
    """The HTTP meaning of an error raised by the scheduler, the tokenizer or the chat template."""
    if isinstance(e, QueueFull):
        return APIError(429, str(e), "queue_full", headers={"Retry-After": "1"})
    if isinstance(e, SchedulerClosed):
        return APIError(503, str(e), "shutting_down")
    if isinstance(e, ContextOverflowError):
        return APIError(400, str(e), "context_length_exceeded", "messages")
    if isinstance(e, UsageError):
        return APIError(400, str(e), "invalid_value")
    return APIError(400, str(e), "invalid_request")  # e.g. a chat template that rejects the messages


ErrorShape = Callable[[APIError], Response]


def render_error(scope: Scope, e: APIError) -> Response:
    """e in the shape of the API the request's path belongs to: a dialect's, by the path prefixes in the
    app's state.error_shapes (routes.ERROR_SHAPES), else OpenAI's."""
    app = scope.get("app")
    shapes: Mapping[str, ErrorShape] = getattr(app.state, "error_shapes", {}) if app is not None else {}
    for prefix, shape in shapes.items():
        if scope["path"].startswith(prefix):
            return shape(e)
    return error_response(e.status, e.message, e.code, e.param, e.headers)


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return render_error(request.scope, exc)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    message = (
        exc.detail if exc.status_code != 404 else f"no such endpoint: {request.method} {request.url.path}"
    )
    return render_error(request.scope, APIError(exc.status_code, str(message), headers=exc.headers))


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    # The traceback goes to the server log, never to the client.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return render_error(request.scope, APIError(500, "internal server error", "internal_error"))
