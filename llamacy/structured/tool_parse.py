"""A reply that may contain tool calls, parsed into OpenAI's message.tool_calls shape, whole or streamed.

Recognised: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Hermes, Qwen; the closing tag may
be missing at the end of the reply), Gemma 4's `<|tool_call>call:NAME{key:value,...}<tool_call|>` (strings
between `<|"|>` quotes, keys bare, as its chat template writes calls), and a reply that is only a JSON call or a
list of calls, optionally in a ```json fence (Llama 3.1 writes "parameters" for "arguments"). A call naming a function that is not offered
stays text: inventing a call the program cannot dispatch is worse than showing what the model wrote.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from typing import Any

from llamacy.structured.call_syntax import CALL_CLOSE, CALL_OPEN, GEMMA4_CLOSE, GEMMA4_OPEN, GEMMA4_QUOTE

_BLOCK = re.compile(re.escape(CALL_OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CALL_CLOSE) + r"|$)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)
_GEMMA4_BLOCK = re.compile(
    re.escape(GEMMA4_OPEN) + r"call:([^{<\s]+)(\{.*?\})\s*(?:" + re.escape(GEMMA4_CLOSE) + r"|$)", re.S
)
_OPENERS = (CALL_OPEN, GEMMA4_OPEN)
_GEMMA4_ATOM = re.compile(r"[^,}\]]*")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _as_call(obj: Any, names: set[str]) -> dict[str, Any] | None:
    """OpenAI's tool call for a decoded {"name", "arguments"} object, or None if it is not one."""
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


def _bare_calls(text: str, names: set[str]) -> list[dict[str, Any]] | None:
    """Calls when the whole text is a JSON call or a list of them (fenced or not)."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    if not body.startswith(("{", "[")):
        return None
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    items = obj if isinstance(obj, list) else [obj]
    calls = [_as_call(x, names) for x in items]
    return calls if calls and all(c is not None for c in calls) else None  # type: ignore[return-value]


def gemma4_atom(text: str) -> Any:
    """A bare value of Gemma 4's syntax (up to the next `,`, `}` or `]`): true, false, null, a number, or
    else the text itself as a string."""
    atom = text.strip()
    if atom in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[atom]
    try:
        return json.loads(atom)  # a number
    except json.JSONDecodeError:
        return atom  # bare text: kept as a string


class _Gemma4Value:
    """Gemma 4's argument syntax (format_argument in its template) -> Python values."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def value(self) -> Any:
        t, q = self.text, GEMMA4_QUOTE
        if t.startswith(q, self.pos):
            end = t.find(q, self.pos + len(q))
            if end < 0:
                raise ValueError("unterminated string")
            out, self.pos = t[self.pos + len(q) : end], end + len(q)
            return out
        if t.startswith("{", self.pos):
            return self.mapping()
        if t.startswith("[", self.pos):
            self.pos += 1
            items: list[Any] = []
            while not t.startswith("]", self.pos):
                items.append(self.value())
                if t.startswith(",", self.pos):
                    self.pos += 1
                elif not t.startswith("]", self.pos):
                    raise ValueError("bad list")
            self.pos += 1
            return items
        m = _GEMMA4_ATOM.match(t, self.pos)
        self.pos = m.end()
        return gemma4_atom(m.group())

    def mapping(self) -> dict[str, Any]:
        t = self.text
        if not t.startswith("{", self.pos):
            raise ValueError("not an object")
        self.pos += 1
        out: dict[str, Any] = {}
        while not t.startswith("}", self.pos):
            if t.startswith(GEMMA4_QUOTE, self.pos):
                key = self.value()
                colon = t.find(":", self.pos)
            else:
                colon = t.find(":", self.pos)
                key = t[self.pos : colon].strip()
            if colon < 0:
                raise ValueError("key without value")
            self.pos = colon + 1
            out[key] = self.value()
            if t.startswith(",", self.pos):
                self.pos += 1
            elif not t.startswith("}", self.pos):
                raise ValueError("bad object")
        self.pos += 1
        return out


def gemma4_arguments(body: str) -> dict[str, Any] | None:
    """`{key:value,...}` as Gemma 4 writes a call's arguments, or None when it is not that."""
    p = _Gemma4Value(body)
    try:
        args = p.mapping()
    except (ValueError, IndexError, AttributeError):
        return None
    return args if p.pos == len(body) else None


def _gemma4_calls(text: str, names: set[str]) -> tuple[list[dict[str, Any]], list[tuple[int, int]]]:
    calls, spans = [], []
    for m in _GEMMA4_BLOCK.finditer(text):
        args = gemma4_arguments(m.group(2))
        call = None if args is None else _as_call({"name": m.group(1), "arguments": args}, names)
        if call is not None:
            calls.append(call)
            spans.append(m.span())
    return calls, spans


def parse_tool_calls(text: str, names: Iterable[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool_calls) of a reply. Content is the text around the calls, None when there is none."""
    names = set(names)
    bare = _bare_calls(text, names)
    if bare is not None:
        return None, bare
    if GEMMA4_OPEN in text:
        calls, spans = _gemma4_calls(text, names)
        if calls:
            kept, pos = [], 0
            for start, end in spans:
                kept.append(text[pos:start])
                pos = end
            kept.append(text[pos:])
            return ("".join(kept).strip() or None), calls
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    pos = 0
    for m in _BLOCK.finditer(text):
        try:
            call = _as_call(json.loads(m.group(1)), names)
        except json.JSONDecodeError:
            call = None
        if call is None:
            continue  # not a valid call: it stays in the content
        kept.append(text[pos : m.start()])
        pos = m.end()
        calls.append(call)
    kept.append(text[pos:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


class ToolCallStream:
    """Streams a reply's text while holding back whatever may turn out to be a tool call.

    feed() returns the text that can be shown now. Text is held from the first point where a call could
    begin (a `<tool_call>` marker or a prefix of one, or a reply that starts like JSON) until it is clear;
    finish() parses what was held and returns (remaining content, tool_calls).
    """

    def __init__(self, names: Iterable[str], max_calls: int | None = None, hold_all: bool = False) -> None:
        """max_calls: keep the first calls only; hold_all: the reply is calls by grammar, show no text."""
        self.names = set(names)
        self.max_calls = max_calls
        self.hold_all = hold_all
        self._shown = ""  # text already returned by feed()
        self._held = ""  # text after it, not shown yet
        self._holding_rest = hold_all  # a call has begun: everything else waits for finish()

    def feed(self, piece: str) -> str:
        if not piece:
            return ""
        self._held += piece
        if self._holding_rest:
            return ""
        if not self._shown and self._held.lstrip().startswith(("{", "[", "`")):
            self._holding_rest = True  # the whole reply may be a bare JSON call
            return ""
        found = [at for at in (self._held.find(o) for o in _OPENERS) if at >= 0]
        if found:
            self._holding_rest = True
            return self._release(min(found))
        # Keep back a tail that could be the start of a marker.
        for k in range(min(max(map(len, _OPENERS)) - 1, len(self._held)), 0, -1):
            if any(o.startswith(self._held[-k:]) for o in _OPENERS):
                return self._release(len(self._held) - k)
        return self._release(len(self._held))

    @property
    def held(self) -> str:
        """The text held back so far: from where a call may begin."""
        return self._held

    def _release(self, n: int) -> str:
        out, self._held = self._held[:n], self._held[n:]
        self._shown += out
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(text still to show, tool calls). With calls, the held text's non-call part is returned."""
        held, self._held = self._held, ""
        content, calls = parse_tool_calls(self._shown + held, self.names)
        calls = calls[: self.max_calls]
        if not calls:
            return held, []
        if self.hold_all:
            return "", calls
        # The shown part had no call in it (it ends before the first marker): what remains is after it.
        rest = content or ""
        shown = self._shown.strip()
        if shown and rest.startswith(shown):
            rest = rest[len(shown) :]
        return (rest if rest.strip() else ""), calls
