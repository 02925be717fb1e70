"""What a request asks the output to be, compiled into an llguidance grammar and checked.

Every entry point returns a Grammar or raises UsageError with one line that says what is wrong, so a bad schema
is a 400 on the server and a one-line error on the command line, never a crash at the first token.

    g = json_schema_grammar({"type": "object", "properties": {"a": {"type": "integer"}}})
    g = response_format_grammar({"type": "json_object"})          # None for {"type": "text"}
    g = gbnf_grammar('root ::= "yes" | "no"')                     # llama.cpp GBNF (or Lark)

Schemas are honoured as written: a "strict" schema whose properties are not all required keeps them optional
(OpenAI refuses such schemas; programs that send them expect them to work). Whitespace between JSON tokens is
bounded the way llama.cpp's schema converter bounds it (a space, or one newline and some indentation), so a
small model under greedy decoding cannot loop on newlines until max_tokens; none is allowed before or after
the value, so the output is the bare JSON. An object schema that lists properties and says nothing about others
gets only those (llama.cpp's converter does the same): JSON Schema would allow any extra key, and a small model
under that freedom invents keys until max_tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llamacy.errors import UsageError

# Between two JSON tokens: nothing, one space, or a newline and indentation (llama.cpp's `space` rule).
JSON_WHITESPACE = r"(?:[ ]?|\n[ \t]{0,32})"
_JSON_OPTIONS = {"whitespace_pattern": JSON_WHITESPACE}
_MAX_MESSAGE = 300


@dataclass(frozen=True)
class Grammar:
    """An llguidance grammar (its serialized form) and what it came from, for messages."""

    text: str
    source: str  # "json_schema", "gbnf", "regex", "lark", "tool_calls"

    @property
    def what(self) -> str:
        """The grammar's kind as messages name it."""
        return _SOURCE_NAMES.get(self.source, self.source)


_SOURCE_NAMES = {
    "json_schema": "JSON schema",
    "gbnf": "grammar",
    "regex": "regex",
    "lark": "Lark grammar",
    "tool_calls": "tool parameters schema",
}


def one_line(message: str) -> str:
    """llguidance's messages can span lines (a caret under the offending character): keep one line."""
    parts = [line.strip() for line in message.splitlines()]
    text = " ".join(p for p in parts if p and set(p) != {"^"})
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


def check(grammar: str, source: str, what: str) -> Grammar:
    """The grammar if llguidance accepts it; else UsageError naming `what` and the reason."""
    import llguidance  # in each function, not at the top: plain generation never needs it (~25 ms)

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise UsageError(f"invalid {what}: {one_line(messages[0] if messages else 'rejected')}")
    return Grammar(grammar, source)


def _as_schema(schema: Any, what: str) -> dict[str, Any]:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise UsageError(f"{what} is not valid JSON: {e}") from None
    if schema is True:
        schema = {}
    if not isinstance(schema, Mapping):
        raise UsageError(f"{what} must be a JSON object, got {type(schema).__name__}")
    return dict(schema)


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def close_objects(schema: Any) -> Any:
    """A copy of `schema` where objects with listed properties and no additionalProperties allow no others.
    Walks the keywords that hold subschemas only (a property may well be named "properties")."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: close_objects(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(v) for v in out[key]]
    for key in _SCHEMA_ONE:
        if key in out:
            v = out[key]
            out[key] = [close_objects(x) for x in v] if isinstance(v, list) else close_objects(v)
    if (
        isinstance(out.get("properties"), Mapping)
        and "additionalProperties" not in out
        and ("patternProperties" not in out)
    ):
        out["additionalProperties"] = False
    return out


def json_schema_grammar(schema: Any, what: str = "JSON schema") -> Grammar:
    """Output that is one JSON value valid against `schema` (a dict, or its JSON text)."""
    import llguidance

    schema = close_objects(_as_schema(schema, what))
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=_JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise UsageError(f"invalid {what}: {one_line(str(e))}") from None
    return check(text, "json_schema", what)


def json_object_grammar() -> Grammar:
    """Any JSON object (OpenAI's JSON mode)."""
    return json_schema_grammar({"type": "object"})


def gbnf_grammar(text: str) -> Grammar:
    """A llama.cpp GBNF grammar (root rule `root`); Lark text is accepted too, as llguidance does."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("grammar must be non-empty GBNF text")
    import llguidance

    try:
        compiled = llguidance.grammar_from("gbnf", text)
    except ValueError as e:
        raise UsageError(f"invalid grammar: {one_line(str(e))}") from None
    return check(compiled, "gbnf", "grammar")


def lark_grammar(text: str) -> Grammar:
    if not isinstance(text, str) or not text.strip():
        raise UsageError("grammar must be non-empty Lark text")
    import llguidance

    return check(llguidance.LLMatcher.grammar_from_lark(text), "lark", "Lark grammar")


def regex_grammar(pattern: str) -> Grammar:
    """Output that matches `pattern` as a whole (Rust regex syntax)."""
    if not isinstance(pattern, str) or not pattern:
        raise UsageError("regex must be a non-empty string")
    import llguidance

    return check(llguidance.LLMatcher.grammar_from_regex(pattern), "regex", "regex")


def response_format_grammar(response_format: Any) -> Grammar | None:
    """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"} (optionally with llama.cpp's
    "schema"), or {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise UsageError('response_format must be an object such as {"type": "json_object"}')
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return (
            json_object_grammar() if schema is None else json_schema_grammar(schema, "response_format.schema")
        )
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, Mapping):
            raise UsageError("response_format.json_schema must be an object with 'name' and 'schema'")
        name = spec.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise UsageError(
                f"response_format.json_schema.name must be 1-64 letters, digits, '_' or '-', got {name!r}"
            )
        if "strict" in spec and spec["strict"] is not None and not isinstance(spec["strict"], bool):
            raise UsageError(f"response_format.json_schema.strict must be a boolean, got {spec['strict']!r}")
        # OpenAI treats a missing schema as "any JSON"; an empty schema means the same.
        schema = spec.get("schema", {})
        return json_schema_grammar(schema, f"JSON schema {name!r}")
    raise UsageError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def request_grammar(
    response_format: Any = None, grammar: str | None = None, json_schema: Any = None
) -> Grammar | None:
    """The one constraint a request asks for: OpenAI's response_format, or llama.cpp's `grammar` (GBNF) or
    `json_schema` fields. Two at once is an error rather than a silent choice."""
    given = [
        name
        for name, value in (
            ("response_format", response_format),
            ("grammar", grammar),
            ("json_schema", json_schema),
        )
        if value is not None and not (name == "response_format" and _is_text_format(value))
    ]
    if len(given) > 1:
        raise UsageError(f"give only one of {', '.join(given)}: they would constrain the output twice")
    if grammar is not None:
        return gbnf_grammar(grammar)
    if json_schema is not None:
        return json_schema_grammar(json_schema)
    return response_format_grammar(response_format)


def _is_text_format(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") == "text"


def cli_grammar(
    json_object: bool = False, json_schema: str | None = None, grammar: str | None = None
) -> Grammar | None:
    """The grammar of `--json`, `--json-schema FILE_OR_JSON` or `--grammar FILE` (at most one of them)."""
    given = [
        n for n, v in (("--json", json_object), ("--json-schema", json_schema), ("--grammar", grammar)) if v
    ]
    if len(given) > 1:
        raise UsageError(f"give only one of {', '.join(given)}")
    if json_object:
        return json_object_grammar()
    if json_schema is not None:
        if json_schema.lstrip().startswith("{"):
            return json_schema_grammar(json_schema, "--json-schema")
        return json_schema_grammar(_read(json_schema, "JSON schema"), f"JSON schema {json_schema}")
    if grammar is not None:
        return gbnf_grammar(_read(grammar, "grammar"))
    return None


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"cannot read {what} file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} file {path} is not UTF-8 text") from None
