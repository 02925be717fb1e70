"""Speculative decoding: guess the next tokens cheaply, verify them in one batched forward step.

- Speculation: the options (how drafts are made, how many per step), validated with one-line errors.
- NgramDrafter (prompt lookup): the last n tokens of the history (prompt + generated) are looked up among
  earlier positions of that history; the tokens that followed the latest earlier occurrence are the draft.
  Edits of given text, code rewrites and quotations repeat long runs of the prompt, which this finds.
- MtpDrafter: the model's own multi-token-prediction block (Qwen3.5, Qwen3-Next; model/mtp.py) drafts
  from the model's last hidden state: no second model, and drafts that agree with the model far more often
  than a smaller model's would, for the cost of one layer and the output head per drafted token.
- verify_token: the token a sequence emits at a drafted position, given the target model's logits there.
  Greedy: the argmax, exactly as without drafts (a draft is accepted iff it equals it). Sampling: the
  speculative rejection rule (Leviathan et al. 2023, Chen et al. 2023), which leaves the target
  distribution exact: accept draft x with probability min(1, p(x)/q(x)); on rejection draw from
  max(0, p - q), renormalised. A prompt-lookup draft is deterministic (q is a point mass on x), so the
  rule becomes: accept with probability p(x), else draw from p with x removed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llamacy.errors import UsageError
from llamacy.sampling import Sampler, SamplingParams

MODES = ("ngram", "draft", "mtp")
DEFAULT_DRAFT_MAX = 16
# A multi-token-prediction block is trained to predict one token ahead; chained further, its guesses fall
# off, and each costs the output head.
DEFAULT_MTP_DRAFT_MAX = 3
# A chained guess below this probability (under the block's own distribution) ends the draft.
MTP_P_MIN = 0.5
# Drafting with the block pauses while it brings fewer accepted tokens than it costs: for 1, 2, 4, ... steps
# (up to this many), so that a block that is wrong on this text costs little more than plain decoding.
MTP_MAX_PAUSE = 64
MTP_EMA = 0.25  # the weight of the newest step in the running acceptance and cost
DEFAULT_NGRAM = 3
MAX_DRAFT = 64


@dataclass(frozen=True)
class Speculation:
    """mode "ngram": prompt lookup; "draft": a smaller model with the same vocabulary (draft_model, a path
    or a known name) proposes; "mtp": the model's own multi-token-prediction block. draft_max: the most
    tokens drafted per step. ngram: the length of the n-gram looked up (shorter ones match more often, by
    chance too)."""

    mode: str = "ngram"
    draft_max: int = DEFAULT_DRAFT_MAX
    ngram: int = DEFAULT_NGRAM
    draft_model: str | None = None

    def validate(self) -> Speculation:
        if self.mode not in MODES:
            raise UsageError(f"--speculate must be one of {', '.join(MODES)}, got {self.mode!r}")
        if (self.mode == "draft") != (self.draft_model is not None):
            raise UsageError("--speculate draft needs --draft-model PATH, and --draft-model goes with it")
        for name, value, hi in (("draft_max", self.draft_max, MAX_DRAFT), ("ngram", self.ngram, 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise UsageError(
                    f"{name} (--{name.replace('_', '-')}) must be an integer in [1, {hi}], got {value!r}"
                )
        return self


def speculation(
    mode: str | None, draft_max: int | None = None, ngram: int | None = None, draft_model: str | None = None
) -> Speculation | None:
    """Speculation from the command-line / API options (None: speculation off)."""
    if mode is None or mode == "none":
        if draft_model is not None:
            raise UsageError("--draft-model goes with --speculate draft")
        return None
    default_max = DEFAULT_MTP_DRAFT_MAX if mode == "mtp" else DEFAULT_DRAFT_MAX
    return Speculation(
        mode,
        default_max if draft_max is None else draft_max,
        DEFAULT_NGRAM if ngram is None else ngram,
        None if draft_model is None else str(draft_model),
    ).validate()


class _Adaptive:
    """The draft length adapts to acceptance: each drafted token costs a fraction of a decoding step to
    verify, so it doubles (up to draft_max) while drafts are accepted whole and falls back to one more than
    the accepted count after a rejection."""

    def __init__(self, draft_max: int) -> None:
        self.draft_max = draft_max
        self.length = min(4, draft_max)
        # The draft distribution q of each drafted token (ids, probs), None where q is a point mass.
        self.probs: list[tuple[np.ndarray, np.ndarray] | None] = []

    def feedback(self, drafted: int, accepted: int) -> None:
        """How the last draft fared: adapt the next draft's length."""
        if drafted:
            self.length = min(self.draft_max, 2 * self.length) if accepted == drafted else accepted + 1


class NgramDrafter(_Adaptive):
    """Prompt-lookup drafts over a growing history. It keeps, incrementally, the latest position that
    followed each n-gram, so a proposal costs O(n) whatever the history's length. With the adaptive
    length, a chance match in text that repeats nothing costs one token."""

    def __init__(self, spec: Speculation) -> None:
        super().__init__(spec.draft_max)
        self.n = spec.ngram
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> the latest position that followed it
        self._indexed = 0  # positions below this one are in _next

    def propose(self, history: Sequence[int], limit: int) -> list[int]:
        """Up to min(current length, limit) tokens likely to follow history; [] when nothing matches."""
        n, end = self.n, len(history)
        # Index every position before the end: the last n-gram must match an *earlier* occurrence.
        for j in range(max(self._indexed, n), end):
            self._next[tuple(history[j - n : j])] = j
        self._indexed = end
        limit = min(limit, self.length)
        if limit <= 0 or end <= n:
            return []
        j = self._next.get(tuple(history[end - n :]))
        return [] if j is None else list(history[j : min(j + limit, end)])


class ModelDrafter(_Adaptive):
    """Drafts from a smaller model with the same vocabulary (a llamacy.model.Model of one sequence): its
    cache follows the history (the common prefix is kept), and it samples draft_len tokens one at a time
    with the request's sampling settings and its own random stream, recording each token's distribution."""

    def __init__(self, model: Any, spec: Speculation, params: SamplingParams, seed: int) -> None:
        super().__init__(spec.draft_max)
        self.model = model
        self.sampler = Sampler(replace(params, seed=seed), model.cfg.n_vocab)

    def propose(self, history: Sequence[int], limit: int) -> list[int]:
        limit = min(limit, self.length, self.model.n_ctx - len(history))
        self.probs = []
        if limit <= 0:
            return []
        keep = self.model.kv.reuse_prefix(0, history)
        logits = self.model.eval(list(history[keep:]), logits="last")
        seen, draft = list(history), []
        for _ in range(limit):
            tok, q = _draw(self.sampler, logits, seen)
            draft.append(tok)
            self.probs.append(q)
            seen.append(tok)
            if len(draft) < limit:
                logits = self.model.eval([tok], logits="last")
        return draft


class MtpDrafter(_Adaptive):
    """Drafts from the model's own multi-token-prediction block (an MtpHead, model/mtp.py), in the
    block's sequence `slot` (the model's own). The generator feeds it every position the model evaluated
    and kept (`observe`, after each step); a draft starts from the last of them and chains on the block's
    own output, with the request's sampling settings and its own random stream. A chained guess whose
    probability falls below MTP_P_MIN ends the draft.

    Each drafted token costs head.draft_cost of a plain step (mtp.py: the block's layer, the output head,
    the row that verifies it). While the running count of accepted tokens per drafting step is below the
    running cost of its drafts, drafting pauses, for twice as many steps each time it still does not pay
    (up to MTP_MAX_PAUSE), and the pause goes back to one step once it does. Both counts follow from the
    acceptance alone, so whether a step drafts is as deterministic as the drafts are."""

    def __init__(self, head: Any, slot: int, spec: Speculation, params: SamplingParams, seed: int) -> None:
        super().__init__(spec.draft_max)
        self.head = head
        self.slot = slot
        self.sampler = Sampler(replace(params, seed=seed), head.n_vocab)
        self._ready: tuple[int, np.ndarray] | None = None  # (the token the block last read, its output)
        self._gain = 1.0  # running accepted tokens per drafting step: optimistic, so that it drafts first
        self._cost = 0.0  # running cost of a step's drafts, in plain steps
        self._pause = 0  # steps left without drafting
        self._backoff = 1  # the next pause's length
        self.paused_steps = 0  # steps it sat out (statistics, tests)

    def feedback(self, drafted: int, accepted: int) -> None:
        super().feedback(drafted, accepted)
        if not drafted:
            return
        self._gain += MTP_EMA * (accepted - self._gain)
        self._cost += MTP_EMA * (drafted * self.head.draft_cost - self._cost)
        if self._gain < self._cost:
            self._pause, self._backoff = self._backoff, min(MTP_MAX_PAUSE, 2 * self._backoff)
        else:
            self._backoff = 1

    def observe(self, tokens: Sequence[int], nxt: int, p0: int, rows: np.ndarray) -> None:
        """After a step: the model kept positions p0 .. p0 + len(rows) - 1 (rows: their final hidden
        states); tokens: what its memory holds, nxt: the token it evaluates next."""
        h = self.head.observe(self.slot, tokens, nxt, p0, rows)
        self._ready = None if h is None else (nxt, h)

    def propose(self, history: Sequence[int], limit: int) -> list[int]:
        limit = min(limit, self.length)
        self.probs = []
        if self._pause:
            self._pause -= 1
            self.paused_steps += 1
            return []
        # The block must have read the token about to be evaluated (history's last): else nothing to say.
        if limit <= 0 or self._ready is None or self._ready[0] != history[-1]:
            return []
        h = self._ready[1]
        logits = self.head.head(h)
        seen, draft = list(history), []
        try:
            for _ in range(limit):
                tok, q = _draw(self.sampler, logits, seen)
                if draft and _probability(logits, tok, q) < MTP_P_MIN:
                    break
                draft.append(tok)
                self.probs.append(q)
                seen.append(tok)
                if len(draft) < limit:
                    logits, h = self.head.chain(self.slot, tok, h)
        finally:
            self.head.drop_chain(self.slot)
        return draft


def _draw(sampler: Sampler, logits: np.ndarray, seen: list[int]) -> tuple[int, tuple | None]:
    """A drafted token and its draft distribution (ids, probs); None for a greedy (point-mass) draft."""
    if sampler.params.greedy:
        return sampler.sample(logits, seen), None
    ids, probs = sampler.distribution(logits, seen)
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, sampler.rng.random() * cdf[-1], side="right"))
    return int(ids[min(i, len(ids) - 1)]), (ids, probs)


def _probability(logits: np.ndarray, tok: int, q: tuple | None) -> float:
    """The drafter's own probability of tok: from its draft distribution, else the softmax of its logits."""
    if q is not None:
        hit = np.flatnonzero(q[0] == tok)
        return float(q[1][hit[0]]) if len(hit) else 0.0
    x = logits.astype(np.float64)
    return float(1.0 / np.exp(x - x[tok]).sum())


def same_vocabulary(target: Any, draft: Any, name: str) -> None:
    """Refuse, in one line, a draft model whose vocabulary differs from the target's (a Llama each)."""
    key = "tokenizer.ggml.tokens"
    if draft.n_vocab != target.n_vocab or draft.metadata.get(key) != target.metadata.get(key):
        raise UsageError(
            f"draft model {name} has a different vocabulary from the model's ({draft.n_vocab} tokens "
            f"against {target.n_vocab}): speculative decoding needs the same tokens"
        )


def verify_token(
    sampler: Sampler,
    logits: np.ndarray,
    history: Sequence[int],
    draft: int,
    q: tuple[np.ndarray, np.ndarray] | None = None,
) -> int:
    """The token emitted at a position where `draft` was proposed, distributed exactly as
    sampler.sample(logits, history) would be. q: the draft's distribution (ids, probs); None: a point mass."""
    if sampler.params.greedy:
        return sampler.sample(logits, history)  # deterministic: identical to decoding without drafts
    ids, probs = sampler.distribution(logits, history)
    if q is not None:
        return _verify_sampled(sampler, ids, probs, draft, q)
    hit = np.flatnonzero(ids == draft)
    p = float(probs[hit[0]]) if len(hit) else 0.0
    rng = sampler.rng
    if p > 0.0 and rng.random() < p:
        return draft
    # Rejected: the residual max(0, p - q) with q a point mass on the draft is p without it.
    rest = probs.copy()
    if len(hit):
        rest[hit[0]] = 0.0
    cdf = np.cumsum(rest)
    u = rng.random() * cdf[-1]
    # u < cdf[-1], so the first entry whose cdf exceeds u has mass: never the removed draft.
    i = int(np.searchsorted(cdf, u, side="right"))
    return int(ids[min(i, len(ids) - 1)])


def _verify_sampled(
    sampler: Sampler, ids: np.ndarray, probs: np.ndarray, draft: int, q: tuple[np.ndarray, np.ndarray]
) -> int:
    """The rule for a sampled draft: accept with min(1, p(x)/q(x)), else draw from max(0, p - q)."""
    n = sampler.n_vocab
    p_full = np.zeros(n)
    p_full[ids] = probs
    q_full = np.zeros(n)
    q_full[q[0]] = q[1]
    rng = sampler.rng
    if rng.random() * q_full[draft] < p_full[draft]:
        return draft
    rest = np.maximum(p_full - q_full, 0.0)
    cand = np.flatnonzero(rest)  # a rejection means p(x) < q(x), so p > q somewhere else (but rounding)
    if not len(cand):
        return draft
    cdf = np.cumsum(rest[cand])
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return int(cand[min(i, len(cand) - 1)])
