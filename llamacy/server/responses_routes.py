"""OpenAI's Responses API: POST /v1/responses (whole or streamed), GET and DELETE /v1/responses/{id}.

A response that is stored (`store`, the default) can be continued: `previous_response_id` puts its
conversation before the new input. The stored entry keeps the prompt text and the token ids the model saw
followed by its reply, so a next prompt that extends that text is those very ids plus the new ones: the
scheduler's slot that holds them in its KV cache is chosen and only the new tokens are evaluated.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import llamacy.server.generation as gen
from llamacy.errors import LlamacyError
from llamacy.scheduler import Done
from llamacy.server.answer import answer
from llamacy.server.context_shift import fit_messages, reserve
from llamacy.server.errors import APIError
from llamacy.server.models import ServedModel
from llamacy.server.responses_schemas import ResponsesRequest, input_messages
from llamacy.server.responses_shapes import ResponsesEncoder, new_id
from llamacy.server.responses_store import StoredResponse
from llamacy.server.schemas import parse
from llamacy.server.state import state_of
from llamacy.server.structured import attach_constraints, structured_request
from llamacy.structured import StructuredRequest


async def _prompt(
    served: ServedModel,
    structured: StructuredRequest,
    messages: list[dict[str, Any]],
    prev: StoredResponse | None,
) -> tuple[str, list[int]]:
    """The prompt's text and ids; when the text extends the previous response's, its ids come first."""
    tpl = served.template
    if tpl is None:
        raise APIError(
            501, "responses need a chat template, and none could be loaded for this model", "no_chat_template"
        )

    def render() -> tuple[str, list[int]]:
        text = structured.render(tpl, messages, add_generation_prompt=True)
        if prev is not None and prev.ids and prev.model == served.name and text.startswith(prev.text):
            rest = served.tokenizer.encode(text[len(prev.text) :], add_bos=False, special=True)
            return text, prev.ids + rest
        return text, tpl.encode(text)

    try:
        return await run_in_threadpool(render)
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_value", "input") from None


def _truncation(body: ResponsesRequest, state: Any) -> str:
    """The request's truncation, or the server's default (--context-shift: "auto")."""
    return body.truncation or ("auto" if state.settings.context_shift else "disabled")


async def _fit(
    served: ServedModel, structured: StructuredRequest, messages: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], str, list[int]]:
    """truncation "auto": the messages without the oldest turns that do not fit (context_shift.py)."""
    tpl = served.template

    def encode(kept: list[dict[str, Any]]) -> tuple[str, list[int]]:
        text = structured.render(tpl, kept, add_generation_prompt=True)
        return text, tpl.encode(text)

    try:
        return await run_in_threadpool(fit_messages, messages, encode, served.scheduler.n_ctx)
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_value", "input") from None


def _head(body: ResponsesRequest, served: ServedModel, truncation: str) -> dict[str, Any]:
    """The Response's fields that echo the request."""
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": served.name,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tools": body.tools or [],
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "text": {"format": body.text.format if body.text and body.text.format else {"type": "text"}},
        "truncation": truncation,
        "metadata": body.metadata or {},
        "store": body.store,
        "error": None,
        "incomplete_details": None,
        "usage": None,
    }


def _reply_messages(final: dict[str, Any]) -> list[dict[str, Any]]:
    """The response's output as chat messages: one assistant turn with its text and calls."""
    text = "".join(
        part["text"] for item in final["output"] if item["type"] == "message" for part in item["content"]
    )
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in final["output"]
        if i["type"] == "function_call"
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def _stored(
    final: dict[str, Any],
    history: list[dict[str, Any]],
    prompt_text: str,
    ids: list[int],
    done: Done,
    stop_ids: frozenset[int],
) -> StoredResponse:
    fed = list(done.tokens)
    if fed and fed[-1] in stop_ids:
        fed.pop()  # the end-of-turn token: sampled, never evaluated, and not in the text
    aligned = done.stop_string is None  # a stop string is cut from the text but its tokens were generated
    return StoredResponse(
        body=final,
        model=final["model"],
        messages=history + _reply_messages(final),
        text=prompt_text + done.text if aligned else "",
        ids=ids + fed if aligned else [],
    )


async def create(request: Request) -> Response:
    body: ResponsesRequest = parse(ResponsesRequest, await request.body())
    state = state_of(request)
    prev = None
    if body.previous_response_id is not None:
        prev = state.responses.get(body.previous_response_id)
        if prev is None:
            raise APIError(
                404,
                f"previous response with id {body.previous_response_id!r} not found",
                "previous_response_not_found",
                "previous_response_id",
            )
    items = body.items()
    if not items and prev is None:
        raise APIError(400, "input must not be empty", "invalid_value", "input")
    fields = body.structured_fields()
    served = await state.models.acquire(body.model)
    history = (prev.messages if prev is not None else []) + input_messages(items)
    # Instructions belong to this request alone: a continued conversation does not inherit them.
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    structured = await structured_request(served, chat=True, **fields)
    prompt_text, ids = await _prompt(served, structured, system + history, prev)
    if _truncation(body, state) == "auto" and len(ids) > served.scheduler.n_ctx - reserve(
        served.scheduler.n_ctx
    ):
        kept, prompt_text, ids = await _fit(served, structured, system + history)
        history = kept[len(system) :]
    req = gen.build_request(served, body, ids, body.max_output_tokens, chat=True)
    await attach_constraints(served, structured, [req])
    call = await gen.start(served, [req])
    stop_ids = req.stop_ids or frozenset()

    def keep(final: dict[str, Any], done: Done) -> None:
        if body.store:
            state.responses.put(final["id"], _stored(final, history, prompt_text, ids, done, stop_ids))

    encoder = ResponsesEncoder(_head(body, served, _truncation(body, state)), structured, keep)
    return await answer(request, call, encoder, body.stream)


def _lookup(request: Request) -> tuple[str, StoredResponse]:
    rid = request.path_params["response_id"]
    item = state_of(request).responses.get(rid)
    if item is None:
        raise APIError(404, f"response with id {rid!r} not found", "response_not_found")
    return rid, item


async def retrieve(request: Request) -> Response:
    _, item = _lookup(request)
    return JSONResponse(item.body)


async def delete(request: Request) -> Response:
    rid, _ = _lookup(request)
    state_of(request).responses.delete(rid)
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


ROUTES = [
    Route("/v1/responses", create, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete, methods=["DELETE"]),
]
