"""Decode with the model's own multi-token-prediction block (speculate mtp) against plain decode, paired
in one process.

    python3 benchmarks/bench_mtp.py -m FILE [--tokens 64] [--rounds 5] [-t 2] [--draft 1,2,3]
                                    [--accept 0,0.6,0.8,1]

FILE must carry the block (llama.cpp's converter and `llamacy convert` write it for Qwen3.5 / Qwen3-Next;
`make_models.py qwen3.5-0.8b-mtp` writes a random one with Qwen3.5-0.8B's shapes). A random block agrees
with its model by chance only, so besides the drafts as made ("real"), the acceptance is SIMULATED: the
block runs in full (its entries, its chained drafts, its output head: every cost is real), then each drafted
token is replaced by the right one (the plain greedy continuation, known from the round's plain run) with
probability --accept, independently, a wrong token otherwise. The block's chaining threshold is off, so each
step drafts --draft tokens. What this measures is the cost side: tokens/s as a function of acceptance, to
set beside the acceptance a trained block reaches on real text (not measured here).

Every round runs plain decode and each setting once, in turn, on fresh conversations; reported: plain t/s
and, per setting, the median over rounds of its t/s over the same round's plain t/s, with the range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per run")
    ap.add_argument("--prompt", type=int, default=32, help="random prompt tokens")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--draft", default="1,2,3", help="tokens drafted per step (draft_max)")
    ap.add_argument("--accept", default="real,0.6,0.8,1", help="'real' or a simulated acceptance")
    args = ap.parse_args()

    from llamacy.engine import Llama
    from llamacy.generation import speculate

    llm = Llama(args.model, n_threads=args.threads, n_ctx=args.prompt + args.tokens + 16, repack="load")
    rng = np.random.default_rng(0)
    settings = [(a, int(k)) for a in args.accept.split(",") for k in args.draft.split(",")]
    real_propose = speculate.MtpDrafter.propose
    plan: dict = {}  # what the patched drafter does this run: acceptance, the continuation, a generator

    def propose(self, history, limit):
        draft = real_propose(self, history, limit)
        if plan.get("accept") is None:
            return draft
        done = len(history) - plan["n_prompt"]
        out = []
        for i, tok in enumerate(draft):
            right = plan["want"][done + i] if done + i < len(plan["want"]) else tok
            out.append(right if plan["rng"].random() < plan["accept"] else (right + 1) % llm.config.n_vocab)
        return out

    speculate.MtpDrafter.propose = propose
    speculate.MTP_P_MIN = 0.0  # chains run to draft_max: a trained block is confident where it is right

    def run(prompt: list[int], **kw) -> tuple[list[int], float]:
        llm.reset()  # each run evaluates the prompt afresh: the block's entries start empty too
        toks = [
            t for t, _ in llm.generate_tokens(prompt, max_tokens=args.tokens, temperature=0, **kw) if t >= 0
        ]
        return toks, llm.last.stats.gen_tps

    ratios: dict[tuple, list[float]] = {s: [] for s in settings}
    accepted: dict[tuple, list[float]] = {s: [] for s in settings}
    plain_tps = []
    for r in range(args.rounds):
        prompt = [int(x) for x in rng.integers(3, llm.config.n_vocab - 8, args.prompt)]
        plan.clear()
        want, base = run(prompt)
        plain_tps.append(base)
        for a, k in settings:
            plan.update(accept=None if a == "real" else float(a), want=want, n_prompt=len(prompt),
                        rng=np.random.default_rng(r))  # fmt: skip
            got, tps = run(prompt, speculate="mtp", draft_max=k)
            if got != want:
                sys.exit(f"bench_mtp: speculative output differs from plain decode ({a}, {k})")
            st = llm.last.stats
            ratios[(a, k)].append(tps / base)
            accepted[(a, k)].append(st.draft_accepted / max(1, st.draft_tokens))
        print(f"round {r + 1}: plain {base:.1f} t/s", file=sys.stderr)
    print(
        f"model {Path(args.model).name}, {args.threads} threads, {args.tokens} tokens, {args.rounds} rounds"
    )
    print(f"plain decode: {statistics.median(plain_tps):.1f} t/s (median)")
    print("acceptance  draft  accepted  mtp / plain (range)")
    for a, k in settings:
        rs = ratios[(a, k)]
        print(f"{a:>10}  {k:>5}  {statistics.median(accepted[(a, k)]):8.2f}  "
              f"{statistics.median(rs):.3f} ({min(rs):.3f}-{max(rs):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
