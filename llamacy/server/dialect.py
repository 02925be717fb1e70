"""What the non-OpenAI dialects (Ollama, Anthropic) share: errors rendered in the dialect's own shape, and
waiting for a request that is not streamed."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

import llamacy.server.generation as gen
from llamacy.scheduler import Done, Failed, Piece, TokenLogprob
from llamacy.server.errors import APIError

log = logging.getLogger("llamacy.server")

Endpoint = Callable[[Request], Awaitable[Response]]


def errors_as(render: Callable[[APIError], Response]) -> Callable[[Endpoint], Endpoint]:
    """Wrap an endpoint so that its errors (APIError from validation, the registry or the scheduler, and
    anything unexpected) answer in the dialect's shape instead of OpenAI's."""

    def wrap(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def wrapped(request: Request) -> Response:
            try:
                return await endpoint(request)
            except APIError as e:
                return render(e)
            except Exception as e:  # the traceback goes to the server log, never to the client
                log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=e)
                return render(APIError(500, "internal server error", "internal_error"))

        return wrapped

    return wrap


async def collect(request: Request, call: gen.Generation) -> tuple[Done | Failed, list[TokenLogprob]]:
    """The end of a one-request call that is not streamed, and the logprobs of its tokens."""
    lps: list[TokenLogprob] = []
    async with gen.cancel_on_disconnect(request, call):
        async for _, ev in call.events:
            if isinstance(ev, Piece):
                lps.extend(ev.logprobs or ())
            else:
                return ev, lps
    raise AssertionError("the event stream ended without Done or Failed")


def ns(ms: float) -> int:
    """Milliseconds as the integer nanoseconds Ollama reports durations in."""
    return round(ms * 1_000_000)
