"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

Both generation endpoints answer n choices (n requests to the scheduler, each its own sequence), whole or
streamed as server-sent events; they differ only in how a choice is spelled (a _Shape). Streams end with
a chunk per choice that carries its finish_reason (and, as llama.cpp does, its usage); with
stream_options.include_usage, as OpenAI does instead: `usage: null` on every chunk, then one last chunk
with empty choices and the usage of the whole call.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.scheduler import Done, Failed, Piece, TokenLogprob
from llamacy.server.errors import APIError, error_body
from llamacy.server.models import ServedModel
from llamacy.server.schemas import ChatRequest, CompletionRequest, parse
from llamacy.server.state import state_of
from llamacy.server.structured import attach_constraints, messages_of, structured_for
from llamacy.structured import StructuredRequest, tool_call_deltas

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy endpoint; chat has none


async def list_models(request: Request) -> JSONResponse:
    state = state_of(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                # `loaded`: an addition; a model that is not is loaded by its first request.
                {
                    "id": name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "llamacy",
                    "loaded": state.models.is_loaded(name),
                }
                for name in state.models.names()
            ],
        }
    )


# ---- how each endpoint spells a choice ---------------------------------------------------------------


class _Shape:
    """One endpoint's choice objects: whole (`whole`) or as stream chunks (`opening`, `delta`, `closing`;
    None: nothing to send)."""

    object = ""
    chunk_object = ""

    def opening(self, i: int) -> dict | None:
        return None

    def delta(self, i: int, piece: Piece) -> dict | None:
        raise NotImplementedError

    def closing(self, i: int, done: Done) -> dict:
        raise NotImplementedError

    def whole(self, i: int, done: Done, lps: list[TokenLogprob]) -> dict:
        raise NotImplementedError


class _CompletionShape(_Shape):
    object = chunk_object = "text_completion"

    def __init__(self, served: ServedModel, n: int, echo: str, logprobs: bool) -> None:
        self.served = served
        self.echo = echo
        self.logprobs = logprobs
        self.offsets = [len(echo)] * n  # text_offset of each choice's next token

    @staticmethod
    def _choice(i: int, text: str, finish: str | None = None, lps: dict | None = None) -> dict:
        return {"text": text, "index": i, "logprobs": lps, "finish_reason": finish}

    def opening(self, i: int) -> dict | None:
        return self._choice(i, self.echo) if self.echo else None

    def delta(self, i: int, piece: Piece) -> dict | None:
        lps = None
        if self.logprobs and piece.logprobs:
            lps = gen.completion_logprobs(self.served, piece.logprobs, self.offsets[i])
        self.offsets[i] += len(piece.text)
        return self._choice(i, piece.text, None, lps) if piece.text or lps else None

    def closing(self, i: int, done: Done) -> dict:
        return self._choice(i, "", gen.finish_reason(done))

    def whole(self, i: int, done: Done, lps: list[TokenLogprob]) -> dict:
        lp = gen.completion_logprobs(self.served, lps, len(self.echo)) if self.logprobs else None
        return self._choice(i, self.echo + done.text, gen.finish_reason(done), lp)


class _ChatShape(_Shape):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, served: ServedModel, logprobs: bool, structured: StructuredRequest, n: int) -> None:
        self.served = served
        self.logprobs = logprobs
        self.structured = structured
        # Per choice: a parser that holds back text that may be a tool call (None: no tools offered).
        self.parsers = [structured.stream() for _ in range(n)]

    @staticmethod
    def _chunk(i: int, delta: dict, finish: str | None = None, lps: dict | None = None) -> dict:
        return {"index": i, "delta": delta, "logprobs": lps, "finish_reason": finish}

    def opening(self, i: int) -> dict | None:
        return self._chunk(i, {"role": "assistant", "content": ""})

    def delta(self, i: int, piece: Piece) -> dict | None:
        lps = gen.chat_logprobs(self.served, piece.logprobs) if piece.logprobs else None
        parser = self.parsers[i]
        text = parser.feed(piece.text) if parser is not None else piece.text
        return self._chunk(i, {"content": text}, None, lps) if text or lps else None

    def closing(self, i: int, done: Done) -> dict:
        finish = gen.finish_reason(done)
        delta: dict[str, Any] = {}
        parser = self.parsers[i]
        if parser is not None:
            rest, calls = parser.finish()
            if rest:
                delta["content"] = rest
            if calls:
                delta["tool_calls"] = tool_call_deltas(calls)
                finish = "tool_calls"
        return self._chunk(i, delta, finish)

    def whole(self, i: int, done: Done, lps: list[TokenLogprob]) -> dict:
        content, calls, finish = self.structured.reply(done.text, gen.finish_reason(done))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return {
            "index": i,
            "message": message,
            "logprobs": gen.chat_logprobs(self.served, lps) if self.logprobs else None,
            "finish_reason": finish,
        }


# ---- the endpoints -----------------------------------------------------------------------------------


async def completions(request: Request) -> Response:
    body = parse(CompletionRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a list of one prompt
    ids = await gen.encode_text(served, prompt) if isinstance(prompt, str) else list(prompt)
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    structured = await structured_for(served, body, chat=False)
    req = gen.build_request(served, body, ids, max_tokens, body.logprobs)
    requests = gen.choices(req, body.choices())
    await attach_constraints(served, structured, requests)
    call = await gen.start(served, requests)
    echo = ""
    if body.echo:  # token ids are decoded only now: the scheduler has checked them against the vocabulary
        echo = prompt if isinstance(prompt, str) else served.tokenizer.decode(ids)
    shape = _CompletionShape(served, body.choices(), echo, body.logprobs is not None)
    return await _answer(request, served, call, shape, body.stream, body.include_usage(), "cmpl")


async def chat_completions(request: Request) -> Response:
    body = parse(ChatRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    structured = await structured_for(served, body, chat=True)
    ids = await gen.encode_chat(served, messages_of(body), structured)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    req = gen.build_request(served, body, ids, body.token_limit(), logprobs, chat=True)
    requests = gen.choices(req, body.choices())
    await attach_constraints(served, structured, requests)
    call = await gen.start(served, requests)
    shape = _ChatShape(served, body.logprobs, structured, body.choices())
    return await _answer(request, served, call, shape, body.stream, body.include_usage(), "chatcmpl")


# ---- shared ------------------------------------------------------------------------------------------


def _failure(ev: Failed) -> APIError:
    status = 503 if ev.shutdown else 500  # 503: the server is stopping, the request was fine
    return APIError(status, ev.message, "generation_failed")


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _answer(
    request: Request,
    served: ServedModel,
    call: gen.Generation,
    shape: _Shape,
    stream: bool,
    include_usage: bool,
    id_prefix: str,
) -> Response:
    n = len(call.handles)
    head = {"id": f"{id_prefix}-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.name}

    if stream:

        def chunk(choices: list[dict], **extra: Any) -> str:
            usage = {"usage": None} if include_usage else {}
            return _sse({**head, "object": shape.chunk_object, "choices": choices, **usage, **extra})

        async def events() -> AsyncIterator[str]:
            dones: list[Done] = []
            async with gen.cancel_on_disconnect(request, call):
                for i in range(n):
                    if (c := shape.opening(i)) is not None:
                        yield chunk([c])
                async for i, ev in call.events:
                    if isinstance(ev, Piece):
                        if (c := shape.delta(i, ev)) is not None:
                            yield chunk([c])
                    elif isinstance(ev, Done):
                        dones.append(ev)
                        own_usage = {} if include_usage else {"usage": gen.usage_dict(ev)}
                        yield chunk([shape.closing(i, ev)], **own_usage, timings=ev.timings.as_dict())
                    else:
                        e = _failure(ev)
                        yield _sse(error_body(e.status, e.message, e.code))
                        break  # leaving the block cancels the other choices
                if include_usage and len(dones) == n:
                    yield chunk([], usage=gen.usage_dict(*dones))
            yield "data: [DONE]\n\n"

        # No buffering by proxies; the client sees each token as it comes.
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    finals: dict[int, Done] = {}
    lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
    async with gen.cancel_on_disconnect(request, call):
        async for i, ev in call.events:
            if isinstance(ev, Piece):
                lps[i].extend(ev.logprobs or ())
            elif isinstance(ev, Failed):
                raise _failure(ev)
            else:
                finals[i] = ev
    dones = [finals[i] for i in range(n)]
    last = max(dones, key=lambda d: d.timings.total_ms)  # the call took as long as its slowest choice
    return JSONResponse(
        {
            **head,
            "object": shape.object,
            "choices": [shape.whole(i, d, lps[i]) for i, d in enumerate(dones)],
            "usage": gen.usage_dict(*dones),
            "timings": last.timings.as_dict(),
        }
    )


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
