"""OpenAI's choice objects, whole or as stream chunk choices, for chat and legacy completions: one
definition for the server's OpenAI routes and for the Python API (Llama.create_chat_completion).

    shapes = ChatChoices(structured, n)
    shapes.opening(i)                    # the first chunk choice: role and empty content
    shapes.delta(i, text, logprobs)      # chunk choices for a piece of text (tool calls in pieces)
    shapes.closing(i, finish)            # the last ones: held text, the rest of the calls, finish_reason
    shapes.whole(i, text, finish, logprobs)

`finish` is the generation's ("stop", "length", ...); a reply with tool calls finishes "tool_calls".
Logprobs are passed already in the endpoint's shape (they need the tokenizer) or None.
"""

from __future__ import annotations

from typing import Any

from llamacy.structured import StructuredRequest
from llamacy.structured.call_stream import CallArgs, CallStart, ReplyEvent, Text


def finish_reason(finish: str | None) -> str:
    return "length" if finish == "length" else "stop"


def _chunk(i: int, delta: dict[str, Any], finish: str | None = None, lps: Any = None) -> dict[str, Any]:
    return {"index": i, "delta": delta, "logprobs": lps, "finish_reason": finish}


def _delta(ev: ReplyEvent) -> dict[str, Any]:
    if isinstance(ev, Text):
        return {"content": ev.text}
    if isinstance(ev, CallStart):
        call = {
            "index": ev.index,
            "id": ev.id,
            "type": "function",
            "function": {"name": ev.name, "arguments": ""},
        }
        return {"tool_calls": [call]}
    assert isinstance(ev, CallArgs)
    return {"tool_calls": [{"index": ev.index, "function": {"arguments": ev.text}}]}


class ChatChoices:
    def __init__(self, structured: StructuredRequest, n: int = 1) -> None:
        self.structured = structured
        # Per choice: a parser that holds back text that may be a tool call (None: no tools offered).
        self.parsers = [structured.reply_stream() for _ in range(n)]
        self.called = [False] * n

    def opening(self, i: int) -> dict[str, Any]:
        return _chunk(i, {"role": "assistant", "content": ""})

    def delta(self, i: int, text: str, lps: Any = None) -> list[dict[str, Any]]:
        parser = self.parsers[i]
        events: list[ReplyEvent] = parser.feed(text) if parser is not None else ([Text(text)] if text else [])
        out = [_chunk(i, _delta(ev)) for ev in events]
        if lps:
            if out:
                out[0]["logprobs"] = lps
            else:
                out.append(_chunk(i, {"content": ""}, None, lps))
        return out

    def closing(self, i: int, finish: str | None) -> list[dict[str, Any]]:
        finish = finish_reason(finish)
        parser = self.parsers[i]
        out = []
        if parser is not None:
            events, calls = parser.finish()
            out = [_chunk(i, _delta(ev)) for ev in events]
            if calls:
                finish = "tool_calls"
        out.append(_chunk(i, {}, finish))
        return out

    def whole(self, i: int, text: str, finish: str | None, lps: Any = None) -> dict[str, Any]:
        content, calls, reason = self.structured.reply(text, finish_reason(finish))
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        return {"index": i, "message": message, "logprobs": lps, "finish_reason": reason}


def completion_choice(i: int, text: str, finish: str | None = None, lps: Any = None) -> dict[str, Any]:
    """A legacy completion's choice, whole or as a chunk (finish None until the last one)."""
    return {"text": text, "index": i, "logprobs": lps, "finish_reason": finish}
