"""From a validated request to scheduler events, and from those events back into the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from llamacy.errors import LlamacyError
from llamacy.sampling import MAX_SEED, SamplingParams
from llamacy.scheduler import Done, GenerationRequest, Handle, TokenLogprob
from llamacy.server.errors import APIError, from_engine_error
from llamacy.server.mailbox import EventBridge
from llamacy.server.mailbox import LoopMailbox as LoopMailbox  # re-exported: tests/test_scheduler.py uses it
from llamacy.server.models import ServedModel
from llamacy.server.schemas import SamplingFields

_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
)


def sampling_params(f: SamplingFields) -> SamplingParams:
    """The request's sampling options over the engine's defaults; APIError 400 for a bad value."""
    kwargs: dict[str, Any] = {k: getattr(f, k) for k in _SAMPLING_FIELDS if getattr(f, k) is not None}
    if f.seed is not None:
        # OpenAI seeds are signed 64-bit; ours are unsigned. Same bits, same stream.
        kwargs["seed"] = f.seed & MAX_SEED if -(2**63) <= f.seed < 0 else f.seed
    params = SamplingParams(**kwargs)
    try:
        params.validate()
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_value") from None
    return params


async def encode_text(served: ServedModel, text: str) -> list[int]:
    """Token ids of a completion prompt (special tokens parsed; BOS as the model wants, once)."""
    tok = served.tokenizer

    def encode() -> list[int]:
        ids = tok.encode(text, add_bos=False, special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    return await run_in_threadpool(encode)  # a 1 MB prompt takes a while: not on the event loop


async def encode_chat(served: ServedModel, messages: list[dict[str, Any]], prefill: str = "") -> list[int]:
    """Token ids of the messages through the chat template, ending where the assistant's reply begins;
    `prefill`: the start of that reply, which generation continues (Anthropic's final assistant turn)."""
    tpl = served.template
    if tpl is None:
        raise APIError(
            501,
            "chat completions need a chat template, and none could be loaded for this model",
            "no_chat_template",
        )

    def render() -> list[int]:
        return tpl.encode(tpl.render(messages, add_generation_prompt=True) + prefill)

    try:
        return await run_in_threadpool(render)
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_messages", "messages") from None


def build_request(
    served: ServedModel,
    f: SamplingFields,
    prompt: list[int],
    max_tokens: int | None,
    logprobs: int | None = None,
    chat: bool = False,
) -> GenerationRequest:
    stop_ids = set(served.scheduler.eog_ids)
    stop = f.stop_list()
    if chat and served.template is not None:
        # End-of-turn markers of the template: ids, and as text for a model that spells them out.
        stop_ids |= set(served.template.stop_ids)
        stop += [s for s in served.template.stop_strings if s not in stop]
    return GenerationRequest(
        prompt=prompt,
        params=sampling_params(f),
        max_tokens=max_tokens,
        stop=stop,
        stop_ids=frozenset(stop_ids),
        ignore_eos=f.ignore_eos,
        logprobs=logprobs,
    )


def submit(served: ServedModel, request: GenerationRequest, listener: Any = None) -> Handle:
    try:
        return served.scheduler.submit(request, listener)
    except LlamacyError as e:
        raise from_engine_error(e) from None


async def start(served: ServedModel, request: GenerationRequest) -> tuple[Handle, EventBridge]:
    bridge = EventBridge(served.mailbox())
    return submit(served, request, bridge.listener), bridge


@contextlib.asynccontextmanager
async def cancel_on_disconnect(http: Request, handle: Handle) -> AsyncIterator[None]:
    """While the body runs, a client that disconnects cancels its request (the scheduler frees the slot at
    its next step); leaving the block early, or by an exception, cancels it too."""

    async def watch() -> None:
        while True:
            message = await http.receive()
            if message["type"] == "http.disconnect":
                handle.cancel()
                return

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        handle.cancel()  # no-op when it finished


# ---- logprobs in OpenAI's two shapes ----------------------------------------------------------------


def _token_str(served: ServedModel, tid: int) -> str:
    return served.tokenizer.token_bytes(tid).decode("utf-8", errors="replace")


def completion_logprobs(served: ServedModel, lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions shape: parallel lists, text_offset counted from `offset`."""
    tokens, offsets = [], []
    for lp in lps:
        s = _token_str(served, lp.token)
        tokens.append(s)
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{_token_str(served, t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def chat_logprobs(served: ServedModel, lps: list[TokenLogprob]) -> dict[str, Any]:
    def entry(tid: int, value: float) -> dict[str, Any]:
        raw = served.tokenizer.token_bytes(tid)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}

    return {
        "content": [
            {**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps
        ]
    }


def usage_dict(done: Done) -> dict[str, Any]:
    u = done.usage
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def finish_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"
