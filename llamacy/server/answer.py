"""The one streaming loop and the one collecting loop every generation endpoint answers through; what
differs between dialects (OpenAI chat and completions, the Responses API, Ollama, Anthropic) is an Encoder.

    call = await gen.start(served, requests)
    return await answer(request, call, encoder, stream=body.stream)

Streamed: encoder.opening(), then per event delta(i, piece) / closing(i, done) / error(failed) (after an
error the other choices are cancelled), finale(dones) once every choice is done, tail() in any case.
Whole: the events are collected (logprobs kept), a Failed raises encoder.failure(failed), and
encoder.whole(dones, logprobs) is the JSON body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

import llamacy.server.generation as gen
from llamacy.scheduler import Done, Failed, Piece, TokenLogprob
from llamacy.server.errors import APIError

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # no buffering by proxies


class Encoder:
    """One dialect's answer: each method returns the wire lines to send (SSE events or NDJSON lines)."""

    media_type = "text/event-stream"
    headers: dict[str, str] = SSE_HEADERS

    def opening(self) -> list[str]:
        return []

    def delta(self, i: int, piece: Piece) -> list[str]:
        raise NotImplementedError

    def closing(self, i: int, done: Done) -> list[str]:
        raise NotImplementedError

    def finale(self, dones: list[Done]) -> list[str]:
        """After the last choice's closing (not after an error)."""
        return []

    def tail(self) -> list[str]:
        """The stream's very end, after an error too (OpenAI's [DONE])."""
        return []

    def error(self, failed: Failed) -> list[str]:
        raise NotImplementedError

    def failure(self, failed: Failed) -> APIError:
        """A failed request that is not streamed, as the error response to answer."""
        return APIError(503 if failed.shutdown else 500, failed.message, "generation_failed")

    def whole(self, dones: list[Done], logprobs: list[list[TokenLogprob]]) -> dict[str, Any]:
        raise NotImplementedError


async def collect(
    request: Request, call: gen.Generation
) -> tuple[list[Done | Failed], list[list[TokenLogprob]]]:
    """Every choice's end (by index; the first Failed ends the wait) and the logprobs of its tokens."""
    n = len(call.handles)
    ends: dict[int, Done | Failed] = {}
    lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
    async with gen.cancel_on_disconnect(request, call):
        async for i, ev in call.events:
            if isinstance(ev, Piece):
                lps[i].extend(ev.logprobs or ())
            elif isinstance(ev, Failed):
                return [ev], lps
            else:
                ends[i] = ev
    return [ends[i] for i in range(n)], lps


async def drive(call: gen.Generation, encoder: Encoder) -> AsyncIterator[str]:
    """The one loop over a call's events: the encoder's lines for each, as described above. Leaving it early
    does not cancel the requests (lines() does; a job runs on without a client)."""
    n = len(call.handles)
    dones: dict[int, Done] = {}
    for line in encoder.opening():
        yield line
    async for i, ev in call.events:
        if isinstance(ev, Piece):
            out = encoder.delta(i, ev)
        elif isinstance(ev, Done):
            dones[i] = ev
            out = encoder.closing(i, ev)
        else:
            for line in encoder.error(ev):
                yield line
            break
        for line in out:
            yield line
    else:
        if len(dones) == n:
            for line in encoder.finale([dones[i] for i in range(n)]):
                yield line
    for line in encoder.tail():
        yield line


async def lines(request: Request, call: gen.Generation, encoder: Encoder) -> AsyncIterator[str]:
    """drive(), for a client that is listening: its disconnecting, or an error in one choice, cancels the
    call's requests."""
    async with gen.cancel_on_disconnect(request, call):
        async for line in drive(call, encoder):
            yield line


async def answer(request: Request, call: gen.Generation, encoder: Encoder, stream: bool) -> Response:
    if stream:
        return StreamingResponse(
            lines(request, call, encoder), media_type=encoder.media_type, headers=encoder.headers
        )
    ends, lps = await collect(request, call)
    if isinstance(ends[0], Failed):
        raise encoder.failure(ends[0])
    return JSONResponse(encoder.whole(ends, lps))  # type: ignore[arg-type]
