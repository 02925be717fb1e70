"""Structured output on the OpenAI routes: response_format, llama.cpp's grammar and json_schema fields, tools;
the Ollama and Anthropic routes translate their fields to these and call structured_request.

    s = await structured_for(served, body, chat=True)     # APIError 400 naming the field for bad input
    prompt ids: encode_chat(served, messages_of(body), s)
    for r in requests: r.constraint = s.constraint(...)   # attach_constraints: one per choice

Compiling a schema is quick, but the first constrained request of a model builds llguidance's view of the
vocabulary (0.3 s for 49k tokens, 1.5 s for 262k): both run off the event loop.
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool

from llamacy.errors import UsageError
from llamacy.scheduler import GenerationRequest
from llamacy.server.errors import APIError
from llamacy.server.models import ServedModel
from llamacy.structured import StructuredRequest

__all__ = ["attach_constraints", "messages_of", "structured_for", "structured_request"]


def _param(message: str, given: list[str]) -> str | None:
    """The request field a structured-output error is about (OpenAI's error `param`): a tools field the
    message names, else the first output-format field the request gave."""
    for name in ("tool_choice", "parallel_tool_calls"):
        if name in message:
            return name
    if message.startswith("tools") or "tool " in message:
        return "tools"
    formats = [name for name in ("response_format", "grammar", "json_schema") if name in given]
    return formats[0] if formats else None


async def structured_for(served: ServedModel, body: Any, chat: bool) -> StructuredRequest:
    """The request's grammar and tools, checked; StructuredRequest.none() when it asks for neither."""
    return await structured_request(
        served,
        chat=chat,
        response_format=body.response_format,
        grammar=body.grammar,
        json_schema=body.json_schema,
        tools=getattr(body, "tools", None) if chat else None,
        tool_choice=getattr(body, "tool_choice", None) if chat else None,
        parallel_tool_calls=getattr(body, "parallel_tool_calls", None) if chat else None,
    )


async def structured_request(served: ServedModel, *, chat: bool, **fields: Any) -> StructuredRequest:
    """structured_for with the fields given in OpenAI's terms (the other dialects translate theirs first):
    StructuredRequest.from_request's keywords (response_format, grammar, json_schema, tools, tool_choice,
    parallel_tool_calls); APIError 400 naming the field for bad input."""
    # parallel_tool_calls alone asks for nothing: it only qualifies tools.
    given = [name for name, value in fields.items() if value is not None and name != "parallel_tool_calls"]
    if not given or (chat and served.template is None):  # no template: the chat route answers 501 itself
        return StructuredRequest.none()

    def build() -> StructuredRequest:
        s = StructuredRequest.from_request(served.template, **fields)
        if s.constrained:
            s.constraint(served.tokenizer)  # builds the vocabulary view now, and proves the grammar loads
        return s

    try:
        return await run_in_threadpool(build)
    except UsageError as e:
        raise APIError(400, str(e), "invalid_value", _param(str(e), given)) from None


async def attach_constraints(
    served: ServedModel, s: StructuredRequest, requests: list[GenerationRequest]
) -> None:
    """Each choice gets its own constraint: a grammar's state belongs to one sequence."""
    if not s.constrained:
        return
    n_vocab = served.scheduler.n_vocab

    def build() -> None:
        for r in requests:
            r.constraint = s.constraint(served.tokenizer, n_vocab)

    await run_in_threadpool(build)


def messages_of(body: Any) -> list[dict[str, Any]]:
    """The chat messages as the template and the tool prompt take them: content as text, and the fields of
    earlier tool calls (assistant tool_calls, a tool message's tool_call_id and name) kept."""
    out = []
    for m in body.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name:
            msg["name"] = m.name
        if m.tool_calls:
            msg["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out
