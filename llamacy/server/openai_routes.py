"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions.

Both generation endpoints answer n choices (n requests to the scheduler, each its own sequence), whole or
streamed as server-sent events, through the answer loops (server/answer.py); they differ in how a choice
is spelled (llamacy/openai_shapes.py, which the Python API uses too). Streams end with
a chunk per choice that carries its finish_reason (and, as llama.cpp does, its usage); with
stream_options.include_usage, as OpenAI does instead: `usage: null` on every chunk, then one last chunk
with empty choices and the usage of the whole call.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.openai_shapes import ChatChoices, completion_choice
from llamacy.scheduler import Done, Failed, Piece, TokenLogprob
from llamacy.server.answer import Encoder, answer
from llamacy.server.context_shift import truncate_prompt
from llamacy.server.errors import error_body
from llamacy.server.models import ServedModel
from llamacy.server.schemas import ChatRequest, CompletionRequest, parse
from llamacy.server.state import state_of
from llamacy.server.structured import attach_constraints, messages_of, structured_for
from llamacy.structured import StructuredRequest

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


class _OpenAIEncoder(Encoder):
    """n choices as OpenAI's chunks (each choice's events in the order they come) or one whole object;
    a subclass spells the choices (`_opening`, `_delta`, `_closing`: chunk choices; `_whole`)."""

    object = ""
    chunk_object = ""

    def __init__(self, served: ServedModel, n: int, include_usage: bool, id_prefix: str) -> None:
        self.served = served
        self.n = n
        self.include_usage = include_usage
        self.head = {
            "id": f"{id_prefix}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": served.name,
        }

    def _chunk(self, choices: list[dict], **extra: Any) -> str:
        usage = {"usage": None} if self.include_usage else {}
        return _sse({**self.head, "object": self.chunk_object, "choices": choices, **usage, **extra})

    def _opening(self, i: int) -> dict | None:
        return None

    def _delta(self, i: int, piece: Piece) -> list[dict]:
        raise NotImplementedError

    def _closing(self, i: int, done: Done) -> list[dict]:
        raise NotImplementedError

    def _whole(self, i: int, done: Done, lps: list[TokenLogprob]) -> dict:
        raise NotImplementedError

    def opening(self) -> list[str]:
        return [self._chunk([c]) for i in range(self.n) if (c := self._opening(i)) is not None]

    def delta(self, i: int, piece: Piece) -> list[str]:
        return [self._chunk([c]) for c in self._delta(i, piece)]

    def closing(self, i: int, done: Done) -> list[str]:
        *first, last = self._closing(i, done)
        # The choice's last chunk carries its finish_reason, timings and (as llama.cpp's) its usage.
        own_usage = {} if self.include_usage else {"usage": gen.usage_dict(done)}
        return [self._chunk([c]) for c in first] + [
            self._chunk([last], **own_usage, timings=done.timings.as_dict())
        ]

    def finale(self, dones: list[Done]) -> list[str]:
        return [self._chunk([], usage=gen.usage_dict(*dones))] if self.include_usage else []

    def tail(self) -> list[str]:
        return ["data: [DONE]\n\n"]

    def error(self, failed: Failed) -> list[str]:
        e = self.failure(failed)
        return [_sse(error_body(e.status, e.message, e.code))]

    def whole(self, dones: list[Done], logprobs: list[list[TokenLogprob]]) -> dict:
        last = max(dones, key=lambda d: d.timings.total_ms)  # the call took as long as its slowest choice
        return {
            **self.head,
            "object": self.object,
            "choices": [self._whole(i, d, logprobs[i]) for i, d in enumerate(dones)],
            "usage": gen.usage_dict(*dones),
            "timings": last.timings.as_dict(),
        }


class _CompletionEncoder(_OpenAIEncoder):
    object = chunk_object = "text_completion"

    def __init__(self, served: ServedModel, n: int, include_usage: bool, echo: str, logprobs: bool) -> None:
        super().__init__(served, n, include_usage, "cmpl")
        self.echo = echo
        self.logprobs = logprobs
        self.offsets = [len(echo)] * n  # text_offset of each choice's next token

    def _opening(self, i: int) -> dict | None:
        return completion_choice(i, self.echo) if self.echo else None

    def _delta(self, i: int, piece: Piece) -> list[dict]:
        lps = None
        if self.logprobs and piece.logprobs:
            lps = gen.completion_logprobs(self.served, piece.logprobs, self.offsets[i])
        self.offsets[i] += len(piece.text)
        return [completion_choice(i, piece.text, None, lps)] if piece.text or lps else []

    def _closing(self, i: int, done: Done) -> list[dict]:
        return [completion_choice(i, "", gen.finish_reason(done))]

    def _whole(self, i: int, done: Done, lps: list[TokenLogprob]) -> dict:
        lp = gen.completion_logprobs(self.served, lps, len(self.echo)) if self.logprobs else None
        return completion_choice(i, self.echo + done.text, gen.finish_reason(done), lp)


class _ChatEncoder(_OpenAIEncoder):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(
        self, served: ServedModel, n: int, include_usage: bool, logprobs: bool, structured: StructuredRequest
    ) -> None:
        super().__init__(served, n, include_usage, "chatcmpl")
        self.logprobs = logprobs
        self.choices = ChatChoices(structured, n)

    def _opening(self, i: int) -> dict | None:
        return self.choices.opening(i)

    def _delta(self, i: int, piece: Piece) -> list[dict]:
        lps = gen.chat_logprobs(self.served, piece.logprobs) if piece.logprobs else None
        return self.choices.delta(i, piece.text, lps)

    def _closing(self, i: int, done: Done) -> list[dict]:
        return self.choices.closing(i, done.finish_reason)

    def _whole(self, i: int, done: Done, lps: list[TokenLogprob]) -> dict:
        lp = gen.chat_logprobs(self.served, lps) if self.logprobs else None
        return self.choices.whole(i, done.text, done.finish_reason, lp)


# ---- the endpoints -----------------------------------------------------------------------------------


async def completions(request: Request) -> Response:
    body = parse(CompletionRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a list of one prompt
    ids = await gen.encode_text(served, prompt) if isinstance(prompt, str) else list(prompt)
    settings = state_of(request).settings
    if settings.context_shift:  # the first --keep tokens and the end of the prompt (context_shift.py)
        ids = truncate_prompt(ids, served.scheduler.n_ctx, settings.keep)
    max_tokens = body.max_tokens if body.max_tokens is not None else COMPLETIONS_DEFAULT_MAX_TOKENS
    structured = await structured_for(served, body, chat=False)
    req = gen.build_request(served, body, ids, max_tokens, body.logprobs, shift_keep=_shift_keep(request))
    requests = gen.choices(req, body.choices())
    await attach_constraints(served, structured, requests)
    call = await gen.start(served, requests)
    echo = ""
    if body.echo:  # token ids are decoded only now: the scheduler has checked them against the vocabulary
        echo = prompt if isinstance(prompt, str) else served.tokenizer.decode(ids)
    enc = _CompletionEncoder(served, body.choices(), body.include_usage(), echo, body.logprobs is not None)
    return await answer(request, call, enc, body.stream)


async def chat_completions(request: Request) -> Response:
    body = parse(ChatRequest, await request.body())
    served = await state_of(request).models.acquire(body.model)
    structured = await structured_for(served, body, chat=True)
    shift = state_of(request).settings.context_shift
    ids = await gen.encode_chat(served, messages_of(body), structured, shift=shift)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    req = gen.build_request(
        served, body, ids, body.token_limit(), logprobs, chat=True, shift_keep=_shift_keep(request)
    )
    requests = gen.choices(req, body.choices())
    await attach_constraints(served, structured, requests)
    call = await gen.start(served, requests)
    enc = _ChatEncoder(served, body.choices(), body.include_usage(), body.logprobs, structured)
    return await answer(request, call, enc, body.stream)


# ---- shared ------------------------------------------------------------------------------------------


def _shift_keep(request: Request) -> int | None:
    """serve --context-shift: a reply that fills the context keeps the first --keep tokens and goes on."""
    settings = state_of(request).settings
    return settings.keep if settings.context_shift else None


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
]
