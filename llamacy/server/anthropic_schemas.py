"""Anthropic's Messages API request bodies (POST /v1/messages, /v1/messages/count_tokens).

As Anthropic's API does, a field it does not know is refused ("Extra inputs are not permitted"). Fields
it knows that do not change the answer here are accepted (metadata, service_tier, cache_control, ...);
those that would and that this server cannot honour (server tools, extended thinking, images and other
non-text content) are refused with a sentence saying so. Custom tools, tool_choice, the tool_use /
tool_result blocks of earlier turns (anthropic_tools.py) and structured outputs (output_config.format)
are served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamacy.server.anthropic_tools import history_call, history_result
from llamacy.server.errors import APIError
from llamacy.server.schemas import MAX_STOP_STRINGS, SamplingFields, StopStr, describe

Block = dict[str, Any]  # a content block: text (block_text), tool_use or tool_result (anthropic_tools)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


def block_text(block: Block, where: str) -> str:
    kind = block.get("type")
    if kind != "text":
        what = (
            f"{kind!r} content blocks are" if isinstance(kind, str) else "content blocks without a type are"
        )
        raise APIError(400, f"{where}: {what} not supported by this server (only text)")
    try:
        return TextBlock.model_validate(block).text
    except ValidationError as e:
        raise APIError(400, f"{where}: {describe(e)}") from None


def text_of(content: str | list[Block], where: str) -> str:
    if isinstance(content, str):
        return content
    # Blocks of one message are joined as the OpenAI route joins a message's text parts.
    return "".join(block_text(b, f"{where}.{j}") for j, b in enumerate(content))


class Metadata(_Strict):
    user_id: str | None = None  # an opaque id of the end user: nothing to do with it here


class MessageParam(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


@dataclass
class Conversation:
    """The request's turns as chat-template messages, and the start of the reply it asks to continue."""

    messages: list[dict[str, Any]]
    prefill: str


class _Common(_Strict):
    """The fields /v1/messages and /v1/messages/count_tokens share."""

    model: str
    messages: list[MessageParam]
    system: str | list[Block] | None = None
    tools: list[Any] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None  # a caching hint; llamacy reuses prompt prefixes anyway
    speed: str | None = None

    def unsupported(self) -> None:
        if self.thinking is not None and self.thinking.get("type") not in ("disabled", "adaptive"):
            raise APIError(400, "thinking: extended thinking is not supported by this server")
        self.output_schema()  # checked here, before the model is acquired
        if not self.messages:
            raise APIError(400, "messages: at least one message is required")

    def output_schema(self) -> dict[str, Any] | None:
        """output_config.format's JSON schema (structured outputs): the reply is JSON valid against it."""
        fmt = (self.output_config or {}).get("format")
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise APIError(
                400, 'output_config.format: only {"type": "json_schema", "schema": {...}} is supported'
            )
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "output_config.format.schema: a JSON schema object is required")
        return fmt["schema"]

    def conversation(self) -> Conversation:
        """System prompt first; consecutive turns of one role merged into one (as Anthropic does); a final
        assistant turn is the prefill that the reply continues. tool_use blocks become the assistant turn's
        tool_calls, tool_result blocks "tool" messages ahead of their user turn's text."""
        turns: list[dict[str, Any]] = []
        names: dict[str, str] = {}  # tool_use id -> the tool's name
        last = len(self.messages) - 1
        for i, m in enumerate(self.messages):
            where = f"messages.{i}.content"
            blocks = [{"type": "text", "text": m.content}] if isinstance(m.content, str) else m.content
            texts, calls, results = [], [], []
            for j, b in enumerate(blocks):
                kind = b.get("type") if isinstance(b, dict) else None
                if kind == "tool_use" and m.role == "assistant":
                    calls.append(history_call(b, f"{where}.{j}"))
                    names[calls[-1]["id"]] = calls[-1]["function"]["name"]
                elif kind == "tool_result" and m.role == "user":
                    content = b.get("content", "")
                    text = text_of(content, f"{where}.{j}.content") if isinstance(content, str | list) else ""
                    results.append(history_result(b, text, names, f"{where}.{j}"))
                else:
                    texts.append(block_text(b, f"{where}.{j}"))
            text = "".join(texts)  # as the OpenAI route joins a message's text parts
            if not text and not calls and not results and not (i == last and m.role == "assistant"):
                raise APIError(
                    400,
                    f"messages.{i}: all messages must have non-empty content except for the optional "
                    "final assistant message",
                )
            turns.extend(results)
            if not text and not calls and results:
                continue  # a turn of tool results only
            prev = turns[-1] if turns else None
            if prev is not None and prev["role"] == m.role:
                prev["content"] = "\n\n".join(x for x in (prev["content"], text) if x)
                if calls:
                    prev["tool_calls"] = [*prev.get("tool_calls", []), *calls]
            else:
                turns.append({"role": m.role, "content": text, **({"tool_calls": calls} if calls else {})})
        prefill = ""
        if turns[-1]["role"] == "assistant":
            if turns[-1].get("tool_calls"):
                raise APIError(
                    400,
                    f"messages.{last}: tool_use blocks must be followed by a user turn with their tool_result",
                )
            prefill = turns.pop()["content"]
            if prefill != prefill.rstrip():
                raise APIError(400, "final assistant content cannot end with trailing whitespace")
        system = text_of(self.system, "system") if self.system is not None else ""
        if system:
            turns.insert(0, {"role": "system", "content": system})
        return Conversation(turns, prefill)


class CountTokensRequest(_Common):
    """The prompt alone: generation fields (max_tokens, stop_sequences, ...) are refused, as Anthropic does."""


class MessagesRequest(_Common):
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[StopStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool | None = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None
    container: Any = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.container is not None:
            raise APIError(400, "container: code execution containers are not supported by this server")

    def sampling(self) -> SamplingFields:
        return SamplingFields(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=self.stop_sequences,
        )
