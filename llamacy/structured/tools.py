"""OpenAI tools: check the definitions and tool_choice, build the prompt, and the grammar of a forced call.

    plan = ToolPlan.from_request(tools, tool_choice, parallel_tool_calls)   # UsageError on bad input
    prompt = plan.render(template, messages)     # the model's template if it knows tools, else a built-in prompt
    grammar = plan.grammar()                     # None for "auto"/"none": the model may answer in text

A call is written in the template's syntax (call_syntax.py): the Hermes format,
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, which many tool-trained models use; bare JSON for
a template that knows tools but not that marker (Llama 3.1); Gemma 4's `<|tool_call>call:NAME{...}<tool_call|>`
(its grammar from gemma4_grammar.py).
With tool_choice "required" or a named function the grammar makes the reply a call from its first token; with
"auto" the model is free and its reply is parsed either way (tool_parse.py).

parallel_tool_calls: OpenAI's default (true) lets the model make several calls, which is what a reply parsed in
"auto" mode keeps. A forced call is one call unless parallel_tool_calls is true explicitly: under a grammar that
allows another call after each, a small model repeats the same call until max_tokens. False keeps the first.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llamacy.errors import UsageError
from llamacy.structured.call_syntax import CALL_CLOSE, CALL_OPEN, CallSyntax, knows_tools
from llamacy.structured.gemma4_grammar import gemma4_call_lark
from llamacy.structured.grammar import JSON_WHITESPACE, Grammar, check, close_objects, json_schema_grammar

__all__ = ["CALL_CLOSE", "CALL_OPEN", "ToolPlan", "knows_tools"]
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

_BUILTIN_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    definition: dict[str, Any]  # as the request gave it (OpenAI shape), for templates that know tools


def parse_tools(tools: Any) -> list[Tool]:
    """OpenAI's `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?}}]."""
    if tools is None:
        return []
    if not isinstance(tools, Sequence) or isinstance(tools, str | bytes):
        raise UsageError('tools must be a list of {"type": "function", "function": {...}} objects')
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if (
            not isinstance(t, Mapping)
            or t.get("type") != "function"
            or not isinstance(t.get("function"), Mapping)
        ):
            raise UsageError(f'{where} must be {{"type": "function", "function": {{...}}}}')
        fn = t["function"]
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise UsageError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', got {name!r}")
        if any(x.name == name for x in out):
            raise UsageError(f"{where}: two tools are named {name!r}")
        params = fn.get("parameters")
        if params is None:
            params = dict(_EMPTY_PARAMETERS)
        if not isinstance(params, Mapping):
            raise UsageError(f"{where}.function.parameters must be a JSON schema object")
        json_schema_grammar(params, f"parameters schema of tool {name!r}")  # a bad schema fails here, by name
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise UsageError(f"{where}.function.description must be a string")
        definition = {"type": "function", "function": {**dict(fn), "parameters": dict(params)}}
        out.append(Tool(name, desc, dict(params), definition))
    return out


def parse_tool_choice(choice: Any, tools: list[Tool]) -> str:
    """ "auto", "none", "required", or the name of the one function to call."""
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise UsageError(f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}")
        if choice == "required" and not tools:
            raise UsageError("tool_choice 'required' needs at least one tool in tools")
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if not isinstance(name, str):
            raise UsageError('tool_choice {"type": "function"} needs function.name')
        if not any(t.name == name for t in tools):
            raise UsageError(f"tool_choice names function {name!r}, which is not in tools")
        return name
    raise UsageError(
        f"tool_choice must be 'auto', 'none', 'required' or {{\"type\": \"function\", ...}}, got {choice!r}"
    )


def arguments_object(arguments: Any) -> Any:
    """A call's arguments as a JSON value: OpenAI sends a JSON string, templates expect the object."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments
    return arguments


def _call_text(call: Mapping[str, Any]) -> str:
    fn = call.get("function") or {}
    body = {"name": fn.get("name"), "arguments": arguments_object(fn.get("arguments", {}))}
    return f"{CALL_OPEN}\n{json.dumps(body, ensure_ascii=False)}\n{CALL_CLOSE}"


def _text(content: Any) -> str:
    """Message content as text: a string, None, or OpenAI's list of {"type": "text", "text"} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return str(content)


def plain_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that knows nothing of tools: calls written into the assistant's text, tool
    results as user turns in <tool_response> tags, and neighbours of one role merged (Gemma's template
    requires user/assistant alternation)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        text = _text(m.get("content"))
        if role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_call_text(c) for c in m["tool_calls"])
            text = f"{text}\n{calls}" if text.strip() else calls
        elif role in ("tool", "function"):
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        if out and out[-1]["role"] == role and role != "system":
            out[-1]["content"] += "\n" + text
        else:
            out.append({"role": role, "content": text})
    return out


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages for a template that knows tools (Hugging Face convention): call arguments as objects."""
    out: list[dict[str, Any]] = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**dict(c), "function": {**dict(c.get("function") or {}),
                                         "arguments": arguments_object((c.get("function") or {}).get("arguments"))}}
                for c in m["tool_calls"]
            ]  # fmt: skip
        if m.get("content") is None:
            m["content"] = ""
        out.append(m)
    return out


@dataclass(frozen=True)
class ToolPlan:
    """The tools of one request and how the reply may use them."""

    tools: tuple[Tool, ...]
    choice: str  # "auto", "none", "required" or a function name
    parallel: bool | None  # parallel_tool_calls as given (None: OpenAI's default, true)

    @classmethod
    def from_request(cls, tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None) -> ToolPlan:
        parsed = parse_tools(tools)
        choice = parse_tool_choice(tool_choice, parsed)
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise UsageError(f"parallel_tool_calls must be a boolean, got {parallel_tool_calls!r}")
        return cls(tuple(parsed), choice, parallel_tool_calls)

    @property
    def max_calls(self) -> int | None:
        """How many calls a reply keeps (None: all)."""
        return 1 if self.parallel is False else None

    @property
    def active(self) -> bool:
        """The model is offered the tools and its reply is parsed for calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> bool:
        """The reply must be a call ("required" or a named function)."""
        return self.active and self.choice != "auto"

    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def offered(self) -> list[Tool]:
        """The tools the reply may call: all, or only the named one."""
        if self.choice in ("auto", "required", "none"):
            return list(self.tools)
        return [t for t in self.tools if t.name == self.choice]

    # ---- prompt ------------------------------------------------------------------------------------
    def render(self, template: Any, messages: Sequence[Mapping[str, Any]], **extra: Any) -> str:
        """The prompt for `messages` with these tools: through the template when it knows tools, else with
        the built-in tool prompt added to the system message. Without tools or tool messages, the template
        renders the messages as they are."""
        if not self.active and not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
            return template.render(messages, **extra)
        if knows_tools(template):
            tools = [t.definition for t in self.offered()] if self.active else None
            return template.render(template_messages(messages), tools=tools, **extra)
        msgs = plain_messages(messages)
        if self.active:
            listing = "\n".join(json.dumps(t.definition, ensure_ascii=False) for t in self.offered())
            prompt = _BUILTIN_PROMPT.format(tools=listing)
            if msgs and msgs[0]["role"] == "system":
                msgs[0]["content"] = f"{msgs[0]['content']}\n\n{prompt}"
            else:
                msgs.insert(0, {"role": "system", "content": prompt})
        return template.render(msgs, **extra)

    def wrapped(self, template: Any) -> bool:
        """Calls are written in <tool_call> tags (else as bare JSON or in Gemma 4's syntax)."""
        return CallSyntax.of(template) is CallSyntax.TAGGED

    # ---- grammar -----------------------------------------------------------------------------------
    def grammar(self, template: Any) -> Grammar | None:
        """For "required" or a named function: the reply is one call (or several, with parallel calls) and
        nothing else. None when the model may answer in text."""
        if not self.forced:
            return None
        many = self.parallel is True and self.choice == "required"
        syntax = CallSyntax.of(template)
        if syntax is CallSyntax.GEMMA4:
            return self._gemma4_grammar(many=many, after_trigger=False)
        call = f'"{CALL_OPEN}\\n" body "\\n{CALL_CLOSE}"' if syntax is CallSyntax.TAGGED else "body"
        more = ' ("\\n" call)*' if many else ""
        return self._call_grammar(f"start: call{more}\ncall: {call}\n")

    def after_trigger_grammar(self, template: Any) -> Grammar | None:
        """For "auto": what must follow the marker of a call the model opens (CallSyntax.trigger): the rest
        of the call, then the end or, with parallel_tool_calls true, more calls. None without a trigger."""
        syntax = CallSyntax.of(template)
        if not self.active or self.forced or syntax.trigger is None:
            return None
        many = self.parallel is True
        if syntax is CallSyntax.GEMMA4:
            return self._gemma4_grammar(many=many, after_trigger=True)
        rest = f'/[ \\t]*\\n?/ body /[ \\t]*\\n?/ "{CALL_CLOSE}"'
        more = f' ("\\n{CALL_OPEN}" rest)*' if many else ""
        return self._call_grammar(f"start: rest{more}\nrest: {rest}\n")

    def _gemma4_grammar(self, *, many: bool, after_trigger: bool) -> Grammar:
        import llguidance

        try:
            lark = gemma4_call_lark(self.offered(), many=many, after_trigger=after_trigger)
        except (ValueError, TypeError) as e:  # a quote token in a key, an empty integer range, a bad bound
            raise UsageError(f"tool parameters cannot be written in Gemma 4's call syntax: {e}") from None
        return check(llguidance.LLMatcher.grammar_from_lark(lark), "tool_calls", "tool parameters schema")

    def _call_grammar(self, rules: str) -> Grammar:
        """`rules` plus `body`: one call's JSON, {"name": <an offered tool>, "arguments": <its parameters>}."""
        import llguidance  # here, not at the top: plain generation never needs it (~25 ms)

        variants = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": close_objects(t.parameters)},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in self.offered()
        ]
        schema = {"anyOf": variants, "x-guidance": {"whitespace_pattern": JSON_WHITESPACE}}
        lark = f"{rules}body: %json {json.dumps(schema)}\n"
        return check(llguidance.LLMatcher.grammar_from_lark(lark), "tool_calls", "tool parameters schema")
