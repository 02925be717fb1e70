"""From a validated request to scheduler events, and from those events back into the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from llamacy.errors import LlamacyError
from llamacy.generation.speculate import Speculation, speculation
from llamacy.sampling import MAX_SEED, SamplingParams
from llamacy.scheduler import Done, Event, Failed, GenerationRequest, Handle, TokenLogprob
from llamacy.server.context_shift import fit_messages
from llamacy.server.errors import APIError, from_engine_error
from llamacy.server.mailbox import EventBridge
from llamacy.server.mailbox import LoopMailbox as LoopMailbox  # re-exported: tests/test_scheduler.py uses it
from llamacy.server.models import ServedModel
from llamacy.server.schemas import SamplingFields
from llamacy.structured import StructuredRequest

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
    if f.logit_bias:
        kwargs["logit_bias"] = _token_bias(f.logit_bias)
    params = SamplingParams(**kwargs)
    try:
        params.validate()
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_value") from None
    return params


def _token_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's logit_bias has token ids as JSON object keys, so as strings of digits."""
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not key.isascii() or not key.isdigit():
            raise APIError(
                400, f"logit_bias keys must be token ids, got {key!r}", "invalid_value", "logit_bias"
            )
        out[int(key)] = value
    return out


def text_ids(tok: Any, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
    """Token ids of a text. parse_special: special tokens spelled out are those tokens; add_special: BOS
    as the model wants, once (not twice when the text spells it out)."""
    ids = tok.encode(text, add_bos=False, special=parse_special)
    if add_special and tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
        ids.insert(0, tok.bos_id)
    return ids


async def encode_text(served: ServedModel, text: str) -> list[int]:
    """Token ids of a completion prompt (special tokens parsed; BOS as the model wants, once)."""
    # A 1 MB prompt takes a while: not on the event loop.
    return await run_in_threadpool(text_ids, served.tokenizer, text)


async def encode_chat(
    served: ServedModel,
    messages: list[dict[str, Any]],
    structured: StructuredRequest | None = None,
    prefill: str = "",
    shift: bool = False,
) -> list[int]:
    """Token ids of the messages through the chat template, ending where the assistant's reply begins;
    `structured`: tools offered, earlier calls and their results; `prefill`: the start of that reply,
    which generation continues (Anthropic's final assistant turn); `shift`: drop the oldest turns of a
    conversation longer than the context rather than refuse it."""
    tpl = served.template
    if tpl is None:
        raise APIError(
            501,
            "chat completions need a chat template, and none could be loaded for this model",
            "no_chat_template",
        )

    def encode(kept: list[dict[str, Any]]) -> tuple[None, list[int]]:
        if structured is not None:
            text = structured.render(tpl, kept, add_generation_prompt=True)
        else:
            text = tpl.render(kept, add_generation_prompt=True)
        return None, tpl.encode(text + prefill)

    def render() -> list[int]:
        if shift:  # serve --context-shift: the oldest turns go rather than the request (context_shift.py)
            return fit_messages(messages, encode, served.scheduler.n_ctx)[2]
        return encode(messages)[1]

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
    shift_keep: int | None = None,
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
        stop=stop,
        stop_ids=frozenset(stop_ids),
        ignore_eos=f.ignore_eos,
        logprobs=logprobs,
        speculate=_speculation(f, served),
        slot=f.slot(),
        shift_keep=shift_keep,
        # A reply that shifts the context could go on for ever: one context's worth unless told.
        max_tokens=max_tokens if max_tokens is not None or shift_keep is None else served.scheduler.n_ctx,
    )


def _speculation(f: SamplingFields, served: ServedModel) -> Speculation | None:
    if f.speculate in (None, "none") and (f.draft_max is not None or f.ngram is not None):
        raise APIError(400, 'draft_max and ngram go with speculate: "ngram"', "invalid_value", "speculate")
    draft = None
    if f.speculate == "draft":
        draft = getattr(served.scheduler, "draft_name", None)
        if draft is None:
            raise APIError(
                400,
                'speculate "draft" needs a server started with --draft-model',
                "invalid_value",
                "speculate",
            )
    if f.speculate in ("draft", "mtp") and f.ngram is not None:
        raise APIError(400, 'ngram goes with speculate: "ngram"', "invalid_value", "ngram")
    try:
        return speculation(f.speculate, f.draft_max, f.ngram, draft)
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_value", "speculate") from None


def submit(served: ServedModel, request: GenerationRequest, listener: Callable[[Event], None]) -> Handle:
    """Queue a request; the model counts as busy (not to be unloaded) until it ends."""

    def on_event(ev: Event) -> None:
        # Finished before the event is handed on: a client that sees the end finds the model idle.
        if isinstance(ev, Done | Failed):
            served.finished()
        listener(ev)

    served.submitted()
    try:
        return served.scheduler.submit(request, on_event)
    except BaseException as e:
        served.finished()  # refused: it never ran
        if isinstance(e, LlamacyError):
            raise from_engine_error(e) from None
        raise


def choices(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """n requests for n choices of one prompt. Each is its own sequence; with a seed, choice i samples
    with seed + i, so that choice 0 is what n=1 gives and the others differ from it."""
    seed = request.params.seed
    if seed is None:
        return [request] + [replace(request) for _ in range(n - 1)]  # each sampler draws its own seed
    return [replace(request, params=replace(request.params, seed=(seed + i) & MAX_SEED)) for i in range(n)]


@dataclass
class Generation:
    """The requests of one API call and their merged events."""

    handles: list[Handle]
    events: EventBridge

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()  # no-op for those that finished


async def start(served: ServedModel, requests: list[GenerationRequest]) -> Generation:
    """Submit every request, or none: when one is refused (a full queue), those already queued are
    cancelled and the refusal is raised."""
    bridge = EventBridge(served.mailbox(), len(requests))
    call = Generation([], bridge)
    try:
        for i, req in enumerate(requests):
            call.handles.append(submit(served, req, bridge.listener(i)))
    except BaseException:
        call.cancel()
        raise
    return call


@contextlib.asynccontextmanager
async def cancel_on_disconnect(http: Request, call: Generation) -> AsyncIterator[None]:
    """While the body runs, a client that disconnects cancels its requests (the scheduler frees the slots
    at its next step); leaving the block early, or by an exception, cancels them too."""

    async def watch() -> None:
        while True:
            message = await http.receive()
            if message["type"] == "http.disconnect":
                call.cancel()
                return

    task = asyncio.create_task(watch())
    try:
        yield
    finally:
        task.cancel()
        call.cancel()


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


def usage_dict(*dones: Done) -> dict[str, Any]:
    """OpenAI's usage of a call: the prompt once, the completion tokens of every choice; cached tokens
    are those that every choice reused."""
    prompt = dones[0].usage.prompt_tokens
    completion = sum(d.usage.completion_tokens for d in dones)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": min(d.usage.cached_tokens for d in dones)},
    }


def finish_reason(done: Done) -> str:
    return "length" if done.finish_reason == "length" else "stop"
