"""Request bodies, validated strictly: a wrong type is a 400 with the field's name, never a silent cast.

Unknown fields are ignored (clients send many: `user`, `stream_options`, ...); fields that would change
the answer and that we cannot honour are refused in `unsupported()` rather than ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llamacy.server.errors import APIError

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256  # matching a stop string costs its length squared per token: keep it small
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"  # a uuid, or any similar opaque name
MAX_CHOICES = 128  # OpenAI's limit on n


StopStr = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    def unsupported(self) -> None:
        """Raise APIError for a field this endpoint cannot honour (after validation); none by default."""


class SamplingFields(_Strict):
    """Fields every generation endpoint takes. None = the engine's default (see llamacy.sampling)."""

    max_tokens: Annotated[int, Field(ge=0)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: StopStr | Annotated[list[StopStr], Field(max_length=MAX_STOP_STRINGS)] | None = None
    ignore_eos: bool = False  # llama.cpp's extension: generate through end-of-turn tokens
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] | None = None
    logit_bias: dict[str, float] | None = None  # token id (a string: JSON keys) -> bias in [-100, 100]
    # Speculative decoding of this request (llamacy's extension): "ngram" drafts by prompt lookup, up to
    # draft_max tokens per step (n-grams of `ngram` tokens); "draft" with the server's --draft-model; "mtp"
    # with the model's own multi-token-prediction block; the answer is distributed as without it.
    speculate: Literal["ngram", "draft", "mtp", "none"] | None = None
    draft_max: int | None = None
    ngram: int | None = None
    # llama-server's id_slot: run in this slot (e.g. one restored from a file); -1 or absent: any slot.
    id_slot: Annotated[int, Field(ge=-1)] | None = None

    MULTIPLE_CHOICES: ClassVar[bool] = False  # whether the endpoint answers n > 1 choices

    def unsupported(self) -> None:
        if not self.MULTIPLE_CHOICES and self.n not in (None, 1):
            raise APIError(
                400, f"n={self.n} is not supported here: one answer per request", "unsupported", "n"
            )
        if self.slot() is not None and self.n not in (None, 1):
            raise APIError(
                400, "id_slot names one slot: it cannot run n > 1 choices", "invalid_value", "id_slot"
            )

    def slot(self) -> int | None:
        return None if self.id_slot in (None, -1) else self.id_slot

    def choices(self) -> int:
        return self.n or 1

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class StreamOptions(_Strict):
    include_usage: bool = False


class _OpenAIRequest(SamplingFields):
    MULTIPLE_CHOICES: ClassVar[bool] = True

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Structured output (llamacy.structured): OpenAI's response_format, llama.cpp's GBNF grammar and json_schema.
    response_format: dict[str, Any] | None = None
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.stream_options is not None and not self.stream:
            raise APIError(
                400, "stream_options is only allowed when stream is true", "invalid_value", "stream_options"
            )

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_OpenAIRequest):
    # A string, a list of token ids, or either wrapped in a list of one (batches of prompts: use n requests).
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0)] | None = None
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.best_of not in (None, 1):
            raise APIError(400, "best_of is not supported (use best_of=1)", "unsupported", "best_of")
        if self.suffix:
            raise APIError(400, "suffix (fill-in-the-middle) is not supported", "unsupported", "suffix")
        many = (
            isinstance(self.prompt, list) and len(self.prompt) > 1 and isinstance(self.prompt[0], str | list)
        )
        if many:
            raise APIError(
                400,
                "send one prompt per request (a list of prompts is not supported; n gives several answers)",
                "unsupported",
                "prompt",
            )


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatRequest(_OpenAIRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=0)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", "invalid_value", "top_logprobs")

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class JobRequest(SamplingFields):
    model: str | None = None
    id: Annotated[str, Field(pattern=JOB_ID_PATTERN)] | None = None
    prompt: str


class TokenizeRequest(_Strict):
    model: str | None = None
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def parse(model: type[_Strict], body: bytes) -> Any:
    """Validate a JSON body; APIError 400 naming the first bad field."""
    try:
        obj = model.model_validate_json(body)
    except ValidationError as e:
        raise APIError(400, describe(e), "invalid_request", _param(e)) from None
    obj.unsupported()
    return obj


def _field_path(loc: tuple[Any, ...]) -> str:
    # Union members appear in loc as type names ("str", "list[int]"); they mean nothing to a client.
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    return ".".join(parts)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after", "constrained-str"}


def _most_specific(e: ValidationError) -> Any:
    """The error to report. For a union, pydantic lists one error per member; a member whose type matched
    but whose constraint failed (too long, too small, not one of the allowed values) says what to fix."""
    errs = e.errors()
    if not errs:
        return None
    specific = [x for x in errs if not x["type"].endswith("_type") and x["type"] != "missing"]
    return (specific or errs)[0]


def _param(e: ValidationError) -> str | None:
    first = _most_specific(e)
    return (_field_path(first["loc"]) or None) if first else None


def describe(e: ValidationError) -> str:
    first = _most_specific(e)
    if first is None:
        return "invalid request body"
    if first["type"] == "json_invalid":
        return f"the body is not valid JSON: {first['msg'].removeprefix('Invalid JSON: ')}"
    if first["type"] == "model_type" and not first["loc"]:
        return "the body must be a JSON object"
    path = _field_path(first["loc"])
    if first["type"] == "missing":
        return f"missing required field: {path}"
    if first["type"] == "extra_forbidden":
        return f"unknown field: {path}"
    return f"{path}: {first['msg']}" if path else first["msg"]
