"""The tokenizer of a Hugging Face checkpoint, written as GGUF `tokenizer.ggml.*` metadata.

As convert_hf_to_gguf.py does it, without transformers:
- `tokenizer.model` (SentencePiece) -> tokenizer.ggml.model "llama": every piece with its score and type
  (normal, unknown, control, unused, byte), then added tokens from added_tokens.json and
  tokenizer_config.json's added_tokens_decoder (control if special or special-looking, else user-defined);
- otherwise `tokenizer.json` with a byte-level BPE model -> "gpt2": tokens (added ones typed as above),
  merges, and the pre-tokenizer's name in tokenizer.ggml.pre;
- Gemma 4 (`tokenizer.json`, BPE with byte fallback) -> "gemma4", as Gemma4Model.set_vocab writes it: the
  tokens as gguf's LlamaHfVocab lists them (score -1000, <0xXX> byte, special ids control, the rest normal,
  added tokens past the base vocabulary user-defined), its seven tool/channel markers user-defined, merges,
  add_space_prefix false, add_bos true. LlamaHfVocab asks transformers for the special ids; we take the
  named special tokens of tokenizer_config.json and the added tokens marked special.
Both are padded with "[PAD<i>]" unused tokens up to the model's vocab_size (the embedding's rows). Special
token ids, add_bos/add_eos and the chat template come from gguf.SpecialVocab, the reference's own reader of
tokenizer_config.json / tokenizer.json / config.json.

llama.cpp recognises a BPE pre-tokenizer by hashing the tokens of a fixed text (which needs transformers);
here it is recognised by its structure in tokenizer.json: the split regex and the digit and byte-level
steps. Only pre-tokenizers our tokenizer (llamacy/tokenizer/bpe.py) implements are accepted.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from gguf import GGUFWriter, SpecialVocab, TokenType

from llamacy.errors import UnsupportedModelError, UsageError

log = logging.getLogger("llamacy")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# The Split regexes of the Hugging Face tokenizers (as written in tokenizer.json) that llama.cpp knows.
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# Pre-tokenizer structure -> tokenizer.ggml.pre. ("bytelevel", True) is GPT-2's own regex inside ByteLevel.
_PRE_NAMES: dict[tuple[tuple[Any, ...], ...], str] = {
    (("bytelevel", True),): "gpt-2",
    (("digits", True), ("bytelevel", True)): "smollm",
    (("split", _LLAMA3_REGEX), ("bytelevel", False)): "llama-bpe",
    (("split", _QWEN2_REGEX), ("bytelevel", False)): "qwen2",
}


def add_tokenizer(w: GGUFWriter, directory: Path, arch: str, n_vocab: int) -> None:
    """Write the tokenizer of `directory` for a model with `n_vocab` embedding rows."""
    if arch == "gemma4" and (directory / "tokenizer.json").is_file():
        n_tokens = _add_gemma4(w, directory, n_vocab)
        special = SpecialVocab(directory, load_merges=True, n_vocab=n_tokens)
        special.add_special_token["bos"] = True  # Gemma4Model.set_vocab: add_add_bos_token(True)
        special.add_to_gguf(w, quiet=True)  # add_space_prefix false: the architecture's tokenizer hook
    elif (directory / "tokenizer.model").is_file():
        n_tokens = _add_sentencepiece(w, directory, n_vocab)
        SpecialVocab(directory, n_vocab=n_tokens).add_to_gguf(w, quiet=True)
    elif (directory / "tokenizer.json").is_file():
        n_tokens = _add_bpe(w, directory, n_vocab)
        special = SpecialVocab(directory, load_merges=True, n_vocab=n_tokens)
        if not special.merges:
            raise UnsupportedModelError(f"{directory / 'tokenizer.json'}: the BPE model has no merges")
        special.add_to_gguf(w, quiet=True)
    else:
        raise UsageError(f"{directory}: no tokenizer (neither tokenizer.model nor tokenizer.json)")


def _looks_special(text: str) -> bool:
    """convert_hf_to_gguf's does_token_look_special: added tokens that are control tokens in all but name."""
    return (
        text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (text.startswith("<|") and text.endswith("|>"))
        or (text.startswith("<｜") and text.endswith("｜>"))
        or (text.startswith("<unused") and text.endswith(">"))
    )


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read ({e})") from None


# -- SentencePiece ---------------------------------------------------------------------------------------


def _add_sentencepiece(w: GGUFWriter, directory: Path, n_vocab: int) -> int:
    import sentencepiece

    path = directory / "tokenizer.model"
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(path))
    except (OSError, RuntimeError) as e:
        raise UsageError(f"{path}: not a SentencePiece model ({e})") from None
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    scores = [-10000.0] * n_vocab
    types = [int(TokenType.UNUSED)] * n_vocab
    if sp.vocab_size() > n_vocab:
        log.warning(
            "%s has %d pieces, the model only %d rows: the rest are dropped", path, sp.vocab_size(), n_vocab
        )
    for i in range(min(sp.vocab_size(), n_vocab)):
        tokens[i] = sp.IdToPiece(i)
        scores[i] = sp.GetScore(i)
        if sp.IsUnknown(i):
            types[i] = TokenType.UNKNOWN
        elif sp.IsControl(i):
            types[i] = TokenType.CONTROL
        elif sp.IsUnused(i):
            types[i] = TokenType.UNUSED
        elif sp.IsByte(i):
            types[i] = TokenType.BYTE
        else:
            types[i] = TokenType.NORMAL

    added_file = directory / "added_tokens.json"
    if added_file.is_file():
        for text, tid in _read_json(added_file).items():
            if 0 <= int(tid) < n_vocab:
                tokens[tid], scores[tid], types[tid] = text, -1000.0, TokenType.USER_DEFINED
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        for key, data in (_read_json(config_file).get("added_tokens_decoder") or {}).items():
            tid, text = int(key), str(data["content"])
            if not 0 <= tid < n_vocab:
                continue
            if data.get("special") or _looks_special(text):
                types[tid] = TokenType.CONTROL
            else:
                text = text.replace("\u2581", " ")  # user-defined tokens are matched pre-normalized
                types[tid] = TokenType.USER_DEFINED
            tokens[tid], scores[tid] = text, -1000.0

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types([int(t) for t in types])
    return n_vocab


# -- byte-level BPE --------------------------------------------------------------------------------------


def _add_bpe(w: GGUFWriter, directory: Path, n_vocab: int) -> int:
    path = directory / "tokenizer.json"
    data = _read_json(path)
    model = data.get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedModelError(
            f"{path}: tokenizer model {model.get('type')!r} is not supported (BPE only)"
        )
    if model.get("byte_fallback") or "Metaspace" in json.dumps(data.get("pre_tokenizer")):
        # A SentencePiece vocabulary exported to tokenizer.json (Llama 2, TinyLlama): convert_hf_to_gguf reads
        # those through transformers; we need the original tokenizer.model.
        raise UnsupportedModelError(f"{path} is a SentencePiece-style tokenizer: tokenizer.model is needed")
    pre = bpe_pre_name(data, path)
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = {int(a["id"]): a for a in data.get("added_tokens") or []}
    for tid, a in added.items():
        vocab[a["content"]] = tid
    reverse = {tid: text for text, tid in vocab.items()}
    if reverse and max(reverse) >= n_vocab:
        raise UnsupportedModelError(
            f"{path}: token id {max(reverse)} does not fit the model's vocab_size of {n_vocab}"
        )
    tokens, types = [], []
    for i in range(n_vocab):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(int(TokenType.UNUSED))
            continue
        if i in added:
            if added[i].get("special") or _looks_special(text):
                types.append(int(TokenType.CONTROL))
            else:
                text = text.replace("\u2581", " ")
                types.append(int(TokenType.USER_DEFINED))
        else:
            types.append(int(TokenType.NORMAL))
        tokens.append(text)

    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    return n_vocab


# convert_hf_to_gguf.py Gemma4Model.set_vocab: "always render these tokens, so that the chat parser can read them"
_GEMMA4_VISIBLE = {
    "<|channel>",
    "<channel|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
}


def _add_gemma4(w: GGUFWriter, directory: Path, n_vocab: int) -> int:
    path = directory / "tokenizer.json"
    data = _read_json(path)
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        raise UnsupportedModelError(f"{path}: Gemma 4's tokenizer is a BPE model with byte fallback")
    base: dict[str, int] = dict(model.get("vocab") or {})
    n_base = len(base)
    text_of = {tid: text for text, tid in base.items()}
    added = {int(a["id"]): a for a in data.get("added_tokens") or []}
    for tid, a in added.items():
        text_of[tid] = a["content"]
    config = directory / "tokenizer_config.json"
    config_data = _read_json(config) if config.is_file() else {}
    named = []
    for key in ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "sep_token", "cls_token"):
        value = config_data.get(key)
        named.append(value.get("content") if isinstance(value, dict) else value)
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra = config_data.get(key) or []
        named += list(extra.values()) if isinstance(extra, dict) else list(extra)
    ids = {t: i for i, t in text_of.items()}
    special = {ids[t] for t in named if isinstance(t, str) and t in ids}
    special |= {tid for tid, a in added.items() if a.get("special")}
    order = list(range(n_base)) + sorted(t for t in added if t >= n_base)
    if (order and max(order) >= n_vocab) or len(order) > n_vocab:
        raise UnsupportedModelError(
            f"{path}: {len(order)} tokens do not fit the model's vocab_size of {n_vocab}"
        )
    tokens, types = [], []
    for tid in order:
        text = text_of.get(tid, f"[PAD{tid}]")
        if text in _GEMMA4_VISIBLE:
            ttype = TokenType.USER_DEFINED
        elif tid >= n_base:
            ttype = TokenType.CONTROL if tid in special else TokenType.USER_DEFINED
        elif _BYTE_TOKEN.fullmatch(text):
            ttype = TokenType.BYTE
        else:
            ttype = TokenType.CONTROL if tid in special else TokenType.NORMAL
        tokens.append(text)
        types.append(int(ttype))
    for i in range(len(tokens), n_vocab):
        tokens.append(f"[PAD{i}]")
        types.append(int(TokenType.UNUSED))
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores([-1000.0] * len(tokens))
    w.add_token_types(types)
    return len(tokens)


def bpe_pre_name(tokenizer_json: dict[str, Any], path: Path | str = "tokenizer.json") -> str:
    """tokenizer.ggml.pre for a byte-level BPE tokenizer.json; UnsupportedModelError if unknown."""
    pre = tokenizer_json.get("pre_tokenizer")
    steps = (
        (pre.get("pretokenizers") or []) if pre and pre.get("type") == "Sequence" else [pre] if pre else []
    )
    signature: list[tuple[Any, ...]] = []
    for step in steps:
        kind = step.get("type")
        if kind == "Split":
            pattern = step.get("pattern") or {}
            signature.append(("split", pattern.get("Regex", pattern.get("String"))))
        elif kind == "ByteLevel":
            signature.append(("bytelevel", bool(step.get("use_regex", True))))
        elif kind == "Digits":
            signature.append(("digits", bool(step.get("individual_digits", False))))
        else:
            signature.append((kind,))
    name = _PRE_NAMES.get(tuple(signature))
    if name is None:
        raise UnsupportedModelError(
            f"{path}: unrecognised pre-tokenizer {signature!r}; supported: gpt-2, smollm, llama-bpe (Llama 3), "
            "qwen2 byte-level BPE"
        )
    return name
