"""Context shift (issue #28): what to keep when a sequence outgrows its context. llama.cpp's rules; the kept
tokens are evaluated again rather than re-rotated, which is exact for every layer kind (full, sliding window,
shared).

- A prompt of n_ctx tokens or more: the first `keep` tokens, then the prompt without whole blocks of
  (n_ctx - keep) / 2 tokens from after them, so that its end, where generation continues, is kept.
- Generation that fills the context: the first `keep` tokens, then the newer half of the rest.
"""

from __future__ import annotations

from collections.abc import Sequence


def truncate_prompt(ids: Sequence[int], n_ctx: int, keep: int) -> list[int]:
    """The prompt fitted into fewer than n_ctx tokens; keep -1: as many first tokens as can be (half)."""
    ids = list(ids)
    if len(ids) < n_ctx:
        return ids
    keep = n_ctx // 2 if keep < 0 else min(keep, n_ctx // 2)
    block = max(1, (n_ctx - keep) // 2)
    erased = (len(ids) - keep - block) // block
    return ids[:keep] + ids[keep + erased * block :]


def shifted(tokens: Sequence[int], keep: int) -> list[int]:
    """A full context's tokens after a shift: the first `keep` (-1: as many as can be, half), and the newer
    half of the rest."""
    tokens = list(tokens)
    keep = len(tokens) // 2 if keep < 0 else min(keep, len(tokens) // 2)
    discard = max(1, (len(tokens) - keep) // 2)
    return tokens[:keep] + tokens[keep + discard :]
