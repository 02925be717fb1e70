"""Perplexity: the reference tool's chunking and scoring, checked against the numpy oracle by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy import Llama
from llamacy.errors import UsageError
from llamacy.perplexity import perplexity
from tests.reference.numpy_forward import reference_logits

TEXT = "the cat sat on the mat and the dog sat on the log; " * 12


def _oracle_ppl(path, llm, text: str, n_ctx: int) -> tuple[float, int]:
    tokens = llm.tokenize(text, add_bos=llm.tokenizer.add_bos, special=False)
    nlls = []
    for i in range(len(tokens) // n_ctx):
        chunk = list(tokens[i * n_ctx : (i + 1) * n_ctx])
        if llm.tokenizer.add_bos:
            chunk[0] = llm.tokenizer.bos_id
        logits = reference_logits(path, chunk).astype(np.float64)
        for j in range(n_ctx // 2, n_ctx - 1):
            row = logits[j]
            lse = math.log(np.exp(row - row.max()).sum()) + row.max()
            nlls.append(lse - row[tokens[i * n_ctx + j + 1]])
    return math.exp(float(np.mean(nlls))), len(nlls)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_matches_oracle(tiny_model, arch):
    path = tiny_model(arch, QT.F32)
    llm = Llama(path, n_threads=1, n_ctx=32, kv_type="f32")
    r = perplexity(llm, TEXT, 32)
    want, n = _oracle_ppl(path, llm, TEXT, 32)
    assert r.n_scored == n
    assert r.ppl == pytest.approx(want, rel=1e-4)
    assert len(r.running) == r.n_chunks
    assert r.running[-1] == pytest.approx(r.ppl)
    assert r.uncertainty > 0


def test_text_too_short_is_a_clear_error(tiny_model):
    llm = Llama(tiny_model("llama", QT.Q8_0), n_threads=1, n_ctx=64)
    with pytest.raises(UsageError, match="needs at least 128"):
        perplexity(llm, "too short", 64)


def test_cli_prints_final_estimate(tiny_model, tmp_path):
    import subprocess
    import sys

    path = tiny_model("llama", QT.Q8_0)
    f = tmp_path / "text.txt"
    f.write_text(TEXT)
    r = subprocess.run(
        [sys.executable, "-m", "llamacy", "perplexity", "-m", str(path), "-f", str(f), "-c", "32", "-t", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("[1]")
    assert lines[-1].startswith("Final estimate: PPL = ")
    value = float(lines[-1].split("=")[1].split("+/-")[0])
    assert value == pytest.approx(perplexity(Llama(path, n_threads=1, n_ctx=32), TEXT, 32).ppl, rel=1e-4)
