"""Chat templates: turn a list of messages into the prompt text a model was trained on.

    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)      # or override="my-template.jinja"
    text = tpl.render([{"role": "user", "content": "Hi"}])          # ends with the assistant's turn opener
    ids = tpl.encode(text)                                          # BOS handled, special tokens parsed

The template is the Jinja program stored in the model (`tokenizer.chat_template`), run the way Hugging Face
transformers runs it (sandboxed, trim_blocks/lstrip_blocks, loop controls, `raise_exception`,
`strftime_now`, an HF-compatible `tojson`), so published templates render exactly as they do there.

A model without a template gets a built-in one chosen from its architecture and vocabulary: the reference
engine falls back to ChatML, which is wrong for Gemma (its 270M file carries no template but was trained on
`<start_of_turn>` turns).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from llamacy.chat_gemma4 import GEMMA4
from llamacy.errors import LlamacyError, UsageError

# ChatML (SmolLM, Qwen, many fine-tunes): the reference engine's own fallback.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Gemma 3's published template (google/gemma-3-*-it tokenizer_config.json), verbatim: a system message has no
# turn of its own, it is prefixed to the first user turn.
GEMMA = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""

# Llama 3 Instruct's published template (meta-llama/Meta-Llama-3-8B-Instruct).
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

BUILTINS: dict[str, str] = {"chatml": CHATML, "gemma": GEMMA, "gemma4": GEMMA4, "llama3": LLAMA3}

# Text markers that end an assistant turn (the end token) or begin another one (a model that skips its end
# token and starts the next turn). Those a template mentions become stop strings and stop ids.
_END_MARKERS = (
    "<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>",
    "<|end_of_text|>", "<end_of_utterance>", "</s>", "<eos>", "<turn|>",
)  # fmt: skip
_START_MARKERS = (
    "<|im_start|>", "<start_of_turn>", "<|start_header_id|>", "<|user|>", "<|assistant|>", "<|turn>",
)  # fmt: skip


class ChatTemplateError(LlamacyError):
    """The template failed to render these messages (raise_exception, a Jinja error)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: no HTML escaping (Jinja's own does it), non-ASCII kept as is, indent supported.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTags(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers marks assistant text with it): transparent."""

        tags = frozenset({"generation"})

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, GenerationTags]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _vocab_id(tokenizer: Any, text: str) -> int | None:
    """The id of the token spelled `text`, if the vocabulary has one."""
    return tokenizer.vocab.token_to_id.get(text)


def _token_text(tokenizer: Any, tid: int | None) -> str:
    return "" if tid is None or tid < 0 else tokenizer.token_text(tid)


def choose_builtin(metadata: Mapping[str, Any], tokenizer: Any) -> tuple[str, str]:
    """The built-in template a model without one was trained with: (name, why)."""
    arch = str(metadata.get("general.architecture", ""))
    has = lambda text: _vocab_id(tokenizer, text) is not None  # noqa: E731
    if has("<|turn>") and has("<turn|>"):  # Gemma 4's turn markers
        return "gemma4", "the vocabulary has <|turn>"
    if arch.startswith("gemma") or has("<start_of_turn>"):
        return "gemma", f"{arch} model" if arch.startswith("gemma") else "the vocabulary has <start_of_turn>"
    if has("<|start_header_id|>") and has("<|eot_id|>"):
        return "llama3", "the vocabulary has Llama 3 headers"
    if has("<|im_start|>") and has("<|im_end|>"):
        return "chatml", "the vocabulary has <|im_start|>"
    return "chatml", "a guess: the vocabulary has no known chat markers"


class ChatTemplate:
    """A model's chat format: render messages to prompt text, and know which tokens end a turn."""

    def __init__(
        self, source: str, tokenizer: Any, name: str, builtin: bool = False, reason: str = ""
    ) -> None:
        self.source = source
        self.tokenizer = tokenizer
        self.name = name
        self.builtin = builtin
        self.reason = reason  # why a built-in was chosen (shown to the user)
        self.bos_token = _token_text(tokenizer, tokenizer.bos_id)
        self.eos_token = _token_text(tokenizer, tokenizer.eos_id)
        try:
            self._template = _environment().from_string(source)
        except Exception as e:  # jinja2.TemplateSyntaxError and friends
            raise UsageError(f"chat template {name!r} does not compile: {e}") from None
        self.stop_ids, self.stop_strings = self._stops()

    @classmethod
    def from_model(
        cls, metadata: Mapping[str, Any], tokenizer: Any, override: str | Path | None = None
    ) -> ChatTemplate:
        """The template in the model file; a built-in chosen from the model when it has none; or the Jinja file
        `override` (--chat-template FILE)."""
        if override is not None:
            path = Path(override)
            try:
                source = path.read_text(encoding="utf-8")
            except OSError as e:
                raise UsageError(f"cannot read chat template {path}: {e.strerror}") from None
            except UnicodeDecodeError:
                raise UsageError(f"chat template {path} is not UTF-8 text") from None
            return cls(source, tokenizer, name=path.name)
        source = metadata.get("tokenizer.chat_template")
        if isinstance(source, str) and source.strip():
            return cls(source, tokenizer, name="model")
        name, why = choose_builtin(metadata, tokenizer)
        return cls(BUILTINS[name], tokenizer, name=name, builtin=True, reason=why)

    def _stops(self) -> tuple[set[int], list[str]]:
        tok = self.tokenizer
        ids: set[int] = set(getattr(tok, "eot_ids", ()))
        if tok.eos_id is not None and tok.eos_id >= 0:
            ids.add(tok.eos_id)
        strings: list[str] = []
        for marker in (*_END_MARKERS, *_START_MARKERS):
            if marker not in self.source:
                continue
            tid = _vocab_id(tok, marker)
            if tid is None:
                continue  # not a token of this model: as plain text it could be legitimate output
            strings.append(marker)
            if marker in _END_MARKERS:
                ids.add(tid)
        # End-of-generation tokens written out as text by a confused model end the turn too.
        for tid in sorted(ids):
            text = _token_text(tok, tid)
            if text and tok.is_special(tid) and text not in strings and text != self.bos_token:
                strings.append(text)
        return ids, strings

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}]); with add_generation_prompt it ends
        where the assistant's reply begins. `extra` reaches the template (tools=..., date_string=...)."""
        context = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": None,
            "documents": None,
            **extra,
        }
        try:
            return self._template.render(**context)
        except ChatTemplateError:
            raise
        except Exception as e:  # a template bug or unexpected messages: one line, not a traceback
            raise ChatTemplateError(f"chat template {self.name!r} failed: {type(e).__name__}: {e}") from None

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text: special tokens parsed, and BOS added only when the model wants one and
        the template did not already write it."""
        tok = self.tokenizer
        add_bos = bool(tok.add_bos) and not (self.bos_token and text.startswith(self.bos_token))
        return tok.encode(text, add_bos=add_bos, special=True)

    def describe(self) -> str:
        """One line for the user: which template is in use and why."""
        if self.builtin:
            return f"chat template: built-in {self.name} (the model has none; {self.reason})"
        if self.name == "model":
            return "chat template: the model's own"
        return f"chat template: {self.name}"

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, builtin={self.builtin})"
