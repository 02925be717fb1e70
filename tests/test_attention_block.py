"""A prompt's attention in blocks of tokens (ops.attend_block, attention_block.h): every (token, head) gets
bit for bit what the grouped kernel gives it alone, on AVX2 and AVX-512 vectors (attention512.h), so a prompt
gives the same logits whole, in micro-batches, one token at a time and beside another sequence."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from llamacy.kernels import ops, testing
from llamacy.model.kv_types import kv_format

WIDE_AVAILABLE = ops.set_attention_wide(True)
ops.set_attention_wide(ops.ATTENTION_WIDE)


@pytest.fixture(params=[False, True], ids=["avx2", "avx512"])
def wide(request):
    """The block kernel on AVX2 vectors, then on AVX-512's where this CPU has them; restored after."""
    if request.param and not WIDE_AVAILABLE:
        pytest.skip("no AVX-512F here (or a build without the wide kernel)")
    ops.set_attention_wide(request.param)
    yield request.param
    ops.set_attention_wide(ops.ATTENTION_WIDE)


def _rows(rng, n, hd, kv_type):
    """K (twice V's spread) and V rows as the cache holds them in kv_type."""
    K = (rng.standard_normal((n, hd)) * 2).astype(np.float32)
    V = rng.standard_normal((n, hd)).astype(np.float32)
    if kv_type == "f32":
        return K, V, -1
    if kv_type == "f16":
        return K.astype(np.float16), V.astype(np.float16), -1
    fmt = kv_format(kv_type)
    return testing.py_store_kv_rows(K, fmt), testing.py_store_kv_rows(V, fmt), fmt


# head_dim 8 and 72 leave 8 columns after the 16- and 64-column vectors; 32 and 96 take the AVX2 kernels'
# one-vector column path. Heads 1, 3 (a pair and one), 4 and 7 (four, a pair and one); the AVX-512 kernel
# takes the block's queries four at a time across tokens, so 3 heads x 5 tokens ends in 3. Ranges: the
# first position past 0, 0..7 rows after the blocks of 8 that every token sees, and blocks ending inside
# the tokens' own rows.
# Quantized rows need head_dim a multiple of 32.
CASES = [
    (t, hd)
    for t in ("f32", "f16", "q8_0", "q4_0")
    for hd in (8, 32, 64, 72, 96, 128, 256)
    if t[0] == "f" or hd % 32 == 0
]


@pytest.mark.parametrize(("kv_type", "hd"), CASES)
def test_block_equals_grouped_kernel_per_token(wide, kv_type, hd):
    rng = np.random.default_rng(hd)
    n = 160
    K, V, fmt = _rows(rng, n, hd, kv_type)
    for heads in (1, 3, 4, 7):
        for tokens in (1, 5, 8):
            for first, last0 in ((0, 0), (0, 7), (3, 9), (5, 30), (9, 44), (0, 131)):
                q = rng.standard_normal((tokens, heads, hd)).astype(np.float32)
                got = testing.py_attend_block(q, K, V, first, last0, 1 / np.sqrt(hd), kv_fmt=fmt)
                for i in range(tokens):
                    want = testing.py_attend_group(q[i], K, V, first, last0 + i, 1 / np.sqrt(hd), kv_fmt=fmt)
                    assert np.array_equal(got[i], want), (heads, tokens, first, last0, i)


def test_block_matches_numpy(wide):
    """Against float64 numpy attention over the same rows (an oracle independent of the kernels)."""
    rng = np.random.default_rng(7)
    hd, heads, tokens, first, last0 = 64, 3, 8, 2, 90
    K, V, _ = _rows(rng, 100, hd, "f16")
    q = rng.standard_normal((tokens, heads, hd)).astype(np.float32)
    got = testing.py_attend_block(q, K, V, first, last0, 0.125)
    for i in range(tokens):
        rows = slice(first, last0 + i + 1)
        s = q[i].astype(np.float64) @ K[rows].astype(np.float64).T * 0.125
        p = np.exp(s - s.max(axis=1, keepdims=True))
        want = (p / p.sum(axis=1, keepdims=True)) @ V[rows].astype(np.float64)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)


def test_engine_sizes_the_block_scratch_with_the_kernel_constant():
    from llamacy import engine

    assert engine.ATT_BLOCK_TOKENS == ops.ATT_BLOCK_TOKENS


def test_block_rejects_bad_ranges():
    K = np.zeros((10, 8), np.float32)
    with pytest.raises(ValueError, match="range"):
        testing.py_attend_block(np.zeros((4, 1, 8), np.float32), K, K, 0, 7, 1.0)  # token 3 would read row 10
    with pytest.raises(ValueError, match="range"):
        testing.py_attend_block(np.zeros((1, 1, 8), np.float32), K, K, 5, 4, 1.0)


def _ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, 300, n).tolist()


# Gemma 3's tiny model slides a window of 8 on its local layers: past it, each token's first position
# differs, and the blocks split into runs of one. Llama with 9 query heads over 3 KV heads.
@pytest.mark.parametrize(
    ("arch", "heads"), [("llama", {"n_head": 9, "n_head_kv": 3}), ("gemma3", {"n_head": 4, "n_head_kv": 1})]
)
@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_prompt_blocks_give_decode_bits(tiny_model, wide, arch, heads, kv_type):
    path = tiny_model(arch, QT.F32, **heads)
    ids = _ids(45)
    whole = Llama(path, n_threads=1, kv_type=kv_type).logits(ids)
    for threads, n_batch in ((2, 512), (1, 19), (2, 1)):
        other = Llama(path, n_threads=threads, n_batch=n_batch, kv_type=kv_type).logits(ids)
        np.testing.assert_array_equal(other, whole, err_msg=f"threads={threads} n_batch={n_batch}")


def test_two_prompts_in_one_batch_equal_each_alone(tiny_model, wide):
    """Two sequences' prompts in one micro-batch: a block of tokens that spans both splits at the boundary
    (their rows differ), and each gets the bits it gets alone."""
    from llamacy.gguf import GGUFFile
    from llamacy.model import Model

    path = tiny_model("llama", QT.F32, n_head=9, n_head_kv=3)
    a, b = _ids(21, seed=1), _ids(19, seed=2)  # a's last block of 8 holds a's 5 last tokens and b's 3 first
    alone = [Llama(path, n_threads=1, n_ctx=64, kv_type="f16").logits(s) for s in (a, b)]
    m = Model(GGUFFile(path), n_ctx=64, n_threads=2, n_seq=2, kv_type="f16")
    toks = np.array(a + b)
    pos = np.concatenate([np.arange(len(a)), np.arange(len(b))])
    seq = np.concatenate([np.zeros(len(a), int), np.ones(len(b), int)])
    out = m.eval_batch(toks, pos, seq, np.arange(len(toks)))
    np.testing.assert_array_equal(out[: len(a)], alone[0])
    np.testing.assert_array_equal(out[len(a) :], alone[1])
