"""An HTTP request carried from the ingress to a replica as one value, and the replica's ASGI messages
carried back as a stream: the replica runs the whole llamacy app on it (every endpoint, its middleware,
streaming) exactly as a local server would."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive

log = logging.getLogger("llamacy.distributed")

# The parts of an HTTP scope that describe the request (the rest is the ASGI server's own state).
SCOPE_FIELDS = (
    "type",
    "asgi",
    "http_version",
    "method",
    "scheme",
    "path",
    "raw_path",
    "query_string",
    "headers",
    "client",
    "server",
)


@dataclass
class ForwardedRequest:
    scope: dict[str, Any]
    body: bytes
    prefix: tuple[str, ...] = field(default=())  # the prompt's prefix hashes: the router reads them


def portable_scope(scope: dict[str, Any]) -> dict[str, Any]:
    out = {k: scope[k] for k in SCOPE_FIELDS if k in scope}
    out["headers"] = [(bytes(k), bytes(v)) for k, v in scope.get("headers", [])]
    out["root_path"] = ""
    for k in ("client", "server"):
        if out.get(k) is not None:
            out[k] = tuple(out[k])
    return out


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request body, read up to `limit` bytes (the app refuses a body over its own limit with 413)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False) or size >= limit:
            break
    return b"".join(chunks)


async def run_app(app: ASGIApp, request: ForwardedRequest) -> AsyncIterator[list[Message]]:
    """Run `app` on the request; yield its ASGI messages, in batches of those ready together (under load,
    a stream's pieces travel in fewer, larger hops). Closing the iterator early (the client went away)
    cancels the app, which cancels its generation."""
    queue: asyncio.Queue[Message] = asyncio.Queue()
    body_sent = False

    async def receive() -> Message:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect to report: a client that leaves cancels us instead
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        queue.put_nowait(message)

    task = asyncio.create_task(app(dict(request.scope), receive, send))
    ended = False
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break  # the app returned (or raised) with nothing more queued
            batch = [getter.result()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            yield batch
            if _ends_response(batch[-1]):
                ended = True
                break
        try:
            await task
        except Exception:
            if not ended:
                raise  # no response (or half of one): the caller answers for it
            # Starlette re-raises what it already answered with a 500, for the server's log: log it here.
            log.exception("after %s %s", request.scope.get("method"), request.scope.get("path"))
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _ends_response(message: Message) -> bool:
    return message["type"] == "http.response.body" and not message.get("more_body", False)
