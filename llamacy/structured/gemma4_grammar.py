"""The Lark grammar (for llguidance) of Gemma 4 tool calls, generated from the tools' JSON-schema parameters.

    lark = gemma4_call_lark(tools, many=False, after_trigger=False)

A call is `<|tool_call>call:NAME{key:value,...}<tool_call|>` as Gemma 4's chat template writes it
(format_argument with escape_keys=False): strings between `<|"|>` quote tokens, keys bare, numbers, true,
false and null bare, `{...}` objects and `[...]` lists, no whitespace. Several calls follow each other with
nothing between them, as llama.cpp's gemma4 parser reads them (common/chat.cpp); its grammar accepts any
Gemma 4 value as the arguments, this one follows each tool's schema.

Schema support:
- object: the listed properties only (as llama.cpp's converter, and close_objects for the JSON form; extra
  keys an additionalProperties schema would allow beside them are not written), each
  required one present, optional ones present or not, in the template's order (Jinja's dictsort: sorted by
  lower-cased key). That is the order the model saw its calls rendered in while training, so a call the
  template renders is a sentence of the grammar. An object without properties takes any keys, with values
  of its additionalProperties schema when it has one.
- string: minLength/maxLength, never the quote token inside; enum and const of any JSON value.
- integer: minimum/maximum/exclusive* exactly, at most 15 digits. number: at most 15 integer and 6 fraction
  digits; with bounds, the whole numbers in range and fractions whose whole unit interval lies in range
  (minimum -2.5 allows -1.99 but not -2.25: never a value out of range); a range that holds no whole number
  (0.2..0.7) only restricts the sign.
- boolean, null, array (items, minItems/maxItems), anyOf/oneOf (as alternatives), type lists, `nullable`,
  local `$ref`s (recursion included).
Anything else (allOf, not, if/then, patternProperties, pattern, format, prefixItems, remote $refs) is not
enforced: that part of the value falls back to the permissive rule, any Gemma 4 value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from llamacy.structured.call_syntax import GEMMA4_CLOSE, GEMMA4_OPEN, GEMMA4_QUOTE

_MAX_INT = 10**15 - 1  # 15 digits: bounded, so a random model cannot write digits until max_tokens
_FRACTION = r"\.[0-9]{1,6}"
_ANY_NUMBER = r"-?(0|[1-9][0-9]{0,14})(\.[0-9]{1,15})?"
# String content: any text without the quote token written out (the token itself, like every special token,
# is outside the UTF-8 a regex matches).
_NO_QUOTE = r'~/(?s:.*)<\|"\|>(?s:.*)/'
_QUOTE = f"<{GEMMA4_QUOTE[1:-1]}>"  # the quote token in Lark's <token> syntax

_PERMISSIVE = rf"""g4_any: g4_str | g4_dict | g4_list | G4_NUMBER | "true" | "false" | "null"
g4_str: {_QUOTE} G4_TEXT {_QUOTE}
g4_dict: "{{" (g4_kv ("," g4_kv)*)? "}}"
g4_kv: G4_KEY ":" g4_any
g4_list: "[" (g4_any ("," g4_any)*)? "]"
G4_TEXT: /(?s:.)*/ & {_NO_QUOTE}
G4_KEY: /[A-Za-z_][A-Za-z0-9_.-]{{0,63}}/
G4_NUMBER: /{_ANY_NUMBER}/
"""


def gemma4_call_lark(tools: Sequence[Any], *, many: bool, after_trigger: bool) -> str:
    """The grammar of calls to `tools` (objects with .name and .parameters). after_trigger: the text after
    an opening `<|tool_call>` the model wrote itself; many: further calls may follow."""
    rules = _Rules()
    fns = []
    for t in tools:
        args = _Schema(t.parameters, rules).object(t.parameters)
        fns.append(rules.add("fn", f"{json.dumps('call:' + t.name)} {args}"))
    close = f"<{GEMMA4_CLOSE[1:-1]}>"
    open_ = f"<{GEMMA4_OPEN[1:-1]}>"
    head = [f"rest: ({' | '.join(fns)}) {close}"]
    if after_trigger:
        head.insert(0, f"start: rest ({open_} rest)*" if many else "start: rest")
    else:
        head.insert(0, f"start: {open_} rest ({open_} rest)*" if many else f"start: {open_} rest")
    return "\n".join(head + rules.lines()) + "\n" + (_PERMISSIVE if rules.permissive else "")


class _Rules:
    """The rules and terminals generated so far, named by a counter; terminals shared when equal."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self.terminals: dict[str, str] = {}  # body -> name
        self.permissive = False
        self._n = 0

    def name(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def add(self, prefix: str, body: str) -> str:
        name = self.name(prefix)
        self.rules[name] = body
        return name

    def terminal(self, body: str) -> str:
        if body not in self.terminals:
            self.terminals[body] = self.name("G4_T")
        return self.terminals[body]

    def any(self) -> str:
        self.permissive = True
        return "g4_any"

    def lines(self) -> list[str]:
        return [f"{n}: {b}" for n, b in self.rules.items()] + [f"{n}: {b}" for b, n in self.terminals.items()]


class _Schema:
    """One tool's parameters schema turned into rules (its root resolves the schema's local $refs)."""

    def __init__(self, root: Mapping[str, Any], rules: _Rules) -> None:
        self.root = root
        self.rules = rules
        self.refs: dict[str, str] = {}

    def value(self, s: Any) -> str:
        """An expression (a rule or terminal name, or a short sequence) for a value of schema `s`."""
        if not isinstance(s, Mapping):
            return self.rules.any()  # `true`, or not a schema at all
        if s.get("nullable") is True:
            return f'({self.value({k: v for k, v in s.items() if k != "nullable"})} | "null")'
        if "$ref" in s:
            return self.ref(s["$ref"])
        if "const" in s:
            return _literal(s["const"]) or self.rules.any()
        if "enum" in s and isinstance(s["enum"], list):
            alts = [a for a in map(_literal, s["enum"]) if a]
            return f"({' | '.join(alts)})" if alts else self.rules.any()
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key]:
                return "(" + " | ".join(self.value(x) for x in s[key]) + ")"
        kind = s.get("type")
        if isinstance(kind, list):
            return (
                "(" + " | ".join(self.value({**s, "type": k}) for k in kind) + ")"
                if kind
                else self.rules.any()
            )
        if kind == "string":
            return self.string(s)
        if kind == "integer":
            return self.rules.terminal(f"/{_integer_regex(*_int_bounds(s))}/")
        if kind == "number":
            return self.rules.terminal(f"/{_number_regex(s)}/")
        if kind == "boolean":
            return '("true" | "false")'
        if kind == "null":
            return '"null"'
        if kind == "array":
            return self.array(s)
        if kind == "object" or (kind is None and "properties" in s):
            return self.object(s)
        return self.rules.any()

    def ref(self, ref: Any) -> str:
        """A local "#/..." pointer as a rule of its own (named before it is built: schemas may recurse)."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return self.rules.any()
        if ref not in self.refs:
            target: Any = self.root
            for part in [p for p in ref[1:].split("/") if p]:
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
            if target is None:
                return self.rules.any()
            name = self.rules.name("ref")
            self.refs[ref] = name
            self.rules.rules[name] = self.value(target)
        return self.refs[ref]

    def string(self, s: Mapping[str, Any]) -> str:
        lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
        reps = "*" if hi is None and lo == 0 else f"{{{lo},{'' if hi is None else int(hi)}}}"
        text = self.rules.terminal(f"/(?s:.){reps}/ & {_NO_QUOTE}")
        return f"{_QUOTE} {text} {_QUOTE}"

    def array(self, s: Mapping[str, Any]) -> str:
        item = self.value(s.get("items", True))
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        if hi is not None and int(hi) == 0:
            return '("[" "]")'
        more_lo = max(lo - 1, 0)
        more = f'("," {item})' + (f"{{{more_lo},{int(hi) - 1}}}" if hi is not None else f"{{{more_lo},}}")
        body = f"{item} {more}"
        return self.rules.add("arr", f'"[" {body} "]"' if lo else f'"[" ({body})? "]"')

    def object(self, s: Mapping[str, Any]) -> str:
        props = s.get("properties")
        listed = isinstance(props, Mapping) and not ({"additionalProperties", "patternProperties"} & set(s))
        if not listed and not props:
            extra = s.get("additionalProperties")
            if isinstance(extra, Mapping):  # a map: any keys, values of one schema
                kv = f'G4_KEY ":" {self.value(extra)}'
                self.rules.permissive = True  # G4_KEY lives with the permissive rules
                return self.rules.add("map", f'"{{" ({kv} ("," {kv})*)? "}}"')
            self.rules.any()
            return "g4_dict"
        if not props:  # `"properties": {}` and nothing about others (a function without parameters)
            return '("{" "}")'
        required = set(s.get("required") or ())
        keys = sorted(props, key=lambda k: k.lower())  # Jinja's dictsort, as the template renders calls
        members = [f"{_key(k)} {self.value(props[k])}" for k in keys]
        tail = self._members(members, [k in required for k in keys], 0, True, {})
        return self.rules.add("obj", f'"{{" {tail} "}}"' if tail else '"{" "}"')

    def _members(
        self, members: list[str], required: list[bool], i: int, first: bool, memo: dict[tuple[int, bool], str]
    ) -> str:
        """Members i.. of an object as a rule ("" when none can follow); `first`: none was written yet, so
        the next one has no comma before it. Each (i, first) is one rule, so optional keys stay linear."""
        if i == len(members):
            return ""
        if (i, first) in memo:
            return memo[(i, first)]
        this = members[i] if first else f'"," {members[i]}'
        after = self._members(members, required, i + 1, False, memo)
        present = f"{this} {after}".strip()
        if required[i]:
            body = present
        else:
            skip = self._members(members, required, i + 1, first, memo)
            body = f"{present} | {skip}" if skip else f"({present})?"
        memo[(i, first)] = self.rules.add("mem", body)
        return memo[(i, first)]


def _key(k: str) -> str:
    """A key and its colon: bare as the template writes keys, quoted where a bare one would not parse back."""
    if ":" in k or k != k.strip() or not k or k.startswith(("<", "}")):
        if GEMMA4_QUOTE in k:
            raise ValueError(f"property name {k!r} contains Gemma 4's quote token")
        return f'{_QUOTE} {json.dumps(k)} {_QUOTE} ":"'
    return json.dumps(k + ":")


def _gemma4_text(v: Any) -> str | None:
    """`v` as the template's format_argument writes it (None: a string holding the quote token)."""
    if isinstance(v, str):
        return None if GEMMA4_QUOTE in v else f"{GEMMA4_QUOTE}{v}{GEMMA4_QUOTE}"
    if v is None or isinstance(v, bool | int | float):
        return json.dumps(v)
    if isinstance(v, Mapping):
        parts = [(str(k), _gemma4_text(v[k])) for k in sorted(v, key=lambda k: str(k).lower())]
        if any(t is None for _, t in parts):
            return None
        return "{" + ",".join(f"{k}:{t}" for k, t in parts) + "}"
    if isinstance(v, list):
        items = [_gemma4_text(x) for x in v]
        return None if any(t is None for t in items) else "[" + ",".join(items) + "]"  # type: ignore[arg-type]
    return None


def _literal(v: Any) -> str | None:
    """A Lark sequence spelling `v` in Gemma 4's syntax: text literals, and the quote as its token."""
    text = _gemma4_text(v)
    if text is None:
        return None
    pieces = [json.dumps(p, ensure_ascii=False) if p else "" for p in text.split(GEMMA4_QUOTE)]
    return "(" + f" {_QUOTE} ".join(pieces).strip() + ")"


def _bound(s: Mapping[str, Any], key: str, exclusive: str) -> tuple[float | None, bool]:
    """A bound and whether it is exclusive (draft 6+ numbers, or draft 4's boolean flags)."""
    value, excl = s.get(key), s.get(exclusive)
    numeric_excl = isinstance(excl, int | float) and not isinstance(excl, bool)
    if numeric_excl and (value is None or (excl >= value if key == "minimum" else excl <= value)):
        return float(excl), True
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value), excl is True
    return None, False


def _int_bounds(s: Mapping[str, Any]) -> tuple[int, int]:
    lo, lo_x = _bound(s, "minimum", "exclusiveMinimum")
    hi, hi_x = _bound(s, "maximum", "exclusiveMaximum")
    first = -_MAX_INT if lo is None else (math.floor(lo) + 1 if lo_x else math.ceil(lo))
    last = _MAX_INT if hi is None else (math.ceil(hi) - 1 if hi_x else math.floor(hi))
    return max(first, -_MAX_INT), min(last, _MAX_INT)


def _number_regex(s: Mapping[str, Any]) -> str:
    """Whole numbers in range, plus fractions of the whole numbers whose unit interval stays in range."""
    lo, hi = _int_bounds(s)
    if lo > hi:  # no whole number in range (0.2..0.7): only the sign is held to
        low = _bound(s, "minimum", "exclusiveMinimum")[0]
        return _ANY_NUMBER.removeprefix("-?") if low is not None and low >= 0 else _ANY_NUMBER
    alts = [_integer_regex(lo, hi)]
    if max(lo, 0) <= hi - 1:  # I.f in [I, I+1), inside [lo, hi]
        alts.append(f"({_integer_regex(max(lo, 0), hi - 1)}){_FRACTION}")
    if max(0, -hi) <= -lo - 1:  # -m.f in (-(m+1), -m], inside [lo, hi]
        alts.append(f"-({'|'.join(_nonnegative(max(0, -hi), -lo - 1))}){_FRACTION}")
    return "|".join(f"({a})" for a in alts)


def _integer_regex(lo: int, hi: int) -> str:
    """A regex matching exactly the integers lo..hi written as JSON writes them."""
    if lo > hi:
        raise ValueError(f"no integer between {lo} and {hi}")
    alts = _nonnegative(max(lo, 0), hi) if hi >= 0 else []
    if lo < 0:
        alts.append(f"-({'|'.join(_nonnegative(max(1, -hi), -lo))})")
    return "|".join(alts) if len(alts) == 1 else "(" + "|".join(alts) + ")"


def _nonnegative(lo: int, hi: int) -> list[str]:
    """Alternatives matching lo..hi (0 <= lo <= hi), split by digit count."""
    out: list[str] = []
    while lo <= hi:
        end = min(hi, 10 ** len(str(lo)) - 1)
        out += _same_length(str(lo), str(end))
        lo = end + 1
    return out


def _same_length(a: str, b: str) -> list[str]:
    """Alternatives matching the numbers a..b, two digit strings of one length."""
    if not a:
        return [""]
    if a[0] == b[0]:
        return [a[0] + r for r in _same_length(a[1:], b[1:])]
    n = len(a) - 1
    low_full, high_full = a[1:] == "0" * n, b[1:] == "9" * n
    out = [] if low_full else [a[0] + r for r in _same_length(a[1:], "9" * n)]
    first, last = int(a[0]) + (not low_full), int(b[0]) - (not high_full)
    if first <= last:
        digit = str(first) if first == last else f"[{first}-{last}]"
        out.append(digit + (f"[0-9]{{{n}}}" if n else ""))
    if not high_full:
        out += [b[0] + r for r in _same_length("0" * n, b[1:])]
    return out
