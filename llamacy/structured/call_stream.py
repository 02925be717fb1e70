"""A reply streamed as typed events: text to show, and tool calls whose arguments arrive in pieces as the
model writes them (every API dialect streams them so: OpenAI's delta.tool_calls[].function.arguments,
Anthropic's input_json_delta, the Responses API's function_call_arguments.delta).

    s = ReplyStream(names, max_calls, hold_all)
    for ev in s.feed(piece): ...        # Text(text) | CallStart(index, id, name) | CallArgs(index, text)
    events, calls = s.finish()          # the last events, and the calls (parse_tool_calls' shape, same ids)

Calls are scanned from the template's call marker (CallSyntax.opener): CallScan reads the JSON of a
`<tool_call>` block, gemma4_scan.Gemma4CallScan Gemma 4's `<|tool_call>call:NAME{...}` syntax.

The arguments are streamed in the form parse_tool_calls gives them (json.dumps of the object: ", " and ": "
separators, no other whitespace, strings re-escaped), so the pieces joined equal the arguments of the reply
answered whole. A number, an escape or a literal is sent once it is complete.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from llamacy.structured.call_syntax import CallSyntax
from llamacy.structured.gemma4_scan import Gemma4CallScan
from llamacy.structured.tool_parse import ToolCallStream

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


class CallScan:
    """One call's JSON text ({"name": ..., "arguments": {...}}), fed as it is written: its name once
    written, and its arguments re-serialized as json.dumps writes them, as far as they are complete. Each
    character is read once (a reply's calls are scanned at every token)."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.arguments: list[str] = []
        self.streamable = True  # False: arguments that are not an object (a JSON string of JSON ...)
        self._stopped = False  # the arguments are complete, or the text is not JSON we can follow
        self._stack: list[_Frame] = []
        self._capture: int | None = None  # the stack depth of the arguments value while it is written
        self._in_string = False
        self._is_key = False
        self._buf: list[str] = []  # the string's decoded text (keys and the name)
        self._esc = ""  # an escape sequence being read
        self._high: int | None = None  # a high surrogate waiting for its low half
        self._token = ""  # a number or literal being read

    @classmethod
    def of(cls, text: str) -> CallScan:
        scan = cls()
        scan.feed(text)
        return scan

    def feed(self, text: str) -> None:
        for c in text:
            if self._stopped:
                return
            if not self._char(c):
                self._stopped = True

    def _emit(self, s: str) -> None:
        if self._capture is not None:
            self.arguments.append(s)

    def _value_starts(self) -> None:
        stack = self._stack
        if (
            self._capture is None
            and len(stack) == 1
            and stack[0].is_object
            and stack[0].key in _ARGUMENT_KEYS
        ):
            self._capture = len(stack)

    def _after_value(self) -> None:
        if self._capture is not None and len(self._stack) == self._capture:
            self._stopped = True  # the arguments are complete: nothing more to collect
        if self._stack and self._stack[-1].is_object:
            self._stack[-1].expect_key = False

    def _end_token(self) -> bool:
        if not self._token:
            return True
        try:
            self._emit(json.dumps(json.loads(self._token)))
        except json.JSONDecodeError:
            return False
        self._token = ""
        self._after_value()
        return True

    def _string_char(self, c: str) -> bool:
        if self._esc:
            self._esc += c
            esc = self._esc
            if esc[1] == "u" and len(esc) < 6:
                return True
            self._esc = ""
            if esc[1] == "u":
                try:
                    code = int(esc[2:], 16)
                except ValueError:
                    return False
                if 0xD800 <= code < 0xDC00 and self._high is None:
                    self._high = code
                    return True
                if self._high is not None and 0xDC00 <= code < 0xE000:
                    ch = chr(0x10000 + ((self._high - 0xD800) << 10) + (code - 0xDC00))
                    self._high = None
                else:
                    self._flush_high()
                    ch = chr(code)
            else:
                ch = _ESCAPES.get(c)
                if ch is None:
                    return False
            self._emit(_char(ch))
            self._buf.append(ch)
            return True
        if c == "\\":
            self._esc = c
            return True
        self._flush_high()
        if c != '"':
            self._emit(_char(c))
            self._buf.append(c)
            return True
        self._in_string = False
        self._emit('"')
        text = "".join(self._buf)
        if self._is_key:
            self._stack[-1].key = text
        else:
            if len(self._stack) == 1 and self._stack[0].key == "name":
                self.name = text
            self._after_value()
        return True

    def _flush_high(self) -> None:
        if self._high is not None:
            self._emit(_char(chr(self._high)))  # a lone high surrogate, escaped as json.dumps writes it
            self._high = None

    def _char(self, c: str) -> bool:
        """Take one character; False when the text stops being JSON we can follow."""
        if self._in_string:
            return self._string_char(c)
        stack = self._stack
        if c in " \t\r\n":
            return self._end_token()
        if c.isalnum() or c in "+-.":
            if not self._token:
                self._value_starts()
            self._token += c
            if self._token in _LITERALS:
                self._emit(self._token)
                self._token = ""
                self._after_value()
            return True
        if not self._end_token():
            return False
        if self._stopped:  # that number or literal ended the arguments: the rest is not theirs
            return True
        if c in "{[":
            if stack:
                self._value_starts()
            self._emit(c)
            stack.append(_Frame(is_object=c == "{", expect_key=c == "{"))
        elif c in "}]":
            if not stack:
                return False
            self._emit(c)
            stack.pop()
            self._after_value()
        elif c == ",":
            self._emit(", ")
            if stack and stack[-1].is_object:
                stack[-1].expect_key = True
        elif c == ":":
            self._emit(": ")
            if stack and stack[-1].is_object:
                stack[-1].expect_key = False
        elif c == '"':
            if not stack:
                return False
            self._is_key = stack[-1].is_object and stack[-1].expect_key
            if not self._is_key:
                self._value_starts()
                if self._capture == len(stack):
                    self.streamable = False  # arguments as a string: sent whole at the end
                    self._capture = None
            self._in_string = True
            self._buf = []
            self._emit('"')
        else:
            return False
        return True


@dataclass
class _Open:
    id: str
    name: str
    sent: str = ""


class ReplyStream:
    """ToolCallStream's text, and the calls it holds back streamed as CallStart and CallArgs events."""

    def __init__(
        self,
        names: Any,
        max_calls: int | None = None,
        hold_all: bool = False,
        syntax: CallSyntax = CallSyntax.TAGGED,
    ) -> None:
        self.text = ToolCallStream(names, max_calls, hold_all)
        self.opener = syntax.opener
        self.scan_type = Gemma4CallScan if syntax is CallSyntax.GEMMA4 else CallScan
        self.names = set(names)
        self.max_calls = max_calls
        self.open: list[_Open] = []
        self.scans: list[tuple[CallScan | Gemma4CallScan, int]] = []  # per call: its scan, characters fed

    def feed(self, piece: str) -> list[ReplyEvent]:
        shown = self.text.feed(piece)
        events: list[ReplyEvent] = [Text(shown)] if shown else []
        return events + self._calls()

    def _calls(self) -> list[ReplyEvent]:
        held = self.text.held
        at = held.find(self.opener)
        if at < 0:
            return []
        bodies = held[at + len(self.opener) :].split(self.opener)
        events: list[ReplyEvent] = []
        for i, body in enumerate(bodies):
            if self.max_calls is not None and i >= self.max_calls:
                break
            if i == len(self.scans):
                self.scans.append((self.scan_type(), 0))
            scan, fed = self.scans[i]
            if len(body) > fed:  # (shorter: a marker completed after the call, whose scan had stopped)
                scan.feed(body[fed:])
                self.scans[i] = (scan, len(body))
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
