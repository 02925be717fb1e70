"""Two sequences through one Model the way continuous batching runs them: a prompt chunk each, then one
token per sequence per step. The architectures' "batched = solo" tests compare what comes out with each
sequence evaluated alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def interleaved(path: Path, a: list[int], b: list[int], steps: int, starts: tuple[int, int] = (5, 3)):
    """Logits of a[starts[0]:] and b[starts[1]:] batched together (steps of one token per sequence),
    and of all of a and b each alone from an empty cache: (batched_a, batched_b, alone_a, alone_b)."""
    from llamacy.engine import Llama
    from llamacy.gguf import GGUFFile
    from llamacy.model import Model

    alone = [Llama(path, n_threads=1, n_ctx=64).logits(s) for s in (a, b)]
    m = Model(GGUFFile(path), n_ctx=64, n_threads=1, n_seq=2)
    for s, ids, start in ((0, a, starts[0]), (1, b, starts[1])):
        m.eval_batch(np.array(ids[:start]), np.arange(start), np.full(start, s), np.array([], np.int32))
        m.kv.append(s, ids[:start])  # recorded as the scheduler does (a recurrent state checks positions)
    outs: dict[int, list[np.ndarray]] = {0: [], 1: []}
    for step in range(steps):
        toks, pos, seq = [], [], []
        for s, ids, start in ((0, a, starts[0]), (1, b, starts[1])):
            if start + step < len(ids):
                toks.append(ids[start + step])
                pos.append(start + step)
                seq.append(s)
        out = m.eval_batch(np.array(toks), np.array(pos), np.array(seq), np.arange(len(toks)))
        for row, s in enumerate(seq):
            outs[s].append(out[row])
            m.kv.append(s, [toks[row]])
    return np.stack(outs[0]), np.stack(outs[1]), alone[0][starts[0] :], alone[1][starts[1] :]
