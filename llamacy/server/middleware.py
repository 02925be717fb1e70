"""The ASGI middleware in front of the routes, outermost first: name the replica (when the server is one
of several) -> count requests (so that refusals count too) -> API key -> body size -> hold the models a
request uses."""

from __future__ import annotations

import hmac
import threading
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llamacy.server.errors import APIError, render_error
from llamacy.server.models import holding


class HTTPMiddleware:
    """Passes anything but HTTP (lifespan, websockets) straight through; subclasses handle HTTP."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


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


def endpoint_label(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """The path template of the route a request goes to ("/jobs/{job_id}"): a bounded set of labels,
    taken from the registered routes themselves; paths no route serves share the label "other"."""
    for route in routes:
        if route.matches(scope)[0] != Match.NONE:  # PARTIAL: the path, not the method (a 405)
            return getattr(route, "path", "other")
    return "other"


class CountRequests(HTTPMiddleware):
    """Count every HTTP response by endpoint and status (outermost, so that 401 and 413 count)."""

    def __init__(self, app: ASGIApp, counter: RequestCounter, routes: Sequence[BaseRoute]) -> None:
        super().__init__(app)
        self.counter = counter
        self.routes = routes

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 500  # an exception before the response started

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        label = endpoint_label(self.routes, scope)  # before the router adds its keys to the scope
        try:
            await self.app(scope, receive, send_and_note)
        finally:
            self.counter.add(label, status)


class NameReplica(HTTPMiddleware):
    """Every response says which replica answered it (`X-Llamacy-Replica`), errors included."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        super().__init__(app)
        self.header = (b"x-llamacy-replica", name.encode())

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


class HoldModels(HTTPMiddleware):
    """The models a request acquires stay loaded until its response has been sent (streams included). They
    are let go just before the last message of the response goes out: once the client has the whole
    response, its next request finds them idle (released after the send, it could race the release)."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        with holding() as release:

            async def send_releasing(message: Message) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body", False):
                    release()
                await send(message)

            await self.app(scope, receive, send_releasing)


class RequireAPIKey(HTTPMiddleware):
    """`Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) on every path but the public ones
    (/health: load balancers probe it without credentials)."""

    def __init__(self, app: ASGIApp, api_key: str, public_paths: frozenset[str]) -> None:
        super().__init__(app)
        self.expected = f"Bearer {api_key}".encode()
        self.expected_x = api_key.encode()
        self.public_paths = public_paths

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] not in self.public_paths:
            headers = dict(scope["headers"])
            given = headers.get(b"authorization", b"")
            given_x = headers.get(b"x-api-key", b"")
            # Constant time: no key guessing by timing.
            ok = hmac.compare_digest(given, self.expected) or hmac.compare_digest(given_x, self.expected_x)
            if not ok:
                message = (
                    "missing API key (send Authorization: Bearer <key>)"
                    if not (given or given_x)
                    else "invalid API key"
                )
                e = APIError(401, message, "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await render_error(scope, e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class LimitBody(HTTPMiddleware):
    """Refuse bodies over `limit` bytes with 413: by Content-Length up front, else while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await render_error(scope, APIError(413, self._message(), "body_too_large"))(scope, receive, send)
            return
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:  # chunked upload without a length
                    raise APIError(413, self._message(), "body_too_large")
            return message

        await self.app(scope, limited_receive, send)

    def _message(self) -> str:
        return f"the request body is larger than {self.limit} bytes"
