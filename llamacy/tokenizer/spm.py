"""SentencePiece vocabularies (`tokenizer.ggml.model == "llama"`) through the `sentencepiece` library.

llama.cpp does not run sentencepiece: its SPM tokenizer (llm_tokenizer_spm_session) is its own version of
the BPE merge loop over the vocabulary scores. Per raw fragment (special tokens already cut out) it
1. prepends one space when `add_space_prefix` is set and the fragment starts the text or follows a special
   token, and replaces every " " with "▁" -- no other normalisation, no collapsing of repeated spaces;
2. splits the fragment into UTF-8 characters and repeatedly merges the adjacent pair whose concatenation
   is a token with the highest score (ties: leftmost), whatever that token's type;
3. emits each final symbol's id, or the byte tokens <0xXX> of a symbol that is not a token.

A sentencepiece BPE model does the same merge loop when it is built as follows: every token is a NORMAL
piece (so control and user-defined texts merge exactly as in llama.cpp; user-defined pieces would
otherwise be matched greedily first), except the 256 byte tokens, which are BYTE pieces for byte
fallback; a normaliser that does nothing (identity, no dummy prefix, no whitespace removal or escaping:
step 1 is ours). sentencepiece insists on one UNKNOWN piece, so an extra one is appended after the real
vocabulary; it can only come out when a character is neither a token nor byte-encodable, and then the
fragment goes through `merge_reference`, a direct port of llama.cpp's loop.

The model proto is serialised by hand (five fields; no protobuf dependency). For Gemma's 262,144 tokens
that takes a noticeable fraction of start-up, so large vocabularies' protos are cached in
$XDG_CACHE_HOME/llamacy/tokenizers (or ~/.cache/llamacy/tokenizers), keyed by the caller's identity of
the file. Small ones build in milliseconds and are not cached (tests write many tiny models).
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llamacy.catalog import cache_dir
from llamacy.errors import UnsupportedModelError
from llamacy.tokenizer.vocab import TokenType, Vocab

if TYPE_CHECKING:
    import sentencepiece

log = logging.getLogger("llamacy")

_CACHE_VERSION = "spm-proto-1"  # bump when the proto layout below changes
_CACHE_MIN_VOCAB = 32768  # below this, building is cheaper than a cache file is worth
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")

# Protobuf wire-format tags of the fields we write (sentencepiece_model.proto).
_PIECES = 0x0A  # ModelProto.pieces = 1 (message)
_TRAINER_SPEC = 0x12  # ModelProto.trainer_spec = 2
_NORMALIZER_SPEC = 0x1A  # ModelProto.normalizer_spec = 3
_PIECE = 0x0A  # SentencePiece.piece = 1 (string)
_SCORE = 0x15  # SentencePiece.score = 2 (fixed32 float)
_TYPE = 0x18  # SentencePiece.type = 3 (varint enum)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


def byte_token_ids(vocab: Vocab) -> dict[int, int] | None:
    """byte value -> id of its <0xXX> token, when the vocabulary has all 256 of them."""
    found: dict[int, int] = {}
    for tid in np.flatnonzero(vocab.types == TokenType.BYTE):
        m = _BYTE_TOKEN.fullmatch(vocab.tokens[tid])
        if m:
            found.setdefault(int(m.group(1), 16), int(tid))
    return found if len(found) == 256 else None


def _pieces(tokens: list[str], scores: np.ndarray, is_byte: np.ndarray) -> bytes:
    """The repeated `pieces` field for all tokens, vectorised with numpy (a Python loop over Gemma's
    262,144 tokens costs ~0.3 s; this is a few times faster)."""
    n = len(tokens)
    encoded = [t.encode("utf-8") for t in tokens]
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    length = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    tail = np.where(is_byte, 2, 0)  # the type field, written for BYTE pieces only (NORMAL is the default)
    inner = 1 + _varint_len(length) + length + 5 + tail
    record = 1 + _varint_len(inner) + inner
    end = np.cumsum(record)
    out = np.zeros(int(end[-1]), dtype=np.uint8)
    pos = end - record
    out[pos] = _PIECES
    pos = _put_varint(out, pos + 1, inner)
    out[pos] = _PIECE
    pos = _put_varint(out, pos + 1, length)
    src = np.cumsum(length) - length
    out[np.repeat(pos - src, length) + np.arange(blob.size)] = blob
    pos = pos + length
    out[pos] = _SCORE
    score_bytes = np.ascontiguousarray(scores, dtype="<f4").view(np.uint8).reshape(n, 4)
    for k in range(4):
        out[pos + 1 + k] = score_bytes[:, k]
    pos = pos + 5
    out[pos[is_byte]] = _TYPE
    out[pos[is_byte] + 1] = TokenType.BYTE
    return out.tobytes()


def _varint_len(x: np.ndarray) -> np.ndarray:
    if x.size and int(x.max()) >= 1 << 21:
        raise ValueError("token too long for the model proto")
    return 1 + (x >= 1 << 7) + (x >= 1 << 14)


def _put_varint(out: np.ndarray, pos: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Writes x (< 2**21) as varints at pos; returns the positions after them."""
    n = _varint_len(x)
    out[pos] = np.where(n > 1, (x & 0x7F) | 0x80, x)
    two = n > 1
    out[pos[two] + 1] = np.where(n[two] > 2, ((x[two] >> 7) & 0x7F) | 0x80, x[two] >> 7)
    three = n > 2
    out[pos[three] + 2] = x[three] >> 14
    return pos + n


def model_proto(vocab: Vocab, byte_ids: dict[int, int] | None) -> bytes:
    n = vocab.n_vocab
    scores = vocab.scores if vocab.scores is not None else np.zeros(n, dtype=np.float32)
    is_byte = np.zeros(n, dtype=bool)
    if byte_ids is not None:
        is_byte[list(byte_ids.values())] = True
    unk_text = "<llamacy:unk>"
    while unk_text in vocab.tokens:
        unk_text += "_"
    unk = _field(_PIECE, unk_text.encode()) + bytes((_SCORE,)) + bytes(4) + bytes((_TYPE, TokenType.UNKNOWN))
    trainer = b"\x18\x02"  # model_type = BPE
    if byte_ids is not None:
        trainer += b"\x98\x02\x01"  # byte_fallback (field 35) = true
    normalizer = _field(0x0A, b"identity") + b"\x18\x00" + b"\x20\x00" + b"\x28\x00"
    # add_dummy_prefix (3), remove_extra_whitespaces (4), escape_whitespaces (5) all false
    return (
        _pieces(vocab.tokens, scores, is_byte)
        + _field(_PIECES, unk)
        + _field(_TRAINER_SPEC, trainer)
        + _field(_NORMALIZER_SPEC, normalizer)
    )


def cache_path(cache_key: str, n_vocab: int) -> Path:
    digest = hashlib.sha256(f"{_CACHE_VERSION}\0{cache_key}\0{n_vocab}".encode()).hexdigest()
    return cache_dir() / "tokenizers" / f"{digest[:32]}.spm"


def load_processor(
    vocab: Vocab, byte_ids: dict[int, int] | None, cache_key: str | None
) -> sentencepiece.SentencePieceProcessor:
    """The sentencepiece processor for this vocabulary, from the cache when we built it before."""
    path = None
    if cache_key is not None and vocab.n_vocab >= _CACHE_MIN_VOCAB:
        path = cache_path(cache_key, vocab.n_vocab)
        try:
            sp = _processor(path.read_bytes())
            n = vocab.n_vocab
            if sp.get_piece_size() == n + 1 and (sp.id_to_piece(0), sp.id_to_piece(n - 1)) == (
                vocab.tokens[0],
                vocab.tokens[n - 1],
            ):
                return sp
        except (OSError, RuntimeError, ValueError):
            pass  # missing or stale: rebuild below
    proto = model_proto(vocab, byte_ids)
    try:
        sp = _processor(proto)
    except RuntimeError as e:  # e.g. "<x> is already defined": a duplicate token, which llama.cpp refuses too
        message = " ".join(str(e).split())
        raise UnsupportedModelError(f"sentencepiece cannot load this vocabulary: {message}") from None
    if path is not None:
        _write_atomically(path, proto)
    return sp


def _processor(proto: bytes) -> sentencepiece.SentencePieceProcessor:
    import sentencepiece  # imported here: BPE models never need it

    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(proto)
    return sp


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".spm")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:  # a read-only home is no reason to fail; we just rebuild next time
        log.debug("could not cache the tokenizer at %s: %s", path, e)


def merge_reference(vocab: Vocab, text: str) -> list[int]:
    """llama.cpp's SPM merge loop for one escaped fragment (slow; the rare fallback)."""
    token_to_id, scores = vocab.token_to_id, vocab.scores
    syms = list(text)
    prev = list(range(-1, len(syms) - 1))
    nxt = [*range(1, len(syms)), -1]
    heap: list[tuple[float, int, int, int]] = []

    def push(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        tid = token_to_id.get(syms[left] + syms[right])
        if tid is not None:
            score = float(scores[tid]) if scores is not None else 0.0
            heapq.heappush(heap, (-score, left, right, len(syms[left]) + len(syms[right])))

    for i in range(1, len(syms)):
        push(i - 1, i)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if not syms[left] or not syms[right] or len(syms[left]) + len(syms[right]) != size:
            continue
        syms[left] += syms[right]
        syms[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    out: list[int] = []
    i = 0 if syms else -1
    while i >= 0:
        tid = token_to_id.get(syms[i])
        if tid is not None:
            out.append(tid)
        else:
            for b in syms[i].encode("utf-8"):
                bid = token_to_id.get(f"<0x{b:02X}>", token_to_id.get(chr(b)))
                if bid is None:
                    bid = vocab.unk_id  # llama.cpp aborts here; the unknown token is kinder
                if bid is not None:
                    out.append(bid)
        i = nxt[i]
    return out
