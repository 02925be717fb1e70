"""Perplexity the way the reference engine's perplexity tool computes it.

The text is tokenized once (with BOS where the model adds one) and cut into chunks of n_ctx tokens; each
chunk is evaluated from an empty cache with its first token replaced by BOS (when the model adds BOS),
and only the second half of each chunk is scored, so every scored token sees at least n_ctx/2 of context.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llamacy.errors import UsageError


@dataclass
class PerplexityResult:
    ppl: float
    uncertainty: float  # the reference tool's "+/-": standard error of the mean NLL, scaled by ppl
    n_chunks: int
    n_ctx: int
    n_scored: int
    running: list[float] = field(default_factory=list)  # the estimate after each chunk


def _token_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """-log softmax(logits)[target] per row, in float64 for a stable sum over thousands of tokens."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    logz = np.log(np.exp(x - m).sum(axis=1)) + m[:, 0]
    return logz - x[np.arange(len(targets)), targets]


def perplexity(
    llm: Any,
    text: str,
    n_ctx: int,
    max_chunks: int | None = None,
    on_chunk: Callable[[int, float], None] | None = None,
) -> PerplexityResult:
    if n_ctx < 8:
        raise UsageError(f"perplexity needs a context of at least 8 tokens, got {n_ctx}")
    if n_ctx > llm.n_ctx:
        raise UsageError(f"-c {n_ctx} exceeds the loaded context of {llm.n_ctx}")
    add_bos = bool(llm.tokenizer.add_bos)
    tokens = llm.tokenize(text, add_bos=add_bos, special=False)
    n_chunks = len(tokens) // n_ctx
    if max_chunks is not None:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks < 1 or len(tokens) < 2 * n_ctx:
        raise UsageError(
            f"the text has {len(tokens)} tokens; perplexity with -c {n_ctx} needs at least {2 * n_ctx}"
        )
    first = n_ctx // 2
    nll = nll2 = 0.0
    count = 0
    running: list[float] = []
    for i in range(n_chunks):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        targets = np.asarray(chunk[first + 1 :], dtype=np.int64)
        if add_bos:
            chunk[0] = llm.tokenizer.bos_id
        logits = llm.logits(chunk)[first : n_ctx - 1]
        per_token = _token_nll(logits, targets)
        nll += float(per_token.sum())
        nll2 += float((per_token**2).sum())
        count += len(per_token)
        running.append(math.exp(nll / count))
        if on_chunk is not None:
            on_chunk(i, running[-1])
    mean = nll / count
    var = nll2 / count - mean * mean
    ppl = math.exp(mean)
    err = math.sqrt(var / (count - 1)) * ppl if var > 0 and count > 1 else 0.0
    return PerplexityResult(ppl, err, n_chunks, n_ctx, count, running)
