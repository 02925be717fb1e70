"""Ollama's request bodies and its `options` map.

As Ollama's own server does, unknown fields and unknown option names are ignored, and a known field or
option of the wrong type is refused. What would change the answer and cannot be honoured (images,
thinking, template overrides, fill-in-the-middle, mirostat and friends) is refused with a sentence saying
so, rather than ignored. `format` ("json" or a JSON schema) and `tools` are served by the structured-output
layer (ollama_routes.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from llamacy.server.errors import APIError
from llamacy.server.schemas import MAX_STOP_LENGTH, MAX_STOP_STRINGS, SamplingFields

# Go's time.ParseDuration syntax ("5m", "1h30m", "-1s", "0"), which Ollama parses keep_alive with.
_DURATION = re.compile(r"^[-+]?(0|(\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$")

KeepAlive = float | int | str


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


def _check_keep_alive(value: KeepAlive | None) -> None:
    # Accepted for compatibility, no effect: when models unload is `llamacy serve`'s to say (--idle-unload).
    if isinstance(value, str) and not _DURATION.match(value):
        raise APIError(400, f'keep_alive: invalid duration {value!r} (e.g. "5m", "1h", -1)')


def _refuse(what: str) -> NoReturn:
    raise APIError(400, what)


class _Generation(_Body):
    model: str = ""
    stream: bool | None = None  # absent or null: stream (Ollama's default)
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    think: bool | str | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None

    def unsupported(self) -> None:
        if not self.model:
            _refuse("model is required")
        _check_keep_alive(self.keep_alive)
        if isinstance(self.format, str) and self.format not in ("", "json"):
            _refuse(f'format must be "json" or a JSON schema object, got {self.format!r}')
        if self.think not in (None, False):
            _refuse(f"{self.model!r} does not support thinking")
        if self.top_logprobs and not self.logprobs:
            _refuse("top_logprobs requires logprobs to be true")

    def streaming(self) -> bool:
        return self.stream is not False

    def format_fields(self) -> dict[str, Any]:
        """`format` in the structured-output layer's terms: JSON mode, or output valid against a schema."""
        if self.format == "json":
            return {"response_format": {"type": "json_object"}}
        if isinstance(self.format, dict):
            return {"json_schema": self.format}
        return {}

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class GenerateRequest(_Generation):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.suffix:
            _refuse(f"{self.model!r} does not support insert (suffix, fill-in-the-middle)")
        if self.template:
            _refuse("template is not supported: the model's own chat template is used (or send raw=true)")
        if self.images:
            _refuse(f"{self.model!r} does not support images")


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[Any] | None = None
    tool_calls: list[Any] | None = None
    thinking: str | None = None  # a thinking model's earlier reasoning: nothing to render it for here
    tool_name: str | None = None


class ChatRequest(_Generation):
    messages: list[ChatMessage] = Field(default_factory=list)  # empty: "load the model", no generation
    tools: list[Any] | None = None

    def unsupported(self) -> None:
        super().unsupported()
        for i, m in enumerate(self.messages):
            if m.images:
                _refuse(f"messages.{i}.images: {self.model!r} does not support images")

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages in the OpenAI terms the chat template and the tool prompt take: an earlier call's
        arguments (an object in Ollama's shape) as JSON text, a tool result's tool_name as its name."""
        out: list[dict[str, Any]] = []
        for i, m in enumerate(self.messages):
            msg: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    _openai_call(c, f"messages.{i}.tool_calls.{j}") for j, c in enumerate(m.tool_calls)
                ]
            if m.role == "tool" and m.tool_name:
                msg["name"] = m.tool_name
            out.append(msg)
        return out


def _openai_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        _refuse(f'{where} must be {{"function": {{"name": ..., "arguments": {{...}}}}}}')
    args = fn.get("arguments", {})
    if not isinstance(args, dict):
        _refuse(f"{where}.function.arguments must be an object")
    return {
        "id": call.get("id") or f"call_{where.replace('.', '_')}",
        "type": "function",
        "function": {"name": fn["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


class ShowRequest(_Body):
    model: str = ""
    name: str = ""  # the older spelling of `model`
    verbose: bool = False

    def unsupported(self) -> None:
        if not (self.model or self.name):
            _refuse("model is required")

    def model_name(self) -> str:
        return self.model or self.name


class EmbedRequest(_Body):
    model: str = ""
    input: str | list[str] | None = None  # none, or "": Ollama's "load the model", no embeddings
    truncate: bool | None = None  # absent: cut inputs longer than the context at its end
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None
    dimensions: Annotated[int, Field(ge=1)] | None = None

    def unsupported(self) -> None:
        if not self.model:
            _refuse("model is required")
        _check_keep_alive(self.keep_alive)
        for i, x in enumerate(self.inputs()):
            if not x:
                _refuse(f"input {i} is empty")

    def inputs(self) -> list[str]:
        if isinstance(self.input, str):
            return [self.input] if self.input else []
        return list(self.input or [])


class EmbeddingsRequest(_Body):
    """The older /api/embeddings: one prompt, a vector as the model makes it (not normalized)."""

    model: str = ""
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None

    def unsupported(self) -> None:
        if not self.model:
            _refuse("model is required")
        _check_keep_alive(self.keep_alive)


# ---- options ----------------------------------------------------------------------------------------

_INT = (
    "num_keep", "seed", "num_predict", "top_k", "repeat_last_n", "mirostat", "num_ctx", "num_batch",
    "num_gpu", "main_gpu", "num_thread",
)  # fmt: skip
_FLOAT = (
    "top_p", "min_p", "tfs_z", "typical_p", "temperature", "repeat_penalty", "presence_penalty",
    "frequency_penalty", "mirostat_tau", "mirostat_eta",
)  # fmt: skip
_BOOL = (
    "penalize_newline", "numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock",
    "embedding_only",
)  # fmt: skip
# Options that would change the answer and that this engine has no sampler for: refused unless neutral.
_NEUTRAL = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}
_SAMPLING = (
    "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
    "frequency_penalty",
)  # fmt: skip


def _typed(key: str, value: Any) -> Any:
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if key in _INT:
        if not is_number:
            raise APIError(400, f'option "{key}" must be of type integer')
        return int(value)  # JSON numbers: Ollama truncates 1.0 (and 1.5) to an integer
    if key in _FLOAT:
        if not is_number:
            raise APIError(400, f'option "{key}" must be a number')
        return float(value)
    if key in _BOOL:
        if not isinstance(value, bool):
            raise APIError(400, f'option "{key}" must be of type boolean')
        return value
    if key == "stop":
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            raise APIError(400, 'option "stop" must be an array of strings')
        if len(value) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_LENGTH for s in value):
            raise APIError(
                400, f'option "stop": at most {MAX_STOP_STRINGS} strings of {MAX_STOP_LENGTH} characters'
            )
        return value
    return None  # unknown: ignored, as Ollama does


@dataclass
class Options:
    """A request's options, in the engine's terms."""

    sampling: SamplingFields  # the sampling fields and stop strings, for generation.build_request
    num_predict: int | None  # None: until a stop or the context is full
    num_ctx: int | None  # None: the server's context size


def parse_options(raw: dict[str, Any] | None) -> Options:
    opts = {k: _typed(k, v) for k, v in (raw or {}).items() if v is not None}
    opts = {k: v for k, v in opts.items() if v is not None}
    for key, neutral in _NEUTRAL.items():
        if key in opts and opts[key] != neutral:
            raise APIError(400, f'option "{key}" is not supported by this server (leave it at {neutral})')
    seed = opts.get("seed")
    sampling = SamplingFields(
        **{k: opts[k] for k in _SAMPLING if k in opts},
        seed=seed if seed is not None and seed >= 0 else None,  # Ollama's -1: a random seed
        stop=opts.get("stop"),
    )
    num_predict = opts.get("num_predict")
    num_ctx = opts.get("num_ctx")
    if num_ctx is not None and num_ctx < 1:
        raise APIError(400, f'option "num_ctx" must be at least 1, got {num_ctx}')
    return Options(
        sampling=sampling,
        # Ollama: -1 generates until a stop, -2 until the context is full, 0 is "not set".
        num_predict=num_predict if num_predict is not None and num_predict > 0 else None,
        num_ctx=num_ctx,
    )
