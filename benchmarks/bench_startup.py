"""Whole-process time to the first token: `llamacy run -n 1` against the reference CLI, side by side.

    python3 benchmarks/bench_startup.py [--tree DIR ...] [--ref-cli PATH/llama-completion] [--rounds 15]

Each round runs every contender once, the order rotating from round to round so that a machine warming up
or slowing down hits all alike; the figure is the median wall time of a whole process (interpreter start,
imports, model load, prompt, one generated token, exit) over the rounds. A --tree is a llamacy checkout
(PYTHONPATH points at it; several compare builds); the reference CLI is llama.cpp's llama-completion (built
by build_reference.sh, default $LLAMACY_REF_CLI), given the same model file, prompt and thread count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", type=Path, action="append", help="llamacy checkout (default: this one)")
    ap.add_argument("--ref-cli", default=os.environ.get("LLAMACY_REF_CLI"), help="llama-completion")
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("-p", "--prompt", default="The capital of France is")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()

    from llamacy.catalog import resolve_model

    model = str(resolve_model(args.model))
    contenders: dict[str, tuple[list[str], dict[str, str]]] = {}
    for tree in [t.resolve() for t in (args.tree or [ROOT])]:
        cmd = [sys.executable, "-m", "llamacy", "run", args.prompt, "-m", model, "-n", "1", "--temp", "0"]
        cmd += ["-t", str(args.threads)]
        # bytecode cached as an installed package has it, outside the trees (which may not be ours to write)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "llamacy-startup-pycache")
        contenders[f"llamacy {tree}"] = (cmd, dict(env, PYTHONPATH=str(tree)))
    if args.ref_cli:
        cmd = [
            args.ref_cli,
            "-m",
            model,
            "-p",
            args.prompt,
            "-n",
            "1",
            "--temp",
            "0",
            "-t",
            str(args.threads),
        ]
        contenders["reference llama-completion"] = ([*cmd, "-no-cnv"], dict(os.environ))
    names = list(contenders)
    for name in names:  # warm the page cache and (llamacy) write the bytecode caches
        wall(*contenders[name])
    times: dict[str, list[float]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            times[name].append(wall(*contenders[name]))
    first = statistics.median(times[names[0]])
    print(f"model {model}, {args.threads} threads, {args.rounds} rounds; median whole-process seconds")
    for name in names:
        med = statistics.median(times[name])
        print(f"{med:7.3f} s  ({med / first:.2f}x the first)  {name}")


if __name__ == "__main__":
    main()
