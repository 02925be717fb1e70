"""Whole-process time to the first token: `llamacy run -n 1` against the reference CLI, side by side.

    python3 benchmarks/bench_startup.py [--tree DIR ...] [--ref-cli PATH/llama-completion] [--rounds 15]

Each round runs every contender once, the order rotating from round to round so that a machine warming up
or slowing down hits all alike. Printed per contender: the median wall time of a whole process
(interpreter start, imports, model load, prompt, one generated token, exit), its median CPU time (user +
system, all threads: less sensitive than wall time to other work on a shared machine, though a spinning
thread team counts too) and the median of the per-round wall-time ratios to the first contender. A
--tree is a llamacy checkout (PYTHONPATH points at it; several compare builds); the reference CLI is
llama.cpp's llama-completion (built by build_reference.sh, default $LLAMACY_REF_CLI), given the same model
file, prompt and thread count.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def wall(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system, all threads) of one whole process."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, check=True)
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


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
    contenders: dict[str, tuple[list[str], dict[str, str], Path]] = {}
    for tree in [t.resolve() for t in (args.tree or [ROOT])]:
        cmd = [sys.executable, "-m", "llamacy", "run", args.prompt, "-m", model, "-n", "1", "--temp", "0"]
        cmd += ["-t", str(args.threads)]
        # bytecode cached as an installed package has it, outside the trees (which may not be ours to write)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "llamacy-startup-pycache")
        # Run in the tree: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH, so
        # from any other checkout every contender would run that checkout's code.
        contenders[f"llamacy {tree}"] = (cmd, dict(env, PYTHONPATH=str(tree)), tree)
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
        contenders["reference llama-completion"] = ([*cmd, "-no-cnv"], dict(os.environ), ROOT)
    names = list(contenders)
    for name in names:  # warm the page cache and (llamacy) write the bytecode caches
        wall(*contenders[name])
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            times[name].append(wall(*contenders[name]))
    print(f"model {model}, {args.threads} threads, {args.rounds} rounds; medians of whole processes")
    print("   wall s  CPU s   wall ÷ first's, per round (median)")
    first = times[names[0]]
    for name in names:
        med_wall = statistics.median(w for w, _ in times[name])
        med_cpu = statistics.median(c for _, c in times[name])
        # Per-round ratios: both processes of a round met the same load, so their ratio drifts less.
        ratio = statistics.median(w / f for (w, _), (f, _) in zip(times[name], first, strict=True))
        print(f"{med_wall:7.3f} {med_cpu:7.3f}   {ratio:.2f}x  {name}")


if __name__ == "__main__":
    main()
