"""Speculative decoding by prompt lookup against plain decoding: generation speed, greedy, same output.

    python3 benchmarks/bench_speculate.py --model smollm2-135m --threads 2 --rounds 7 --tokens 200

Two prompts through the model's chat template: an edit of given code (the reply copies most of the prompt,
which prompt lookup drafts) and a story (nothing in the prompt to copy: the cost of trying). Every round
generates each prompt plain and with --speculate ngram, alternating which goes first, in one process with one
loaded model; the figure is the median over rounds of generated tokens / generation seconds (prompt
evaluation excluded, and the cache is cleared before each run so every run evaluates the same prompt).
Greedy output is checked to be the same token for token, so both modes do the same useful work.
"""

from __future__ import annotations

import argparse
import statistics
import time

from llamacy import Llama
from llamacy.chat_template import ChatTemplate

CODE = """import json


def load_users(path):
    with open(path) as f:
        data = json.load(f)
    users = []
    for entry in data["users"]:
        name = entry["name"].strip()
        email = entry["email"].lower()
        if not email:
            continue
        users.append({"name": name, "email": email, "age": entry.get("age", 0)})
    return users


def oldest_user(users):
    best = None
    for user in users:
        if best is None or user["age"] > best["age"]:
            best = user
    return best
"""

PROMPTS = {
    "edit code": f"Fix the bug in this code. Output the corrected code.\n```python\n{CODE}```",
    "nothing to draft": "Write a short story about a dragon who learns to bake bread.",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--draft-max", type=int, default=None)
    ap.add_argument("--ngram", type=int, default=None)
    args = ap.parse_args()

    llm = Llama(args.model, repack="load", n_ctx=2048, n_threads=args.threads)
    template = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    prompts = {
        name: template.encode(template.render([{"role": "user", "content": text}]))
        for name, text in PROMPTS.items()
    }
    spec = {"draft_max": args.draft_max, "ngram": args.ngram}
    modes = {"plain": {}, "ngram": {"speculate": "ngram", **spec}}
    tps: dict[tuple[str, str], list[float]] = {(p, m): [] for p in prompts for m in modes}
    drafts: dict[str, tuple[int, int, int]] = {}
    for r in range(args.rounds):
        for name, ids in prompts.items():
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            outputs = {}
            for mode in order:
                llm.reset()
                toks = [t for t, _ in llm.generate_tokens(ids, args.tokens, temperature=0, **modes[mode])]
                st = llm.last.stats
                tps[(name, mode)].append(st.gen_tokens / st.gen_s)
                outputs[mode] = toks
                if mode == "ngram":
                    drafts[name] = (st.gen_tokens, st.draft_tokens, st.draft_accepted)
            if outputs["plain"] != outputs["ngram"]:
                raise SystemExit(f"{name}: greedy output differs with speculation (a bug)")
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    print(
        f"\n{llm.model_path.name}, {args.threads} threads, {args.tokens} tokens, {args.rounds} rounds, greedy"
    )
    print("| prompt | plain tok/s | ngram tok/s | speed-up | generated | drafted | accepted |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in prompts:
        plain = statistics.median(tps[(name, "plain")])
        fast = statistics.median(tps[(name, "ngram")])
        ratios = [f / p for p, f in zip(tps[(name, "plain")], tps[(name, "ngram")], strict=True)]
        gen, drafted, accepted = drafts[name]
        print(
            f"| {name} | {plain:.1f} | {fast:.1f} | {statistics.median(ratios):.2f}x "
            f"(rounds {min(ratios):.2f}-{max(ratios):.2f}) | {gen} | {drafted} | {accepted} |"
        )
    print(f"({time.strftime('%Y-%m-%d %H:%M')})")


if __name__ == "__main__":
    main()
