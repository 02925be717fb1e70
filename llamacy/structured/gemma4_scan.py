"""One Gemma 4 call, `call:NAME{key:value,...}` (the text after `<|tool_call>`), read as it is written: its
name once the `{` follows it, and its arguments as the JSON text parse_tool_calls will give them
(json.dumps of the parsed object: ", " and ": " separators, strings escaped), as far as they are complete.

It reads the syntax the way tool_parse's _Gemma4Value does, so the pieces joined equal the arguments of the
reply parsed whole: a string is sent character by character (held back only where the closing `<|"|>`
may be starting), a bare value (number, true, false, null, other text) once the `,`, `}` or `]` after it
shows where it ends, a key with its colon, a comma only once the member after it begins (a trailing comma
writes nothing). Where the text stops looking like what the grammar writes (whitespace, a stray character),
the scan stops: the rest of the arguments is sent when the reply is parsed whole.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from llamacy.structured.call_syntax import GEMMA4_QUOTE
from llamacy.structured.tool_parse import gemma4_atom

_HEAD = re.compile(r"call:([^{<\s]+)")
_ENDS_ATOM = ",}]"


@dataclass
class _Frame:
    is_object: bool
    comma: bool = False  # a comma was read: ", " goes out before the next member


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


class Gemma4CallScan:
    """CallScan's interface (name, arguments, streamable, feed) for Gemma 4's call syntax."""

    def __init__(self) -> None:
        self.name: str | None = None
        self.arguments: list[str] = []
        self.streamable = True  # Gemma 4 arguments are always an object
        self._stopped = False
        self._stack: list[_Frame] = []
        self._mode = "head"  # head, key, bare_key, quoted_key, colon, value, string, atom, after
        self._text = ""  # the head, a key, a bare value, or a string's held-back tail
        self._quoted: list[str] = []  # a quoted key's characters

    def feed(self, text: str) -> None:
        for c in text:
            if self._stopped:
                return
            if not self._char(c):
                self._stopped = True

    # ---- helpers -------------------------------------------------------------------------------------
    def _emit(self, s: str) -> None:
        self.arguments.append(s)

    def _separator(self) -> str:
        """ ", " when a comma came before this member, else nothing (and the comma is used up)."""
        top = self._stack[-1]
        sep, top.comma = (", " if top.comma else ""), False
        return sep

    def _open(self, c: str) -> None:
        if self._stack:
            self._emit(self._separator())
        self._emit(c)
        self._stack.append(_Frame(is_object=c == "{"))
        self._text, self._mode = "", "key" if c == "{" else "value"

    def _close(self) -> None:
        self._emit("}" if self._stack.pop().is_object else "]")
        self._after_value()

    def _after_value(self) -> None:
        self._text = ""
        if not self._stack:
            self._stopped = True  # the arguments are complete
        else:
            self._mode = "after"

    def _key_done(self, key: str) -> None:
        self._emit(f"{self._separator()}{_json(key)}: ")
        self._text, self._mode = "", "value"

    # ---- one character -------------------------------------------------------------------------------
    def _char(self, c: str) -> bool:
        """Take one character; False when the text stops being a call we can follow."""
        mode = self._mode
        if mode == "head":
            if c != "{":
                self._text += c
                return len(self._text) < 200
            m = _HEAD.fullmatch(self._text)
            if m is None:
                return False
            self.name = m.group(1)
            self._open(c)
            return True
        if mode == "string":
            return self._string_char(c)
        if mode == "atom":
            if c not in _ENDS_ATOM:
                self._text += c
                return True
            sep = self._separator()
            self._emit(sep + _json(gemma4_atom(self._text)))
            self._after_value()
            return self._char(c)
        if mode == "after":
            if c == ",":
                self._stack[-1].comma = True
                self._mode = "key" if self._stack[-1].is_object else "value"
                return True
            if c == ("}" if self._stack[-1].is_object else "]"):
                self._close()
                return True
            return False
        if mode == "key":
            return self._key_start(c)
        if mode == "bare_key":
            if c == ":":
                self._key_done(self._text.strip())
                return True
            self._text += c
            return c not in "{}[],\n"
        if mode == "quoted_key":
            return self._string_char(c)
        if mode == "colon":
            if c != ":":
                return False
            self._key_done("".join(self._quoted))
            return True
        return self._value_start(c)

    def _key_start(self, c: str) -> bool:
        """A key or the object's end; `<` may begin a quoted key: held until the quote is clear."""
        if not self._text and c == "}":
            self._stack[-1].comma = False
            self._close()
            return True
        self._text += c
        if GEMMA4_QUOTE.startswith(self._text):
            if self._text == GEMMA4_QUOTE:
                self._text, self._quoted, self._mode = "", [], "quoted_key"
            return True
        self._mode = "bare_key"
        text, self._text = self._text, ""
        return all(self._char(ch) for ch in text)

    def _value_start(self, c: str) -> bool:
        """A value: an object, a list, a quoted string or a bare value; a list may end here instead."""
        if not self._text:
            if c in "{[":
                self._open(c)
                return True
            if c == "]" and not self._stack[-1].is_object:
                self._stack[-1].comma = False
                self._close()
                return True
        self._text += c
        if GEMMA4_QUOTE.startswith(self._text):
            if self._text == GEMMA4_QUOTE:
                self._emit(self._separator() + '"')
                self._text, self._mode = "", "string"
            return True
        self._mode = "atom"
        text, self._text = self._text, ""
        return all(self._char(ch) for ch in text)

    def _string_char(self, c: str) -> bool:
        """String content up to the closing quote. A tail that may be the quote's beginning is held."""
        self._text += c
        while self._text and not GEMMA4_QUOTE.startswith(self._text):
            self._string_out(self._text[0])
            self._text = self._text[1:]
        if self._text == GEMMA4_QUOTE:
            if self._mode == "quoted_key":
                self._text, self._mode = "", "colon"
            else:
                self._emit('"')
                self._after_value()
        return True

    def _string_out(self, ch: str) -> None:
        if self._mode == "quoted_key":
            self._quoted.append(ch)
        else:
            self._emit(_json(ch)[1:-1])
