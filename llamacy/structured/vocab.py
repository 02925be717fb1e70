"""Our tokenizer as llguidance sees it: one LLTokenizer per vocabulary, built once and shared.

llguidance computes token masks from the bytes of every token. It gets them from Tokenizer.token_bytes, which
already renders byte-level BPE, SentencePiece "▁" and <0xAB> tokens as their bytes. Special tokens are marked
the way llguidance's own llama.cpp bridge marks them, with a 0xFF prefix, so that no grammar can spell them
by accident: control tokens, and user-defined ones that look like markup (`<...>`). Other user-defined tokens
are text (Gemma's "\n" and runs of spaces are user-defined). The end-of-generation ids become the EOS.

Building costs about 0.3 s for SmolLM2's 49k vocabulary and 1.5 s for Gemma's 262k, so it is done lazily (the
first constrained request) and cached for the tokenizer's lifetime.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from llamacy.tokenizer import TokenType

if TYPE_CHECKING:
    import llguidance  # imported where used (~25 ms): only constrained generation needs it

_SPECIAL_PREFIX = b"\xff"

_cache: weakref.WeakKeyDictionary[Any, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Wrapped:
    """The duck type llguidance.TokenizerWrapper reads: token bytes, special ids, BOS/EOS and encode."""

    def __init__(self, tokenizer: Any) -> None:
        n = tokenizer.n_vocab
        tokens = [tokenizer.token_bytes(i) for i in range(n)]
        types = tokenizer.token_types
        special = [
            i
            for i in range(n)
            if types[i] == TokenType.CONTROL
            or (
                types[i] == TokenType.USER_DEFINED and tokens[i].startswith(b"<") and tokens[i].endswith(b">")
            )
        ]
        for i in special:
            tokens[i] = _SPECIAL_PREFIX + tokens[i]
        self.tokens = tokens
        self.special_token_ids = special
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self._tok = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        # llguidance re-tokenizes forced text with this; special tokens written in it stay plain text.
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._tok.encode(text, add_bos=False, special=False)


def ll_tokenizer(tokenizer: Any) -> llguidance.LLTokenizer:
    """The LLTokenizer of `tokenizer` (a llamacy.tokenizer.Tokenizer), built on first use."""
    import llguidance

    with _lock:
        cached = _cache.get(tokenizer)
        if cached is None:
            eos = sorted(tokenizer.eot_ids) or ([tokenizer.eos_id] if tokenizer.eos_id is not None else [])
            cached = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped(tokenizer)), eos_token=eos)
            _cache[tokenizer] = cached
        return cached
