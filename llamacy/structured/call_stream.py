"""A reply streamed as typed events: text to show, and tool calls whose arguments arrive in pieces as the
model writes them (every API dialect streams them so: OpenAI's delta.tool_calls[].function.arguments,
Anthropic's input_json_delta, the Responses API's function_call_arguments.delta).

    s = ReplyStream(names, max_calls, hold_all)
    for ev in s.feed(piece): ...        # Text(text) | CallStart(index, id, name) | CallArgs(index, text)
    events, calls = s.finish()          # the last events, and the calls (parse_tool_calls' shape, same ids)

The arguments are streamed in the form parse_tool_calls gives them (json.dumps of the object: ", " and ": "
separators, no other whitespace, strings re-escaped), so the pieces joined equal the arguments of the reply
answered whole. A number, an escape or a literal is sent once it is complete.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from llamacy.structured.tool_parse import ToolCallStream
from llamacy.structured.tools import CALL_OPEN

log = logging.getLogger("llamacy.structured")

_ARGUMENT_KEYS = ("arguments", "parameters")  # Llama 3.1 writes "parameters"
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = ("true", "false", "null")


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str


ReplyEvent = Text | CallStart | CallArgs


def _char(c: str) -> str:
    return json.dumps(c, ensure_ascii=False)[1:-1]


@dataclass
class _Frame:
    is_object: bool
    expect_key: bool = True
    key: str | None = None


@dataclass
class CallScan:
    """One call's JSON text so far ({"name": ..., "arguments": {...}}): its name once written, and its
    arguments re-serialized as json.dumps writes them, as far as they are complete."""

    name: str | None = None
    arguments: list[str] = field(default_factory=list)
    streamable: bool = True  # False: arguments that are not an object (a JSON string of JSON ...)

    @classmethod
    def of(cls, text: str) -> CallScan:
        scan = cls()
        scan._run(text)
        return scan

    def _run(self, text: str) -> None:  # one state machine: it reads better whole
        stack: list[_Frame] = []
        capture = None  # the stack depth of the arguments value while it is being written
        in_string = False
        is_key = False
        buf: list[str] = []  # the string's decoded text (keys and the name)
        esc = ""  # an escape sequence being read
        high = None  # a high surrogate waiting for its low half
        token = ""  # a number or literal being read
        out = self.arguments

        def emit(s: str) -> None:
            if capture is not None:
                out.append(s)

        def value_starts() -> None:
            nonlocal capture
            if capture is None and len(stack) == 1 and stack[0].is_object and stack[0].key in _ARGUMENT_KEYS:
                capture = len(stack)

        def end_token() -> bool:
            nonlocal token
            if not token:
                return True
            try:
                emit(json.dumps(json.loads(token)))
            except json.JSONDecodeError:
                return False
            token = ""
            after_value()
            return True

        def after_value() -> None:
            nonlocal capture
            if capture is not None and len(stack) == capture:
                capture = -1  # the arguments are complete: nothing more to collect
            if stack and stack[-1].is_object:
                stack[-1].expect_key = False

        for c in text:
            if capture == -1:
                return
            if in_string:
                if esc:
                    esc += c
                    if esc[1] == "u" and len(esc) < 6:
                        continue
                    if esc[1] == "u":
                        try:
                            code = int(esc[2:], 16)
                        except ValueError:
                            return
                        esc = ""
                        if 0xD800 <= code < 0xDC00 and high is None:
                            high = code
                            continue
                        if high is not None and 0xDC00 <= code < 0xE000:
                            ch = chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00))
                            high = None
                        else:
                            if high is not None:
                                emit(_char(chr(high)))
                                high = None
                            ch = chr(code)
                    else:
                        ch = _ESCAPES.get(c)
                        esc = ""
                        if ch is None:
                            return
                    emit(_char(ch))
                    buf.append(ch)
                    continue
                if c == "\\":
                    esc = c
                    continue
                if high is not None:
                    emit(_char(chr(high)))
                    high = None
                if c == '"':
                    in_string = False
                    emit('"')
                    s = "".join(buf)
                    if is_key:
                        stack[-1].key = s
                    else:
                        if len(stack) == 1 and stack[0].key == "name":
                            self.name = s
                        after_value()
                    continue
                emit(_char(c))
                buf.append(c)
                continue
            if c in " \t\r\n":
                if not end_token():
                    return
                continue
            if c.isalnum() or c in "+-.":
                if not token:
                    value_starts()
                token += c
                if token in _LITERALS:
                    emit(token)
                    token = ""
                    after_value()
                continue
            if not end_token():
                return
            if c in "{[":
                if stack:
                    value_starts()
                emit(c)
                stack.append(_Frame(is_object=c == "{", expect_key=c == "{"))
            elif c in "}]":
                if not stack:
                    return
                emit(c)
                stack.pop()
                after_value()
            elif c == ",":
                emit(", ")
                if stack and stack[-1].is_object:
                    stack[-1].expect_key = True
            elif c == ":":
                emit(": ")
                if stack and stack[-1].is_object:
                    stack[-1].expect_key = False
            elif c == '"':
                if not stack:
                    return
                is_key = stack[-1].is_object and stack[-1].expect_key
                if not is_key:
                    value_starts()
                    if capture == len(stack):
                        self.streamable = False  # arguments as a string: sent whole at the end
                        capture = None
                in_string = True
                buf = []
                emit('"')
            else:
                return


@dataclass
class _Open:
    id: str
    name: str
    sent: str = ""


class ReplyStream:
    """ToolCallStream's text, and the calls it holds back streamed as CallStart and CallArgs events."""

    def __init__(self, names: Any, max_calls: int | None = None, hold_all: bool = False) -> None:
        self.text = ToolCallStream(names, max_calls, hold_all)
        self.names = set(names)
        self.max_calls = max_calls
        self.open: list[_Open] = []

    def feed(self, piece: str) -> list[ReplyEvent]:
        shown = self.text.feed(piece)
        events: list[ReplyEvent] = [Text(shown)] if shown else []
        return events + self._calls()

    def _calls(self) -> list[ReplyEvent]:
        held = self.text.held
        at = held.find(CALL_OPEN)
        if at < 0:
            return []
        bodies = held[at + len(CALL_OPEN) :].split(CALL_OPEN)
        events: list[ReplyEvent] = []
        for i, body in enumerate(bodies):
            if self.max_calls is not None and i >= self.max_calls:
                break
            scan = CallScan.of(body)
            if i == len(self.open):
                if scan.name is None or scan.name not in self.names:
                    break  # not (yet) a call of an offered tool: it may stay text
                self.open.append(_Open(_new_id(), scan.name))
                events.append(CallStart(i, self.open[i].id, scan.name))
            opened = self.open[i]
            if not scan.streamable:
                continue
            text = "".join(scan.arguments)
            if len(text) > len(opened.sent) and text.startswith(opened.sent):
                events.append(CallArgs(i, text[len(opened.sent) :]))
                opened.sent = text
        return events

    def finish(self) -> tuple[list[ReplyEvent], list[dict[str, Any]]]:
        """The events still to send (held text that is not a call, calls not streamed yet, the rest of the
        arguments), and the reply's calls with the ids their CallStart gave them."""
        rest, calls = self.text.finish()
        events: list[ReplyEvent] = [Text(rest)] if rest else []
        for i, call in enumerate(calls):
            fn = call["function"]
            if i < len(self.open) and self.open[i].name == fn["name"]:
                call["id"] = self.open[i].id
            else:
                if i < len(self.open):  # a streamed call that did not parse as the one found: rare
                    log.warning(
                        "tool call %d was streamed as %s, parsed as %s", i, self.open[i].name, fn["name"]
                    )
                    continue
                self.open.append(_Open(call["id"], fn["name"]))
                events.append(CallStart(i, call["id"], fn["name"]))
            sent = self.open[i].sent
            if fn["arguments"].startswith(sent):
                if len(fn["arguments"]) > len(sent):
                    events.append(CallArgs(i, fn["arguments"][len(sent) :]))
                self.open[i].sent = fn["arguments"]
            else:
                log.warning("tool call %d: streamed arguments differ from the parsed ones", i)
        return events, calls


def _new_id() -> str:
    from llamacy.structured.tool_parse import new_call_id

    return new_call_id()
