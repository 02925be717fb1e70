"""The recurrent memory kind's bookkeeping (llamacy/model/memory.py): where a sequence can go back to, and
that going back restores the state copy for exactly that length. The mixers that write the states are
tested with their architectures (test_nemotron_h.py, test_qwen3next.py); here the layer loop's writes are
played by hand, so that every rule is checked against known values."""

from __future__ import annotations

import numpy as np
import pytest

from llamacy.model import memory_file
from llamacy.model.config import ModelConfig
from llamacy.model.memory import MAX_CHECKPOINTS, Memory, RollbackError
from llamacy.model.memory_file import MemoryFileError, load_memory, save_memory

CONV, SSM = 6, 10


def _cfg(window: int = 0) -> ModelConfig:
    return ModelConfig(
        arch="test", name="", n_vocab=50, n_ctx_train=512, n_embd=8, n_layer=3, n_head=2, n_head_kv=1,
        head_dim=4, n_ff=16, n_rot=4, rms_eps=1e-5, rope_base=10000.0,
        layer_mixer=["mamba2", "attention", "deltanet"], layer_window=[0, window, 0],
        layer_state_conv=[CONV, 0, CONV], layer_state_ssm=[SSM, 0, 2 * SSM],
    )  # fmt: skip


def _eval(mem: Memory, seq: int, tokens: list[int]) -> None:
    """What the layer loop does for a multi-token run: each token's state is a value that says which
    position it follows (state = position + 1, per layer), the last n_snap are snapshot, then append."""
    start = mem.length(seq)
    n = len(tokens)
    for i, _ in enumerate(tokens):
        p = start + i
        for k, lm in enumerate(mem.recurrent):
            lm.state[seq, 0] = p + 1 + 1000 * k
            if n > 1 and i >= n - mem.n_snap:
                lm.state[seq, 1 + p % mem.n_snap] = lm.state[seq, 0]
        if n > 1 and i >= n - mem.n_snap:
            mem.snap_pos[seq, p % mem.n_snap] = p
    mem.append(seq, tokens)


def _at(mem: Memory, seq: int = 0) -> list[float]:
    return [float(lm.state[seq, 0, 0]) for lm in mem.recurrent]


def test_layout_and_sizes():
    cfg = _cfg()
    assert cfg.recurrent and cfg.state_bytes == 4 * (2 * CONV + 3 * SSM)
    mem = Memory(cfg, 64, n_seq=2, snapshots=4)
    assert [lm.kind for lm in mem.layers] == ["recurrent", "kv", "recurrent"]
    assert [lm.state.shape for lm in mem.recurrent] == [(2, 5, CONV + SSM), (2, 5, CONV + 2 * SSM)]
    assert mem.max_rollback == 3
    # Recurrent layers keep no K/V rows; the attention layer's are counted as before.
    assert cfg.kv_bytes(64, 1, "f32") == 2 * 64 * 1 * 16
    assert {g["mixer"]: g["state_bytes"] for g in cfg.layer_mix(64)}["mamba2"] == 4 * (CONV + SSM)


def test_default_snapshots_fit_the_budget():
    assert Memory(_cfg(), 64).n_snap == 17  # small states: enough for a full draft
    assert Memory(ModelConfig(**{**vars(_cfg()), "layer_state_ssm": [40 << 20, 0, 0]}), 64).n_snap == 2
    plain = {"layer_mixer": ["attention"] * 3, "layer_state_conv": [0] * 3, "layer_state_ssm": [0] * 3}
    assert Memory(ModelConfig(**{**vars(_cfg()), **plain}), 64).n_snap == 0
    with pytest.raises(ValueError, match="recurrent mixer"):
        _ = ModelConfig(**{**vars(_cfg()), "layer_state_ssm": [0, 5, 0], "layer_state_conv": [0] * 3}).layers


def test_truncate_restores_snapshots_and_refuses_without_a_copy():
    mem = Memory(_cfg(), 64, snapshots=4)
    _eval(mem, 0, list(range(10)))  # snapshots after positions 6..9
    assert _at(mem) == [10, 1010]
    for n in (10, 9, 8, 7):
        assert mem.can_cut(0, n)
    assert not mem.can_cut(0, 6) and not mem.can_cut(0, 3)
    with pytest.raises(RollbackError):
        mem.truncate(0, 5)
    assert mem.length(0) == 10 and _at(mem) == [10, 1010]  # a refusal changes nothing
    mem.truncate(0, 8)
    assert mem.length(0) == 8 and _at(mem) == [8, 1008]
    # The snapshot of position 8 and 9 belonged to the dropped tokens.
    assert sorted(mem.snap_pos[0].tolist()) == [-1, -1, 6, 7]
    # A single token (plain decoding) keeps no snapshot: the live state is enough for it.
    _eval(mem, 0, [3])
    assert _at(mem) == [9, 1009] and mem.can_cut(0, 8) and not mem.can_cut(0, 6)


def test_checkpoints_and_reuse_prefix():
    mem = Memory(_cfg(), 64, snapshots=3)
    prompt = list(range(20))
    _eval(mem, 0, prompt)
    mem.checkpoint(0)  # the end of the prompt
    for t in range(5):  # decoding: one token at a time
        _eval(mem, 0, [40 + t])
    # The next turn re-renders the reply: the common prefix ends inside it. The best cut is the prompt's end.
    nxt = [*prompt, 40, 41, 7, 8, 9]
    assert mem.common_prefix(0, nxt) == 22
    assert mem.best_cut(0, 22) == 20
    assert mem.reuse_prefix(0, nxt) == 20 and _at(mem) == [20, 1020]
    # The whole history matching: nothing restored, the live state continues.
    _eval(mem, 0, [1, 2])
    assert mem.reuse_prefix(0, mem.tokens[0] + [5]) == 22 and _at(mem) == [22, 1022]
    # At most MAX_CHECKPOINTS, the newest kept; below every copy: from the start.
    for _ in range(MAX_CHECKPOINTS + 1):
        _eval(mem, 0, [9])
        mem.checkpoint(0)
    assert [c for c, _ in mem.checkpoints[0]] == [24, 25]
    assert mem.reuse_prefix(0, [0, 1, 2, 3, 99]) == 0 and mem.length(0) == 0
    assert mem.checkpoints[0] == [] and (mem.snap_pos[0] == -1).all()


def test_checkpoint_survives_truncate_to_itself_and_copies_the_state():
    mem = Memory(_cfg(), 64, snapshots=2)
    _eval(mem, 0, list(range(6)))
    mem.checkpoint(0)
    _eval(mem, 0, [1, 2, 3])
    mem.truncate(0, 6)
    assert _at(mem) == [6, 1006] and [c for c, _ in mem.checkpoints[0]] == [6]
    _eval(mem, 0, [4])
    assert mem.checkpoints[0][0][0] == 6 and mem.checkpoints[0][0][1][0][0] == 6  # a copy


def test_sequences_are_independent():
    mem = Memory(_cfg(), 64, n_seq=2, snapshots=3)
    _eval(mem, 0, list(range(8)))
    _eval(mem, 1, list(range(5)))
    mem.truncate(1, 4)
    assert _at(mem, 0) == [8, 1008] and _at(mem, 1) == [4, 1004]
    mem.clear(0)
    assert mem.length(1) == 4 and (mem.snap_pos[0] == -1).all() and (mem.snap_pos[1] >= 0).any()


def test_window_and_recurrent_layers_both_bound_the_cut():
    mem = Memory(_cfg(window=4), 64, snapshots=8, ubatch=2)  # ring of 4 + 2 - 1 = 5 positions
    assert mem.max_rollback == 2  # the ring's bound (5 - 4 + 1) is below the snapshots' (7)
    _eval(mem, 0, list(range(20)))
    assert mem.lowest_cut(0) == 18
    assert mem.can_cut(0, 18) and not mem.can_cut(0, 17)  # a snapshot exists, the ring's rows do not
    assert mem.best_cut(0, 17) == 0


def test_memory_file_keeps_the_state(tmp_path, monkeypatch):
    cfg = _cfg()
    mem = Memory(cfg, 64, snapshots=4)
    _eval(mem, 0, list(range(12)))
    rng = np.random.default_rng(0)
    for lm in mem.recurrent:
        lm.state[0, 0] = rng.standard_normal(lm.state.shape[2])
    live = [lm.state[0, 0].copy() for lm in mem.recurrent]
    path = tmp_path / "m.bin"
    save_memory(path, mem, 0, "id", "test")
    other = Memory(cfg, 64, snapshots=4)
    assert load_memory(path, other, 0, "id", "test").tokens == list(range(12))
    assert all(np.array_equal(lm.state[0, 0], v) for lm, v in zip(other.recurrent, live, strict=True))
    # The snapshots came along: the loaded sequence can go back as far as the saved one could.
    assert other.copy_lengths(0) == mem.copy_lengths(0) == [9, 10, 11]
    other.truncate(0, 9)
    assert _at(other) == [9, 1009]
    # An earlier length is saved from its snapshot; one without a copy is refused.
    save_memory(path, mem, 0, "id", "test", n_tokens=10)
    load_memory(path, other, 0, "id", "test")
    assert other.length(0) == 10 and _at(other) == [10, 1010]
    with pytest.raises(MemoryFileError, match="recurrent state"):
        save_memory(path, mem, 0, "id", "test", n_tokens=3)
    # Another state size: refused before anything is written.
    save_memory(path, mem, 0, "id", "test")
    small = Memory(ModelConfig(**{**vars(cfg), "layer_state_ssm": [SSM, 0, SSM]}), 64, snapshots=4)
    with pytest.raises(MemoryFileError, match="state does not match"):
        load_memory(path, small, 0, "id", "test")
    assert small.length(0) == 0
    # A file from before the state's column-major order (no "order") would be misread: refused.
    with monkeypatch.context() as m:
        m.setattr(memory_file, "STATE_ORDER", None)
        save_memory(path, mem, 0, "id", "test")
    fresh = Memory(cfg, 64, snapshots=4)
    with pytest.raises(MemoryFileError, match="another order; delete the file"):
        load_memory(path, fresh, 0, "id", "test")
    assert fresh.length(0) == 0
    mem.checkpoint(0)  # at 12; then 5 more tokens push it out of the snapshots' reach
    _eval(mem, 0, [1, 2, 3, 4, 5])
    save_memory(path, mem, 0, "id", "test")
    load_memory(path, other, 0, "id", "test")
    assert other.copy_lengths(0) == [12, 14, 15, 16] and [c for c, _ in other.checkpoints[0]] == [12]
    other.truncate(0, 12)  # the checkpoint: the random live state it was taken from
    assert all(np.array_equal(lm.state[0, 0], v) for lm, v in zip(other.recurrent, live, strict=True))
