"""Throughput of `llamacy serve` with many streaming clients vs one.

    python benchmarks/bench_server.py [--model PATH] [--clients 8] [--tokens 64] [--threads N] [--rounds 5]
                                      [--client lean|httpx] [--ref-server PATH/TO/llama-server]

Starts `llamacy serve --parallel CLIENTS` on a free loopback port, warms it up, then runs --rounds rounds,
each measuring both cases back to back (which one goes first alternates):
  1. one streaming client generating --tokens tokens (alone on the server),
  2. CLIENTS streaming clients at once, each generating --tokens tokens.
Generated tokens per second = all completion tokens / wall time from the first request to the last
[DONE]. Batching shares each weight read across the sequences of a step, so (2) should be several times
(1); the target is >= 3x with 8 clients. Every request uses ignore_eos, so each makes exactly --tokens.

On a small shared machine single runs move by 20% and more, so the figures are medians over the rounds,
and the speed-up is the median of each round's own ratio (its two cases ran seconds apart). Beside them:
the CPU time the server process and this client process spent per generated token (from /proc and
getrusage), which noise from other tenants barely moves and which shows where the cores went.

--ref-server (or $LLAMACY_REF_SERVER; `make bench-server`) puts the native reference engine's server
(llama.cpp's llama-server, built by build_reference.sh) beside ours in the same run: the same model file, `-np CLIENTS`, the same context per
sequence and threads, the same requests on its OpenAI-compatible /v1/completions. Each round then measures
both cases on both servers (the order of the engines alternating too), and the figure to quote is the
median of the rounds' own ratios ours / its at CLIENTS clients. Both servers stay up all run; an idle one
sleeps on a socket (neither spins between requests).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The history of the Roman Empire begins with",
    "Here is a recipe for a simple tomato soup:",
    "The three laws of thermodynamics state that",
    "In computer science, a hash table is",
    "My favourite season of the year is autumn, because",
    "The quick brown fox jumps over the lazy dog. Then",
    "To learn a new language quickly, you should",
]


@dataclass
class Run:
    tokens: int
    ttft_s: float  # time to the first generated text
    total_s: float


def request_body(prompt: str, n_tokens: int, seed: int) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": n_tokens,
        "temperature": 0.8,
        "seed": seed,
        "stream": True,
        "ignore_eos": True,
    }


def stream_httpx(url: str, prompt: str, n_tokens: int, seed: int) -> Run:
    """A full client: httpx, every chunk parsed as JSON (~0.9 ms of CPU per token on this machine)."""
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with httpx.stream(
        "POST", url + "/v1/completions", json=request_body(prompt, n_tokens, seed), timeout=600
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            _check_event(url, chunk)
            if ttft is None and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - t0
            if "usage" in chunk:
                tokens = chunk["usage"]["completion_tokens"]
    return Run(tokens, ttft or 0.0, time.perf_counter() - t0)


def stream_lean(url: str, prompt: str, n_tokens: int, seed: int) -> Run:
    """A load generator that costs little CPU: the standard library's HTTP client reads the event lines,
    and only the last chunk (the one with `usage`) is parsed. The clients share the machine's cores with
    the server, so every millisecond they spend is one the server's math does not get; the first event
    line is the first text (the server sends no empty text chunks before the final one)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    t0 = time.perf_counter()
    ttft = None
    last = b""
    try:
        payload = json.dumps(request_body(prompt, n_tokens, seed)).encode()
        conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        while line := r.readline():
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                break
            if ttft is None:
                ttft = time.perf_counter() - t0
            last = line
    finally:
        conn.close()
    final = json.loads(last[6:]) if last else {}
    _check_event(url, final)
    return Run(final["usage"]["completion_tokens"] if final else 0, ttft or 0.0, time.perf_counter() - t0)


def _check_event(url: str, event: dict) -> None:
    """A server that ends a stream with an error event (llama-server does, with HTTP 200 already sent:
    e.g. "The model produced output that does not match the expected Content-only format" on a
    random-weight model's text) stops the benchmark with its message instead of a KeyError."""
    if "error" in event:
        raise RuntimeError(f"{url}: the stream ended in an error: {event['error']}")


CLIENTS = {"lean": stream_lean, "httpx": stream_httpx}


@dataclass
class Round:
    tokens_per_s: float
    runs: list[Run]
    server_cpu_s: float  # CPU time of the server process (all its threads) during the round
    client_cpu_s: float  # CPU time of this process (the clients) during the round

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.runs)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process, all threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_s() -> float:
    return time.process_time()


def measure_round(url: str, pid: int, clients: int, n_tokens: int, seed0: int, stream=stream_lean) -> Round:
    s0, c0 = process_cpu_s(pid), client_cpu_s()
    tps, runs = measure(url, clients, n_tokens, seed0, stream)
    return Round(tps, runs, process_cpu_s(pid) - s0, client_cpu_s() - c0)


def measure(url: str, clients: int, n_tokens: int, seed0: int, stream=stream_lean) -> tuple[float, list[Run]]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        runs = list(
            pool.map(lambda i: stream(url, PROMPTS[i % len(PROMPTS)], n_tokens, seed0 + i), range(clients))
        )
    wall = time.perf_counter() - t0
    return sum(r.tokens for r in runs) / wall, runs


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    cmd = [
        sys.executable,
        "-m",
        "llamacy",
        "serve",
        "--port",
        "0",
        "--parallel",
        str(args.clients),
        "--ctx-size",
        str(args.ctx_size),
    ]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {k: v for k, v in os.environ.items() if k != "LLAMACY_API_KEY"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    if " at http" not in line:
        proc.kill()
        sys.exit(f"the server did not start: {line}{proc.stderr.read()}")
    # Keep draining stderr so that the server never blocks on a full pipe.
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, line.split(" at ")[1].split()[0].removesuffix("/v1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reference_server(args: argparse.Namespace, binary: str) -> tuple[subprocess.Popen, str]:
    """llama-server on a free loopback port, CPU only, one slot per client; ready once /health says ok."""
    from llamacy.catalog import resolve_model

    port = free_port()
    cmd = [binary, "-m", str(resolve_model(args.model)), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-np", str(args.clients), "-c", str(args.ctx_size * args.clients), "-ngl", "0"]
    if args.threads:
        cmd += ["-t", str(args.threads), "-tb", str(args.threads)]
    env = dict(os.environ)
    # A build tree's binaries find their libggml*.so beside them.
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (os.path.dirname(os.path.abspath(binary)), env.get("LD_LIBRARY_PATH")) if p
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, cmd, url, timeout=120)
    return proc, url


def wait_healthy(proc: subprocess.Popen, cmd: list[str], url: str, timeout: float) -> None:
    """Return once GET url/health answers 200; kill proc and exit with one line if it ends first or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(
                f"the server did not start within {timeout:.0f} s (exit code {proc.poll()}): {' '.join(cmd)}"
            )
        time.sleep(0.2)


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, timeout: float = 20) -> None:
    """Ask proc to shut down with sig; kill it if it has not within `timeout` seconds."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()


def report(
    label: str, clients: int, singles: list[Round], manys: list[Round]
) -> tuple[list[float], list[float]]:
    """Print one engine's figures; return its per-round 1-client and CLIENTS-client tokens/s."""

    def med(xs: list[float]) -> float:
        return statistics.median(xs)

    ratios = [m.tokens_per_s / s.tokens_per_s for s, m in zip(singles, manys, strict=True)]
    ttft = med([r.ttft_s for m in manys for r in m.runs])
    per_client = med([r.tokens / r.total_s for m in manys for r in m.runs])
    print(f"{label}:")
    for name, rs in (("1 client: ", singles), (f"{clients} clients:", manys)):
        tps = [r.tokens_per_s for r in rs]
        srv = med([r.server_cpu_s / r.tokens * 1000 for r in rs])
        cli = med([r.client_cpu_s / r.tokens * 1000 for r in rs])
        print(
            f"  {name} {med(tps):7.1f} generated tokens/s (median; range {min(tps):.1f}-{max(tps):.1f})  "
            f"CPU per token: server {srv:.2f} ms, clients {cli:.2f} ms"
        )
    print(
        f"  {clients} clients: per client {per_client:.1f} tok/s, median time to first token {ttft * 1000:.0f} ms"
    )
    print(
        f"  speed-up: {med(ratios):.2f}x (median of the rounds' ratios; "
        f"range {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    return [s.tokens_per_s for s in singles], [m.tokens_per_s for m in manys]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", "-m", default=None, help="GGUF file or known name (default: the default model)"
    )
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64, help="tokens each client generates")
    ap.add_argument("--threads", "-t", type=int, default=None)
    ap.add_argument("--ctx-size", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of (1 client, CLIENTS clients)")
    ap.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="lean",
        help="lean: http.client, only the last chunk parsed; httpx: every chunk parsed as JSON",
    )
    ap.add_argument(
        "--ref-server",
        default=os.environ.get("LLAMACY_REF_SERVER") or None,
        metavar="PATH",
        help="the reference engine's llama-server binary, measured beside ours in the same run "
        "(default: $LLAMACY_REF_SERVER)",
    )
    args = ap.parse_args()

    engines: list[tuple[str, subprocess.Popen, str]] = []
    try:
        engines.append(("llamacy", *start_server(args)))
        if args.ref_server:
            engines.append(("llama-server", *start_reference_server(args, args.ref_server)))
        stream = CLIENTS[args.client]
        for _, _, url in engines:
            stream(url, "Warm-up", 8, 0)
            measure(url, args.clients, 8, 0, stream)  # every slot touched once
        results = {name: ([], []) for name, _, _ in engines}
        for i in range(args.rounds):
            for name, proc, url in engines if i % 2 == 0 else engines[::-1]:
                singles, manys = results[name]
                order = (1, args.clients) if i % 2 == 0 else (args.clients, 1)
                for n in order:
                    r = measure_round(url, proc.pid, n, args.tokens, 100 if n == 1 else 200, stream)
                    (singles if n == 1 else manys).append(r)
    finally:
        for _, proc, _ in engines:
            stop(proc)

    print(
        f"model: {args.model or 'default'}  threads: {args.threads or 'all'}  tokens/client: {args.tokens}  "
        f"rounds: {args.rounds}  client: {args.client}  cpus: {len(os.sched_getaffinity(0))}"
    )
    tps = {name: report(name, args.clients, *results[name]) for name, _, _ in engines}
    if args.ref_server:
        # The engines measured round by round, alternating: the ratio per round, then its median.
        for i, clients in ((0, 1), (1, args.clients)):
            ratios = [a / b for a, b in zip(tps["llamacy"][i], tps["llama-server"][i], strict=True)]
            print(
                f"llamacy / llama-server at {clients} client{'s' if clients > 1 else ''}: "
                f"{statistics.median(ratios):.2f}x (median of the rounds' ratios; range {min(ratios):.2f}-"
                f"{max(ratios):.2f}x; per round: " + " ".join(f"{r:.2f}" for r in ratios) + ")"
            )


if __name__ == "__main__":
    try:
        main()
    except RuntimeError as e:  # a server's error, in one line (main's finally has stopped the servers)
        sys.exit(f"bench_server: {e}")
