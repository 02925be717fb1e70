"""llama.cpp's server extensions for token ids: POST /tokenize and POST /detokenize.

    /tokenize    {"content": str, "add_special"?: false, "parse_special"?: true, "with_pieces"?: false,
                  "model"?} -> {"tokens": [int]}  (with_pieces: [{"id": int, "piece": str | [byte]}])
    /detokenize  {"tokens": [int], "model"?} -> {"content": str}

add_special adds what the model adds to a prompt (its BOS, if it wants one); parse_special reads special
tokens spelled out in the text ("<|im_start|>") as those tokens, as the completion endpoints do.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.server.errors import APIError
from llamacy.server.schemas import DetokenizeRequest, TokenizeRequest, parse
from llamacy.server.state import state_of


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:  # a part of a multi-byte character: its bytes, as llama.cpp gives them
        return list(raw)


async def tokenize(request: Request) -> JSONResponse:
    body = parse(TokenizeRequest, await request.body())
    tok = (await state_of(request).models.acquire(body.model)).tokenizer
    ids = await run_in_threadpool(gen.text_ids, tok, body.content, body.add_special, body.parse_special)
    tokens: list[Any] = ids
    if body.with_pieces:
        tokens = [{"id": t, "piece": _piece(tok.token_bytes(t))} for t in ids]
    return JSONResponse({"tokens": tokens})


async def detokenize(request: Request) -> JSONResponse:
    body = parse(DetokenizeRequest, await request.body())
    tok = (await state_of(request).models.acquire(body.model)).tokenizer
    n_vocab = tok.n_vocab
    bad = [t for t in body.tokens if not 0 <= t < n_vocab]
    if bad:
        raise APIError(
            400, f"token id {bad[0]} is outside the vocabulary [0, {n_vocab})", "invalid_value", "tokens"
        )
    return JSONResponse({"content": await run_in_threadpool(tok.decode, body.tokens)})


ROUTES = [
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]
