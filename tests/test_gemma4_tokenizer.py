"""Gemma 4's tokenizer (`tokenizer.ggml.model == "gemma4"`) on a tiny vocabulary written the way llama.cpp's
converter writes it (Gemma4Model.set_vocab: tokens, scores and types from the HF tokenizer, the seven
"visible" tool/channel tokens USER_DEFINED, merges, add_space_prefix false, add_bos true).

The expected ids are derived by hand from llama.cpp's algorithm (llama-vocab.cpp: LLAMA_VOCAB_PRE_TYPE_GEMMA4,
llm_tokenizer_bpe_session::tokenize): spaces become "▁", the text is cut into runs of newlines and runs of
everything else, a newline run that is a token is taken whole, the rest merges by lowest rank (ties:
leftmost), and a symbol that is not a token becomes its <0xXX> byte tokens. Each case's comment gives the
derivation. llama-cpp-python is not installed here, so no ids from llama.cpp itself.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFWriter

from llamacy.gguf import GGUFFile
from llamacy.tokenizer import Tokenizer, TokenType
from llamacy.tokenizer.gemma4 import merge_reference

# Gemma's layout: pad, eos, bos, unk, mask, then the turn/tool markers, the 256 byte tokens, the rest.
SPECIALS = [
    ("<pad>", TokenType.CONTROL), ("<eos>", TokenType.CONTROL), ("<bos>", TokenType.CONTROL),
    ("<unk>", TokenType.CONTROL), ("<mask>", TokenType.CONTROL),  # LlamaHfVocab: special ids are CONTROL
    ("<|turn>", TokenType.CONTROL), ("<turn|>", TokenType.CONTROL), ("<|think|>", TokenType.CONTROL),
    ("<|tool>", TokenType.CONTROL), ("<tool|>", TokenType.CONTROL),
    # convert_hf_to_gguf.py Gemma4Model.set_vocab: "always render these tokens" -> USER_DEFINED
    ("<|tool_call>", TokenType.USER_DEFINED), ("<tool_call|>", TokenType.USER_DEFINED),
    ("<|tool_response>", TokenType.USER_DEFINED), ("<tool_response|>", TokenType.USER_DEFINED),
    ('<|"|>', TokenType.USER_DEFINED), ("<|channel>", TokenType.USER_DEFINED),
    ("<channel|>", TokenType.USER_DEFINED),
]  # fmt: skip
CHARS = ["\n", "\t", "\u2581", "é", *"abcdefghijklmnopqrstuvwxyz", *".,!?:{}_'"]
MERGES = [
    "l l", "▁ h", "e ll", "▁h ell", "▁hell o", "h e", "▁ ▁", "a a", "▁ w", "o r", "▁w or", "▁wor l",
    "▁worl d", "u s", "e r", "us er", "m o", "d e", "mo de", "mode l", "t h", "▁ th", "h i", "▁ hi",
]  # fmt: skip
EXTRA = ["\n\n"]  # a newline run that is a token but no merge makes


def gemma4_vocab(add_bos: bool = True) -> dict[str, Any]:
    tokens = [t for t, _ in SPECIALS] + [f"<0x{b:02X}>" for b in range(256)] + CHARS
    types = [ty for _, ty in SPECIALS] + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * len(CHARS)
    for m in MERGES:
        a, b = m.split(" ")
        assert a in tokens and b in tokens and a + b not in tokens, m
        tokens.append(a + b)
        types.append(TokenType.NORMAL)
    tokens += EXTRA
    types += [TokenType.NORMAL] * len(EXTRA)
    return {
        "model": "gemma4",
        "pre": None,  # the converter writes none; llama.cpp forces "gemma4" anyway
        "tokens": tokens,
        "types": types,
        "merges": list(MERGES),
        "scores": [-1000.0] * len(tokens),  # LlamaHfVocab's placeholder; llama.cpp's BPE ignores scores
        "special": {"bos": 2, "eos": 1, "unk": 3, "pad": 0},
        "add_bos": add_bos,
        "add_space_prefix": False,
        "template": None,
    }


def write_gemma4_tokenizer(w: GGUFWriter, vocab: dict[str, Any], n_vocab: int | None = None) -> None:
    """The tokenizer keys as Gemma4Model.set_vocab writes them (model, tokens, scores, types, then
    SpecialVocab's merges/ids/template, add_space_prefix, add_bos)."""
    tokens, types, scores = list(vocab["tokens"]), [int(t) for t in vocab["types"]], list(vocab["scores"])
    for i in range((n_vocab or len(tokens)) - len(tokens)):
        tokens.append(f"<unused{i}>")
        types.append(int(TokenType.UNUSED))
        scores.append(-1000.0)
    w.add_tokenizer_model("gemma4")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_token_merges(vocab["merges"])
    w.add_bos_token_id(vocab["special"]["bos"])
    w.add_eos_token_id(vocab["special"]["eos"])
    w.add_unk_token_id(vocab["special"]["unk"])
    w.add_pad_token_id(vocab["special"]["pad"])
    if vocab.get("template"):
        w.add_chat_template(vocab["template"])
    w.add_add_space_prefix(False)
    w.add_add_bos_token(vocab["add_bos"])


def metadata(add_bos: bool = True) -> dict[str, Any]:
    v = gemma4_vocab(add_bos)
    return {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": v["tokens"],
        "tokenizer.ggml.scores": v["scores"],
        "tokenizer.ggml.token_type": [int(t) for t in v["types"]],
        "tokenizer.ggml.merges": v["merges"],
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
        "tokenizer.ggml.add_bos_token": add_bos,
    }


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_metadata(metadata())


def ids(tok: Tokenizer, *pieces: str) -> list[int]:
    """Ids of token texts; "<0xE4>" style names are byte tokens."""
    return [tok.vocab.token_to_id[p.replace(" ", "\u2581")] for p in pieces]


def byte_ids(tok: Tokenizer, text: str) -> list[int]:
    return [tok.vocab.token_to_id[f"<0x{b:02X}>"] for b in text.encode()]


# (text, expected pieces) -- derivations in the comments ("r3" = the merge of rank 3).
CASES = [
    # h e l l o: ll (r0), then e+ll (r2); h+e (r5) is stale by then: not "he"+"llo", not "hello"
    ("hello", ["h", "ell", "o"]),
    # ▁ h e l l o: ll r0, ▁h r1, ell r2, ▁hell r3, ▁hello r4
    (" hello", [" hello"]),
    # no space is added in front of the text (add_space_prefix false)
    ("hello world", ["h", "ell", "o", " world"]),
    # ▁▁ (r6) loses to the chain ▁h r1 ... ▁hello r4 that takes the second ▁
    ("  hello", [" ", " hello"]),
    # equal ranks: the leftmost pair first
    ("   ", ["  ", " "]),
    ("aaa", ["aa", "a"]),
    # m o d e l: mo r16, de r17, mode r18, model r19; "▁ m" is no merge
    ("user model", ["user", " ", "model"]),
    # ▁ t h e: h+e (r5) comes before t+h (r20), and nothing joins "▁", "t", "he"
    (" the", [" ", "t", "he"]),
    # ▁ t h i: th r20 before hi r22, then ▁th r21
    (" thi", [" th", "i"]),
    # "\n\n" is a token: taken whole although no merge makes it; "\n\n\n" is not: three "\n"
    ("a\n\nb", ["a", "\n\n", "b"]),
    ("a\n\n\nb", ["a", "\n", "\n", "\n", "b"]),
    ("\n", ["\n"]),
    # h i -> hi (r22); ▁ h i -> ▁h (r1) first, so "▁ hi" (r23) never applies
    ("hi\n hi", ["hi", "\n", " h", "i"]),
    ("\ta\t", ["\t", "a", "\t"]),
]


@pytest.mark.parametrize("text, pieces", CASES)
def test_merges_by_rank_as_llama_cpp(tok, text, pieces) -> None:
    assert tok.encode(text) == ids(tok, *pieces)


def test_byte_fallback_for_characters_without_a_token(tok) -> None:
    assert tok.encode("é") == ids(tok, "é")
    assert tok.encode("中") == byte_ids(tok, "中")
    assert tok.encode("añ\r🙂") == ids(tok, "a") + byte_ids(tok, "ñ\r🙂")
    # a character without a token does not merge; its neighbours still do
    assert tok.encode("ll中ll") == ids(tok, "ll") + byte_ids(tok, "中") + ids(tok, "ll")


def test_special_tokens(tok) -> None:
    turn, end = tok.vocab.token_to_id["<|turn>"], tok.vocab.token_to_id["<turn|>"]
    assert tok.encode("<|turn>user\nhello<turn|>", special=True) == [
        turn,
        *ids(tok, "user", "\n", "h", "ell", "o"),
        end,
    ]
    # without `special`, control tokens are text: < | > have no token and fall back to bytes
    assert tok.encode("<|turn>user", special=False) == (
        byte_ids(tok, "<|") + ids(tok, "t", "u", "r", "n") + byte_ids(tok, ">") + ids(tok, "user")
    )
    # the converter's USER_DEFINED markers are cut out of any text
    q = tok.vocab.token_to_id['<|"|>']
    call = tok.vocab.token_to_id["<|tool_call>"]
    assert tok.encode('a<|"|>b') == [*ids(tok, "a"), q, *ids(tok, "b")]
    assert tok.encode("<|tool_call>call:") == [call, *ids(tok, "c", "a", "ll", ":")]
    assert tok.is_special(q) and not tok.is_special(ids(tok, "a")[0])


def test_bos_is_always_added_and_the_end_tokens(tok) -> None:
    assert tok.kind == "gemma4" and tok.bos_id == 2 and tok.eos_id == 1 and tok.add_bos
    assert tok.encode("hi", add_bos=True) == [2, *ids(tok, "hi")]
    # llama.cpp overrides add_bos_token = false for Gemma 4 (llama-vocab.cpp, "workaround for Gemma 4")
    assert Tokenizer.from_metadata(metadata(add_bos=False)).add_bos
    assert {1, tok.vocab.token_to_id["<turn|>"]} <= tok.eot_ids
    assert not tok.add_space_prefix


def test_decoding(tok) -> None:
    assert tok.decode(ids(tok, " hello", " world")) == " hello world"  # no prefix space to remove
    assert tok.decode(byte_ids(tok, "中")) == "中"
    texts = ["hello world", "  a\n\n\nb\t", "añ 中🙂\r\n", 'x <|"|> y', "<|turn>model\nhi<turn|>"]
    for text in texts:
        assert tok.decode(tok.encode(text, special=True)) == text
        dec = tok.stream_decoder()
        assert "".join(dec.feed(i) for i in tok.encode(text)) + dec.flush() == text
    turn = tok.vocab.token_to_id["<|turn>"]
    assert tok.decode([turn, *ids(tok, "a")], skip_special=True) == "a"
    assert tok.token_bytes(ids(tok, " th")[0]) == b" th"


def test_fast_path_equals_the_ported_merge_loop_on_random_texts(tok) -> None:
    rng = random.Random(0)
    alphabet = "helo wrdaus mthi\n\n\t中ñé<|>:" + "  "
    enc = tok._gemma4
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        piece = text.replace("\n", "")
        assert tok.encode(piece) == merge_reference(tok.vocab, enc.ranks, piece.replace(" ", "\u2581")), text
        tok.encode(text)  # newlines and all: no error


def test_a_file_written_as_llama_cpp_converter_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "g4tok.gguf"
    w = GGUFWriter(str(path), "gemma4")
    write_gemma4_tokenizer(w, gemma4_vocab(), n_vocab=512)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile(path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
    assert tok.n_vocab == 512 and tok.kind == "gemma4"
    assert tok.encode("hello world", add_bos=True) == [2, *ids(tok, "h", "ell", "o", " world")]


def test_a_vocabulary_without_merges_is_refused() -> None:
    from llamacy.errors import UnsupportedModelError

    md = metadata()
    del md["tokenizer.ggml.merges"]
    with pytest.raises(UnsupportedModelError, match="merges"):
        Tokenizer.from_metadata(md)


def write_hf_gemma4_tokenizer(directory: Path) -> Any:
    """The same vocabulary as a Hugging Face tokenizer.json (BPE with byte fallback, spaces replaced by "▁",
    the markers as added tokens) and tokenizer_config.json; returns the `tokenizers` Tokenizer."""
    from tokenizers import AddedToken, decoders, models, normalizers
    from tokenizers import Tokenizer as HFTokenizer

    v = gemma4_vocab()
    table = {t: i for i, t in enumerate(v["tokens"])}
    pairs = [tuple(m.split(" ")) for m in v["merges"]]
    hf = HFTokenizer(
        models.BPE(vocab=table, merges=pairs, byte_fallback=True, unk_token="<unk>", fuse_unk=True)
    )
    hf.normalizer = normalizers.Replace(" ", "\u2581")
    hf.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    hf.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in SPECIALS if ty != TokenType.USER_DEFINED]
    )
    hf.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in SPECIALS if ty == TokenType.USER_DEFINED]
    )
    hf.save(str(directory / "tokenizer.json"))
    config = {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "add_bos_token": True, "add_eos_token": False,
    }  # fmt: skip
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return hf


HF_TEXTS = [
    "hello world", " hello", "  hello  world ", "user model", " the thi", "aaa aa a", "hi\n hi\n",
    "añ 中🙂 é\r\n", "<|turn>user\nhello<turn|>\n<|turn>model\n", 'x<|"|>y<|tool_call>call:f{}<tool_call|>',
    "\t\tab\tc", "world, worlds! hello?",
]  # fmt: skip


def test_llamacy_convert_writes_gemma4s_tokenizer_and_it_agrees_with_hugging_face(tmp_path: Path) -> None:
    """`llamacy convert` of a Gemma 4 checkpoint with a tokenizer.json writes the "gemma4" tokenizer as
    Gemma4Model.set_vocab does, and on text without newline runs (which llama.cpp takes whole when they are a
    token) its ids are those of the Hugging Face tokenizer."""
    from llamacy.convert import convert
    from tests.hf_gemma4 import write_gemma4_hf_model

    model = write_gemma4_hf_model(tmp_path / "hf", seed=1)
    (model.path / "tokenizer.model").unlink()  # Gemma 4 ships tokenizer.json
    hf = write_hf_gemma4_tokenizer(model.path)
    out = tmp_path / "conv.gguf"
    convert(model.path, out, "f32", threads=1)
    with GGUFFile(out) as f:
        md = f.metadata
        tok = Tokenizer.from_metadata(md)
    assert md["tokenizer.ggml.model"] == "gemma4" and md["tokenizer.ggml.add_bos_token"] is True
    assert md["tokenizer.ggml.add_space_prefix"] is False
    v = gemma4_vocab()
    n = len(v["tokens"])
    assert list(md["tokenizer.ggml.tokens"])[:n] == v["tokens"]
    assert [int(t) for t in md["tokenizer.ggml.token_type"]][:n] == [int(t) for t in v["types"]]
    assert list(md["tokenizer.ggml.merges"]) == v["merges"]
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (2, 1, 0)
    for text in HF_TEXTS:
        assert tok.encode(text, special=True) == hf.encode(text, add_special_tokens=False).ids, text
    assert tok.encode("a\n\nb") != hf.encode("a\n\nb").ids  # llama.cpp's rule for newline runs
