"""Llama.create_chat_completion: an OpenAI-shaped chat completion from the Python API, without a server.

    llm.create_chat_completion([{"role": "user", "content": "Hi"}], response_format={"type": "json_object"})
    llm.create_chat_completion(messages, tools=[...], tool_choice="required")  # message.tool_calls

The prompt goes through the model's chat template (tools included when it knows them, else a built-in tool
prompt); a forced tool call or a response_format constrains the output (llamacy.structured); the reply is
parsed for tool calls whenever tools are offered.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from llamacy.chat_template import ChatTemplate
from llamacy.completion_shapes import envelope, sampling_options, stop_list, usage
from llamacy.openai_shapes import ChatChoices
from llamacy.structured import StructuredRequest

_templates: weakref.WeakKeyDictionary[Any, ChatTemplate] = weakref.WeakKeyDictionary()


def chat_template(llm: Any) -> ChatTemplate:
    """The model's template (or the built-in one it was trained with), compiled once per Llama."""
    tpl = _templates.get(llm)
    if tpl is None:
        tpl = _templates[llm] = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    return tpl


def create_chat_completion(
    llm: Any,
    messages: Sequence[dict],
    max_tokens: int | None = None,
    temperature: float = 0.8,
    top_p: float = 0.95,
    top_k: int = 40,
    min_p: float = 0.05,
    repeat_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    stream: bool = False,
    response_format: dict | None = None,
    tools: list[dict] | None = None,
    tool_choice: str | dict | None = None,
    parallel_tool_calls: bool | None = None,
) -> dict | Iterator[dict]:
    """See Llama.create_chat_completion. UsageError (one line) for a bad schema, tool or tool_choice."""
    tpl = chat_template(llm)
    structured = StructuredRequest.from_request(
        tpl,
        response_format=response_format,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel_tool_calls,
    )
    ids = tpl.encode(structured.render(tpl, messages, add_generation_prompt=True))
    stops = stop_list(stop)
    stops += [s for s in tpl.stop_strings if s not in stops]
    sampling = sampling_options(locals())
    constraint = structured.constraint(llm.tokenizer, llm.n_vocab)
    gen = llm.generate_tokens(ids, max_tokens, stop=stops, constraint=constraint, **sampling)
    wrap = envelope("chatcmpl", llm.model_path.name)
    choices = ChatChoices(structured)  # the server's OpenAI chat route spells its choices with these too
    if stream:
        return _chunks(llm, gen, choices, lambda choice: wrap("chat.completion.chunk", choice))
    for _ in gen:
        pass
    done = llm.last
    out = wrap("chat.completion", choices.whole(0, done.text, done.finish_reason))
    out["usage"] = usage(done.stats)
    return out


def _chunks(llm: Any, gen: Iterator[tuple[int, str]], choices: ChatChoices, wrap: Any) -> Iterator[dict]:
    yield wrap(choices.opening(0))
    for _, piece in gen:
        for choice in choices.delta(0, piece):
            yield wrap(choice)
    for choice in choices.closing(0, llm.last.finish_reason):
        yield wrap(choice)
