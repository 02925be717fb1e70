"""Per-layer memory (llamacy/model/memory.py): sliding-window layers keep only their window, as a ring
that gives the very bits a full cache gives, and the rollback contract that prefix reuse and speculative
decoding rely on."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from llamacy.engine import Llama
from llamacy.model import Model
from llamacy.model.memory import RollbackError

WINDOW = 8  # the tiny gemma3's sliding window (tests/model_factory.py)


def _gemma(tiny_model, **kw):
    return tiny_model("gemma3", QT.Q8_0, n_ctx=256, **kw)


def _model(llm: Llama, n_ctx: int, ubatch: int, kv_type: str = "f32") -> Model:
    return Model(llm.gguf, n_ctx, 1, ubatch=ubatch, cfg=llm.config, kv_type=kv_type, weights=llm.weights)


@pytest.mark.parametrize("kv_type", ["f32", "f16"])
def test_window_ring_gives_the_bits_of_a_full_cache(tiny_model, kv_type):
    llm = Llama(_gemma(tiny_model), n_ctx=256, n_threads=1)
    ring = _model(llm, 200, 4, kv_type)  # rings of 8 + 4 - 1 = 11 positions, stored twice
    full = _model(llm, 200, 120, kv_type)  # 2 * (8 + 119) >= 200: every layer keeps every position
    local = [lm for lm in ring.memory.layers if lm.window]
    assert local and all(lm.ring == 11 and lm.slots == 22 for lm in local)
    assert all(lm.ring == 0 and lm.slots == 200 for lm in full.memory.layers)
    assert ring.memory.nbytes < full.memory.nbytes / 3
    ids = [int(t) for t in np.random.default_rng(0).integers(3, 200, 90)]
    # A prompt in uneven chunks (micro-batches of 4 wrap the ring many times), then decoding.
    a = np.concatenate([ring.eval(ids[i:j], logits="all") for i, j in ((0, 3), (3, 40), (40, 70))])
    b = np.concatenate([full.eval(ids[i:j], logits="all") for i, j in ((0, 3), (3, 40), (40, 70))])
    assert np.array_equal(a, b)
    for t in ids[70:]:
        assert np.array_equal(ring.eval([t]), full.eval([t]))


def test_rollback_contract_of_a_ring(tiny_model):
    llm = Llama(_gemma(tiny_model), n_ctx=256, n_threads=1)
    m = _model(llm, 200, 4)
    mem = m.memory
    assert mem.max_rollback == 4  # ring - window + 1 = the micro-batch
    ids = [int(t) for t in np.random.default_rng(1).integers(3, 200, 40)]
    m.eval(ids)
    # Position n needs n - 7 .. n - 1; the rings hold 29 .. 39.
    assert mem.lowest_cut(0) == 40 - 11 + WINDOW - 1 == 36
    with pytest.raises(RollbackError, match="can go back to 36"):
        mem.truncate(0, 20)
    assert mem.length(0) == 40  # a refused cut changes nothing
    mem.truncate(0, 37)  # dropping 3 of the newest: within max_rollback
    again = m.eval(ids[37:], logits="all")
    fresh = _model(llm, 200, 4)
    assert np.array_equal(again, fresh.eval(ids, logits="all")[37:])
    # Prefix reuse that would need overwritten rows starts over instead of computing from them.
    assert mem.reuse_prefix(0, [*ids[:20], 5, 6]) == 0 and mem.length(0) == 0
    # A full-attention model can always go back.
    llama = Llama(tiny_model("llama", QT.Q8_0), n_ctx=64, n_threads=1)
    assert llama.new_model(64, 1).memory.max_rollback is None


def test_speculative_decoding_on_rings_keeps_greedy_output(tiny_model):
    path = _gemma(tiny_model)
    plain = Llama(path, n_ctx=200, n_threads=1, n_batch=4)
    assert any(lm.ring for lm in plain.session.model.memory.layers)
    prompt = "ab ab ab ab ab ab ab ab ab ab ab ab"
    want = plain.create_completion(prompt, max_tokens=60, temperature=0)["choices"][0]["text"]
    fast = Llama(path, n_ctx=200, n_threads=1, n_batch=4)
    got = fast.create_completion(prompt, max_tokens=60, temperature=0, speculate="ngram", draft_max=16)
    assert got["choices"][0]["text"] == want
    assert fast.last.stats.draft_accepted > 0  # drafts were made, capped at the ring's rollback


def test_kv_bytes_count_only_the_window(tiny_model):
    llm = Llama(_gemma(tiny_model), n_ctx=256, n_threads=1)
    cfg = llm.config
    n_local = sum(1 for w in cfg.layer_window if w)
    row = 2 * cfg.n_head_kv * cfg.head_dim * 2  # K + V, f16
    assert cfg.kv_bytes(4096, ubatch=256) == row * (
        n_local * 2 * (WINDOW + 255) + (cfg.n_layer - n_local) * 4096
    )
    assert cfg.kv_bytes(64, ubatch=256) == row * cfg.n_layer * 64  # a ring no smaller than the context: none
    mix = cfg.layer_mix(4096)
    assert [(g["count"], g["positions"]) for g in mix] == [
        (n_local, 2 * (WINDOW + 255)),
        (cfg.n_layer - n_local, 4096),
    ]
