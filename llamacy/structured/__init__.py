"""Structured output: constrained decoding with llguidance, and OpenAI tool calls.

- grammar.py: response_format / JSON schema / GBNF / regex / Lark -> a checked Grammar (UsageError if bad)
- constraint.py: one sequence's matcher: the allowed-token mask for the sampler, forced tokens, done; the lazy
  TriggeredConstraint (free text until a <tool_call> opens)
- vocab.py: our tokenizer as an llguidance LLTokenizer (built once per vocabulary)
- call_syntax.py: how the template writes calls (JSON in <tool_call> tags, bare JSON, Gemma 4's own syntax)
- tools.py: tool definitions, tool_choice, the tool prompt, the grammars of a forced and of an opened call
- gemma4_grammar.py: the Lark grammar of Gemma 4 calls, from the tools' schemas
- tool_parse.py: a reply -> (content, tool_calls), whole or while streaming
- call_stream.py, gemma4_scan.py: a streamed reply's calls, their arguments in pieces as they are written
- decode.py: the constrained part of a generation step (forced tokens, the masked draw)
- request.py: one request's grammar and tools together, for the API layers
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# Where each public name lives. Loaded on first use: a generation step imports decode.py on every start, and
# the request, tool and grammar modules (≈10 ms) serve only requests that ask for structure.
_HOME = {
    "Constraint": "constraint",
    "TriggeredConstraint": "constraint",
    "next_tokens": "decode",
    "Grammar": "grammar",
    "gbnf_grammar": "grammar",
    "json_object_grammar": "grammar",
    "json_schema_grammar": "grammar",
    "lark_grammar": "grammar",
    "regex_grammar": "grammar",
    "request_grammar": "grammar",
    "response_format_grammar": "grammar",
    "StructuredRequest": "request",
    "tool_call_deltas": "request",
    "ToolCallStream": "tool_parse",
    "parse_tool_calls": "tool_parse",
    "ToolPlan": "tools",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "Constraint",
    "Grammar",
    "StructuredRequest",
    "ToolCallStream",
    "ToolPlan",
    "TriggeredConstraint",
    "gbnf_grammar",
    "json_object_grammar",
    "json_schema_grammar",
    "lark_grammar",
    "next_tokens",
    "parse_tool_calls",
    "regex_grammar",
    "request_grammar",
    "response_format_grammar",
    "tool_call_deltas",
]
