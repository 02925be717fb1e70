"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions."""

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
from llamacy.scheduler import Done, Failed, Handle, Piece, TokenLogprob
from llamacy.server.errors import APIError, error_body
from llamacy.server.schemas import ChatRequest, CompletionRequest, parse
from llamacy.server.state import state_of

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy endpoint; chat has none


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _failure(ev: Failed) -> APIError:
    status = 503 if ev.shutdown else 500  # 503: the server is stopping, the request was fine
    return APIError(status, ev.message, "generation_failed")


def _sse_error(ev: Failed) -> str:
    e = _failure(ev)
    return _sse(error_body(e.status, e.message, e.code))


async def list_models(request: Request) -> JSONResponse:
    state = state_of(request)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": state.created, "owned_by": "llamacy"}
                for name in state.models.names()
            ],
        }
    )


# ---- /v1/completions ---------------------------------------------------------------------------------


async def completions(request: Request) -> Response:
    body = parse(CompletionRequest, await request.body())
    served = state_of(request).models.get(body.model)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a list of one prompt
    if isinstance(prompt, str):
        ids = await gen.encode_text(served, prompt)
        prompt_text = prompt
    else:
        ids = list(prompt)
        prompt_text = ""  # decoded below only when echoed: ids may be outside the vocabulary
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    req = gen.build_request(served, body, ids, max_tokens, body.logprobs)
    handle, events = await gen.start(served, req)
    if body.echo and not isinstance(prompt, str):
        prompt_text = served.tokenizer.decode(ids)
    echo = prompt_text if body.echo else ""
    cid = f"cmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def choice(text: str, finish: str | None, lps: dict | None) -> dict:
        return {"text": text, "index": 0, "logprobs": lps, "finish_reason": finish}

    def wrap(choices: list[dict]) -> dict:
        return {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": served.name,
            "choices": choices,
        }

    want_lp = body.logprobs is not None
    if body.stream:

        async def stream() -> AsyncIterator[str]:
            offset = len(echo)
            async with gen.cancel_on_disconnect(request, handle):
                if echo:
                    yield _sse(wrap([choice(echo, None, None)]))
                async for ev in events:
                    if isinstance(ev, Piece):
                        lps = (
                            gen.completion_logprobs(served, ev.logprobs, offset)
                            if want_lp and ev.logprobs
                            else None
                        )
                        offset += len(ev.text)
                        if ev.text or lps:
                            yield _sse(wrap([choice(ev.text, None, lps)]))
                    elif isinstance(ev, Done):
                        out = wrap([choice("", gen.finish_reason(ev), None)])
                        yield _sse({**out, "usage": gen.usage_dict(ev), "timings": ev.timings.as_dict()})
                    else:
                        yield _sse_error(ev)
                yield "data: [DONE]\n\n"

        return _event_stream(stream())

    final, lps_all = await _finish(request, handle, events)
    lps = gen.completion_logprobs(served, lps_all, len(echo)) if want_lp else None
    out = wrap([choice(echo + final.text, gen.finish_reason(final), lps)])
    return JSONResponse({**out, "usage": gen.usage_dict(final), "timings": final.timings.as_dict()})


# ---- /v1/chat/completions ----------------------------------------------------------------------------


async def chat_completions(request: Request) -> Response:
    body = parse(ChatRequest, await request.body())
    served = state_of(request).models.get(body.model)
    messages = [
        {"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})} for m in body.messages
    ]
    ids = await gen.encode_chat(served, messages)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    req = gen.build_request(served, body, ids, body.token_limit(), logprobs, chat=True)
    handle, events = await gen.start(served, req)
    cid = f"chatcmpl-{uuid.uuid4().hex}"
    created = int(time.time())

    def wrap(obj: str, choices: list[dict]) -> dict:
        return {"id": cid, "object": obj, "created": created, "model": served.name, "choices": choices}

    if body.stream:

        def chunk(delta: dict, finish: str | None = None, lps: dict | None = None) -> dict:
            choice = {"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}
            return wrap("chat.completion.chunk", [choice])

        async def stream() -> AsyncIterator[str]:
            async with gen.cancel_on_disconnect(request, handle):
                yield _sse(chunk({"role": "assistant", "content": ""}))
                async for ev in events:
                    if isinstance(ev, Piece):
                        lps = gen.chat_logprobs(served, ev.logprobs) if ev.logprobs else None
                        if ev.text or lps:
                            yield _sse(chunk({"content": ev.text}, lps=lps))
                    elif isinstance(ev, Done):
                        last = chunk({}, gen.finish_reason(ev))
                        yield _sse({**last, "usage": gen.usage_dict(ev), "timings": ev.timings.as_dict()})
                    else:
                        yield _sse_error(ev)
                yield "data: [DONE]\n\n"

        return _event_stream(stream())

    final, lps_all = await _finish(request, handle, events)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": final.text},
        "logprobs": gen.chat_logprobs(served, lps_all) if body.logprobs else None,
        "finish_reason": gen.finish_reason(final),
    }
    out = wrap("chat.completion", [choice])
    return JSONResponse({**out, "usage": gen.usage_dict(final), "timings": final.timings.as_dict()})


# ---- shared ------------------------------------------------------------------------------------------


async def _finish(
    request: Request, handle: Handle, events: gen.EventBridge
) -> tuple[Done, list[TokenLogprob]]:
    """Wait for a request that is not streamed: its Done and its logprobs; Failed raises APIError."""
    lps: list[TokenLogprob] = []
    async with gen.cancel_on_disconnect(request, handle):
        async for ev in events:
            if isinstance(ev, Piece):
                lps.extend(ev.logprobs or ())
            elif isinstance(ev, Failed):
                raise _failure(ev)
            else:
                return ev, lps
    raise AssertionError("the event stream ended without Done or Failed")


def _event_stream(chunks: AsyncIterator[str]) -> StreamingResponse:
    # No buffering by proxies; the client sees each token as it comes.
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(chunks, media_type="text/event-stream", headers=headers)


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
