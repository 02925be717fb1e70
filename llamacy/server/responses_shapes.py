"""The Responses API's objects: the Response, its output items (an assistant message, function calls),
and its stream of typed events, each with the next sequence_number.

A stream goes: response.created, response.in_progress; for the text, response.output_item.added (a
message), response.content_part.added (output_text), response.output_text.delta ..., .done,
response.content_part.done, response.output_item.done; for each call, response.output_item.added (a
function_call), response.function_call_arguments.delta ..., .done, response.output_item.done; then
response.completed (or response.incomplete when max_output_tokens cut it short, response.failed on an
error). With tools offered, text that may be a call is held back until it is clear (ReplyStream), so
the message item opens with the first text to show; a call's arguments stream as the model writes them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from llamacy.scheduler import Done, Failed, Piece, TokenLogprob
from llamacy.server.answer import Encoder
from llamacy.structured import StructuredRequest
from llamacy.structured.call_stream import CallStart, ReplyEvent, Text


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


class ResponsesEncoder(Encoder):
    """One response, whole or as stream events. `head` holds the fields that echo the request; `on_final`
    gets each finished Response (to store it)."""

    def __init__(
        self,
        head: dict[str, Any],
        structured: StructuredRequest,
        on_final: Callable[[dict[str, Any], Done], None],
    ) -> None:
        self.head = head
        self.structured = structured
        self.on_final = on_final
        self.parser = structured.reply_stream()
        self.seq = 0
        self.output: list[dict[str, Any] | None] = []  # by output_index; None while the item is open
        self.message: tuple[int, str] | None = None  # the open message item: output_index, id
        self.text = ""  # its text so far
        self.added: list[dict[str, Any]] = []  # the function_call items as announced
        # call index -> output_index, item id, call id, arguments so far
        self.calls: dict[int, tuple[int, str, str, str]] = {}

    def response(self, status: str, **fields: Any) -> dict[str, Any]:
        return {**self.head, "status": status, **fields}

    # ---- whole -----------------------------------------------------------------------------------------

    def whole(self, dones: list[Done], logprobs: list[list[TokenLogprob]]) -> dict[str, Any]:
        [done] = dones
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
        final = self.response(
            status,
            output=output,
            usage=usage(done),
            incomplete_details=incomplete,
            completed_at=int(time.time()) if status == "completed" else None,
        )
        self.on_final(final, done)
        return final

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
        index, item_id = len(self.output), new_id("msg")
        self.output.append(None)
        self.message = (index, item_id)
        self.text = ""
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=message_item(item_id, None, "in_progress"),
            ),
            self._event(
                "response.content_part.added",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=_text_part(""),
            ),
        ]

    def _close_message(self, status: str) -> list[str]:
        assert self.message is not None
        index, item_id = self.message
        item = self.output[index] = message_item(item_id, self.text, status)
        self.message = None
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self._event("response.output_text.done", **where, text=self.text, logprobs=[]),
            self._event("response.content_part.done", **where, part=_text_part(self.text)),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _on(self, ev: ReplyEvent) -> list[str]:
        if isinstance(ev, Text):
            out = [] if self.message is not None else self._open_message()
            self.text += ev.text
            index, item_id = self.message  # type: ignore[misc]
            where = {"item_id": item_id, "output_index": index, "content_index": 0}
            return [*out, self._event("response.output_text.delta", **where, delta=ev.text, logprobs=[])]
        if isinstance(ev, CallStart):
            out = self._close_message("completed") if self.message is not None else []
            index, item_id = len(self.output), new_id("fc")
            self.output.append(None)
            self.calls[ev.index] = (index, item_id, ev.id, "")
            call = {"id": ev.id, "function": {"name": ev.name}}
            item = call_item(item_id, call, "", "in_progress")
            self.added.append(item)
            return [*out, self._event("response.output_item.added", output_index=index, item=item)]
        index, item_id, call_id, arguments = self.calls[ev.index]
        self.calls[ev.index] = (index, item_id, call_id, arguments + ev.text)
        return [
            self._event(
                "response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=ev.text
            )
        ]

    def delta(self, i: int, piece: Piece) -> list[str]:
        if self.parser is None:
            return self._on(Text(piece.text)) if piece.text else []
        return [line for ev in self.parser.feed(piece.text) for line in self._on(ev)]

    def closing(self, i: int, done: Done) -> list[str]:
        events, calls = self.parser.finish() if self.parser is not None else ([], [])
        status, incomplete = finished(done, calls)
        out = [line for ev in events for line in self._on(ev)]
        if self.message is None and not calls and None not in self.output:
            out += self._open_message()  # an empty reply is still a message, as whole() answers it
        if self.message is not None:
            out += self._close_message(status)
        parsed = {c["id"]: c for c in calls}
        for _, (index, item_id, call_id, arguments) in sorted(self.calls.items()):
            # A call announced while it was written that did not parse in the end (cut off): incomplete.
            call = parsed.get(call_id)
            item_status = "completed" if call is not None else "incomplete"
            item = self.output[index] = call_item(
                item_id, call or self._announced(call_id), arguments, item_status
            )
            out += [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item_id,
                    output_index=index,
                    arguments=arguments,
                ),
                self._event("response.output_item.done", output_index=index, item=item),
            ]
        final = self._final(status, [x for x in self.output if x is not None], done, incomplete)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*out, self._event(kind, response=final)]

    def _announced(self, call_id: str) -> dict[str, Any]:
        added = next(x for x in self.added if x["call_id"] == call_id)
        return {"id": call_id, "function": {"name": added["name"]}}

    def error(self, failed: Failed) -> list[str]:
        error = {"code": "server_error", "message": failed.message}
        output = [x for x in self.output if x is not None]
        return [self._event("response.failed", response=self.response("failed", output=output, error=error))]
