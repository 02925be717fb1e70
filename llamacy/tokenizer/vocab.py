"""The vocabulary as the reference engine (llama.cpp) reads it from GGUF metadata.

Everything here mirrors llama.cpp's `llama_vocab::impl::load` so that token types, special ids and the
end-of-generation set agree with it: the same defaults per tokenizer model, the same auto-detection of
control tokens by their text, and the same order in which special tokens are cut out of a prompt
(`tokenizer_st_partition`).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError

log = logging.getLogger("llamacy")


class TokenType(enum.IntEnum):
    """`tokenizer.ggml.token_type` values (llama.h `llama_token_type`)."""

    UNDEFINED = 0
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


# Token texts that llama.cpp recognises whatever the file says; each found one becomes a CONTROL token.
_EOT_NAMES = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)  # fmt: skip
_EOM_NAMES = ("<|eom_id|>",)
_FIM_NAMES = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
# Tokens that end generation, by text (llama.cpp's `special_eog_ids` list).
_EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
})  # fmt: skip
# gpt-oss: always rendered, never parsed as control.
_FORCED_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")
# Metadata keys of the special ids (llama-arch.cpp; "seperator" is the format's spelling). For the FIM
# ids the deprecated key is read last and wins, as in llama.cpp.
_ID_KEYS = {
    "bos": ("tokenizer.ggml.bos_token_id",),
    "eos": ("tokenizer.ggml.eos_token_id",),
    "eot": ("tokenizer.ggml.eot_token_id",),
    "eom": ("tokenizer.ggml.eom_token_id",),
    "unk": ("tokenizer.ggml.unknown_token_id",),
    "sep": ("tokenizer.ggml.seperator_token_id",),
    "pad": ("tokenizer.ggml.padding_token_id",),
    "mask": ("tokenizer.ggml.mask_token_id",),
    "fim_pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "fim_suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "fim_mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "fim_pad": ("tokenizer.ggml.fim_pad_token_id",),
    "fim_rep": ("tokenizer.ggml.fim_rep_token_id",),
    "fim_sep": ("tokenizer.ggml.fim_sep_token_id",),
}

# Every text looked up above, for one pass over the vocabulary (hashing 262k tokens into a dict costs
# more than the rest of start-up, so only these are indexed up front).
_KNOWN_NAMES = frozenset(
    {*_EOT_NAMES, *_EOM_NAMES, *_EOG_NAMES, *_FORCED_USER_DEFINED, "<unk>", "<s>"}.union(*_FIM_NAMES.values())
)
_SPECIAL_TYPES = [int(TokenType.CONTROL), int(TokenType.USER_DEFINED), int(TokenType.UNKNOWN)]
_C_SPACE = " \t\n\v\f\r"  # C isspace(): what llama.cpp's lstrip/rstrip attributes remove


@dataclass
class Vocab:
    """Tokens and the facts about them that encoding and decoding need."""

    model: str  # tokenizer.ggml.model: "gpt2", "llama" or "gemma4"
    pre: str  # tokenizer.ggml.pre ("" when absent)
    tokens: list[str]
    types: np.ndarray  # int8 TokenType per token, after llama.cpp's reclassification
    scores: np.ndarray | None  # float32 per token (SPM merge priorities)
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_space_prefix: bool
    lstrip_ids: frozenset[int] = field(default_factory=frozenset)
    rstrip_ids: frozenset[int] = field(default_factory=frozenset)

    @property
    def n_vocab(self) -> int:
        return len(self.tokens)

    @cached_property
    def token_to_id(self) -> dict[str, int]:
        """text -> id for the whole vocabulary (built on first use: ~20-70 ms for 262k tokens)."""
        table = dict(zip(self.tokens, range(len(self.tokens)), strict=True))
        if len(table) != len(self.tokens):
            seen: set[str] = set()
            dup = next(t for t in self.tokens if t in seen or seen.add(t))
            raise UnsupportedModelError(f"duplicate token in the vocabulary: {dup!r}")
        return table


def read_vocab(metadata: Mapping[str, Any], *, default_add_bos: bool) -> Vocab:
    """Token list, types and special ids from GGUF metadata, as llama.cpp derives them."""
    model = str(metadata.get("tokenizer.ggml.model", ""))
    pre = str(metadata.get("tokenizer.ggml.pre", ""))
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None or len(tokens) == 0:
        raise UnsupportedModelError("the model file has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    tokens = list(tokens)
    n = len(tokens)
    if "" in tokens:  # llama.cpp renames empty tokens; sentencepiece would refuse them
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]

    raw_types = metadata.get("tokenizer.ggml.token_type")
    if raw_types is None:
        types = np.full(n, TokenType.NORMAL, dtype=np.int8)
    else:
        raw = np.asarray(raw_types, dtype=np.int64)[:n]
        if raw.size < n:
            raise UnsupportedModelError(f"tokenizer.ggml.token_type has {raw.size} entries for {n} tokens")
        types = np.where((raw >= 0) & (raw <= 6), raw, TokenType.UNDEFINED).astype(np.int8)

    raw_scores = metadata.get("tokenizer.ggml.scores")
    scores = None if raw_scores is None else np.asarray(raw_scores, dtype=np.float32)[:n]
    if scores is not None and scores.size < n:
        raise UnsupportedModelError(f"tokenizer.ggml.scores has {scores.size} entries for {n} tokens")

    named: dict[str, int] = {}  # the first id of each known name present
    for i, t in enumerate(tokens):
        if t in _KNOWN_NAMES:
            named.setdefault(t, i)

    # Special ids: llama.cpp's defaults per tokenizer model, then the file's values when in range.
    if model == "llama":
        ids: dict[str, int | None] = {"bos": 1, "eos": 2, "unk": 0}
    elif model == "gemma4":  # llama.cpp: every default special id unset, the file names them
        ids = {"bos": None, "eos": None, "unk": None}
    else:
        ids = {"bos": 11, "eos": 11, "unk": None}
    ids = {k: (v if v is not None and v < n else None) for k, v in ids.items()}
    for name, keys in _ID_KEYS.items():
        for key in keys:
            value = metadata.get(key)
            if value is None:
                continue
            if 0 <= int(value) < n:
                ids[name] = int(value)
            else:
                log.warning("bad special token %s = %s (vocabulary has %d tokens); ignored", key, value, n)

    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", default_add_bos))
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", model == "llama"))

    def make_control(tid: int) -> None:
        if types[tid] != TokenType.CONTROL:
            types[tid] = TokenType.CONTROL

    # Auto-detection by text, in id order (llama.cpp walks a hash map; the first hit wins for each kind).
    for name, candidates in (("eot", _EOT_NAMES), ("eom", _EOM_NAMES), *_FIM_NAMES.items()):
        if ids.get(name) is not None:
            continue
        hits = [named[t] for t in candidates if t in named]
        if hits:
            ids[name] = min(hits)
            make_control(ids[name])

    eog: set[int] = {ids[k] for k in ("fim_pad", "fim_rep", "fim_sep") if ids.get(k) is not None}
    for text in _EOG_NAMES:
        tid = named.get(text)
        if tid is not None:
            eog.add(tid)
            make_control(tid)
    for text in _FORCED_USER_DEFINED:
        tid = named.get(text)
        if tid is not None:
            types[tid] = TokenType.USER_DEFINED
    eog.update(ids[k] for k in ("eos", "eot", "eom") if ids.get(k) is not None)

    # gpt-oss / solar-open: "<|end|>" closes a message, not the generation.
    texts = {tokens[i] for i in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        end_id = named["<|end|>"]
        eog.discard(end_id)
        types[end_id] = TokenType.USER_DEFINED
    # gemma4: "</s>" is ordinary text there.
    if "<|tool_response>" in texts and "</s>" in texts:
        s_id = named["</s>"]
        eog.discard(s_id)
        types[s_id] = TokenType.NORMAL

    # Per-model strip attributes (llama.cpp keys them on the model name; phi-3 is the SPM case).
    rstrip: set[int] = set()
    name = str(metadata.get("general.name", "")).lower()
    if "phi-3" in name or "phi3" in name:
        rstrip = {int(i) for i in np.flatnonzero(np.isin(types, _SPECIAL_TYPES))}
        for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
            tid = named.get(text)
            if tid is not None:
                (rstrip.add if on else rstrip.discard)(tid)

    return Vocab(
        model=model,
        pre=pre,
        tokens=tokens,
        types=types,
        scores=scores,
        bos_id=ids["bos"],
        eos_id=ids["eos"],
        unk_id=ids["unk"],
        pad_id=ids.get("pad"),
        eog_ids=frozenset(eog),
        add_bos=add_bos,
        add_space_prefix=add_space_prefix,
        rstrip_ids=frozenset(rstrip),
    )


class SpecialSplitter:
    """Cuts special tokens out of a text the way llama.cpp's `tokenizer_st_partition` does.

    llama.cpp takes the special tokens longest first (by UTF-8 length) and splits every remaining text
    fragment at each occurrence of the current one. User-defined tokens are always cut out; control and
    unknown tokens only when special tokens are parsed. Looping over thousands of special tokens (Gemma has
    6,414) for every prompt would be slow in Python, so we first find which special tokens occur in the text
    at all; only those can split anything, and they are then applied in llama.cpp's order.
    """

    def __init__(self, vocab: Vocab) -> None:
        special = [int(i) for i in np.flatnonzero(np.isin(vocab.types, _SPECIAL_TYPES))]
        tokens = vocab.tokens
        # Equal lengths keep id order (llama.cpp's std::sort leaves them in an unspecified order).
        order = sorted(special, key=lambda i: -len(tokens[i].encode("utf-8")))
        self._rank = {tid: r for r, tid in enumerate(order)}
        self._text = {tid: tokens[tid] for tid in special}
        self._lstrip = vocab.lstrip_ids
        self._rstrip = vocab.rstrip_ids
        always = [int(i) for i in np.flatnonzero(vocab.types == TokenType.USER_DEFINED)]
        self._index = {False: _Index(always, tokens), True: _Index(special, tokens)}

    def split(self, text: str, special: bool) -> list[str | int]:
        """The text as a list of raw fragments (str) and special token ids (int), in order."""
        if not text:
            return []
        present = self._index[special].find(text)
        if not present:
            return [text]
        fragments: list[str | int] = [text]
        for tid in sorted(present, key=self._rank.__getitem__):
            fragments = self._split_on(fragments, tid)
        return fragments

    def _split_on(self, fragments: list[str | int], tid: int) -> list[str | int]:
        needle = self._text[tid]
        out: list[str | int] = []
        for frag in fragments:
            if isinstance(frag, int) or needle not in frag:
                out.append(frag)
                continue
            start = 0
            while (hit := frag.find(needle, start)) >= 0:
                left = frag[start:hit]
                if tid in self._lstrip:
                    left = left.rstrip(_C_SPACE)
                if left:
                    out.append(left)
                out.append(tid)
                start = hit + len(needle)
                if tid in self._rstrip:
                    while start < len(frag) and frag[start] in _C_SPACE:
                        start += 1
            if start < len(frag):
                out.append(frag[start:])
        return out


class _Index:
    """Finds which of a set of token texts occur in a text, without trying each of them."""

    def __init__(self, ids: list[int], tokens: list[str]) -> None:
        self.text_to_id = {tokens[tid]: tid for tid in ids}
        self.single = {t: tid for t, tid in self.text_to_id.items() if len(t) == 1}
        # Longer tokens by their first two characters: the lengths worth looking up there. Few distinct
        # lengths share a prefix (Gemma's 6,242 "<unusedN>" tokens have four) except in runs of one
        # character (Gemma: 2 to 31 spaces, newlines, tabs). Those groups are closed under prefixes, so
        # the lengths can be tried shortest first, stopping at the first miss.
        groups: dict[str, set[str]] = {}
        for t in self.text_to_id:
            if len(t) > 1:
                groups.setdefault(t[:2], set()).add(t)
        self.lengths: dict[str, tuple[bool, list[int]]] = {}
        for prefix, texts in groups.items():
            lengths = sorted({len(t) for t in texts})
            closed = len(lengths) > 4 and all(t[:k] in texts for t in texts for k in range(2, len(t)))
            self.lengths[prefix] = (closed, lengths)
        firsts = sorted({t[0] for t in self.text_to_id})
        self.first_chars = re.compile("[" + "".join(re.escape(c) for c in firsts) + "]") if firsts else None

    def find(self, text: str) -> set[int]:
        found: set[int] = set()
        if self.first_chars is None:
            return found
        single, lengths, text_to_id = self.single, self.lengths, self.text_to_id
        for m in self.first_chars.finditer(text):
            i = m.start()
            tid = single.get(text[i])
            if tid is not None:
                found.add(tid)
            group = lengths.get(text[i : i + 2])
            if group is None:
                continue
            closed, group_lengths = group
            for n in group_lengths:
                tid = text_to_id.get(text[i : i + n])
                if tid is not None:
                    found.add(tid)
                elif closed:
                    break
        return found
