"""Ollama's API on the same server: /api/generate, /api/chat (NDJSON streams by default), /api/tags,
/api/show, /api/ps, /api/version. Errors are Ollama's {"error": "..."}.

Prompts go through the same helpers as the OpenAI routes (a chat through the model's chat template, a raw
prompt as a completion), so a greedy answer here equals the OpenAI endpoint's for the same request.
Durations are integer nanoseconds, timestamps RFC 3339 in UTC. A request loads its model if it is not
loaded (load_duration says how long that took); when models unload is `llamacy serve`'s to say
(--idle-unload, --max-memory), so keep_alive is accepted and has no effect. An empty prompt only loads.

`format` ("json": any JSON object; an object: that JSON schema) constrains the answer, and /api/chat's
`tools` are offered as the OpenAI route offers them (server/structured.py): a call comes back as
message.tool_calls [{"function": {"name", "arguments": {...}}}] (arguments an object, as Ollama's), in the
last piece before the final one when streamed; its result comes back as a "tool" message.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import llamacy.server.embeddings as embeddings
import llamacy.server.generation as gen
import llamacy.server.model_card as model_card
from llamacy import __version__
from llamacy.errors import LlamacyError
from llamacy.scheduler import Done, Failed, Piece, TokenLogprob
from llamacy.server.answer import Encoder, answer
from llamacy.server.dialect import ns
from llamacy.server.errors import APIError
from llamacy.server.models import ServedModel
from llamacy.server.ollama_schemas import (
    ChatRequest,
    EmbeddingsRequest,
    EmbedRequest,
    GenerateRequest,
    Options,
    ShowRequest,
    parse_options,
)
from llamacy.server.schemas import parse
from llamacy.server.state import state_of
from llamacy.server.structured import attach_constraints, structured_request
from llamacy.structured import StructuredRequest

log = logging.getLogger("llamacy.server")


def _error(e: APIError) -> JSONResponse:
    return JSONResponse({"error": e.message}, status_code=e.status, headers=e.headers)


@dataclass(frozen=True)
class _Clock:
    """When the request began, and how long loading its model took (0 when it was loaded already)."""

    start: float
    load_ms: float

    def total_ms(self) -> float:
        return (time.perf_counter() - self.start) * 1000


async def _served(request: Request, name: str) -> tuple[ServedModel, _Clock]:
    start = time.perf_counter()
    served = await state_of(request).models.acquire(model_card.untagged(name))
    return served, _Clock(start, (time.perf_counter() - start) * 1000)


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def _metrics(done: Done, clock: _Clock) -> dict[str, Any]:
    t, u = done.timings, done.usage
    return {
        "total_duration": ns(clock.total_ms()),  # as Ollama's: the whole request, loading included
        "load_duration": ns(clock.load_ms),
        "prompt_eval_count": u.prompt_tokens,
        "prompt_eval_duration": ns(t.prompt_ms),
        "eval_count": u.completion_tokens,
        "eval_duration": ns(t.predict_ms),
    }


def _failure(ev: Failed) -> APIError:
    return APIError(503 if ev.shutdown else 500, ev.message)


def _token_limit(served: ServedModel, opts: Options, n_prompt: int) -> int | None:
    """num_predict, and num_ctx as a context smaller than the server's (a larger one cannot be had: the
    server's context size is fixed when it starts)."""
    limit = opts.num_predict
    if opts.num_ctx is not None and opts.num_ctx < served.scheduler.n_ctx:
        room = opts.num_ctx - n_prompt
        if room <= 0:
            raise APIError(400, f"the prompt has {n_prompt} tokens, which do not fit num_ctx={opts.num_ctx}")
        limit = room if limit is None else min(limit, room)
    return limit


def _with_context(served: ServedModel, context: list[int] | None, ids: list[int]) -> list[int]:
    """A previous answer's `context` (its token ids) continued by this prompt's ids, without a second BOS."""
    if not context:
        return ids
    bos = served.tokenizer.bos_id
    return list(context) + (ids[1:] if ids and bos is not None and ids[0] == bos else ids)


async def _start(
    served: ServedModel,
    body: GenerateRequest | ChatRequest,
    opts: Options,
    ids: list[int],
    chat: bool,
    structured: StructuredRequest,
) -> gen.Generation:
    max_tokens = _token_limit(served, opts, len(ids))
    req = gen.build_request(served, opts.sampling, ids, max_tokens, body.logprob_count(), chat=chat)
    await attach_constraints(served, structured, [req])
    return await gen.start(served, [req])


def _ollama_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's tool calls (arguments as JSON text) in Ollama's shape (arguments as an object)."""
    return [
        {"function": {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}}
        for c in calls
    ]


def _logprobs(served: ServedModel, lps: list[TokenLogprob] | None) -> dict[str, Any]:
    # Ollama's entries are OpenAI's chat entries: token, logprob, bytes, top_logprobs.
    return {"logprobs": gen.chat_logprobs(served, lps)["content"]} if lps is not None else {}


class _OllamaEncoder(Encoder):
    """NDJSON lines or one object. part(text, calls) -> the fields of a piece of the answer; final(done,
    text, calls) -> the fields of the last object (text: the whole answer, or "" when streamed; calls: tool
    calls in Ollama's shape, streamed in a piece of their own: Ollama's arguments are an object, not text
    to send in pieces)."""

    media_type = "application/x-ndjson"
    headers = {"Cache-Control": "no-cache"}  # noqa: RUF012 (a class constant)

    def __init__(
        self,
        served: ServedModel,
        clock: _Clock,
        want_lp: bool,
        structured: StructuredRequest,
        part: Callable[[str, list[dict[str, Any]]], dict[str, Any]],
        final: Callable[[Done, str, list[dict[str, Any]]], dict[str, Any]],
    ) -> None:
        self.served = served
        self.clock = clock
        self.want_lp = want_lp
        self.structured = structured
        self.part = part
        self.final = final
        self.parser = structured.stream()  # holds back text that may be a tool call (None: no tools)

    def _head(self) -> dict[str, Any]:
        return {"model": model_card.tagged(self.served.name), "created_at": model_card.rfc3339()}

    def delta(self, i: int, piece: Piece) -> list[str]:
        text = self.parser.feed(piece.text) if self.parser is not None else piece.text
        if not text and not (self.want_lp and piece.logprobs):
            return []
        lps = _logprobs(self.served, piece.logprobs) if self.want_lp else {}
        return [_line({**self._head(), **self.part(text, []), "done": False, **lps})]

    def closing(self, i: int, done: Done) -> list[str]:
        out = []
        if self.parser is not None:
            rest, calls = self.parser.finish()
            if rest or calls:
                out.append(_line({**self._head(), **self.part(rest, _ollama_calls(calls)), "done": False}))
        return [*out, _line({**self._head(), **self.final(done, "", []), **_metrics(done, self.clock)})]

    def error(self, failed: Failed) -> list[str]:
        return [_line({"error": failed.message})]  # the client raises ResponseError

    def failure(self, failed: Failed) -> APIError:
        return _failure(failed)

    def whole(self, dones: list[Done], logprobs: list[list[TokenLogprob]]) -> dict[str, Any]:
        [end] = dones
        lps = _logprobs(self.served, logprobs[0]) if self.want_lp else {}
        content, calls, _ = self.structured.reply(end.text, end.finish_reason)
        fields = self.final(end, content or "", _ollama_calls(calls))
        return {**self._head(), **fields, **_metrics(end, self.clock), **lps}


def _done_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"


# ---- /api/generate -----------------------------------------------------------------------------------


async def generate(request: Request) -> Response:
    body: GenerateRequest = parse(GenerateRequest, await request.body())
    served, clock = await _served(request, body.model)
    if not body.prompt and not body.context:  # Ollama's "load the model" request: nothing to generate
        return JSONResponse(
            {
                "model": model_card.tagged(served.name),
                "created_at": model_card.rfc3339(),
                "response": "",
                "done": True,
                "done_reason": "load",
            }
        )
    opts = parse_options(body.options)
    structured = await structured_request(served, chat=False, **body.format_fields())
    if body.raw:
        ids = await gen.encode_text(served, body.prompt)
    else:
        messages = [{"role": "system", "content": body.system}] if body.system else []
        ids = await gen.encode_chat(served, [*messages, {"role": "user", "content": body.prompt}])
    ids = _with_context(served, body.context, ids)
    call = await _start(served, body, opts, ids, not body.raw, structured)

    def final(done: Done, text: str, _calls: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"response": text, "done": True, "done_reason": _done_reason(done)}
        if not body.raw:  # as Ollama: raw mode returns no context
            out["context"] = ids + done.tokens
        return out

    enc = _OllamaEncoder(
        served, clock, body.logprobs is True, structured, lambda text, _calls: {"response": text}, final
    )
    return await answer(request, call, enc, body.streaming())


# ---- /api/chat ---------------------------------------------------------------------------------------


async def chat(request: Request) -> Response:
    body: ChatRequest = parse(ChatRequest, await request.body())
    served, clock = await _served(request, body.model)
    if not body.messages:
        return JSONResponse(
            {
                "model": model_card.tagged(served.name),
                "created_at": model_card.rfc3339(),
                "message": {"role": "assistant", "content": ""},
                "done_reason": "load",
                "done": True,
            }
        )
    opts = parse_options(body.options)
    structured = await structured_request(served, chat=True, tools=body.tools or None, **body.format_fields())
    ids = await gen.encode_chat(served, body.chat_messages(), structured)
    call = await _start(served, body, opts, ids, True, structured)

    def message(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        tool_calls = {"tool_calls": calls} if calls else {}
        return {"message": {"role": "assistant", "content": text, **tool_calls}}

    def final(done: Done, text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
        # Ollama's done_reason stays "stop" when the answer is a tool call.
        return {**message(text, calls), "done": True, "done_reason": _done_reason(done)}

    enc = _OllamaEncoder(served, clock, body.logprobs is True, structured, message, final)
    return await answer(request, call, enc, body.streaming())


# ---- embeddings --------------------------------------------------------------------------------------


async def embed(request: Request) -> Response:
    body: EmbedRequest = parse(EmbedRequest, await request.body())
    served, clock = await _served(request, body.model)
    parse_options(body.options)  # checked as Ollama checks them; none changes an embedding
    out: dict[str, Any] = {"model": model_card.tagged(served.name), "embeddings": []}
    if body.inputs():
        embeddings.check_dimensions(served, body.dimensions)
        token_lists = [await gen.encode_text(served, x) for x in body.inputs()]
        done = await embeddings.embed(
            served, token_lists, truncate=body.truncate is not False, dimensions=body.dimensions
        )
        out["embeddings"] = done.vectors.tolist()
        out |= {
            "total_duration": ns(clock.total_ms()),
            "load_duration": ns(clock.load_ms),
            "prompt_eval_count": done.tokens,
        }
    return JSONResponse(out)


async def embeddings_v1(request: Request) -> Response:
    body: EmbeddingsRequest = parse(EmbeddingsRequest, await request.body())
    served, _ = await _served(request, body.model)
    parse_options(body.options)
    if not body.prompt:
        return JSONResponse({"embedding": []})
    done = await embeddings.embed(served, [await gen.encode_text(served, body.prompt)], normalize=False)
    return JSONResponse({"embedding": done.vectors[0].tolist()})


# ---- models ------------------------------------------------------------------------------------------


async def tags(request: Request) -> Response:
    """Every model the server can answer for, loaded or not (an unloaded one is read from its file)."""
    registry = state_of(request).models
    loaded = {m.name: m for m in registry.loaded()}

    def cards() -> list[dict[str, Any]]:
        out = []
        for spec in registry.specs():
            try:
                out.append(model_card.tag_entry(model_card.card_of(spec, loaded.get(spec.name))))
            except LlamacyError as e:  # a file gone since the server started: not listed, as Ollama
                log.warning("model %s is not listed: %s", spec.name, e)
        return out

    # The first call hashes each model file for its digest: off the event loop.
    return JSONResponse({"models": await run_in_threadpool(cards)})


async def ps(request: Request) -> Response:
    registry = state_of(request).models
    served = registry.loaded()
    # A model's first card hashes its file: off the event loop.
    entries = await run_in_threadpool(
        lambda: [model_card.ps_entry(m, registry.idle_unload_s) for m in served]
    )
    return JSONResponse({"models": entries})


async def show(request: Request) -> Response:
    body: ShowRequest = parse(ShowRequest, await request.body())
    served, _ = await _served(request, body.model_name())
    return JSONResponse(await run_in_threadpool(model_card.show, served, body.verbose))


async def version(request: Request) -> Response:
    return JSONResponse({"version": __version__})


ROUTES = [
    Route("/api/generate", generate, methods=["POST"]),
    Route("/api/chat", chat, methods=["POST"]),
    Route("/api/embed", embed, methods=["POST"]),
    Route("/api/embeddings", embeddings_v1, methods=["POST"]),
    Route("/api/tags", tags, methods=["GET"]),
    Route("/api/ps", ps, methods=["GET"]),
    Route("/api/show", show, methods=["POST"]),
    Route("/api/version", version, methods=["GET"]),
]
ERROR_SHAPES = {"/api/": _error}  # what the middleware refuses (API key, body size) too
