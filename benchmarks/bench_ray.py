"""Aggregate throughput of `llamacy serve --ray` (2 replicas x 1 thread) against one local server with
2 threads, both with the same streaming clients.

    python benchmarks/bench_ray.py [--model NAME] [--clients 8] [--tokens 64] [--rounds 2]

The local server runs first (`llamacy serve -t 2 --parallel CLIENTS`), then a private Ray cluster of 2
CPUs on 127.0.0.1 (tests/ray_cluster.py) with `llamacy serve --ray --replicas 2 -t 1 --parallel
CLIENTS/2`, so that both have the same sequence slots and the same cores. Each measures --rounds rounds of
CLIENTS clients at once (bench_server's lean client: ignore_eos, every request makes --tokens tokens);
tokens/s = all generated tokens / wall time, the median of the rounds.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_server import free_port, measure, stop, wait_healthy  # noqa: E402
from tests.ray_cluster import LocalRayCluster  # noqa: E402


def _start(cmd: list[str], env: dict | None, url: str, timeout: float = 300) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # never block on a full pipe
    wait_healthy(proc, cmd, url, timeout)
    return proc


def _rounds(url: str, args: argparse.Namespace) -> list[float]:
    measure(url, args.clients, 8, 0)  # warm-up: every slot touched once
    return [measure(url, args.clients, args.tokens, 100 * (i + 1))[0] for i in range(args.rounds)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "-m", default="smollm2-135m")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64, help="tokens each client generates")
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    serve = [sys.executable, "-m", "llamacy", "serve", "-m", args.model, "-c", str(args.ctx_size)]

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start([*serve, "--port", str(port), "-t", "2", "--parallel", str(args.clients)], None, url)
    try:
        local = _rounds(url, args)
    finally:
        stop(proc, signal.SIGTERM, 60)

    with LocalRayCluster(num_cpus=2) as cluster:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [*serve, "--port", str(port), "--ray", cluster.address, "--replicas", "2", "-t", "1"]
        proc = _start([*cmd, "--parallel", str(max(1, args.clients // 2))], cluster.env, url)
        try:
            remote = _rounds(url, args)
        finally:
            stop(proc, signal.SIGTERM, 60)

    med_local, med_remote = statistics.median(local), statistics.median(remote)
    print(
        f"model: {args.model}  clients: {args.clients}  tokens/client: {args.tokens}  rounds: {args.rounds}"
    )
    print(
        f"local server, 2 threads:        {med_local:6.1f} tokens/s  (rounds: {', '.join(f'{x:.1f}' for x in local)})"
    )
    print(
        f"Ray, 2 replicas x 1 thread:     {med_remote:6.1f} tokens/s  (rounds: {', '.join(f'{x:.1f}' for x in remote)})"
    )
    print(f"Ray / local: {med_remote / med_local:.2f}")


if __name__ == "__main__":
    main()
