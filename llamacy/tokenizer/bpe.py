"""Byte-level BPE (`tokenizer.ggml.model == "gpt2"`) through the `tokenizers` library.

The pre-tokenizer is what decides whether we agree with llama.cpp, so it is spelled out here rather than
taken from Hugging Face's presets. llama.cpp splits text with a list of regexes per `tokenizer.ggml.pre`
(llm_tokenizer_bpe in llama-vocab.cpp): each regex cuts every piece left by the previous one, keeping the
text between matches as pieces too, which is what `Split(..., "isolated")` does. Its regex engine differs
from Hugging Face's in ways that change token ids, so the patterns below encode llama.cpp's behaviour:

- `\\s` is the 25 Unicode White_Space code points (llama.cpp's `unicode_set_whitespace`); we write the
  class out instead of trusting Oniguruma's `\\s`.
- Contractions: `'s|'t|...` is case-sensitive for gpt2-style patterns; the `(?i:...)` of Llama 3 / Qwen2
  becomes `'[sS]|'[tT]|...` (llama.cpp lower-cases only ASCII there; Oniguruma's `(?i)` would also fold
  e.g. U+017F "ſ" to "s").
- `\\s+(?!\\S)` keeps the last blank of a run for the next word ("x   y" -> "x", "  ", " y"); a run at the
  end of a fragment stays whole. Fragments end at special tokens, so lookahead never crosses them.
- Digits: smollm (and starcoder, ...) first isolates every `\\p{N}` code point; Llama 3 takes up to three;
  Qwen2 one at a time; gpt2 a whole run.

`\\p{L}`, `\\p{N}`, `\\p{P}` come from Oniguruma's Unicode tables; llama.cpp's are generated from Python's
`regex` module. They agree except on code points added in recent Unicode versions (rare CJK extensions and
scripts).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple

from llamacy.errors import UnsupportedModelError
from llamacy.tokenizer.vocab import Vocab

if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

log = logging.getLogger("llamacy")

# llama.cpp's whitespace set, as a character class body.
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_S = f"[{WHITESPACE}]"
_NOT_S = f"[^{WHITESPACE}]"
_OTHER = rf"[^{WHITESPACE}\p{{L}}\p{{N}}]"  # [^\s\p{L}\p{N}]

_CONTRACTIONS = "'s|'t|'re|'ve|'m|'ll|'d"
_CONTRACTIONS_ANY_CASE = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
GPT2 = rf"{_CONTRACTIONS}| ?\p{{L}}+| ?\p{{N}}+| ?{_OTHER}+|{_S}+(?!{_NOT_S})|{_S}+"


def _llama3_like(digits: str) -> str:
    # (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|<digits>| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    return (
        rf"(?:{_CONTRACTIONS_ANY_CASE})|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|{digits}| ?{_OTHER}+[\r\n]*"
        rf"|{_S}*[\r\n]+|{_S}+(?!{_NOT_S})|{_S}+"
    )


LLAMA3 = _llama3_like(r"\p{N}{1,3}")
QWEN2 = _llama3_like(r"\p{N}")


class PreTokenizer(NamedTuple):
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a pre-token that is already a token is not merged further (Llama 3)
    add_bos: bool = False  # llama.cpp's default when the file lacks tokenizer.ggml.add_bos_token


_GPT2 = PreTokenizer((GPT2,))
_SMOLLM = PreTokenizer((r"\p{N}", GPT2))
_LLAMA3 = PreTokenizer((LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2 = PreTokenizer((QWEN2,))
_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))

# `tokenizer.ggml.pre` names, grouped as llama.cpp groups them (LLAMA_VOCAB_PRE_TYPE_*). Only names whose
# llama.cpp settings are nothing but these regexes and flags are listed; "gpt2" is our alias of "gpt-2".
_NAMES = {
    _DEFAULT: "default",
    _LLAMA3: "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2",
    PreTokenizer((LLAMA3,)): "dbrx smaug-bpe",
    _SMOLLM: "smollm starcoder refact command-r codeshell exaone minerva-7b mellum2",
    _GPT2: "gpt2 gpt-2 phi-2 gigachat a.x-4.0 mellum mpt olmo jais trillion granite-docling exaone4",
    _QWEN2: "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open",
}
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    name: pre for pre, names in _NAMES.items() for name in names.split()
}


def pre_tokenizer_for(pre: str) -> PreTokenizer:
    if not pre:
        # llama.cpp accepts this with a loud warning; so do we.
        log.warning("the model file names no pre-tokenizer (tokenizer.ggml.pre); using 'default'")
        return _DEFAULT
    try:
        return PRE_TOKENIZERS[pre]
    except KeyError:
        names = ", ".join(sorted(PRE_TOKENIZERS))
        raise UnsupportedModelError(
            f"unsupported pre-tokenizer {pre!r} (tokenizer.ggml.pre); supported: {names}"
        ) from None


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (llama.cpp's unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


UNKNOWN_CHAR = "<llamacy:unknown-char>"  # see build()
BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def byte_level_decode(text: str) -> bytes:
    """The bytes a byte-level BPE token stands for. Characters outside the map (never in real
    vocabularies) are kept as their UTF-8 rather than dropped."""
    try:
        return bytes(CHAR_TO_BYTE[c] for c in text)
    except KeyError:
        return b"".join(bytes((CHAR_TO_BYTE[c],)) if c in CHAR_TO_BYTE else c.encode() for c in text)


def split_merges(merges: list[str]) -> list[tuple[str, str]]:
    """The (left, right) pairs of `tokenizer.ggml.merges`: llama.cpp splits each merge at the first space
    after its first character."""
    joined = "\n".join(merges)
    if joined.startswith(" ") or "\n " in joined:
        pairs = [(m[: (p := m.find(" ", 1))], m[p + 1 :]) if m.find(" ", 1) > 0 else (m, "") for m in merges]
    else:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or not pair[0] or not pair[1]:
            raise UnsupportedModelError(
                f"tokenizer.ggml.merges[{i}] = {merges[i]!r} is not two tokens split by a space"
            )
    return pairs  # type: ignore[return-value]


def build(vocab: Vocab, pre: PreTokenizer, merges: list[str]) -> HFTokenizer:
    """A `tokenizers` Tokenizer that turns one raw fragment (no special tokens) into ids.

    Some vocabularies cannot spell every byte (SmolLM2 lacks 21 of the 256, e.g. 0x1D). llama.cpp keeps
    such a character as a symbol that merges with nothing and then emits nothing for it; `tokenizers`
    would drop it first and merge its neighbours across the gap (">" + "<" -> "><"). So the unknown
    character becomes an extra token, id `vocab.n_vocab`, which the caller removes from the output.
    """
    from tokenizers import Regex, models, pre_tokenizers  # imported here: SPM models never need it
    from tokenizers import Tokenizer as HFTokenizer

    pairs = split_merges(merges)
    known = vocab.token_to_id
    unk = UNKNOWN_CHAR
    while unk in known:
        unk += "_"
    table = {**known, unk: vocab.n_vocab}
    options = {"unk_token": unk, "fuse_unk": False, "ignore_merges": pre.ignore_merges}
    try:
        model = models.BPE(vocab=table, merges=pairs, **options)
    except Exception:
        # `tokenizers` refuses merges of unknown tokens; llama.cpp keeps them but they can only matter
        # for text that the vocabulary cannot spell anyway. Dropping them keeps the others' order.
        kept = [(a, b) for a, b in pairs if a in known and b in known and a + b in known]
        log.warning("dropped %d merges that use tokens missing from the vocabulary", len(pairs) - len(kept))
        model = models.BPE(vocab=table, merges=kept, **options)
    tok = HFTokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return tok
