"""Everything one request asks of its output's structure, in one object the API layers share.

    s = StructuredRequest.from_request(template, response_format=..., tools=..., tool_choice=...)
    prompt = s.render(template, messages, add_generation_prompt=True)   # tools in the prompt when offered
    constraint = s.constraint(tokenizer, n_logits)                      # None: unconstrained
    content, tool_calls, finish = s.reply(text, finish_reason)          # OpenAI's message fields

A forced tool call (tool_choice "required" or a named function) takes the call's grammar; response_format then
applies to the answer the model gives after the tool's result, in a later request without a forced call. With
"auto" (and no response_format), the reply is free until the model opens a call (<tool_call>, or <|tool_call> for
Gemma 4: the template's CallSyntax); the call it then writes follows the tools' schemas (a TriggeredConstraint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamacy.structured.call_stream import ReplyStream
from llamacy.structured.call_syntax import CallSyntax
from llamacy.structured.constraint import Constraint, TriggeredConstraint
from llamacy.structured.grammar import Grammar, request_grammar
from llamacy.structured.tool_parse import ToolCallStream, parse_tool_calls
from llamacy.structured.tools import ToolPlan


@dataclass(frozen=True)
class StructuredRequest:
    grammar: Grammar | None  # the whole reply's grammar
    tools: ToolPlan
    after_trigger: Grammar | None = None  # "auto": the grammar after the model opens a call
    syntax: CallSyntax = CallSyntax.TAGGED  # how the template writes calls

    @classmethod
    def from_request(
        cls,
        template: Any = None,
        *,
        response_format: Any = None,
        grammar: str | None = None,
        json_schema: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        parallel_tool_calls: Any = None,
    ) -> StructuredRequest:
        """UsageError (one line) for anything malformed: schema, grammar, tools or tool_choice."""
        plan = ToolPlan.from_request(tools, tool_choice, parallel_tool_calls)
        g = request_grammar(response_format, grammar, json_schema)
        if plan.forced:
            g = plan.grammar(template)
        lazy = plan.after_trigger_grammar(template) if g is None else None
        return cls(g, plan, lazy, CallSyntax.of(template))

    @classmethod
    def none(cls) -> StructuredRequest:
        return cls(None, ToolPlan.from_request(None))

    @property
    def constrained(self) -> bool:
        return self.grammar is not None or self.after_trigger is not None

    def render(self, template: Any, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        """The chat prompt: with the tools when they are offered, and earlier calls and results in any case."""
        return self.tools.render(template, messages, **extra)

    def constraint(
        self, tokenizer: Any, n_logits: int | None = None
    ) -> Constraint | TriggeredConstraint | None:
        """A fresh per-sequence constraint (each sequence of a request needs its own)."""
        if self.grammar is not None:
            return Constraint(self.grammar, tokenizer, n_logits)
        if self.after_trigger is not None and self.syntax.trigger is not None:
            return TriggeredConstraint(self.syntax.trigger, self.after_trigger, tokenizer, n_logits)
        return None

    def reply(
        self, text: str, finish_reason: str | None
    ) -> tuple[str | None, list[dict[str, Any]], str | None]:
        """(content, tool_calls, finish_reason) of a finished reply; finish_reason "tool_calls" with calls."""
        if not self.tools.active:
            return text, [], finish_reason
        content, calls = parse_tool_calls(text, self.tools.names())
        calls = calls[: self.tools.max_calls]
        if self.tools.forced and calls:
            content = None  # the grammar allowed nothing but calls: a cut-off one is not text to show
        return content, calls, ("tool_calls" if calls else finish_reason)

    def reply_stream(self) -> ReplyStream | None:
        """A streaming parser of text and calls, the calls' arguments in pieces (None: no tools offered)."""
        if not self.tools.active:
            return None
        return ReplyStream(
            self.tools.names(), self.tools.max_calls, hold_all=self.tools.forced, syntax=self.syntax
        )

    def stream(self) -> ToolCallStream | None:
        """A streaming parser when the reply may hold calls (None: stream the text as it comes)."""
        if not self.tools.active:
            return None
        return ToolCallStream(self.tools.names(), self.tools.max_calls, hold_all=self.tools.forced)


def tool_call_deltas(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Streamed tool calls in OpenAI's delta shape (each with its index, the whole arguments at once)."""
    return [{"index": i, **dict(c)} for i, c in enumerate(calls)]
