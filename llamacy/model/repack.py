"""Weights rewritten once into the layout their kernels read fastest.

On a CPU whose AVX-512 VNNI kernels are on, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K matrices go into
8-row tiles (kernels/repack.pyx; read by matmul512_x8.pxi and matmul512_kx8.pxi), as llama.cpp's CPU
"repack" buffers hold them. On any other AVX2 CPU, Q4_0, Q8_0, Q4_K and Q6_K do (read by mm_avx2_x8.pxi and
mm_avx2_kx8.pxi; the other types keep the file's layout there: usable_layout). The row-lane kernels would
otherwise transpose 8 rows' quants per block in every product of more than a few tokens (a server step of
8 sequences pays that on every matrix), and decode would unpack them row by row.
The tiles give the same numbers as the stored rows, bit for bit.

When: a Llama repacks between evaluations by default (DeferredRepack below: the first token does not
wait for it), at load where asked (Llama(repack="load"), LLAMACY_REPACK=load: benchmarks, servers,
profiling).

The cost: the repacked matrices live in anonymous memory instead of the file's page cache (Q4_0's,
Q4_1's, Q5_0's, Q8_0's and Q6_K's tiles are the same size, Q4_K's 3% and Q5_K's 2% larger: scales unpacked; the mapping's pages of those tensors
are read once, then released), so processes serving one file no longer share them; and the load reads
every such matrix once. LLAMACY_REPACK=0 keeps the file's layout.

Where: one allocation for all of a model's tiles, on a 2 MiB boundary and advised MADV_HUGEPAGE
(kernels/repack.pyx's arena; DeferredRepack takes it whole before packing the first matrix). One numpy
array per matrix left most of each on 4 KB pages (numpy advises huge pages only for arrays of 4 MiB or more,
and only their aligned inside gets them: 686 of qwen2.5-1.5b Q4_K_M's 1,080 MB). Decode's products over
the arena, kernel alone (benchmarks/bench_pages.py, Zen 4, 2 threads): 1.15x (Q4_K with Q6_K), 1.17x (Q8_0),
1.03x (Q4_0).

Mixture-of-experts stacks ([n_expert, rows, cols] tensors bound as one matrix) go into tiles too where the
VNNI kernels are on and an expert's rows are a multiple of 8 (experts_repackable; moe.pyx reads an expert's
tiles), when the repacking is done at load (servers, benchmarks, LLAMACY_REPACK=load) or in idle time: a
decode step reads only the chosen experts, so their products are where such a model spends its weight
bytes. Zen 4, 2
threads, a synthetic Q4_K_M MoE file with Qwen3-30B-A3B's layer shapes, its stacks tiled and stored in one
process (BENCHMARKS.md, session 30): decode 1.20x, prefill 1.05x. Evaluations do not pack them: each
evaluation packs at least one matrix, and a stack takes longer to pack than a MoE decode step takes, so the
first tokens slowed more than the tiles gave back (on that 1.16 GiB file, load, a 16-token prompt and 64
tokens took 0.87-2.61 s instead of 0.68-0.84 s). They wait for idle time instead: a chat packs them while it
waits for the next message (DeferredRepack's idle entries), so its replies after the first read tiles.

Q8_0 goes into tiles too (one stream instead of 8 rows of 34-byte blocks). On the Intel Xeon of issue #29
(2 threads): qwen2.5-1.5b Q8_0 decode 10.3 -> 15.5 t/s (its 1536-wide rows are 48 blocks), llama-3.2-1b Q8_0
1.03x; the load then takes 1.3-4.5 s to the first token instead of 0.7 s (llama.cpp's CLI, which repacks
too: 4.6-6.8 s on the same file). On Zen 4: decode 1.25x on both qwen2.5-1.5b and llama-3.2-1b Q8_0; the
first token 2.4-3.0 s instead of 0.7-1.0 s, where llama.cpp's CLI (which keeps Q8_0 as stored there) takes
1.5-2.4 s: kept as the default for the decode (BENCHMARKS.md, session 18). Deferred past the first token
(session 20), qwen2.5-1.5b Q8_0 reaches it in 0.93-1.20 s (repacked at load: 2.75-3.68 s; llama.cpp's CLI
1.92-2.13 s).

Q6_K goes into tiles too (issue #29, session 21), and so does an output head tied to the token embeddings
(weights.py binds it as a matrix of its own; the embeddings stay rows, read one row per token from the
file's mapping). Q6_K is the output head of most K-quant files (215 MB of Llama-3.2-1B Q4_K_M's 763 MB) and
half their FFN down matrices; as stored its decode reads 8 rows as 8 streams. On Zen 4, 2 threads, beside
the tree before: llama-3.2-1b Q4_K_M decode 1.14x with its FFN down alone in tiles, qwen2.5-1.5b Q4_K_M
(untied Q6_K head) 1.07x (BENCHMARKS.md).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from dataclasses import replace
from typing import Any

# traits.pxd's LAYOUT_* (WeightT.layout, weights.Matrix.layout), as kernels/repack.pyx exports them.
from llamacy.kernels.repack import (  # noqa: F401
    LAYOUT_Q4_0_X8,
    LAYOUT_Q4_1_X8,
    LAYOUT_Q4_K_X8,
    LAYOUT_Q5_0_X8,
    LAYOUT_Q5_K_X8,
    LAYOUT_Q6_K_X8,
    LAYOUT_Q8_0_X8,
    LAYOUT_STORED,
)

# Tiles already made in this process, by (file, size, mtime, part, offset): several Llama objects over one
# file (threads each with their own, the server's embedder) share one copy, as they share the page cache.
_TILES: weakref.WeakValueDictionary[tuple, Any] = weakref.WeakValueDictionary()


def repack_enabled() -> bool:
    """Whether repacking applies here: some tiled layout has a kernel (every one where this CPU's VNNI
    kernels are on, Q4_0's, Q8_0's, Q4_K's and Q6_K's on any AVX2 CPU), LLAMACY_REPACK is not 0."""
    if os.environ.get("LLAMACY_REPACK", "") == "0":
        return False
    from llamacy.kernels.matmul import any_tiles_available

    return bool(any_tiles_available())


def usable_layout(wtype: int, rows: int, cols: int) -> int:
    """The tiled layout a matrix takes here: its shape's (kernels/repack.pyx's tile_layout) where a kernel
    reads that layout on this CPU, else LAYOUT_STORED."""
    from llamacy.kernels.matmul import layout_available
    from llamacy.kernels.repack import tile_layout

    layout = tile_layout(wtype, rows, cols)
    return layout if layout != LAYOUT_STORED and layout_available(layout) else LAYOUT_STORED


def experts_repackable(rows_per_expert: int) -> bool:
    """Whether a stack of experts of this many rows each is repacked (at load, or deferred to idle time: see
    above): where every tiled layout has its kernel (the VNNI kernels are on), so that the tiles give the
    bits the stored stack gives (matmul_rows runs the same tile code over gathered rows), and a model may
    switch between evaluations, and where 8-row tiles never straddle two experts. On
    AVX2 alone the stored experts run the per-lane kernels (matmul.pyx's IMPL_ROWS), whose float order the
    tiles do not keep: they stay stored."""
    from llamacy.kernels.matmul import tiles_available

    return rows_per_expert % 8 == 0 and bool(tiles_available())


def repack_matrices(
    requests: list[tuple], n_threads: int, outs: list[Any] | None = None
) -> list[tuple[Any, int] | None]:
    """For each (wtype, rows, cols, data, key, release): (the matrix's bytes in the layout its kernel
    reads fastest, that layout), or None where none applies. All are packed in one pass without the GIL
    (kernels/repack.pyx's repack_many), into one allocation on huge pages (its arena) unless `outs` gives
    each request its destination (tile_arena). key: where the bytes come from, to share the result within
    the process (None: not shared); release: data is a file mapping whose pages may be given back once
    copied."""
    from llamacy.kernels.repack import repack_many

    results: list[tuple[Any, int] | None] = [None] * len(requests)
    todo = []
    for i, (wtype, rows, cols, _, key, _) in enumerate(requests):
        layout = usable_layout(wtype, rows, cols)
        if layout == LAYOUT_STORED:
            continue
        tiles = _TILES.get(key) if key is not None else None
        if tiles is not None:
            results[i] = (tiles, layout)
        else:
            todo.append(i)
    items = []
    for i in todo:
        wtype, rows, cols, data, _, release = requests[i]
        items.append((wtype, data, rows, cols, release))
    dst = [outs[i] for i in todo] if outs is not None else None
    for i, (tiles, layout) in zip(todo, repack_many(items, n_threads, dst), strict=True):
        key = requests[i][4]
        if key is not None:
            _TILES[key] = tiles
        results[i] = (tiles, layout)
    return results


def tile_arena(requests: list[tuple]) -> list[Any]:
    """For each repack_matrices request, the array its tiles will fill (None where it has no tile layout):
    views of one allocation on huge pages, made before any is packed (pages are backed as they are
    written), so that matrices packed one at a time still share huge pages."""
    from llamacy.kernels.repack import arena, tiled_bytes

    sizes = [
        tiled_bytes(wtype, rows, cols) if usable_layout(wtype, rows, cols) != LAYOUT_STORED else 0
        for wtype, rows, cols, *_ in requests
    ]
    return [view if size else None for view, size in zip(arena(sizes), sizes, strict=True)]


class DeferredRepack:
    """The repacking a load left for later: the matrices still in the file's layout, packed a few at a
    time between evaluations (Model.eval_batch calls `advance` before each one but the first).

    Why later: on a VM the kernel zeroes, and the host backs, every fresh page the tiles take; on the Zen 4
    of issue #29 that is most of a 1.8 GB Q8_0 model's 1.2-3 s repack, and it stood between the command
    and its first token. The stored rows and the tiles give the same numbers bit for bit (tests/
    test_repack.py), so a model may switch from one to the other between any two evaluations: the first
    token comes as soon as the stored layout allows, and the decode reaches tile speed a few tokens later.

    Each entry is (fields, field, request): the dict of a ModelWeights that holds the matrix, its key there,
    and repack_matrices' request for it. `generation` counts the matrices swapped in; a Model rebinds its
    C records when it sees a new one.

    The last `idle` entries (a MoE model's expert stacks) wait for idle time: advance(idle=True), which a
    chat runs while it waits for the next message (engine.Llama.idle). Evaluations do not pack them: each
    evaluation packs at least one matrix, and a stack takes longer to pack than a MoE decode step (module
    docstring)."""

    def __init__(self, todo: list[tuple[dict, str, tuple]], threads: int, idle: int = 0) -> None:
        # Each entry with its destination in one arena; popped from the end: in the order given.
        dsts = tile_arena([request for _, _, request in todo])
        self._todo = list(reversed(list(zip(todo, dsts, strict=True))))
        self._idle = idle  # how many of the entries left, the last in order, wait for idle time
        self._threads = threads
        self._lock = threading.Lock()
        self.generation = 0

    @property
    def done(self) -> bool:
        """Nothing left for evaluations to pack (idle time may still have some: pending)."""
        return len(self._todo) <= self._idle

    @property
    def pending(self) -> bool:
        """Anything left to pack, idle time's entries included."""
        return bool(self._todo)

    def advance(
        self,
        budget_s: float,
        wait: bool = False,
        stop: Any = None,
        threads: int | None = None,
        idle: bool = False,
    ) -> bool:
        """Pack matrices until budget_s seconds are spent (at least one) or `stop` (a threading.Event) is
        set; False if nothing is left, or if another thread is packing now and not wait (the caller goes on
        with what it has bound). threads: for this call (default: the Models' count). idle: the entries
        that wait for idle time too, after the others."""
        floor = 0 if idle else self._idle
        if len(self._todo) <= floor or not self._lock.acquire(blocking=wait):
            return False
        try:
            t0 = time.perf_counter()
            while len(self._todo) > floor and not (stop is not None and stop.is_set()):
                (fields, field, request), dst = self._todo.pop()
                self._idle = min(self._idle, len(self._todo))
                got = repack_matrices([request], threads or self._threads, [dst])[0]
                if got is not None:
                    fields[field] = replace(fields[field], data=got[0], layout=got[1])
                self.generation += 1
                if time.perf_counter() - t0 >= budget_s:
                    break
            return True
        finally:
            self._lock.release()

    def finish(self) -> None:
        """Pack everything still pending now, idle time's entries included."""
        while self._todo:
            self.advance(float("inf"), wait=True, idle=True)
