"""Tokenizers for GGUF models: text <-> token ids, exactly as the reference engine (llama.cpp) does it.

    tok = Tokenizer.from_metadata(gguf.metadata, cache_key="path:size:mtime")
    ids = tok.encode("<|im_start|>user\\nHi", special=True)
    dec = tok.stream_decoder()
    print("".join(dec.feed(i) for i in ids) + dec.flush())

Three vocabulary kinds, chosen by `tokenizer.ggml.model`:
- "gpt2": byte-level BPE (SmolLM, Llama 3, Qwen2, ...), built with `tokenizers` (see bpe.py);
- "llama": SentencePiece (Llama 1/2, Gemma 1-3, Mistral, ...), run by `sentencepiece` (see spm.py);
- "gemma4": SentencePiece-style BPE ranked by merges (Gemma 4), built with `tokenizers` (see gemma4.py).
In both, special tokens are first cut out of the text the way llama.cpp does it (vocab.py).
"""

from __future__ import annotations

import codecs
import contextlib
import gc
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np

from llamacy.errors import UnsupportedModelError, UsageError
from llamacy.tokenizer import bpe, gemma4, spm
from llamacy.tokenizer.vocab import SpecialSplitter, TokenType, Vocab, read_vocab

__all__ = ["StreamDecoder", "TokenType", "Tokenizer"]

_SUPPORTED_MODELS = "gpt2 (byte-level BPE), llama (SentencePiece), gemma4 (SentencePiece-style BPE)"
_SKIPPED_WHEN_SKIPPING_SPECIAL = frozenset({int(TokenType.CONTROL), int(TokenType.UNKNOWN)})
_SPECIAL = frozenset({int(TokenType.CONTROL), int(TokenType.USER_DEFINED), int(TokenType.UNKNOWN)})


class Tokenizer:
    """Encodes text to token ids and back for one GGUF vocabulary."""

    kind: Literal["bpe", "spm", "gemma4"]

    def __init__(self, vocab: Vocab, kind: Literal["bpe", "spm", "gemma4"]) -> None:
        self.vocab = vocab
        self.kind = kind
        self.n_vocab = vocab.n_vocab
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.unk_id = vocab.unk_id
        self.pad_id = vocab.pad_id
        self.add_bos = vocab.add_bos
        self.add_space_prefix = vocab.add_space_prefix
        # llama.cpp's end-of-generation set: EOS, EOT, EOM and end-of-turn tokens known by name.
        self.eot_ids: set[int] = set(vocab.eog_ids)
        self._splitter = SpecialSplitter(vocab)
        self._types = vocab.types
        self._type_of = vocab.types.tobytes()  # type per id; indexing bytes is the cheapest lookup
        self._bytes: list[bytes | None] = [None] * vocab.n_vocab  # token_bytes, filled on demand
        self._hf = None  # bpe: tokenizers.Tokenizer
        self._sp = None  # spm: sentencepiece processor
        self._byte_ids: dict[int, int] | None = None
        self._gemma4: gemma4.Gemma4Encoder | None = None

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], cache_key: str | None = None) -> Tokenizer:
        """The tokenizer a GGUF file describes. `cache_key` names the file (e.g. path, size and mtime);
        with it, expensive builds are cached on disk. Raises UnsupportedModelError for vocabularies that
        we cannot tokenize exactly as the reference engine does."""
        with _gc_paused():
            return cls._from_metadata(metadata, cache_key)

    @classmethod
    def _from_metadata(cls, metadata: Mapping[str, Any], cache_key: str | None) -> Tokenizer:
        model = metadata.get("tokenizer.ggml.model")
        if model == "gpt2":
            pre = bpe.pre_tokenizer_for(str(metadata.get("tokenizer.ggml.pre", "")))
            vocab = read_vocab(metadata, default_add_bos=pre.add_bos)
            merges = metadata.get("tokenizer.ggml.merges")
            if not merges:
                raise UnsupportedModelError("the BPE vocabulary has no merges (tokenizer.ggml.merges)")
            tok = cls(vocab, "bpe")
            tok._hf = bpe.build(vocab, pre, list(merges))
            return tok
        if model == "llama":
            # llama.cpp ignores tokenizer.ggml.pre for SentencePiece vocabularies, and so do we.
            vocab = read_vocab(metadata, default_add_bos=True)
            tok = cls(vocab, "spm")
            tok._byte_ids = spm.byte_token_ids(vocab)
            tok._sp = spm.load_processor(vocab, tok._byte_ids, cache_key)
            return tok
        if model == "gemma4":
            # llama.cpp: BPE vocabulary, pre-tokenizer "gemma4" whatever the file says, BOS always added.
            vocab = read_vocab(metadata, default_add_bos=True)
            vocab.add_bos = True
            tok = cls(vocab, "gemma4")
            tok._gemma4 = gemma4.build(vocab, metadata.get("tokenizer.ggml.merges"))
            return tok
        raise UnsupportedModelError(
            f"unsupported tokenizer {model!r} (tokenizer.ggml.model); supported: {_SUPPORTED_MODELS}"
        )

    # ---- encoding -----------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool = False, special: bool = False) -> list[int]:
        """Token ids for `text`. With `special`, control tokens written in the text (e.g. "<|im_start|>")
        become their ids; without it they are plain text. User-defined tokens are always recognised, as in
        llama.cpp. `add_bos` prepends the BOS token (the model's preference is `self.add_bos`)."""
        out: list[int] = [self.bos_id] if add_bos and self.bos_id is not None else []
        fragments = self._splitter.split(text, special)
        if self.kind == "bpe":
            hf, unknown = self._hf, self.n_vocab  # see bpe.build: a character the vocabulary lacks
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    ids = hf.encode(frag, add_special_tokens=False).ids
                    out.extend(ids if unknown not in ids else [i for i in ids if i != unknown])
        elif self.kind == "gemma4":
            encoder = self._gemma4
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out.extend(encoder.encode(frag))
        else:
            # Raw fragments are encoded together (Gemma cuts text at every newline, so there can be many);
            # their ids are then put back between the special tokens.
            texts: list[str] = []
            after_special = True  # llama.cpp: the text start counts as "after a special token"
            for frag in fragments:
                if isinstance(frag, int):
                    after_special = True
                else:
                    if self.add_space_prefix and after_special:
                        frag = " " + frag
                    texts.append(frag.replace(" ", "\u2581"))
                    after_special = False
            encoded = iter(self._encode_spm(texts))
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out.extend(next(encoded))
        return out

    def _encode_spm(self, escaped: list[str]) -> list[list[int]]:
        # sentencepiece's batch call has ~0.5 ms of fixed cost (3 ms the first time), one call ~30 us.
        if len(escaped) > 32:
            batches = self._sp.encode(escaped, num_threads=1)
        else:
            batches = [self._sp.encode(text) for text in escaped]
        unknown = self.n_vocab  # our extra UNKNOWN piece: a character with no token and no byte tokens
        return [
            ids if unknown not in ids else spm.merge_reference(self.vocab, text)
            for ids, text in zip(batches, escaped, strict=True)
        ]

    # ---- decoding -----------------------------------------------------------------------------------

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes token `token_id` stands for: byte-level decoded (BPE), "▁" -> " " (SPM), <0xAB> -> the
        byte; control and user-defined tokens as their text (as llama.cpp renders them)."""
        if not 0 <= token_id < self.n_vocab:  # a negative id would silently index from the end
            raise UsageError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
        cached = self._bytes[token_id]
        if cached is None:
            cached = self._bytes[token_id] = self._piece(token_id)
        return cached

    def _piece(self, token_id: int) -> bytes:
        text = self.vocab.tokens[token_id]
        ttype = self._type_of[token_id]
        if ttype in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.USER_DEFINED):
            return text.encode("utf-8")
        if ttype == TokenType.BYTE:
            m = spm._BYTE_TOKEN.fullmatch(text)
            return bytes((int(m.group(1), 16),)) if m else text.encode("utf-8")
        if ttype != TokenType.NORMAL:
            return b""  # unused / undefined tokens render as nothing in llama.cpp
        if self.kind == "bpe":
            return bpe.byte_level_decode(text)
        return text.replace("\u2581", " ").encode("utf-8")

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids`. `skip_special` drops control and unknown tokens (user-defined ones are text).
        As in llama.cpp, when the vocabulary adds a space prefix, the first token's leading space is the
        prefix and is removed, so decode(encode(x)) == x."""
        parts = []
        for i, tid in enumerate(ids):
            piece = self.token_bytes(tid)  # first: it checks the id
            if skip_special and self._type_of[tid] in _SKIPPED_WHEN_SKIPPING_SPECIAL:
                continue
            if i == 0 and self.add_space_prefix and piece.startswith(b" "):
                piece = piece[1:]
            parts.append(piece)
        return b"".join(parts).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> StreamDecoder:
        """An incremental decoder for generated tokens (no space-prefix removal: a continuation's leading
        space is real)."""
        return StreamDecoder(self, skip_special)

    # ---- token facts --------------------------------------------------------------------------------

    def is_special(self, token_id: int) -> bool:
        """A control, user-defined or unknown token (the kinds cut out of text before BPE/SPM)."""
        if not 0 <= token_id < self.n_vocab:
            raise UsageError(f"token id {token_id} is outside the vocabulary (0..{self.n_vocab - 1})")
        return self._type_of[token_id] in _SPECIAL

    def is_eot(self, token_id: int) -> bool:
        return token_id in self.eot_ids

    def token_text(self, token_id: int) -> str:
        """The token as written in the vocabulary (e.g. "Ġthe", "▁the", "<0x0A>")."""
        return self.vocab.tokens[token_id]

    @property
    def token_types(self) -> np.ndarray:
        return self._types

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, n_vocab={self.n_vocab}, pre={self.vocab.pre!r})"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Building allocates ~10^5 small objects (merge pairs, dict entries) at once; the cyclic garbage
    collector's full passes over the large metadata lists meanwhile cost ~40% of a BPE build. Nothing
    built here forms reference cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class StreamDecoder:
    """Turns tokens into text as they are generated. A character whose UTF-8 bytes are spread over several
    tokens (byte tokens, or byte-level BPE pieces) comes out once, whole, when its last byte arrives;
    invalid bytes come out as U+FFFD."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        piece = self._tok.token_bytes(token_id)  # first: it checks the id
        if self._skip_special and self._tok._type_of[token_id] in _SKIPPED_WHEN_SKIPPING_SPECIAL:
            return ""
        return self._utf8.decode(piece)

    def flush(self) -> str:
        """What is still held back (an incomplete character becomes U+FFFD); the decoder starts afresh."""
        text = self._utf8.decode(b"", final=True)
        self._utf8.reset()
        return text
