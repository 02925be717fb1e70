"""Continuous batching: many generation requests share one model, one batch per step.

    sched = Scheduler(llm, n_parallel=4)          # llm: a loaded llamacy.Llama (gguf, config, tokenizer)
    sched.start()
    handle = sched.submit(GenerationRequest(prompt=llm.tokenize("Hi"), max_tokens=16))
    for event in handle.events():                 # Piece(text, tokens, ...) ..., then Done or Failed
        ...
    sched.shutdown()

One scheduler thread owns a Model with `n_parallel` sequences (each its own slice of the KV cache; the
weights are llm's, bound once) and runs steps. A step is ONE call to Model.eval_batch holding the next token
of every decoding sequence plus a chunk of prompt tokens of the oldest prefilling sequences (chunked prefill:
a long prompt costs the others at most `prefill_chunk` extra tokens per step). Each weight row is then read
once for every sequence in the batch, which is where the throughput of serving many clients comes from.

New requests join between steps; a finished or cancelled sequence frees its slot at the next step. A free
slot keeps the tokens it last held, so a new prompt that shares their prefix (a chat that goes on, a
common system prompt) skips evaluating it.

Every request samples with its own seeded Sampler and the layer loop computes each batch row
independently of the others, so a request's tokens are the same whether it ran alone or batched.
Nothing here knows about HTTP: the server and `llamacy batch` both build on it.

The parts: requests.py (the request, its events, the Handle), plan.py (which sequences and prompt chunks
go into a step), apply.py (sampling and events from a step's logits, through the generation steps in
llamacy/generation/steps.py), batcher.py (the slots and the step, no thread: the single-sequence Session
steps it with one slot in its caller's thread), loop.py (the Scheduler: the queue, admission and the
thread).
"""

from llamacy.generation.steps import TokenLogprob
from llamacy.scheduler.batcher import Batcher
from llamacy.scheduler.loop import DEFAULT_PREFILL_CHUNK, Scheduler
from llamacy.scheduler.requests import (
    MAX_LOGPROBS,
    Done,
    Event,
    Failed,
    GenerationRequest,
    Handle,
    Piece,
    QueueFull,
    SchedulerClosed,
    Timings,
    Usage,
)

__all__ = [
    "DEFAULT_PREFILL_CHUNK",
    "MAX_LOGPROBS",
    "Batcher",
    "Done",
    "Event",
    "Failed",
    "GenerationRequest",
    "Handle",
    "Piece",
    "QueueFull",
    "Scheduler",
    "SchedulerClosed",
    "Timings",
    "TokenLogprob",
    "Usage",
]
