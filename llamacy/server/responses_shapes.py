"""The Responses API's objects: the Response, its output items (an assistant message, function calls),
and its stream of typed events, each with the next sequence_number.

A stream goes: response.created, response.in_progress; for the text, response.output_item.added (a
message), response.content_part.added (output_text), response.output_text.delta ..., .done,
response.content_part.done, response.output_item.done; for each call, response.output_item.added (a
function_call), response.function_call_arguments.delta ..., .done, response.output_item.done; then
response.completed (or response.incomplete when max_output_tokens cut it short, response.failed on an
error). With tools offered, text that may be a call is held back until it is clear (ToolCallStream), so
the message item opens with the first text to show.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from llamacy.scheduler import Done, Piece
from llamacy.structured import StructuredRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(done: Done) -> dict[str, Any]:
    u = done.usage
    return {
        "input_tokens": u.prompt_tokens,
        # Written: the prompt tokens evaluated now, whose K/V stay in the slot for a later request.
        "input_tokens_details": {
            "cached_tokens": u.cached_tokens,
            "cache_write_tokens": u.prompt_tokens - u.cached_tokens,
        },
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call: dict[str, Any], arguments: str, status: str) -> dict[str, Any]:
    """A function_call output item from a parsed call (Chat Completions' tool_calls entry)."""
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": arguments,
    }


def finished(done: Done, calls: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    """(status, incomplete_details) of a finished response."""
    if done.finish_reason == "length" and not calls:
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


class ResponseShape:
    """One response, whole (`whole`) or as stream events (`opening`, `delta`, `closing`, `failure`; each
    returns the SSE lines to send). `head` holds the fields that echo the request."""

    def __init__(self, head: dict[str, Any], structured: StructuredRequest) -> None:
        self.head = head
        self.structured = structured
        self.parser = structured.stream()
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # items finished so far
        self.message_id: str | None = None  # the open message item
        self.text = ""  # its text so far

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {**self.head, "status": status, **fields}

    # ---- whole -----------------------------------------------------------------------------------------

    def whole(self, done: Done) -> dict[str, Any]:
        content, calls, _ = self.structured.reply(done.text, done.finish_reason)
        status, incomplete = finished(done, calls)
        output = []
        if content or not calls:
            output.append(message_item(new_id("msg"), content or "", status))
        output += [call_item(new_id("fc"), c, c["function"]["arguments"], "completed") for c in calls]
        return self._final(status, output, done, incomplete)

    def _final(
        self, status: str, output: list[dict[str, Any]], done: Done, incomplete: dict[str, Any] | None
    ) -> dict[str, Any]:
        return self.response(
            status,
            output=output,
            usage=usage(done),
            incomplete_details=incomplete,
            completed_at=int(time.time()) if status == "completed" else None,
        )

    # ---- streamed --------------------------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> str:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n"

    def opening(self) -> list[str]:
        head = self.response("in_progress", output=[], usage=None)
        out = [
            self._event("response.created", response=head),
            self._event("response.in_progress", response=head),
        ]
        if self.parser is None:  # no tools: all of the reply is text, its message opens at once
            out += self._open_message()
        return out

    def _open_message(self) -> list[str]:
        self.message_id = new_id("msg")
        index = len(self.output)
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=message_item(self.message_id, None, "in_progress"),
            ),
            self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=index,
                content_index=0,
                part=_text_part(""),
            ),
        ]

    def _text_delta(self, text: str) -> list[str]:
        out = [] if self.message_id is not None else self._open_message()
        self.text += text
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self.message_id,
                output_index=len(self.output),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def delta(self, piece: Piece) -> list[str]:
        text = self.parser.feed(piece.text) if self.parser is not None else piece.text
        return self._text_delta(text) if text else []

    def _close_message(self, status: str) -> list[str]:
        assert self.message_id is not None
        index, item_id = len(self.output), self.message_id
        item = message_item(item_id, self.text, status)
        self.output.append(item)
        self.message_id = None
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", **where, text=self.text, logprobs=[]),
            self._event("response.content_part.done", **where, part=_text_part(self.text)),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _call_events(self, call: dict[str, Any]) -> list[str]:
        item_id, index = new_id("fc"), len(self.output)
        arguments = call["function"]["arguments"]
        where = {"item_id": item_id, "output_index": index}
        item = call_item(item_id, call, arguments, "completed")
        self.output.append(item)
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=call_item(item_id, call, "", "in_progress"),
            ),
            self._event("response.function_call_arguments.delta", **where, delta=arguments),
            self._event("response.function_call_arguments.done", **where, arguments=arguments),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def closing(self, done: Done) -> tuple[list[str], dict[str, Any]]:
        """The last events, and the finished Response they carry."""
        rest, calls = self.parser.finish() if self.parser is not None else ("", [])
        status, incomplete = finished(done, calls)
        out = self._text_delta(rest) if rest else []
        if self.message_id is None and not calls:
            out += self._open_message()  # an empty reply is still a message, as whole() answers it
        if self.message_id is not None:
            out += self._close_message(status)
        for call in calls:
            out += self._call_events(call)
        final = self._final(status, list(self.output), done, incomplete)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self._event(kind, response=final))
        return out, final

    def failure(self, message: str) -> list[str]:
        error = {"code": "server_error", "message": message}
        return [
            self._event("response.failed", response=self.response("failed", output=self.output, error=error))
        ]
