"""pp/tg benchmarks measured the way the reference engine's bench tool measures them.

pp<N>: N random prompt tokens evaluated as one batch from an empty cache.
tg<N>: N single-token steps from an empty cache.
With a depth D (llama-bench's -d), each test starts from a cache holding D random tokens instead: they are
evaluated once, outside the timing, and every run truncates the cache back to them.
Each test runs once as warm-up, then `repetitions` times; t/s is tokens / seconds of each run.
"""

from __future__ import annotations

import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


@dataclass
class BenchResult:
    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    n_batch: int
    n_threads: int
    n_prompt: int
    n_gen: int
    test_time: str
    avg_ns: int
    stddev_ns: int
    avg_ts: float
    stddev_ts: float
    samples_ns: list[int] = field(default_factory=list)
    samples_ts: list[float] = field(default_factory=list)
    cpu_info: str = ""
    backends: str = "CPU"
    n_depth: int = 0

    @property
    def test(self) -> str:
        name = f"pp{self.n_prompt}" if self.n_prompt else f"tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def model_type(llm: Any) -> str:
    md = llm.metadata
    label = (
        md.get("general.size_label") or f"{sum(t.n_elements for t in llm.gguf.tensors.values()) / 1e6:.0f}M"
    )
    ftype = FILE_TYPES.get(md.get("general.file_type", -1), "?")
    return f"{llm.config.arch} {label} {ftype}"


def _fill_depth(llm: Any, n_depth: int, rng: np.random.Generator) -> None:
    """Evaluate n_depth random tokens into sequence 0 (in batches of llm.n_batch), untimed."""
    model = llm.model
    model.kv.clear(0)
    ids = rng.integers(0, llm.config.n_vocab, n_depth).tolist()
    step = max(1, llm.n_batch)
    for i in range(0, n_depth, step):
        model.eval(ids[i : i + step], logits="last")
    model.kv.checkpoint(0)  # a recurrent state's copy at the depth, for the truncates back to it


def _run_once(llm: Any, n_prompt: int, n_gen: int, rng: np.random.Generator, n_depth: int = 0) -> float:
    model = llm.model
    if n_depth:
        model.kv.truncate(0, n_depth)  # back to the depth filled by _fill_depth
    else:
        model.kv.clear(0)
    vocab = llm.config.n_vocab
    t0 = time.perf_counter_ns()
    if n_prompt:
        model.eval(rng.integers(0, vocab, n_prompt).tolist(), logits="last")
    for _ in range(n_gen):
        model.eval([int(rng.integers(0, vocab))], logits="last")
    return time.perf_counter_ns() - t0


def run_test(
    llm: Any, n_prompt: int, n_gen: int, repetitions: int, seed: int = 0, n_depth: int = 0
) -> BenchResult:
    rng = np.random.default_rng(seed)
    n = n_prompt or n_gen
    if n + n_depth > llm.n_ctx:
        from llamacy.errors import UsageError

        raise UsageError(f"test of {n} tokens at depth {n_depth} does not fit --ctx-size {llm.n_ctx}")
    if n_depth:
        _fill_depth(llm, n_depth, rng)
        forward = llm.model.forward
        if hasattr(forward, "profile_reset"):
            forward.profile_reset()  # a --profile covers the test, not the fill
    _run_once(llm, n_prompt, n_gen, rng, n_depth)  # warm-up: page in the weights, size the caches
    samples = [_run_once(llm, n_prompt, n_gen, rng, n_depth) for _ in range(repetitions)]
    ts = [n / (s / 1e9) for s in samples]
    return BenchResult(
        model_filename=str(llm.model_path),
        model_type=model_type(llm),
        model_size=sum(t.n_bytes for t in llm.gguf.tensors.values()),
        model_n_params=int(sum(t.n_elements for t in llm.gguf.tensors.values())),
        n_batch=llm.model.forward.ubatch_size,
        n_threads=llm.n_threads,
        n_prompt=n_prompt,
        n_gen=n_gen,
        test_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        avg_ns=int(statistics.mean(samples)),
        stddev_ns=int(statistics.stdev(samples)) if len(samples) > 1 else 0,
        avg_ts=statistics.mean(ts),
        stddev_ts=statistics.stdev(ts) if len(ts) > 1 else 0.0,
        samples_ns=[int(s) for s in samples],
        samples_ts=ts,
        cpu_info=cpu_name(),
        n_depth=n_depth,
    )


def _size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def markdown(results: list[BenchResult]) -> str:
    head = "| model | size | params | quant | threads | test | t/s |"
    lines = [head, "| --- | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in results:
        name, _, quant = r.model_type.rpartition(" ")
        lines.append(
            f"| {name} | {_size(r.model_size)} | {_params(r.model_n_params)} | {quant} | {r.n_threads} "
            f"| {r.test} | {r.avg_ts:.2f} ± {r.stddev_ts:.2f} |"
        )
    return "\n".join(lines)


def csv(results: list[BenchResult]) -> str:
    import csv as csvmod
    import io

    buf = io.StringIO()
    fields = [k for k in BenchResult.__dataclass_fields__ if not k.startswith("samples")]
    w = csvmod.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in results:
        w.writerow(r.to_dict())
    return buf.getvalue()
