"""OpenAI's Responses API request (POST /v1/responses), validated strictly, and translated into the terms the
rest of the server speaks: chat messages for the template, and tools / tool_choice / response_format in
the Chat Completions shapes that llamacy.structured takes.

    body = parse(ResponsesRequest, raw)
    messages = input_messages(body.input)          # message, function_call, function_call_output items
    fields = body.structured_fields()               # tools, tool_choice, parallel_tool_calls, response_format
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError

from llamacy.server.errors import APIError
from llamacy.server.schemas import SamplingFields, _Strict, describe

# ---- input items ---------------------------------------------------------------------------------------


class _TextPart(_Strict):
    # input_text in a user/system turn; output_text in an assistant turn sent back (its annotations ignored)
    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(_Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[_TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str  # JSON text, as the API writes it


class FunctionCallOutputItem(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[_TextPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


_ITEMS: dict[str, type[_Strict]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
}

InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem


def parse_items(items: list[Any]) -> list[InputItem]:
    """The input list's items by their `type` (a message may leave it out); APIError 400 naming the item."""
    out: list[InputItem] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise APIError(400, f"input[{i}]: an item must be an object", "invalid_value", f"input[{i}]")
        kind = item.get("type", "message")
        model = _ITEMS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise APIError(
                400,
                f"input[{i}].type: {kind!r} is not supported here "
                "(message, function_call and function_call_output items are)",
                "unsupported",
                f"input[{i}].type",
            )
        try:
            out.append(model.model_validate(item))  # type: ignore[arg-type]
        except ValidationError as e:
            raise APIError(400, f"input[{i}].{describe(e)}", "invalid_value", f"input[{i}]") from None
    return out


def input_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """Chat messages of the input items: a run of function_call items is one assistant turn's tool_calls
    (joined to the assistant's text just before it), a function_call_output a "tool" message."""
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            out.append({"role": item.role, "content": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
    return out


# ---- the request ---------------------------------------------------------------------------------------


class TextConfig(_Strict):
    format: dict[str, Any] | None = None
    verbosity: str | None = None  # a hint for reasoning models; nothing to change here


class ResponsesRequest(SamplingFields):
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    store: bool = True
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = None  # "auto": drop the oldest turns that do not fit
    metadata: dict[str, str] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.max_tokens is not None:
            raise APIError(400, "max_tokens: use max_output_tokens", "invalid_value", "max_tokens")
        if self.background:
            raise APIError(400, "background responses are not supported", "unsupported", "background")
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise APIError(400, f"{name} is not supported here", "unsupported", name)

    def items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return parse_items(self.input)

    def structured_fields(self) -> dict[str, Any]:
        """tools, tool_choice, parallel_tool_calls and response_format as llamacy.structured takes them."""
        return {
            "tools": chat_tools(self.tools),
            "tool_choice": chat_tool_choice(self.tool_choice),
            "parallel_tool_calls": self.parallel_tool_calls,
            "response_format": response_format(self.text.format if self.text else None),
        }


def chat_tools(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    """Responses function tools ({type, name, description, parameters, strict}) in the Chat Completions
    shape; built-in tools (web search, file search, ...) are refused."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise APIError(
                400,
                f"tools[{i}].type: {kind!r} is not supported (only function tools)",
                "unsupported",
                "tools",
            )
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """ "auto" / "none" / "required" as they are; {"type": "function", "name"} in the Chat Completions shape."""
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(
        400,
        f"tool_choice: {choice!r} is not supported (auto, none, required or a named function)",
        "unsupported",
        "tool_choice",
    )


def response_format(fmt: dict[str, Any] | None) -> dict[str, Any] | None:
    """text.format ({type: text | json_object | json_schema, name, schema, strict}) as response_format."""
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format.schema must be an object", "invalid_value", "text.format")
        inner = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": inner}
    raise APIError(
        400,
        f"text.format.type: {fmt.get('type')!r} is not one of text, json_object, json_schema",
        "invalid_value",
        "text.format",
    )
