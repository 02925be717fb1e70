# cython: language_level=3
"""The layer loop: one call evaluates a batch of tokens through every layer, without the GIL.

A batch is a list of (token, position, sequence) triples. All K/V rows of the batch are written into the
cache before any token attends, so one call serves prompt processing (one sequence, consecutive
positions), single-token decoding, and decoding many sequences at once (one token each).
Architecture differences arrive as data (NULL pointers, flags, per-layer window and RoPE base), never as
copies of this loop. Its parts live apart: binding.pyx (weight records -> C structs), scratch.pyx (the
activations), rowjobs.pyx (per-token work between the products), attention.pyx (attention and the KV
prefetches); layout.pxd declares what they share.
"""

from cpython.exc cimport PyErr_CheckSignals
from libc.math cimport tanhf
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libc.stdint cimport int32_t, uint8_t

from llamacy.kernels.matmul cimport matmul
from llamacy.kernels.ops cimport rmsnorm, rope_table, scale_inplace
from llamacy.kernels.quant cimport act_format, dequantize_row
from llamacy.model.attention cimport AttnJob, attend_rows, warm_kv
from llamacy.model.binding cimport BoundWeights
from llamacy.model.layout cimport ACT_GELU, ACT_SILU, HParams, KVRows, LayerT, Scratch, WeightT
from llamacy.model.moe cimport MoeJob, MoeSpace, moe_ffn
from llamacy.model.rowjobs cimport RowJob, act_rows, norm_rows, qkv_rows, quant_rows, residual_rows
from llamacy.model.scratch cimport ScratchSpace

import numpy as np

# Where --profile attributes time inside the layer loop.
cdef enum:
    P_MM_QKV = 0
    P_MM_O = 1
    P_MM_UP = 2
    P_MM_DOWN = 3
    P_MM_OUT = 4
    P_ATTN = 5
    P_QUANT = 6
    P_ELEM = 7
    P_MOE = 8
    N_PROF = 9

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


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class Forward:
    """Weights and scratch of one model; `eval` runs a batch through it."""

    cdef HParams hp
    cdef BoundWeights w
    cdef ScratchSpace scratch
    # The batch in flight: where its tokens meet the KV cache, and the jobs that run on the thread team.
    cdef KVRows kv
    cdef RowJob rj
    cdef AttnJob aj
    cdef MoeSpace moe  # None for a dense model
    cdef MoeJob* mj    # its job; NULL for a dense model
    cdef bint profiling
    cdef double prof[N_PROF]
    cdef double last_mark

    def __init__(self, cfg, weights, Py_ssize_t ubatch, Py_ssize_t n_ctx_max, int threads_max):
        """cfg: a ModelConfig; weights: the ModelWeights bound from the same file (llamacy.model.weights).

        ubatch: the most tokens one micro-batch holds; n_ctx_max: the longest KV cache eval will be given;
        threads_max: the most threads eval will be asked to use.
        """
        acts = {"silu": ACT_SILU, "gelu": ACT_GELU}
        if cfg.activation not in acts:
            raise ValueError(f"unknown activation {cfg.activation!r}")
        self.hp = {**vars(cfg), "act": acts[cfg.activation]}  # by field name (see layout.pxd)
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
        self.mj = NULL
        if cfg.n_expert:
            self.moe = MoeSpace(cfg, ubatch)
            self.mj = &self.moe.job
            self.mj.hp = &self.hp

    @property
    def ubatch_size(self) -> int:
        return self.scratch.ubatch

    def set_profiling(self, bint on):
        """Accumulate time per stage of the layer loop (two clock reads a stage; off by default)."""
        self.profiling = on
        self.profile_reset()

    def profile_reset(self):
        cdef int i
        for i in range(N_PROF):
            self.prof[i] = 0.0

    def profile(self) -> dict:
        """Seconds spent per stage since the last reset."""
        return {PROFILE_NAMES[i]: self.prof[i] for i in range(N_PROF)}

    cdef inline void _lap(self, int kind) noexcept nogil:
        cdef double now
        if self.profiling:
            now = _now()
            self.prof[kind] += now - self.last_mark
            self.last_mark = now

    def eval(self, const int32_t[::1] tokens, const int32_t[::1] pos, const int32_t[::1] seq,
             object k_cache, object v_cache, const int32_t[::1] logit_rows, float[:, ::1] logits, int nthreads,
             bint hidden=False):
        """Evaluate tokens[i] at position pos[i] of sequence seq[i]; write K/V into the caches.

        k_cache, v_cache: [n_layer, n_seq, n_head_kv, n_ctx, head_dim] C-contiguous numpy arrays, both float32
        or both float16 (a half-precision cache: K/V rows rounded to half as they are written).
        logit_rows: indices into the batch whose logits are wanted, ascending; logits: [len, n_vocab].
        hidden: write the final hidden states (after output_norm) instead, [len, n_embd]; the output head
        is not run.
        """
        cdef Py_ssize_t n = tokens.shape[0]
        cdef Py_ssize_t i, start, stop
        if pos.shape[0] != n or seq.shape[0] != n:
            raise ValueError("tokens, pos and seq must have the same length")
        if not (isinstance(k_cache, np.ndarray) and isinstance(v_cache, np.ndarray)):
            raise TypeError("the KV caches must be numpy arrays")
        if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (np.float32, np.float16):
            raise ValueError("the K and V caches must both be float32 or both float16")
        if k_cache.ndim != 5 or k_cache.shape != v_cache.shape:
            raise ValueError("K and V caches differ in shape")
        if not (k_cache.flags.c_contiguous and v_cache.flags.c_contiguous):
            raise ValueError("the KV caches must be C-contiguous")
        if (k_cache.shape[0] != self.w.n_layer or k_cache.shape[2] != self.hp.n_head_kv
                or k_cache.shape[4] != self.hp.head_dim or k_cache.size == 0):
            raise ValueError("KV cache shape does not match the model")
        cdef Py_ssize_t n_seq = k_cache.shape[1], n_ctx = k_cache.shape[3]
        cdef uint8_t[::1] kbytes = k_cache.reshape(-1).view(np.uint8)
        cdef uint8_t[::1] vbytes = v_cache.reshape(-1).view(np.uint8)
        if n_ctx > self.scratch.n_ctx_max:
            raise ValueError("KV cache longer than the scratch was sized for")
        cdef Py_ssize_t width = self.hp.n_embd if hidden else self.hp.n_vocab
        if logits.shape[0] != logit_rows.shape[0] or (logit_rows.shape[0] and logits.shape[1] != width):
            raise ValueError("logits buffer does not match logit_rows")
        for i in range(n):
            if tokens[i] < 0 or tokens[i] >= self.hp.n_vocab:
                raise ValueError(f"token id {tokens[i]} outside the vocabulary (0..{self.hp.n_vocab - 1})")
            if pos[i] < 0 or pos[i] >= n_ctx:
                raise ValueError(f"position {pos[i]} outside the context (0..{n_ctx - 1})")
            if seq[i] < 0 or seq[i] >= n_seq:
                raise ValueError(f"sequence {seq[i]} outside the cache (0..{n_seq - 1})")
        for i in range(logit_rows.shape[0]):
            if logit_rows[i] < 0 or logit_rows[i] >= n or (i and logit_rows[i] <= logit_rows[i - 1]):
                raise ValueError("logit_rows must be ascending indices into the batch")
        nthreads = max(1, min(nthreads, self.scratch.threads_max))
        if n == 0:
            return

        # The cache as the jobs see it.
        cdef KVRows* kv = &self.kv
        kv.head_dim = self.hp.head_dim
        kv.head_stride = n_ctx * self.hp.head_dim
        kv.seq_stride = self.hp.n_head_kv * kv.head_stride
        kv.f16 = k_cache.dtype == np.float16
        kv.es = 2 if kv.f16 else 4
        self.aj.n_ctx = n_ctx
        cdef Py_ssize_t layer_bytes = n_seq * kv.seq_stride * kv.es
        cdef char* kc = <char*>&kbytes[0]
        cdef char* vc = <char*>&vbytes[0]
        cdef float* lg = &logits[0, 0] if logit_rows.shape[0] else NULL
        cdef Py_ssize_t lr = 0, lr_end
        start = 0
        while start < n:
            stop = min(n, start + min(self.scratch.ubatch,
                                      max(UBATCH_MIN_TOKENS, UBATCH_ATTN_BUDGET // max(1, pos[start]))))
            lr_end = lr
            while lr_end < logit_rows.shape[0] and logit_rows[lr_end] < stop:
                lr_end += 1
            kv.pos = &pos[start]
            kv.seq = &seq[start]
            with nogil:
                self._ubatch(&tokens[start], stop - start, kc, vc, layer_bytes,
                             &logit_rows[lr] if lr_end > lr else NULL, lr_end - lr, start,
                             lg + lr * width if lr_end > lr else NULL, hidden, nthreads)
            lr = lr_end
            start = stop
            # A long prompt is many micro-batches: let Ctrl-C through between them.
            if start < n and PyErr_CheckSignals() != 0:
                raise KeyboardInterrupt

    cdef void _matmul(self, const WeightT* w, const float* x, Py_ssize_t ldx, Py_ssize_t n, float* y,
                      int* last_fmt, int nthreads, int kind) noexcept nogil:
        """y[t, :] = w @ x[t, :] for t < n: quantize the rows for this weight's format, then multiply.

        last_fmt: the format the scratch holds x in from the previous product of the same input (-1: none),
        kept up to date; the rows are quantized again only for another format. NULL: always quantize.
        """
        cdef int fmt = act_format(w.type)
        self._lap(P_ELEM)
        if last_fmt == NULL or fmt != last_fmt[0]:
            quant_rows(&self.rj, w, x, ldx, self.scratch.s.aq, n, nthreads)
            if last_fmt != NULL:
                last_fmt[0] = fmt
            self._lap(P_QUANT)
        matmul(w.data, w.type, w.rows, w.cols, self.scratch.s.aq, n, y, w.rows, nthreads)
        self._lap(kind)

    cdef void _ubatch(self, const int32_t* tokens, Py_ssize_t n, char* kc, char* vc, Py_ssize_t layer_bytes,
                      const int32_t* out_rows, Py_ssize_t n_out, Py_ssize_t row0, float* out, bint hidden,
                      int nthreads) noexcept nogil:
        """One micro-batch of n tokens (self.kv.pos/seq point at theirs) through every layer; then, for the
        batch rows out_rows (minus row0), logits or hidden states into out."""
        cdef const HParams* hp = &self.hp
        cdef Py_ssize_t E = hp.n_embd, QW = hp.n_head * hp.head_dim, F = hp.n_ff, R = hp.n_rot
        cdef Py_ssize_t t, l, j
        cdef Scratch* s = &self.scratch.s
        cdef KVRows* kv = &self.kv
        cdef RowJob* rj = &self.rj
        cdef const LayerT* L
        cdef int fmt
        cdef float base = 0.0, fscale = 0.0
        cdef float* normed

        if self.profiling:
            self.last_mark = _now()
        # Token embeddings.
        for t in range(n):
            dequantize_row(self.w.tok_embd.type, self.w.tok_embd.data + tokens[t] * self.w.tok_embd.row_bytes,
                           s.x + t * E, E)
            if hp.embd_scale != 1.0:
                scale_inplace(s.x + t * E, hp.embd_scale, E)

        for l in range(self.w.n_layer):
            L = &self.w.layers[l]
            kv.kl = kc + l * layer_bytes
            kv.vl = vc + l * layer_bytes
            warm_kv(kv, n, hp.n_head_kv, L.window)
            # Attention block.
            norm_rows(rj, s.x, L.attn_norm, s.xn, E, n, nthreads)
            fmt = -1
            self._matmul(&L.wq, s.xn, E, n, s.q, &fmt, nthreads, P_MM_QKV)
            self._matmul(&L.wk, s.xn, E, n, s.k, &fmt, nthreads, P_MM_QKV)
            self._matmul(&L.wv, s.xn, E, n, s.v, &fmt, nthreads, P_MM_QKV)
            if L.rope_base != base or L.rope_freq_scale != fscale:
                base = L.rope_base
                fscale = L.rope_freq_scale
                for t in range(n):
                    rope_table(s.cs + t * R, R, kv.pos[t], base, fscale, self.w.rope_freqs)
            # Biases, q/k norms, RoPE; K/V rows into the cache. Then every (token, head) pair attends.
            qkv_rows(rj, L, n, nthreads)
            self._lap(P_ELEM)
            attend_rows(&self.aj, L.window, n, nthreads)
            self._lap(P_ATTN)
            self._matmul(&L.wo, s.att, QW, n, s.o, NULL, nthreads, P_MM_O)
            # x += post_attn_norm(o), then the feed-forward block's input norm, in one pass per token.
            residual_rows(rj, s.x, s.o, L.post_attn_norm, L.ffn_norm, s.xn, E, n, nthreads)

            # Feed-forward block: a mixture of experts, or dense.
            if L.gate_inp.rows:
                self._lap(P_ELEM)
                moe_ffn(self.mj, rj, L, s.xn, s.aq, s.o, n, nthreads)
                self._lap(P_MOE)
                residual_rows(rj, s.x, s.o, L.post_ffn_norm, NULL, NULL, E, n, nthreads)
                continue
            fmt = -1
            self._matmul(&L.gate, s.xn, E, n, s.g, &fmt, nthreads, P_MM_UP)
            self._matmul(&L.up, s.xn, E, n, s.u, &fmt, nthreads, P_MM_UP)
            act_rows(rj, s.g, s.u, F, n, nthreads)
            self._matmul(&L.down, s.g, F, n, s.o, NULL, nthreads, P_MM_DOWN)
            residual_rows(rj, s.x, s.o, L.post_ffn_norm, NULL, NULL, E, n, nthreads)

        # The final norm, only for the rows whose output is wanted: straight into the output for hidden
        # states, into the output head's input for logits.
        normed = out if hidden else s.xn
        for j in range(n_out):
            rmsnorm(s.x + (out_rows[j] - row0) * E, self.w.output_norm, normed + j * E, E, hp.rms_eps)
        if n_out and not hidden:
            self._matmul(&self.w.output, s.xn, E, n_out, out, NULL, nthreads, P_MM_OUT)
            if hp.final_softcap > 0.0:
                for j in range(n_out * hp.n_vocab):
                    out[j] = hp.final_softcap * tanhf(out[j] / hp.final_softcap)
        self._lap(P_ELEM)
