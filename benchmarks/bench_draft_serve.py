"""Speculative decoding with a draft model in `llamacy serve`: requests with `"speculate": "draft"` against
the same requests without it, on one server, greedy; and `run --speculate draft` against plain for reference.

    python3 benchmarks/make_draft.py gemma3-270m 14 /tmp/gemma3-270m-first14.gguf
    python3 benchmarks/bench_draft_serve.py --model gemma3-270m --draft /tmp/gemma3-270m-first14.gguf \\
        --threads 2 --rounds 5 --tokens 64

One `llamacy serve -m MODEL --draft-model DRAFT --parallel 4` on a free 127.0.0.1 port. Every round measures
four cases, plain and draft alternating which goes first:
  1 client:  the fixed chat prompts one after another, streamed;
  4 clients: the same prompts at once, asking for --tokens, 3/4, 1/2 and 1/4 of it: the requests end one
             by one, as real ones do. A sequence drafts only in the steps it has alone (scheduler/plan.py):
             here, the longest request's last quarter.
Generated tokens/s of a case = its completion tokens / the seconds from each request's first streamed token
to its end (1 client: summed over the requests; 4 clients: from the first token of any to the end of the
last). The figure is the median over rounds of each round's own ratio draft / plain (its cases ran seconds
apart on a noisy shared machine). Every request is greedy (temperature 0) with ignore_eos, so each makes
exactly the tokens it asks for, and every draft answer must equal the plain one, text for text: the run stops
otherwise. Drafted and accepted token counts come from the server's /metrics (llamacy_draft_tokens_total,
llamacy_draft_accepted_total), read around the draft cases.

Then, with the server stopped, the first prompt through the single-sequence session that `llamacy run`
uses (Llama.generate_tokens, plain and with speculate="draft"), --rounds times alternating, for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

PROMPTS = [
    "Write a short story about a dragon who learns to bake bread.",
    "Explain how a hash table works, step by step.",
    "List the planets of the solar system with one fact about each.",
    "What are the main causes of the French Revolution?",
]
MODES = ("plain", "draft")


@dataclass
class Answer:
    text: str
    tokens: int
    t_first: float  # perf_counter at the first streamed text
    t_end: float


def ask(url: str, prompt: str, n_tokens: int, draft: bool) -> Answer:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": n_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if draft:
        body["speculate"] = "draft"
    text, tokens, t_first = [], 0, None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk["choices"]:
                piece = choice["delta"].get("content")
                if piece:
                    if t_first is None:
                        t_first = time.perf_counter()
                    text.append(piece)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return Answer("".join(text), tokens, t_first or end, end)


def draft_counts(url: str) -> tuple[int, int]:
    text = httpx.get(url + "/metrics", timeout=30).text
    found = {}
    for name in ("llamacy_draft_tokens_total", "llamacy_draft_accepted_total"):
        m = re.search(rf"^{name}{{[^}}]*}} (\d+)", text, re.M)
        if m is None:
            raise SystemExit(f"the server's /metrics has no {name}")
        found[name] = int(m.group(1))
    return found["llamacy_draft_tokens_total"], found["llamacy_draft_accepted_total"]


def case(url: str, clients: int, n_tokens: int, draft: bool) -> tuple[float, list[str]]:
    """Generated tokens/s of one case and its answers, in prompt order."""
    if clients == 1:
        answers = [ask(url, p, n_tokens, draft) for p in PROMPTS]
        seconds = sum(a.t_end - a.t_first for a in answers)
    else:
        lengths = [n_tokens * (clients - i) // clients for i in range(clients)]
        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(lambda p, n: ask(url, p, n, draft), PROMPTS[:clients], lengths))
        seconds = max(a.t_end for a in answers) - min(a.t_first for a in answers)
    return sum(a.tokens for a in answers) / seconds, [a.text for a in answers]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable, "-m", "llamacy", "serve", "-m", args.model, "--draft-model", args.draft,
        "--parallel", "4", "--threads", str(args.threads), "--ctx-size", str(args.ctx), "--port", "0",
        "--host", "127.0.0.1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("LLAMACY_API_KEY", None)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    line = proc.stderr.readline()
    if " at http://" not in line:
        proc.kill()
        raise SystemExit(f"the server did not start: {line.strip()} {proc.stderr.read().strip()}")
    return proc, line.split(" at ")[1].split()[0].removesuffix("/v1")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def bench_serve(args: argparse.Namespace) -> dict:
    proc, url = start_server(args)
    try:
        for clients in (1, 4):  # warm-up: first-call costs out of the figures
            case(url, clients, 8, False)
            case(url, clients, 8, True)
        tps = {(c, m): [] for c in (1, 4) for m in MODES}
        drafted = {c: [0, 0] for c in (1, 4)}
        for r in range(args.rounds):
            for clients in (1, 4):
                answers = {}
                for mode in MODES if r % 2 == 0 else reversed(MODES):
                    before = draft_counts(url)
                    rate, answers[mode] = case(url, clients, args.tokens, mode == "draft")
                    after = draft_counts(url)
                    tps[(clients, mode)].append(rate)
                    if mode == "draft":
                        drafted[clients][0] += after[0] - before[0]
                        drafted[clients][1] += after[1] - before[1]
                    elif after != before:
                        raise SystemExit("plain requests drafted (a bug)")
                if answers["plain"] != answers["draft"]:
                    raise SystemExit(f"{clients} client(s): greedy answers differ with drafting (a bug)")
            print(f"serve round {r + 1}/{args.rounds} done", flush=True)
    finally:
        stop_server(proc)
    return {"tps": tps, "drafted": drafted}


def bench_run(args: argparse.Namespace) -> dict:
    from llamacy import Llama
    from llamacy.chat_template import ChatTemplate

    llm = Llama(args.model, repack="load", n_ctx=args.ctx, n_threads=args.threads)
    tpl = ChatTemplate.from_model(llm.metadata, llm.tokenizer)
    ids = tpl.encode(tpl.render([{"role": "user", "content": PROMPTS[0]}]))
    modes = {"plain": {}, "draft": {"speculate": "draft", "draft_model": args.draft}}
    tps = {m: [] for m in MODES}
    counts = (0, 0)
    for r in range(args.rounds):
        outputs = {}
        for mode in MODES if r % 2 == 0 else reversed(MODES):
            llm.reset()
            toks = [t for t, _ in llm.generate_tokens(ids, args.tokens, temperature=0, **modes[mode])]
            st = llm.last.stats
            tps[mode].append(st.gen_tokens / st.gen_s)
            outputs[mode] = toks
            if mode == "draft":
                counts = (counts[0] + st.draft_tokens, counts[1] + st.draft_accepted)
        if outputs["plain"] != outputs["draft"]:
            raise SystemExit("run: greedy output differs with drafting (a bug)")
    return {"tps": tps, "drafted": counts}


def row(name: str, plain: list[float], draft: list[float], drafted: tuple[int, int]) -> str:
    ratios = [d / p for p, d in zip(plain, draft, strict=True)]
    share = f"{drafted[1] / drafted[0]:.0%}" if drafted[0] else "-"
    return (
        f"| {name} | {statistics.median(plain):.1f} | {statistics.median(draft):.1f} | "
        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
        f"{drafted[0]} | {drafted[1]} ({share}) |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", required=True, help="the draft model (a GGUF with the model's vocabulary)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=1024, help="context per sequence")
    args = ap.parse_args()

    serve = bench_serve(args)
    run = bench_run(args)
    print(
        f"\n{args.model} with draft {Path(args.draft).name}, {args.threads} threads, {args.tokens} tokens per "
        f"request, {args.rounds} rounds, greedy; draft answers identical to plain ones in every case"
    )
    print("| case | plain tok/s | draft tok/s | draft / plain | drafted | accepted |")
    print("|---|---:|---:|---:|---:|---:|")
    for clients in (1, 4):
        name = f"serve, {clients} client{'s' if clients > 1 else ''}"
        print(
            row(
                name,
                serve["tps"][(clients, "plain")],
                serve["tps"][(clients, "draft")],
                serve["drafted"][clients],
            )
        )
    print(row("run (session), prompt 1", run["tps"]["plain"], run["tps"]["draft"], run["drafted"]))
    print(f"({time.strftime('%Y-%m-%d %H:%M')})")


if __name__ == "__main__":
    main()
