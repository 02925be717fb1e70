"""Time to first token of a long fixed preamble with and without a prompt cache file (issue #28).

    python3 benchmarks/bench_prompt_cache.py --model smollm2-135m --threads 2 --preamble 2000 --rounds 3

The prompt is a preamble of exactly --preamble tokens (English text, cut at that many tokens) followed by a
short question. "without": the cache is cleared and the whole prompt is evaluated, as every plain
`llamacy run` does. "with": the prompt cache saved by a first run (the preamble + question) is loaded into
a cleared cache and a new question is asked, as `llamacy run --prompt-cache FILE` does: the figure
includes reading and checking the file. Rounds alternate the two; the figure is the median time from the
start (cache load included) to the first generated token, one process, one loaded model. Greedy output of
the cached run is checked to equal the uncached run's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from llamacy import Llama

TEXT = (
    "The committee met on a grey morning to review the harbour records. Each ledger listed the ships that "
    "came in, their cargo, the weight of grain and timber, the names of the pilots, and the fees paid at the "
    "customs house. Some entries were smudged by seawater; others were written in a hurried hand that only "
    "the old clerk could read. Over the years the town had grown around the trade, and the records told of "
    "storms, of good harvests and bad, of a bridge that fell and was rebuilt, and of families who arrived "
    "with nothing and became merchants. "
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--preamble", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-type", default="f16")
    a = ap.parse_args()

    llm = Llama(
        a.model, repack="load", n_threads=a.threads, kv_type=a.kv_type, n_ctx=max(4096, a.preamble + 256)
    )
    ids: list[int] = llm.tokenize(TEXT * 2)
    while len(ids) < a.preamble:
        ids += llm.tokenize(TEXT, add_bos=False)
    preamble = ids[: a.preamble]
    q1 = llm.tokenize("\n\nQuestion: what did the ledgers list?\nAnswer:", add_bos=False)
    q2 = llm.tokenize("\n\nQuestion: what did the records tell of?\nAnswer:", add_bos=False)
    cache = Path(tempfile.mkdtemp()) / "preamble.cache"

    # The first run: evaluates everything and saves the prompt's memory.
    llm.reset()
    t0 = time.perf_counter()
    for _ in llm.generate_tokens(
        preamble + q1, max_tokens=1, temperature=0, on_prompt=lambda _: llm.save_memory(cache)
    ):
        pass
    first_run = time.perf_counter() - t0
    size = cache.stat().st_size

    plain, cached, outputs = [], [], {}
    for r in range(a.rounds):
        for mode in ("without", "with") if r % 2 == 0 else ("with", "without"):
            llm.reset()
            t0 = time.perf_counter()
            if mode == "with":
                llm.load_memory(cache)
            t_load = time.perf_counter() - t0
            text = "".join(p for _, p in llm.generate_tokens(preamble + q2, max_tokens=8, temperature=0))
            st = llm.last.stats
            outputs.setdefault(mode, text)
            (cached if mode == "with" else plain).append(
                (t_load + st.first_token_s, st.prompt_evaluated, t_load)
            )
    assert outputs["with"] == outputs["without"], outputs
    print(
        f"model {llm.model_path.name}, {a.threads} threads, KV {a.kv_type}, prompt {len(preamble + q2)} tokens"
    )
    print(f"first run (evaluate + save {size / 2**20:.1f} MiB): {first_run * 1000:.0f} ms")
    for name, rows in (("without --prompt-cache", plain), ("with --prompt-cache", cached)):
        med = statistics.median(t for t, _, _ in rows)
        load = statistics.median(x for _, _, x in rows)
        print(
            f"{name}: time to first token {med * 1000:.0f} ms (median of {len(rows)}; loading the file "
            f"{load * 1000:.0f} ms of it), {rows[0][1]} prompt tokens evaluated"
        )


if __name__ == "__main__":
    main()
