"""Token sampling: logit bias → penalties → top-k → top-p → min-p → temperature → draw.

The chain and each step's rule follow the reference engine's common sampler (llama.cpp,
src/llama-sampling.cpp: llama_sampler_penalties/top_k/top_p/min_p/temp/dist), so that the same settings
mean the same thing here and there:

- logit_bias (OpenAI's): a number in [-100, 100] added to the logit of each token id it names, before
  everything else (llama.cpp's chain starts with its logit-bias sampler too); -100 all but bans a token.
- penalties act on the (biased) logits of the tokens seen in the last `repeat_last_n` ids of the history
  (prompt + generated, as llama.cpp feeds the prompt to its sampler too): a logit ≤ 0 is multiplied by
  `repeat_penalty`, a positive one divided by it; then `count * frequency_penalty + presence_penalty` is
  subtracted (OpenAI's definition; count = occurrences in the window).
- top-k keeps the k largest logits (0 = off).
- top-p keeps the smallest prefix of the candidates, sorted by probability, whose cumulative probability
  reaches `top_p` (probabilities over the candidates left by top-k, before temperature; 1 = off).
- min-p keeps the candidates whose probability is at least `min_p` times the largest one, tested in logit
  space as llama.cpp does: logit ≥ max_logit + ln(min_p) (0 = off).
- temperature divides the logits of the survivors; 0 means greedy: the argmax of the penalized logits.
- the draw is one uniform double from numpy's PCG64 generator, inverted through the cumulative
  distribution of the candidates in their canonical order.

Where llama.cpp leaves the order of equal logits to std::sort, we fix it: candidates are ordered by logit,
descending, then by token id, ascending. Greedy therefore picks the lowest id among equal maxima, and a
seeded run is reproducible bit for bit. Arithmetic after the penalties is float64 (llama.cpp: float32),
which only matters for cut-offs that fall within rounding error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real

import numpy as np

from llamacy.errors import UsageError
from llamacy.kernels.topk import MAX_K, top_k

# Above these, a value is almost certainly a typo (and would make the chain degenerate).
MAX_TEMPERATURE = 100.0
MAX_REPEAT_PENALTY = 100.0
# OpenAI's documented range for presence/frequency penalties.
MAX_OPENAI_PENALTY = 2.0
MAX_SEED = 2**64 - 1
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: [-100, 100]

# When top-k is off, top-p looks at the best `_TOP_P_FIRST_WINDOW` candidates first and widens the window
# (×8) only if their cumulative probability has not reached top_p: no full sort of a 262k vocabulary.
_TOP_P_FIRST_WINDOW = 64

_NAN_MESSAGE = "logits contain NaN: the forward pass produced invalid values"
_INF_MESSAGE = "logits contain +inf or are all -inf: nothing sensible to sample"


def _is_real(x: object) -> bool:
    return isinstance(x, Real) and not isinstance(x, bool)


def _is_int(x: object) -> bool:
    return isinstance(x, Integral) and not isinstance(x, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. Defaults are the reference engine's (llama.cpp common_params)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit

    def validate(self) -> None:
        """Raise UsageError (one line, naming the option) for a value the chain cannot use."""

        def real_in(name: str, value: object, lo: float, hi: float, lo_open: bool, meaning: str) -> None:
            ok = _is_real(value) and math.isfinite(float(value))  # type: ignore[arg-type]
            if ok:
                v = float(value)  # type: ignore[arg-type]
                ok = (v > lo if lo_open else v >= lo) and v <= hi
            if not ok:
                bracket = "(" if lo_open else "["
                raise UsageError(
                    f"{name} must be a number in {bracket}{lo:g}, {hi:g}]{meaning}, got {value!r}"
                )

        real_in("temperature", self.temperature, 0.0, MAX_TEMPERATURE, False, " (0 = greedy)")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise UsageError(f"top_k must be an integer ≥ 0 (0 = off), got {self.top_k!r}")
        real_in("top_p", self.top_p, 0.0, 1.0, True, " (1 = off)")
        real_in("min_p", self.min_p, 0.0, 1.0, False, " (0 = off)")
        real_in("repeat_penalty", self.repeat_penalty, 0.0, MAX_REPEAT_PENALTY, True, " (1 = off)")
        if not _is_int(self.repeat_last_n) or self.repeat_last_n < -1:
            raise UsageError(
                f"repeat_last_n must be an integer ≥ -1 (-1 = whole context, 0 = off), got {self.repeat_last_n!r}"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            real_in(name, getattr(self, name), -MAX_OPENAI_PENALTY, MAX_OPENAI_PENALTY, False, " (0 = off)")
        if not isinstance(self.logit_bias, dict):
            raise UsageError(f"logit_bias must map token ids to numbers, got {self.logit_bias!r}")
        for tid, bias in self.logit_bias.items():
            if not _is_int(tid) or tid < 0:
                raise UsageError(f"logit_bias keys must be token ids (integers ≥ 0), got {tid!r}")
            real_in(f"logit_bias[{tid}]", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS, False, "")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise UsageError(
                f"seed must be an integer in [0, 2^64-1] (omit it for a random one), got {self.seed!r}"
            )

    @property
    def greedy(self) -> bool:
        """True when the chain reduces to argmax of the penalized logits."""
        return self.temperature == 0 or self.top_k == 1


class Sampler:
    """Picks token ids from logits with one SamplingParams; owns the random state of one sequence."""

    def __init__(self, params: SamplingParams, n_vocab: int) -> None:
        params.validate()
        if not _is_int(n_vocab) or n_vocab < 1:
            raise UsageError(f"n_vocab must be a positive integer, got {n_vocab!r}")
        self.params = params
        self.n_vocab = int(n_vocab)
        bias = params.logit_bias
        if bias and max(bias) >= self.n_vocab:
            raise UsageError(
                f"logit_bias names token id {max(bias)}, outside the vocabulary [0, {self.n_vocab})"
            )
        self._bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self._bias = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        # The seed actually used; printed by the CLI so that an unseeded run can be replayed.
        self.seed: int = params.seed if params.seed is not None else int.from_bytes(os.urandom(4), "little")
        # Made on the first draw: greedy decoding never draws, and numpy.random costs ~10 ms to import.
        self._rng: np.random.Generator | None = None

    @property
    def rng(self) -> np.random.Generator:
        """The sequence's random stream (speculative verification draws from it too)."""
        if self._rng is None:
            self._rng = np.random.Generator(np.random.PCG64(self.seed))
        return self._rng

    def reset(self) -> None:
        """Restart the random stream from the seed: the next draws repeat the first ones."""
        self._rng = None

    def sample(self, logits: np.ndarray, history: Sequence[int] = (), mask: np.ndarray | None = None) -> int:
        """The next token id. `logits` (float32 [n_vocab]) is not modified; `history` = prompt + generated ids;
        `mask` (bool [n_vocab], e.g. a grammar's) allows only the tokens where it is True."""
        ids, probs = self.distribution(logits, history, mask)
        if self.params.greedy:
            return int(ids[0])
        # Inverse CDF with one double per draw, even when one candidate is left, so that the random
        # stream advances by exactly one number per sampled token.
        cdf = np.cumsum(probs)
        u = self.rng.random() * cdf[-1]
        i = int(np.searchsorted(cdf, u, side="right"))
        return int(ids[min(i, len(ids) - 1)])

    def distribution(
        self, logits: np.ndarray, history: Sequence[int] = (), mask: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates left by the chain and the probabilities the draw uses (float64, summing to 1).

        Candidates come in canonical order: logit descending, then id ascending. Greedy settings give one
        candidate with probability 1. Consumes no randomness. A `mask` sets the logits of disallowed tokens to
        -inf before anything else, so penalties, top-k and the rest see only allowed tokens.
        """
        x = self._as_row(logits)
        if len(self._bias):
            x = x.copy()  # the caller's logits stay as they were
            x[self._bias_ids] += self._bias
        if mask is not None:
            x = self._apply_mask(x, mask)
        p = self.params
        n = self.n_vocab
        k = p.top_k if 0 < p.top_k < n else n
        if p.greedy or k > MAX_K:
            x = self._apply_penalties(self._check_logits(x), history)
            if p.greedy:
                # np.argmax returns the first maximum: ties go to the lowest id.
                return np.array([int(np.argmax(x))], dtype=np.int64), np.ones(1)
        else:
            # The common chain: one pass of the top-k kernel finds the candidates and does the checks
            # (penalties keep a NaN a NaN and an infinity infinite, so checking after them is the same).
            x = self._apply_penalties(x, history)
            best = top_k(x, k)
            if best is None:
                raise ValueError(_NAN_MESSAGE)
            ids, vals = best
            if not math.isfinite(float(vals[0])):
                raise ValueError(_INF_MESSAGE)

        if k < n:
            if k > MAX_K:
                ids = _top_sorted(x, k)
                vals = x[ids]
            c = vals.astype(np.float64)
            if p.top_p < 1.0:
                ids, c = _top_p_prefix(ids, c, _softmax(c), p.top_p)
        elif p.top_p < 1.0:
            ids, c = self._top_p_full_vocab(x, p.top_p)
        elif p.min_p > 0.0:
            # No top-k, no top-p: min-p alone needs no sort, only a threshold over the vocabulary.
            mx = float(np.max(x))
            keep = np.flatnonzero(x >= mx + math.log(p.min_p))
            ids = keep[np.argsort(-x[keep], kind="stable")]
            c = x[ids].astype(np.float64)
        else:
            ids = np.argsort(-x, kind="stable")  # every token is a candidate: the one full sort
            c = x[ids].astype(np.float64)

        if p.min_p > 0.0:
            # c is sorted descending, so the survivors form a prefix; c[0] always survives.
            n_keep = int(np.count_nonzero(c >= c[0] + math.log(p.min_p)))
            ids, c = ids[:n_keep], c[:n_keep]

        return ids.astype(np.int64, copy=False), _softmax(c / p.temperature)

    # -- steps -------------------------------------------------------------------------------------------

    def _as_row(self, logits: np.ndarray) -> np.ndarray:
        x = np.asarray(logits)
        if x.shape != (self.n_vocab,):
            raise ValueError(f"logits must have shape ({self.n_vocab},), got {x.shape}")
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        return x

    def _apply_mask(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        m = np.asarray(mask)
        if m.shape != (self.n_vocab,) or m.dtype != np.bool_:
            raise ValueError(f"mask must be a bool array of shape ({self.n_vocab},), got {m.dtype} {m.shape}")
        if not m.any():
            raise ValueError("the mask allows no token")
        return np.where(m, x, np.float32(-np.inf))

    def _check_logits(self, x: np.ndarray) -> np.ndarray:
        if np.isnan(x).any():
            raise ValueError(_NAN_MESSAGE)
        if not np.isfinite(x.max()):
            raise ValueError(_INF_MESSAGE)
        return x

    def _apply_penalties(self, x: np.ndarray, history: Sequence[int]) -> np.ndarray:
        """Repeat / presence / frequency penalties over the last repeat_last_n ids; returns a copy if any."""
        p = self.params
        if (
            p.repeat_last_n == 0
            or len(history) == 0
            or (p.repeat_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0)
        ):
            return x
        window = history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history
        h = np.asarray(window, dtype=np.int64)
        if h.min() < 0 or h.max() >= self.n_vocab:
            raise ValueError(f"history holds token ids outside [0, {self.n_vocab})")
        tokens, counts = np.unique(h, return_counts=True)
        out = x.copy()
        v = out[tokens]
        # llama.cpp: multiply non-positive logits, divide positive ones, so a penalty > 1 always lowers them.
        v = np.where(v <= 0, v * np.float32(p.repeat_penalty), v / np.float32(p.repeat_penalty))
        v = v - (counts * p.frequency_penalty + p.presence_penalty).astype(np.float32)
        out[tokens] = v
        return out

    def _top_p_full_vocab(self, x: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
        """Top-p over the whole vocabulary without sorting all of it: widen a sorted window until it holds
        the cut. The probabilities are normalized over the whole vocabulary, as the full sort would."""
        mx = float(np.max(x))
        logz = mx + math.log(float(np.sum(np.exp(x.astype(np.float64) - mx))))
        n = self.n_vocab
        m = min(_TOP_P_FIRST_WINDOW, n)
        while True:
            ids = _top_sorted(x, m)
            c = x[ids].astype(np.float64)
            probs = np.exp(c - logz)
            if m == n or np.cumsum(probs)[-1] >= top_p:
                return _top_p_prefix(ids, c, probs, top_p)
            m = min(m * 8, n)


def _softmax(c: np.ndarray) -> np.ndarray:
    e = np.exp(c - c.max())
    return e / e.sum()


def _top_p_prefix(
    ids: np.ndarray, c: np.ndarray, probs: np.ndarray, top_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """The smallest prefix whose cumulative probability reaches top_p (all of it if rounding never gets
    there), as llama_sampler_top_p_apply: keep i+1 candidates at the first i with cum_sum ≥ p."""
    cum = np.cumsum(probs)
    hit = np.flatnonzero(cum >= top_p)
    n_keep = int(hit[0]) + 1 if len(hit) else len(ids)
    return ids[:n_keep], c[:n_keep]


def _top_sorted(x: np.ndarray, m: int) -> np.ndarray:
    """Ids of the m largest entries of x, ordered by value descending then id ascending.

    Among entries equal to the m-th largest value the lowest ids are taken, so the result does not depend
    on the selection algorithm. Cost O(n) with a small constant and no sort of the vocabulary: the m-th
    largest value of a strided subsample is a lower bound for the m-th largest of x, so every winner is
    among the (about m * stride) entries at or above it, and the exact selection runs on those only.
    """
    n = len(x)
    if m >= n:
        return np.argsort(-x, kind="stable")
    pool: np.ndarray | None = None  # ids of the entries still in the running (None: all of them)
    vals = x
    stride = math.isqrt(n // m)
    if stride >= 4:
        sub = x[::stride]
        if len(sub) > m:
            bound = np.partition(sub, len(sub) - m)[len(sub) - m]
            pool = np.flatnonzero(x >= bound)  # at least m entries, ascending ids
            vals = x[pool]
    nv = len(vals)
    kth = np.partition(vals, nv - m)[nv - m]  # the m-th largest value
    above = np.flatnonzero(vals > kth)  # fewer than m of them
    ties = np.flatnonzero(vals == kth)[: m - len(above)]
    sel = np.concatenate([above, ties])
    # A stable sort keeps ascending ids among equal values (ties all equal kth, below every `above`).
    sel = sel[np.argsort(-vals[sel], kind="stable")]
    return sel if pool is None else pool[sel]
