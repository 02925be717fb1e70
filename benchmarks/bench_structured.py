"""What constrained decoding costs: tokens/s under a JSON schema vs unconstrained, same length, same prompts.

    python benchmarks/bench_structured.py [--model smollm2-135m] [--threads 2] [--streams 1,8] [--tokens 128]

Both runs go through the scheduler (as the server does) with the same prompts and seeds. Unconstrained
requests ignore end-of-generation tokens; constrained ones follow a schema that cannot be complete within
--tokens (an array of at least 1000 person objects: strings, integers, enums, nested keys), so every request
generates exactly --tokens tokens either way. Each constrained token costs a mask (llguidance), the masked
sampling, and the matcher's advance; forced tokens (a key's letters after its first) skip sampling and are
evaluated in one batch with the sampled token before them. Rounds alternate between the two modes, so machine
noise hits both alike; medians are reported. The target (issue #15): at most 10% fewer tokens/s.

On a shared machine the forward pass's time swings with the load, and so does tokens/s; the time spent
outside the forward pass (sampling, masks, the grammar, detokenizing, scheduling) does much less, so it is
reported too, per generated token: `extra` is what the constraint adds to it, as a share of the
unconstrained time per token.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

PEOPLE = {
    "type": "array",
    "minItems": 1000,
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "email": {"type": "string", "maxLength": 40},
        },
        "required": ["name", "age", "role", "email"],
    },
}
PROMPTS = [
    "A list of people as JSON:",
    "Here are the users of the system in JSON:",
    "Employees (JSON):",
    "The members of the club, as a JSON array:",
    "JSON export of the customer table:",
    "Some example people in JSON format:",
    "Test fixtures (a JSON list of users):",
    "The team, in JSON:",
]


class ForwardClock:
    """Seconds spent in the scheduler's forward pass (Model.eval_batch), wrapped on the instance."""

    def __init__(self, model) -> None:
        self.seconds = 0.0
        inner = model.eval_batch

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        model.eval_batch = timed


def run_round(llm, sched, clock: ForwardClock, n_streams: int, n_tokens: int, grammar) -> tuple[float, float]:
    """(generated tokens per second, seconds per token outside the forward pass) of n_streams requests
    decoded together (submit to last Done)."""
    from llamacy.sampling import SamplingParams
    from llamacy.scheduler import GenerationRequest
    from llamacy.structured import Constraint

    requests = [
        GenerationRequest(
            prompt=llm.tokenize(PROMPTS[i % len(PROMPTS)]),
            params=SamplingParams(seed=i),
            max_tokens=n_tokens,
            ignore_eos=True,
            constraint=None if grammar is None else Constraint(grammar, llm.tokenizer, llm.n_vocab),
        )
        for i in range(n_streams)
    ]
    forward0 = clock.seconds
    t0 = time.perf_counter()
    handles = [sched.submit(r) for r in requests]
    dones = [h.result(timeout=600) for h in handles]
    elapsed = time.perf_counter() - t0
    n = sum(d.usage.completion_tokens for d in dones)
    if n != n_streams * n_tokens:
        raise RuntimeError(f"expected {n_streams * n_tokens} tokens, got {n}: the lengths differ")
    return n / elapsed, (elapsed - (clock.seconds - forward0)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--streams", default="1,8", help="comma-separated numbers of concurrent streams")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per stream")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from llamacy import Llama
    from llamacy.scheduler import Scheduler
    from llamacy.structured import json_schema_grammar
    from llamacy.structured.vocab import ll_tokenizer

    llm = Llama(args.model, repack="load", n_ctx=1024, n_threads=args.threads)
    grammar = json_schema_grammar(PEOPLE)
    ll_tokenizer(llm.tokenizer)  # built once per vocabulary: not part of any round
    print(
        f"{llm.model_path.name}, {args.threads} threads, {args.tokens} tokens per stream, {args.rounds} rounds"
    )
    print(
        f"{'streams':>7}  {'free tok/s':>10}  {'JSON tok/s':>10}  {'cost':>6}  "
        f"{'host ms/tok free':>16}  {'JSON':>6}  {'extra':>6}"
    )
    for n_streams in (int(x) for x in args.streams.split(",")):
        with Scheduler(llm, n_parallel=n_streams, n_ctx=1024, n_threads=args.threads) as sched:
            clock = ForwardClock(sched.model)
            run_round(llm, sched, clock, n_streams, 8, None)  # warm-up: caches, thread team
            run_round(llm, sched, clock, n_streams, 8, grammar)
            free, constrained = [], []
            for _ in range(args.rounds):
                free.append(run_round(llm, sched, clock, n_streams, args.tokens, None))
                constrained.append(run_round(llm, sched, clock, n_streams, args.tokens, grammar))
        f, c = (statistics.median(r[0] for r in runs) for runs in (free, constrained))
        hf, hc = (statistics.median(r[1] for r in runs) for runs in (free, constrained))
        print(
            f"{n_streams:>7}  {f:>10.1f}  {c:>10.1f}  {100 * (1 - c / f):>5.1f}%  "
            f"{1000 * hf:>16.3f}  {1000 * hc:>6.3f}  {100 * (hc - hf) * f:>5.1f}%"
        )


if __name__ == "__main__":
    main()
