"""How a chat template writes a tool call, which decides the grammar of a forced call, the trigger of an
"auto" call and how streamed calls are scanned.

    syntax = CallSyntax.of(template)
    syntax.trigger      # the text that opens a call the model may write on its own ("auto"), or None

- TAGGED: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` (Hermes, Qwen, and the built-in
  tool prompt given to templates that know nothing of tools).
- BARE: the reply is the JSON call itself, for templates that render tools but have no call marker
  (Llama 3.1). Nothing opens such a call, so "auto" has no trigger.
- GEMMA4: `<|tool_call>call:NAME{key:value,...}<tool_call|>`, Gemma 4's own syntax (strings between `<|"|>`
  quotes, bare keys), several calls written back to back as llama.cpp's gemma4 parser reads them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
GEMMA4_OPEN, GEMMA4_CLOSE, GEMMA4_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'


def knows_tools(template: Any) -> bool:
    """The template renders a `tools` list itself (Qwen, Hermes, Llama 3.1, Gemma 4 ...)."""
    return "tools" in template.source


class CallSyntax(Enum):
    TAGGED = "tagged"
    BARE = "bare"
    GEMMA4 = "gemma4"

    @classmethod
    def of(cls, template: Any) -> CallSyntax:
        """The syntax `template` writes calls in. No template, or one that knows nothing of tools, gets the
        built-in tool prompt, which asks for TAGGED calls."""
        if template is None or not knows_tools(template):
            return cls.TAGGED
        if GEMMA4_OPEN in template.source:  # checked first: a Gemma 4 template never writes "<tool_call>"
            return cls.GEMMA4
        if CALL_OPEN in template.source:
            return cls.TAGGED
        return cls.BARE

    @property
    def trigger(self) -> str | None:
        """The marker that opens a call in free text; None when calls have no marker."""
        return {CallSyntax.TAGGED: CALL_OPEN, CallSyntax.GEMMA4: GEMMA4_OPEN}.get(self)

    @property
    def opener(self) -> str:
        """The marker a streamed reply's calls are scanned from (a BARE call is only parsed whole, at the
        end, but a model may still write tags: they are streamed as TAGGED ones)."""
        return GEMMA4_OPEN if self is CallSyntax.GEMMA4 else CALL_OPEN
