"""Anthropic's Messages API on the same server: POST /v1/messages (streamed as Anthropic's event sequence,
message_start ... content_block_delta ... message_stop) and POST /v1/messages/count_tokens. Errors are
Anthropic's {"type": "error", "error": {"type", "message"}, "request_id"}.

The conversation goes through the model's chat template like the OpenAI chat route's, so a greedy answer
here equals the OpenAI endpoint's for the same messages.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.scheduler import Done, Failed, Piece
from llamacy.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from llamacy.server.dialect import collect
from llamacy.server.errors import APIError
from llamacy.server.models import ServedModel
from llamacy.server.schemas import parse
from llamacy.server.state import state_of

# Anthropic's error type for each status; 529 is its "overloaded": here a full queue and every 503 (the
# server shutting down, no memory to load the model now), all worth a retry later.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_OVERLOADED = 529


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": f"req_{uuid.uuid4().hex}",
    }


def _status(e: APIError) -> int:
    return _OVERLOADED if e.code == "queue_full" or e.status == 503 else e.status


def _error(e: APIError) -> JSONResponse:
    status = _status(e)
    body = _error_body(status, e.message)
    headers = {**(e.headers or {}), "request-id": body["request_id"]}  # where the client reads it
    return JSONResponse(body, status_code=status, headers=headers)


def _failure(ev: Failed) -> APIError:
    return APIError(_OVERLOADED, ev.message) if ev.shutdown else APIError(500, ev.message)


async def _prompt(served: ServedModel, body: CountTokensRequest | MessagesRequest) -> list[int]:
    conv = body.conversation()
    return await gen.encode_chat(served, conv.messages, prefill=conv.prefill)


def _stop(done: Done, body: MessagesRequest) -> tuple[str, str | None]:
    """stop_reason and stop_sequence."""
    if done.finish_reason == "stop":
        if done.stop_string is not None and done.stop_string in (body.stop_sequences or ()):
            return "stop_sequence", done.stop_string
        return "end_turn", None  # an end-of-turn token, or the template's end marker spelled out
    if done.usage.completion_tokens >= body.max_tokens:
        return "max_tokens", None
    return "model_context_window_exceeded", None


def _event(kind: str, obj: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj}, ensure_ascii=False)}\n\n"


async def messages(request: Request) -> Response:
    body: MessagesRequest = parse(MessagesRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    ids = await _prompt(served, body)
    req = gen.build_request(served, body.sampling(), ids, body.max_tokens, chat=True)
    call = await gen.start(served, [req])
    message = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": served.name,
    }

    if body.stream:

        async def stream() -> AsyncIterator[str]:
            start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
            usage = {"input_tokens": len(ids), "output_tokens": 0}
            async with gen.cancel_on_disconnect(request, call):
                yield _event("message_start", {"message": {**start, "usage": usage}})
                yield _event(
                    "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
                )
                yield _event("ping", {})
                async for _, ev in call.events:
                    if isinstance(ev, Piece):
                        if ev.text:
                            delta = {"type": "text_delta", "text": ev.text}
                            yield _event("content_block_delta", {"index": 0, "delta": delta})
                    elif isinstance(ev, Done):
                        reason, seq = _stop(ev, body)
                        yield _event("content_block_stop", {"index": 0})
                        yield _event(
                            "message_delta",
                            {
                                "delta": {"stop_reason": reason, "stop_sequence": seq},
                                "usage": {"output_tokens": ev.usage.completion_tokens},
                            },
                        )
                        yield _event("message_stop", {})
                    else:
                        e = _failure(ev)
                        yield f"event: error\ndata: {json.dumps(_error_body(e.status, e.message))}\n\n"

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    end, _ = await collect(request, call)
    if isinstance(end, Failed):
        raise _failure(end)
    reason, seq = _stop(end, body)
    return JSONResponse(
        {
            **message,
            "content": [{"type": "text", "text": end.text}],
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": {"input_tokens": end.usage.prompt_tokens, "output_tokens": end.usage.completion_tokens},
        }
    )


async def count_tokens(request: Request) -> Response:
    body: CountTokensRequest = parse(CountTokensRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    return JSONResponse({"input_tokens": len(await _prompt(served, body))})


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
ERROR_SHAPES = {"/v1/messages": _error}  # what the middleware refuses (API key, body size) too
