"""Errors as HTTP responses in OpenAI's shape: {"error": {"message", "type", "code"}}, never a traceback."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

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


async def handle_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return error_response(exc.status, exc.message, exc.code, exc.param, exc.headers)


async def handle_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    message = (
        exc.detail if exc.status_code != 404 else f"no such endpoint: {request.method} {request.url.path}"
    )
    return error_response(exc.status_code, str(message), headers=exc.headers)


async def handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # The traceback goes to the server log, never to the client.
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal server error", "internal_error")
