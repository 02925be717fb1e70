"""The native reference engine (llama.cpp's own binaries, built by build_reference.sh) as a benchmark peer.

A llama-bench binary is found from an explicit path, else the LLAMACY_REF_BENCH environment variable; its
figures come from its JSON output and carry the commit it was built from, so that every table says which
reference it compares with. A build from a source copy without git history reports its commit as
"unknown"; LLAMACY_REF_COMMIT then names it.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENV_BENCH = "LLAMACY_REF_BENCH"
ENV_COMMIT = "LLAMACY_REF_COMMIT"


@dataclass(frozen=True)
class RefResult:
    avg_ts: float
    stddev_ts: float
    commit: str


def find_bench(path: str | None) -> Path | None:
    """The llama-bench to compare with: `path`, else $LLAMACY_REF_BENCH, else None. A path that is not an
    executable file is an error, not a silent fallback to no reference."""
    chosen = path or os.environ.get(ENV_BENCH) or None
    if chosen is None:
        return None
    p = Path(chosen).expanduser()
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise SystemExit(f"reference llama-bench {p} is not an executable file (see build_reference.sh)")
    return p


def run_bench(
    binary: Path, model: Path, n_prompt: int, n_gen: int, threads: int, reps: int, n_depth: int = 0
) -> RefResult:
    """One llama-bench test (pp<n_prompt> or tg<n_gen>, not both), CPU only, `reps` runs after its warm-up;
    n_depth: tokens already in the cache (its -d; it fills them once, untimed, and restores them per run)."""
    cmd = [str(binary), "-m", str(model), "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads)]
    cmd += ["-r", str(reps), "-ngl", "0", "-o", "json"]
    if n_depth:
        cmd += ["-d", str(n_depth)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [
        r
        for r in json.loads(out)
        if r["n_prompt"] == n_prompt and r["n_gen"] == n_gen and int(r.get("n_depth", 0)) == n_depth
    ]
    if len(rows) != 1:
        raise RuntimeError(f"llama-bench gave {len(rows)} results for pp{n_prompt}/tg{n_gen}: {cmd}")
    r = rows[0]
    commit = str(r.get("build_commit") or "unknown")
    if commit == "unknown":
        commit = os.environ.get(ENV_COMMIT, "unknown commit")
    return RefResult(float(r["avg_ts"]), float(r["stddev_ts"]), commit)
