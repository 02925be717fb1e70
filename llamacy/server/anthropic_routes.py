"""Anthropic's Messages API on the same server: POST /v1/messages (streamed as Anthropic's event sequence,
message_start ... content_block_delta ... message_stop) and POST /v1/messages/count_tokens. Errors are
Anthropic's {"type": "error", "error": {"type", "message"}, "request_id"}.

The conversation goes through the model's chat template like the OpenAI chat route's, so a greedy answer
here equals the OpenAI endpoint's for the same messages. Custom tools are offered through the same
structured-output layer (server/structured.py, anthropic_tools.py): a call comes back as a tool_use block
with stop_reason "tool_use", streamed as content_block_start (the block, input {}), input_json_delta
events with the arguments as the model writes them, content_block_stop. output_config.format's JSON schema
constrains the text.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.scheduler import Done, Failed, Piece
from llamacy.server.answer import Encoder, answer
from llamacy.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from llamacy.server.anthropic_tools import openai_tool_choice, openai_tools, tool_use_blocks, tool_use_id
from llamacy.server.errors import APIError
from llamacy.server.models import ServedModel
from llamacy.server.schemas import parse
from llamacy.server.state import state_of
from llamacy.server.structured import attach_constraints, structured_request
from llamacy.structured import StructuredRequest
from llamacy.structured.call_stream import CallStart, ReplyEvent, Text

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


async def _prompt(
    served: ServedModel, body: CountTokensRequest | MessagesRequest
) -> tuple[list[int], StructuredRequest]:
    """The prompt's token ids (the tools offered in it), and what the reply may be."""
    conv = body.conversation()
    choice, parallel = openai_tool_choice(body.tool_choice, body.tools)
    structured = await structured_request(
        served,
        chat=True,
        json_schema=body.output_schema(),
        tools=openai_tools(body.tools),
        tool_choice=choice,
        parallel_tool_calls=parallel,
    )
    if structured.tools.forced and conv.prefill:
        raise APIError(
            400, "a final assistant message (prefill) cannot be continued when tool_choice forces tool use"
        )
    ids = await gen.encode_chat(served, conv.messages, structured, prefill=conv.prefill)
    return ids, structured


def _stop(done: Done, body: MessagesRequest, calls: bool = False) -> tuple[str, str | None]:
    """stop_reason and stop_sequence."""
    if calls:
        return "tool_use", None
    if done.finish_reason == "stop":
        if done.stop_string is not None and done.stop_string in (body.stop_sequences or ()):
            return "stop_sequence", done.stop_string
        return "end_turn", None  # an end-of-turn token, or the template's end marker spelled out
    if done.usage.completion_tokens >= body.max_tokens:
        return "max_tokens", None
    return "model_context_window_exceeded", None


def _event(kind: str, obj: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj}, ensure_ascii=False)}\n\n"


class _MessagesEncoder(Encoder):
    """One message as Anthropic's events: message_start, content blocks (start, deltas, stop), message_delta
    with the stop reason, message_stop; or whole."""

    def __init__(
        self, body: MessagesRequest, message: dict[str, Any], n_prompt: int, structured: StructuredRequest
    ):
        self.body = body
        self.message = message
        self.n_prompt = n_prompt
        self.structured = structured
        # With tools, text that may be a call is held back, and the text block opens with the first text to
        # show (a forced call is all tool_use blocks); without, it opens at once, as Anthropic's.
        self.parser = structured.reply_stream()
        self.blocks = 0  # content blocks opened so far
        self.open: str | None = None  # the kind of the open block ("text", "tool_use")

    def _start(self, block: dict[str, Any]) -> list[str]:
        out = self._stop_block()
        self.open = block["type"]
        out.append(_event("content_block_start", {"index": self.blocks, "content_block": block}))
        self.blocks += 1
        return out

    def _stop_block(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"index": self.blocks - 1})]

    def _delta(self, delta: dict[str, Any]) -> str:
        return _event("content_block_delta", {"index": self.blocks - 1, "delta": delta})

    def _on(self, ev: ReplyEvent) -> list[str]:
        if isinstance(ev, Text):
            out = [] if self.open == "text" else self._start({"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": ev.text})]
        if isinstance(ev, CallStart):
            block = {"type": "tool_use", "id": tool_use_id(ev.id), "name": ev.name, "input": {}}
            return self._start(block)
        return [self._delta({"type": "input_json_delta", "partial_json": ev.text})]

    def opening(self) -> list[str]:
        start = {**self.message, "content": [], "stop_reason": None, "stop_sequence": None}
        usage = {"input_tokens": self.n_prompt, "output_tokens": 0}
        out = [_event("message_start", {"message": {**start, "usage": usage}})]
        if self.parser is None:
            out += self._start({"type": "text", "text": ""})
        return [*out, _event("ping", {})]

    def delta(self, i: int, piece: Piece) -> list[str]:
        if self.parser is None:
            return self._on(Text(piece.text)) if piece.text else []
        return [line for ev in self.parser.feed(piece.text) for line in self._on(ev)]

    def closing(self, i: int, done: Done) -> list[str]:
        events, calls = self.parser.finish() if self.parser is not None else ([], [])
        out = [line for ev in events for line in self._on(ev)]
        if self.blocks == 0:  # nothing was said: one empty text block, as the whole answer has
            out += [
                *self._start({"type": "text", "text": ""}),
                self._delta({"type": "text_delta", "text": ""}),
            ]
        out += self._stop_block()
        reason, seq = _stop(done, self.body, bool(calls))
        delta = {
            "delta": {"stop_reason": reason, "stop_sequence": seq},
            "usage": {"output_tokens": done.usage.completion_tokens},
        }
        return [*out, _event("message_delta", delta), _event("message_stop", {})]

    def error(self, failed: Failed) -> list[str]:
        e = self.failure(failed)
        return [f"event: error\ndata: {json.dumps(_error_body(e.status, e.message))}\n\n"]

    def failure(self, failed: Failed) -> APIError:
        return _failure(failed)

    def whole(self, dones: list[Done], logprobs: Any) -> dict[str, Any]:
        [end] = dones
        text, calls, _ = self.structured.reply(end.text, end.finish_reason)
        content = [{"type": "text", "text": text or ""}] if text or not calls else []
        reason, seq = _stop(end, self.body, bool(calls))
        return {
            **self.message,
            "content": content + tool_use_blocks(calls),
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": {"input_tokens": end.usage.prompt_tokens, "output_tokens": end.usage.completion_tokens},
        }


async def messages(request: Request) -> Response:
    body: MessagesRequest = parse(MessagesRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    ids, structured = await _prompt(served, body)
    req = gen.build_request(served, body.sampling(), ids, body.max_tokens, chat=True)
    await attach_constraints(served, structured, [req])
    call = await gen.start(served, [req])
    message = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": served.name,
    }
    return await answer(request, call, _MessagesEncoder(body, message, len(ids), structured), body.stream)


async def count_tokens(request: Request) -> Response:
    body: CountTokensRequest = parse(CountTokensRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    ids, _ = await _prompt(served, body)
    return JSONResponse({"input_tokens": len(ids)})


ROUTES = [
    Route("/v1/messages", messages, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
ERROR_SHAPES = {"/v1/messages": _error}  # what the middleware refuses (API key, body size) too
