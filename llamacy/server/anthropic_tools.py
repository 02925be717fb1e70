"""Anthropic's tool use in the structured-output layer's (OpenAI's) terms, and back.

Request: `tools` [{name, description, input_schema}] become OpenAI function tools, `tool_choice`
{"type": "auto" | "any" | "tool" (+ name) | "none", "disable_parallel_tool_use"} becomes tool_choice
"auto" / "required" / a named function / "none" and parallel_tool_calls. History: an assistant turn's
tool_use blocks become its tool_calls, a user turn's tool_result blocks become "tool" messages (before the
turn's text), so the chat template renders them as the OpenAI route renders its tool messages.
Reply: the parsed calls become tool_use content blocks {"type": "tool_use", "id": "toolu_...", "name",
"input"}.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

from llamacy.server.errors import APIError

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _refuse(message: str) -> NoReturn:
    raise APIError(400, message)


def openai_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Custom tools as OpenAI function tools; server tools (web search, bash ...) are refused."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            _refuse(f"tools.{i}: a tool must be an object with name and input_schema")
        kind = t.get("type")
        if kind not in (None, "custom"):
            _refuse(
                f"tools.{i}: server tools ({kind!r}) are not supported by this server (only custom tools)"
            )
        name, schema = t.get("name"), t.get("input_schema")
        if not isinstance(name, str):
            _refuse(f"tools.{i}.name: Field required")
        if not isinstance(schema, dict):
            _refuse(f"tools.{i}.input_schema: a JSON schema object is required")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def openai_tool_choice(choice: dict[str, Any] | None, tools: list[Any] | None) -> tuple[Any, bool | None]:
    """(tool_choice, parallel_tool_calls) in OpenAI's terms."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") is True else None
    if kind in ("any", "tool") and not tools:
        _refuse(f"tool_choice: type {kind!r} needs at least one tool in tools")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str):
            _refuse('tool_choice: type "tool" needs the name of the tool')
        if not any(isinstance(t, dict) and t.get("name") == name for t in tools or ()):
            _refuse(f"tool_choice: tool {name!r} is not in tools")
        return {"type": "function", "function": {"name": name}}, parallel
    if kind not in _CHOICES:
        _refuse(f"tool_choice.type must be 'auto', 'any', 'tool' or 'none', got {kind!r}")
    if not tools:
        return None, None  # "auto" or "none" without tools: nothing to choose from
    return _CHOICES[kind], parallel


def tool_use_id(call_id: str) -> str:
    """A tool_use block's id for a parsed call's (call_ + 24 hex digits: the same digits)."""
    return "toolu_" + call_id.removeprefix("call_")


def tool_use_blocks(calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's parsed tool calls (arguments as JSON text) as tool_use content blocks."""
    return [
        {
            "type": "tool_use",
            "id": tool_use_id(c["id"]),
            "name": c["function"]["name"],
            "input": json.loads(c["function"]["arguments"]),
        }
        for c in calls
    ]


def history_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An earlier tool_use block as an OpenAI tool call."""
    name, args, call_id = block.get("name"), block.get("input"), block.get("id")
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, dict):
        _refuse(f"{where}: a tool_use block needs id, name and input (an object)")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def history_result(block: dict[str, Any], text: str, names: dict[str, str], where: str) -> dict[str, Any]:
    """A tool_result block (its content as text) as an OpenAI "tool" message; the tool's name is the one
    of the earlier tool_use with its id."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        _refuse(f"{where}.tool_use_id: Field required")
    if block.get("is_error") is True:
        text = f"Error: {text}"  # the model is told that the call failed, as Anthropic's models are
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": text}
    if call_id in names:
        msg["name"] = names[call_id]
    return msg
