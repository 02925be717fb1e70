# cython: language_level=3
"""The layer loop: one call evaluates a batch of tokens through every layer, without the GIL.

A batch is a list of (token, position, sequence) triples. All K/V rows of the batch are written into
memory before any token attends, so one call serves prompt processing (one sequence, consecutive
positions), single-token decoding, and decoding many sequences at once (one token each).

Each layer is blocks, run as its recipe says (binding.pyx's LayerT: mixer, ffn; the model's norm kind):
    norm -> mixer (attention.pyx) -> residual (+ post-norm),  norm -> FFN (ffn.pyx, moe.pyx) -> residual.
Architectures differ in recipes and tensors (model/archs/), never in copies of this loop. Its other parts:
binding.pyx (weight records -> C structs), scratch.pyx (the activations), rowjobs.pyx (per-token work
between the products), products.pyx (quantize + matmul, profiled), norms.pyx; layout.pxd declares what
they share, memory.py the per-layer memory the mixers read and write.
"""

from cpython.exc cimport PyErr_CheckSignals
from libc.math cimport tanhf
from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport calloc, free

from llamacy.kernels.ops cimport scale_inplace
from llamacy.kernels.quant cimport dequantize_row
from llamacy.model.attention cimport AttnJob, attention_mixer, warm_kv
from llamacy.model.binding cimport BoundWeights
from llamacy.model.ffn cimport dense_ffn
from llamacy.model.layout cimport (ACT_GELU, ACT_RELU2, ACT_SILU, FFN_MOE, FFN_NONE, HParams, KVRows, LayerT,
                                   MIXER_ATTENTION, NORM_LAYER, NORM_RMS, Scratch, WeightT)
from llamacy.model.moe cimport MoeJob, MoeSpace, moe_ffn
from llamacy.model.norms cimport norm_row
from llamacy.model.products cimport (N_PROF, P_ELEM, P_MM_OUT, P_MOE, Products, lap, now, product)
from llamacy.model.rowjobs cimport RowJob, norm_rows, residual_rows
from llamacy.model.scratch cimport ScratchSpace

import numpy as np

PROFILE_NAMES = (
    "matmul attn q/k/v",
    "matmul attn output",
    "matmul ffn gate/up",
    "matmul ffn down",
    "matmul output head",
    "attention",
    "quantize activations",
    "norms, rope, residuals",
    "mixture of experts",
)

# Deep into a long prompt a micro-batch's attention work grows with the position: micro-batches shrink so
# that tokens x position stays under this (256 tokens at position 1024), to 16 tokens at least.
cdef enum:
    UBATCH_ATTN_BUDGET = 262144
    UBATCH_MIN_TOKENS = 16


# One layer's memory as the loop reads it (memory.py's arrays): K and V rows, NULL for a layer without.
ctypedef struct LayerMem:
    char* k
    char* v
    Py_ssize_t slots
    Py_ssize_t ring


cdef class Forward:
    """Weights and scratch of one model; `eval` runs a batch through it, reading and writing the memory
    bound with `bind_memory`."""

    cdef HParams hp
    cdef BoundWeights w
    cdef ScratchSpace scratch
    # The batch in flight: where its tokens meet a layer's memory, and the jobs that run on the thread team.
    cdef KVRows kv
    cdef RowJob rj
    cdef AttnJob aj
    cdef Products pr
    cdef MoeSpace moe  # None for a dense model
    cdef MoeJob* mj    # its job; NULL for a dense model
    # The memory: one record per layer, the arrays behind them kept alive.
    cdef LayerMem* mem
    cdef object memory
    cdef Py_ssize_t n_seq, n_ctx

    def __cinit__(self):
        self.mem = NULL

    def __dealloc__(self):
        if self.mem != NULL:
            free(self.mem)

    def __init__(self, cfg, weights, Py_ssize_t ubatch, Py_ssize_t n_ctx_max, int threads_max):
        """cfg: a ModelConfig; weights: the ModelWeights bound from the same file (llamacy.model.weights).

        ubatch: the most tokens one micro-batch holds; n_ctx_max: the longest context eval will be given;
        threads_max: the most threads eval will be asked to use.
        """
        acts = {"silu": ACT_SILU, "gelu": ACT_GELU, "relu2": ACT_RELU2}
        norms = {"rms": NORM_RMS, "layer": NORM_LAYER}
        if cfg.activation not in acts:
            raise ValueError(f"unknown activation {cfg.activation!r}")
        if getattr(cfg, "norm", None) not in norms:
            raise ValueError(f"unknown norm {getattr(cfg, 'norm', None)!r}")
        self.hp = {**vars(cfg), "act": acts[cfg.activation], "norm": norms[cfg.norm]}  # by field name
        self.w = BoundWeights(weights)
        # A mixture-of-experts model has no dense feed-forward: its activations are MoeSpace's.
        self.scratch = ScratchSpace(cfg.n_embd, cfg.n_head, cfg.n_head_kv, cfg.head_dim,
                                    1 if cfg.n_expert else cfg.n_ff, cfg.n_rot, ubatch, n_ctx_max, threads_max)
        self.rj.hp = &self.hp
        self.rj.s = &self.scratch.s
        self.rj.kv = &self.kv
        self.aj.hp = &self.hp
        self.aj.s = &self.scratch.s
        self.aj.kv = &self.kv
        self.pr.rj = &self.rj
        self.kv.n_head_kv = self.hp.n_head_kv
        self.kv.head_dim = self.hp.head_dim
        self.mj = NULL
        if cfg.n_expert:
            self.moe = MoeSpace(cfg, ubatch)
            self.mj = &self.moe.job
            self.mj.hp = &self.hp

    def bind_memory(self, memory):
        """Read and write `memory` (a memory.Memory for this model) from now on."""
        if len(memory.layers) != self.w.n_layer:
            raise ValueError("memory has a different number of layers than the model")
        if memory.n_ctx > self.scratch.n_ctx_max or memory.ubatch != self.scratch.ubatch:
            raise ValueError("memory sized for another context or micro-batch than the scratch")
        cdef LayerMem* mem = <LayerMem*> calloc(max(self.w.n_layer, 1), sizeof(LayerMem))
        if mem == NULL:
            raise MemoryError()
        cdef uint8_t[::1] kb, vb
        cdef Py_ssize_t l
        try:
            for l, lm in enumerate(memory.layers):
                if self.w.layers[l].mixer == MIXER_ATTENTION and lm.k is None:
                    raise ValueError(f"layer {l} attends but its memory keeps no K/V rows")
                if lm.k is None:
                    continue
                kb = lm.k.reshape(-1)
                vb = lm.v.reshape(-1)
                need = memory.n_seq * self.hp.n_head_kv * lm.slots * memory.row_bytes
                if kb.shape[0] < need or vb.shape[0] < need:
                    raise ValueError(f"layer {l}'s memory is smaller than its slots")
                mem[l].k = <char*>&kb[0]
                mem[l].v = <char*>&vb[0]
                mem[l].slots = lm.slots
                mem[l].ring = lm.ring
        except BaseException:
            free(mem)
            raise
        if self.mem != NULL:
            free(self.mem)
        self.mem = mem
        self.memory = memory
        self.n_seq = memory.n_seq
        self.n_ctx = memory.n_ctx
        self.kv.row_bytes = memory.row_bytes
        self.kv.fmt = memory.fmt
        self.aj.n_ctx = memory.n_ctx

    @property
    def ubatch_size(self) -> int:
        return self.scratch.ubatch

    def set_profiling(self, bint on):
        """Accumulate time per stage of the layer loop (two clock reads a stage; off by default)."""
        self.pr.profiling = on
        self.profile_reset()

    def profile_reset(self):
        cdef int i
        for i in range(N_PROF):
            self.pr.prof[i] = 0.0

    def profile(self) -> dict:
        """Seconds spent per stage since the last reset."""
        return {PROFILE_NAMES[i]: self.pr.prof[i] for i in range(N_PROF)}

    def eval(self, const int32_t[::1] tokens, const int32_t[::1] pos, const int32_t[::1] seq,
             const int32_t[::1] logit_rows, float[:, ::1] logits, int nthreads, bint hidden=False):
        """Evaluate tokens[i] at position pos[i] of sequence seq[i]; write their K/V rows into memory.

        logit_rows: indices into the batch whose logits are wanted, ascending; logits: [len, n_vocab].
        hidden: write the final hidden states (after output_norm) instead, [len, n_embd]; the output head
        is not run.
        """
        cdef Py_ssize_t n = tokens.shape[0]
        cdef Py_ssize_t i, start, stop
        if self.mem == NULL:
            raise ValueError("no memory bound (bind_memory)")
        if pos.shape[0] != n or seq.shape[0] != n:
            raise ValueError("tokens, pos and seq must have the same length")
        cdef Py_ssize_t width = self.hp.n_embd if hidden else self.hp.n_vocab
        if logits.shape[0] != logit_rows.shape[0] or (logit_rows.shape[0] and logits.shape[1] != width):
            raise ValueError("logits buffer does not match logit_rows")
        for i in range(n):
            if tokens[i] < 0 or tokens[i] >= self.hp.n_vocab:
                raise ValueError(f"token id {tokens[i]} outside the vocabulary (0..{self.hp.n_vocab - 1})")
            if pos[i] < 0 or pos[i] >= self.n_ctx:
                raise ValueError(f"position {pos[i]} outside the context (0..{self.n_ctx - 1})")
            if seq[i] < 0 or seq[i] >= self.n_seq:
                raise ValueError(f"sequence {seq[i]} outside the memory (0..{self.n_seq - 1})")
        for i in range(logit_rows.shape[0]):
            if logit_rows[i] < 0 or logit_rows[i] >= n or (i and logit_rows[i] <= logit_rows[i - 1]):
                raise ValueError("logit_rows must be ascending indices into the batch")
        nthreads = max(1, min(nthreads, self.scratch.threads_max))
        if n == 0:
            return

        cdef float* lg = &logits[0, 0] if logit_rows.shape[0] else NULL
        cdef Py_ssize_t lr = 0, lr_end
        start = 0
        while start < n:
            stop = min(n, start + min(self.scratch.ubatch,
                                      max(UBATCH_MIN_TOKENS, UBATCH_ATTN_BUDGET // max(1, pos[start]))))
            lr_end = lr
            while lr_end < logit_rows.shape[0] and logit_rows[lr_end] < stop:
                lr_end += 1
            self.kv.pos = &pos[start]
            self.kv.seq = &seq[start]
            with nogil:
                self._ubatch(&tokens[start], stop - start, &logit_rows[lr] if lr_end > lr else NULL,
                             lr_end - lr, start, lg + lr * width if lr_end > lr else NULL, hidden, nthreads)
            lr = lr_end
            start = stop
            # A long prompt is many micro-batches: let Ctrl-C through between them.
            if start < n and PyErr_CheckSignals() != 0:
                raise KeyboardInterrupt

    cdef void _ubatch(self, const int32_t* tokens, Py_ssize_t n, const int32_t* out_rows, Py_ssize_t n_out,
                      Py_ssize_t row0, float* out, bint hidden, int nthreads) noexcept nogil:
        """One micro-batch of n tokens (self.kv.pos/seq point at theirs) through every layer; then, for the
        batch rows out_rows (minus row0), logits or hidden states into out."""
        cdef const HParams* hp = &self.hp
        cdef Py_ssize_t E = hp.n_embd, t, l, j
        cdef Scratch* s = &self.scratch.s
        cdef KVRows* kv = &self.kv
        cdef RowJob* rj = &self.rj
        cdef Products* pr = &self.pr
        cdef const LayerT* L
        cdef float* normed

        if pr.profiling:
            pr.last_mark = now()
        # Token embeddings.
        for t in range(n):
            dequantize_row(self.w.tok_embd.type, self.w.tok_embd.data + tokens[t] * self.w.tok_embd.row_bytes,
                           s.x + t * E, E)
            if hp.embd_scale != 1.0:
                scale_inplace(s.x + t * E, hp.embd_scale, E)
        self.aj.rope_base = 0.0  # RoPE tables are built per micro-batch
        self.aj.rope_freq_scale = 0.0

        for l in range(self.w.n_layer):
            L = &self.w.layers[l]
            if L.mixer == MIXER_ATTENTION:
                kv.kl = self.mem[l].k
                kv.vl = self.mem[l].v
                kv.slots = self.mem[l].slots
                kv.ring = self.mem[l].ring
                warm_kv(kv, n, hp.n_head_kv, L.window)
                norm_rows(rj, s.x, L.attn_norm, L.attn_norm_b, s.xn, E, n, nthreads)
                attention_mixer(pr, &self.aj, L, self.w.rope_freqs, n, nthreads)
                # x += post_attn_norm(o), then the feed-forward block's input norm, in one pass per token.
                if L.ffn != FFN_NONE:
                    residual_rows(rj, s.x, s.o, L.post_attn_norm, L.ffn_norm, L.ffn_norm_b, s.xn, E, n, nthreads)
                else:
                    residual_rows(rj, s.x, s.o, L.post_attn_norm, NULL, NULL, NULL, E, n, nthreads)
            elif L.ffn != FFN_NONE:
                norm_rows(rj, s.x, L.ffn_norm, L.ffn_norm_b, s.xn, E, n, nthreads)
            if L.ffn == FFN_NONE:
                continue
            if L.ffn == FFN_MOE:
                lap(pr, P_ELEM)
                moe_ffn(self.mj, rj, L, s.xn, s.aq, s.o, n, nthreads)
                lap(pr, P_MOE)
            else:
                dense_ffn(pr, L, s, E, n, nthreads)
            residual_rows(rj, s.x, s.o, L.post_ffn_norm, NULL, NULL, NULL, E, n, nthreads)

        # The final norm, only for the rows whose output is wanted: straight into the output for hidden
        # states, into the output head's input for logits.
        normed = out if hidden else s.xn
        for j in range(n_out):
            norm_row(hp.norm, s.x + (out_rows[j] - row0) * E, self.w.output_norm, self.w.output_norm_b,
                     normed + j * E, E, hp.rms_eps)
        if n_out and not hidden:
            product(pr, &self.w.output, s.xn, E, n_out, out, NULL, nthreads, P_MM_OUT)
            if hp.final_softcap > 0.0:
                for j in range(n_out * hp.n_vocab):
                    out[j] = hp.final_softcap * tanhf(out[j] / hp.final_softcap)
        lap(pr, P_ELEM)
