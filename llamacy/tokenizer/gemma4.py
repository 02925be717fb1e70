"""Gemma 4's vocabulary (`tokenizer.ggml.model == "gemma4"`): SentencePiece-style BPE ranked by merges.

llama.cpp (src/llama-vocab.cpp) loads a "gemma4" vocabulary as a BPE vocabulary (LLAMA_VOCAB_TYPE_BPE)
whatever `tokenizer.ggml.pre` says: `llama_vocab::impl::load` reads `tokenizer.ggml.merges` into its rank
table, leaves every default special id unset (they come from the file), and forces the pre-tokenizer to
"gemma4" (LLAMA_VOCAB_PRE_TYPE_GEMMA4), which sets `escape_whitespaces`; `add_bos` is forced to true even
when the file says false; `add_space_prefix` is the file's (the converter writes false). Per raw fragment
(special tokens already cut out, see vocab.SpecialSplitter) `llm_tokenizer_bpe_session::tokenize`
1. replaces every " " with "▁" (no space prefix, no other normalisation);
2. splits the text with `[^\\n]+|[\\n]+` on raw UTF-8 (`byte_encode = false`): runs of newlines and runs of
   everything else; a run of newlines that is itself a token becomes that token without merging;
3. splits each piece into UTF-8 characters and repeatedly merges the adjacent pair with the lowest merge
   rank (ties: leftmost);
4. emits each final symbol's id or, for a symbol that is not a token, the <0xXX> byte token of each of its
   bytes (a byte without one is dropped).
Decoding (`token_to_piece`, BPE with escape_whitespaces): "▁" -> " " in normal tokens, <0xXX> -> the byte.

Step 3-4 are the BPE model of `tokenizers` with byte fallback, which we use for speed; an extra unknown
token (id n_vocab) marks a character it cannot spell (no token and no byte tokens), and such pieces go
through `merge_reference`, a direct port of llama.cpp's loop.
"""

from __future__ import annotations

import heapq
import logging
import re
from typing import TYPE_CHECKING

from llamacy.errors import UnsupportedModelError
from llamacy.tokenizer.bpe import UNKNOWN_CHAR, split_merges
from llamacy.tokenizer.vocab import Vocab

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

log = logging.getLogger("llamacy")

PIECES = re.compile(r"[^\n]+|\n+")


class Gemma4Encoder:
    """Raw text (no special tokens) -> ids, as llama.cpp encodes it for a "gemma4" vocabulary."""

    def __init__(self, vocab: Vocab, merges: list[str]) -> None:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models

        pairs = split_merges(merges)
        self.vocab = vocab
        self.ranks = {pair: i for i, pair in reversed(list(enumerate(pairs)))}  # first rank wins
        known = vocab.token_to_id
        self.known = known
        unk = UNKNOWN_CHAR
        while unk in known:
            unk += "_"
        table = {**known, unk: vocab.n_vocab}
        options = {"unk_token": unk, "fuse_unk": False, "byte_fallback": True}
        try:
            model = models.BPE(vocab=table, merges=pairs, **options)
        except Exception:
            # `tokenizers` refuses merges of (or into) unknown tokens; llama.cpp's loop keeps them, and
            # merge_reference does too, so pieces they could touch are sent there (see _needs_reference).
            kept = [(a, b) for a, b in pairs if a in known and b in known and a + b in known]
            log.warning("gemma4 vocabulary: %d merges use tokens it lacks", len(pairs) - len(kept))
            model = models.BPE(vocab=table, merges=kept, **options)
            self._odd_merges = True
        else:
            self._odd_merges = False
        self.hf: HFTokenizer = HFTokenizer(model)  # no normaliser, no pre-tokenizer: we do steps 1-2

    def encode(self, fragment: str) -> list[int]:
        out: list[int] = []
        text = fragment.replace(" ", "\u2581")
        known, unknown = self.known, self.vocab.n_vocab
        for piece in PIECES.findall(text):
            if piece[0] == "\n":
                tid = known.get(piece)
                if tid is not None:
                    out.append(tid)
                    continue
            if self._odd_merges:
                out.extend(merge_reference(self.vocab, self.ranks, piece))
                continue
            ids = self.hf.encode(piece, add_special_tokens=False).ids
            out.extend(ids if unknown not in ids else merge_reference(self.vocab, self.ranks, piece))
        return out


def merge_reference(vocab: Vocab, ranks: dict[tuple[str, str], int], piece: str) -> list[int]:
    """llama.cpp's BPE merge loop for one piece (llm_tokenizer_bpe_session::tokenize), in Python."""
    symbols = list(piece)
    n = len(symbols)
    prev = list(range(-1, n - 1))
    nxt = [*range(1, n), -1]
    heap: list[tuple[int, int, int, str]] = []

    def push(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        rank = ranks.get((symbols[left], symbols[right]))
        if rank is not None:
            heapq.heappush(heap, (rank, left, right, symbols[left] + symbols[right]))

    for i in range(1, n):
        push(i - 1, i)
    while heap:
        _, left, right, text = heapq.heappop(heap)
        if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != text:
            continue  # outdated
        symbols[left], symbols[right] = text, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    known = vocab.token_to_id
    out: list[int] = []
    for sym in symbols:
        if not sym:
            continue
        tid = known.get(sym)
        if tid is not None:
            out.append(tid)
            continue
        for b in sym.encode("utf-8"):
            tid = known.get(f"<0x{b:02X}>")
            if tid is not None:
                out.append(tid)
    return out


def build(vocab: Vocab, merges: list[str] | None) -> Gemma4Encoder:
    if not merges:
        raise UnsupportedModelError("the gemma4 vocabulary has no merges (tokenizer.ggml.merges)")
    return Gemma4Encoder(vocab, list(merges))
