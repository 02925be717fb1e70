"""benchmarks/make_models.py's Gemma 4 writer: the checkpoint it streams converts and runs.

The E2B-shaped model itself (4.6B parameters) is too big for the suite; the same writer at a tiny width,
with E2B's layer pattern (4 sliding + 1 full), shared-KV layers and per-layer inputs, is converted by
`llamacy convert` and generates text, and E2B's own spec is checked for the shapes its config gives.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from llamacy.engine import Llama
from tests.hf_gemma4 import gemma4_text_config, layer_shape

ROOT = Path(__file__).resolve().parent.parent
# loaded by path: benchmarks/ is not a package, and putting it on sys.path would shadow names for the session
_spec = importlib.util.spec_from_file_location("make_models", ROOT / "benchmarks" / "make_models.py")
make_models = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_models", make_models)  # its dataclasses look their module up there
_spec.loader.exec_module(make_models)


def test_e2b_spec_has_e2bs_shapes() -> None:
    spec = dict(make_models.GEMMA4["gemma4-e2b"])
    c = gemma4_text_config(spec.pop("vocab_size"), **spec)
    shapes = [layer_shape(c, il) for il in range(c["num_hidden_layers"])]
    assert len(shapes) == 35 and sum(not s["sliding"] for s in shapes) == 7
    assert [s["shared"] for s in shapes] == [False] * 15 + [True] * 20
    assert {s["n_ff"] for s in shapes[:15]} == {6144} and {s["n_ff"] for s in shapes[15:]} == {12288}
    assert {s["head_dim"] for s in shapes if s["sliding"]} == {256}
    assert {s["head_dim"] for s in shapes if not s["sliding"]} == {512}


def test_tiny_gemma4_from_the_writer_converts_and_runs(tmp_path, monkeypatch) -> None:
    tiny = dict(
        make_models.GEMMA4["gemma4-e2b"],
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=10,
        head_dim=16,
        global_head_dim=32,
        num_kv_shared_layers=4,
        hidden_size_per_layer_input=8,
        vocab_size=512,
        vocab_size_per_layer_input=512,
        sliding_window=8,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
    )
    monkeypatch.setitem(make_models.GEMMA4, "tiny", tiny)
    make_models.write_gemma4(tmp_path / "hf", "tiny")
    out = tmp_path / "tiny.gguf"
    subprocess.run(
        [sys.executable, "-m", "llamacy", "convert", str(tmp_path / "hf"), "-o", str(out), "--type", "q8_0"],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    llm = Llama(out, n_threads=1, n_ctx=64)
    logits = llm.model.eval([2, 10, 11, 12], logits="all")
    assert logits.shape == (4, 512)
    assert (abs(logits) <= 30.0 + 1e-3).all()  # final soft-capping at 30


def test_synthetic_vocabulary_writes_only_valid_utf8(tmp_path) -> None:
    # llama-server answers HTTP 500 to a completion that is not valid UTF-8, so a random model must never be
    # able to write a lone lead or continuation byte: every token but those 128 is text on its own, and
    # their embedding rows (the tied head) are zero.
    import json

    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    shape = make_models.Shape("llama", 64, 128, 1, 4, 2, 6000, 5000, True, make_models.LLAMA3_ROPE)
    make_models.write_checkpoint(tmp_path, "tiny", shape)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    decode = {c: b for b, c in make_models.byte_symbols()}
    lone = set(make_models.lone_byte_ids())
    assert len(lone) == 128 and len(vocab) == shape.n_text_tokens + 3
    for piece, i in vocab.items():
        if i in lone or piece.startswith("<|"):
            continue
        bytes(decode[c] for c in piece).decode("utf-8")  # raises if not valid UTF-8
    assert all(
        a in vocab and b in vocab and a + b in vocab
        for a, b in (m.split(" ") for m in tok["model"]["merges"])
    )
    emb = load_file(str(tmp_path / "model-embed.safetensors"))["model.embed_tokens.weight"]
    assert not emb[sorted(lone)].any() and np.count_nonzero(emb.any(axis=1)) == shape.vocab - 128

    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "Grüße, señor: ¿qué tal? ω"
    assert hf.decode(hf.encode(text).ids) == text
