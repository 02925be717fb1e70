"""From a validated request to scheduler events, and from those events back into the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from llamacy.errors import LlamacyError
from llamacy.sampling import MAX_SEED, SamplingParams
from llamacy.scheduler import Done, Event, Failed, GenerationRequest, Handle, TokenLogprob
from llamacy.server.errors import APIError, from_engine_error
from llamacy.server.schemas import SamplingFields

if TYPE_CHECKING:
    from llamacy.server.app import ServerState

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


async def encode_text(state: ServerState, text: str) -> list[int]:
    """Token ids of a completion prompt (special tokens parsed; BOS as the model wants, once)."""
    tok = state.tokenizer

    def encode() -> list[int]:
        ids = tok.encode(text, add_bos=False, special=True)
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    return await run_in_threadpool(encode)  # a 1 MB prompt takes a while: not on the event loop


async def encode_chat(state: ServerState, messages: list[dict[str, Any]]) -> list[int]:
    tpl = state.template
    if tpl is None:
        raise APIError(
            501,
            "chat completions need a chat template, and none could be loaded for this model",
            "no_chat_template",
        )

    def render() -> list[int]:
        return tpl.encode(tpl.render(messages, add_generation_prompt=True))

    try:
        return await run_in_threadpool(render)
    except LlamacyError as e:
        raise APIError(400, str(e), "invalid_messages", "messages") from None


def build_request(
    state: ServerState,
    f: SamplingFields,
    prompt: list[int],
    max_tokens: int | None,
    logprobs: int | None = None,
    chat: bool = False,
) -> GenerationRequest:
    stop_ids = set(state.scheduler.eog_ids)
    stop = f.stop_list()
    if chat and state.template is not None:
        # End-of-turn markers of the template: ids, and as text for a model that spells them out.
        stop_ids |= set(state.template.stop_ids)
        stop += [s for s in state.template.stop_strings if s not in stop]
    return GenerationRequest(
        prompt=prompt,
        params=sampling_params(f),
        max_tokens=max_tokens,
        stop=stop,
        stop_ids=frozenset(stop_ids),
        ignore_eos=f.ignore_eos,
        logprobs=logprobs,
    )


def submit(state: ServerState, request: GenerationRequest, listener: Any = None) -> Handle:
    try:
        return state.scheduler.submit(request, listener)
    except LlamacyError as e:
        raise from_engine_error(e) from None


class LoopMailbox:
    """Scheduler events on their way to one event loop, handed over once per scheduler step.

    The scheduler emits a step's events one sequence at a time; waking the loop for each (one self-pipe
    write, then the loop takes the GIL while the scheduler thread still samples the other sequences) made
    the two threads trade the GIL 8 times a step with 8 clients. Here events only queue up, and flush()
    (a scheduler step hook) passes the step's batch to the loop in one call, while the next step's math
    runs without the GIL.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[tuple[asyncio.Queue[Event], Event]] = []
        self._lock = threading.Lock()

    def post(self, queue: asyncio.Queue[Event], ev: Event) -> None:
        with self._lock:
            self._items.append((queue, ev))

    def flush(self) -> None:
        with self._lock:
            if not self._items:
                return
            items, self._items = self._items, []
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self._deliver, items)

    @staticmethod
    def _deliver(items: list[tuple[asyncio.Queue[Event], Event]]) -> None:
        for queue, ev in items:
            queue.put_nowait(ev)


def mailbox(state: ServerState) -> LoopMailbox:
    """The running loop's mailbox, registered with the scheduler the first time."""
    loop = asyncio.get_running_loop()
    box = state.mailbox
    if box is None or box.loop is not loop:
        box = state.mailbox = LoopMailbox(loop)
        state.scheduler.add_step_hook(box.flush)
    return box


class EventBridge:
    """Scheduler events (delivered on the scheduler thread) as an async iterator on the event loop."""

    def __init__(self, box: LoopMailbox) -> None:
        self._box = box
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    def listener(self, ev: Event) -> None:
        self._box.post(self._queue, ev)

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            ev = await self._queue.get()
            yield ev
            if isinstance(ev, Done | Failed):
                return


async def start(state: ServerState, request: GenerationRequest) -> tuple[Handle, EventBridge]:
    bridge = EventBridge(mailbox(state))
    return submit(state, request, bridge.listener), bridge


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


def _token_str(state: ServerState, tid: int) -> str:
    return state.tokenizer.token_bytes(tid).decode("utf-8", errors="replace")


def completion_logprobs(state: ServerState, lps: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions shape: parallel lists, text_offset counted from `offset`."""
    tokens, offsets = [], []
    for lp in lps:
        s = _token_str(state, lp.token)
        tokens.append(s)
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{_token_str(state, t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def chat_logprobs(state: ServerState, lps: list[TokenLogprob]) -> dict[str, Any]:
    def entry(tid: int, value: float) -> dict[str, Any]:
        raw = state.tokenizer.token_bytes(tid)
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
