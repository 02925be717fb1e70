# cython: language_level=3
"""The layer loop: one call evaluates a batch of tokens through every layer, without the GIL.

A batch is a list of (token, position, sequence) triples. All K/V rows of the batch are written into the
cache before any token attends, so one call serves prompt processing (one sequence, consecutive
positions), single-token decoding, and decoding many sequences at once (one token each).
Architecture differences arrive as data (NULL pointers, flags, per-layer window and RoPE base), never as
copies of this loop.
"""

from cpython.exc cimport PyErr_CheckSignals
from libc.math cimport sqrtf, tanhf
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport calloc, free

from llamacy.kernels.matmul cimport matmul
from llamacy.kernels.parallel cimport parallel_for
from llamacy.kernels.ops cimport (
    add_inplace,
    attend,
    gelu_mul,
    rmsnorm,
    rmsnorm_heads,
    rope,
    rope_table,
    scale_inplace,
    silu_mul,
    store_kv_row,
)
from llamacy.kernels.quant cimport act_format, act_row_bytes, dequantize_row, quantize_act_row
from llamacy.kernels.simd cimport lc_prefetch, lc_prefetch_l2

import numpy as np

cdef enum:
    ACT_SILU = 0
    ACT_GELU = 1

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
    N_PROF = 8

PROFILE_NAMES = (
    "matmul attn q/k/v",
    "matmul attn output",
    "matmul ffn gate/up",
    "matmul ffn down",
    "matmul output head",
    "attention",
    "quantize activations",
    "norms, rope, residuals",
)


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


ctypedef struct Scratch:
    # Activations of one micro-batch, row-major [n, width].
    float* x        # residual stream [n, n_embd]
    float* xn       # normed input of the current matmul group [n, max(n_embd, q width)]
    float* q        # [n, n_head * head_dim]
    float* k        # [n, n_head_kv * head_dim]
    float* v        # [n, n_head_kv * head_dim]
    float* att      # [n, n_head * head_dim]
    float* o        # [n, n_embd]
    float* g        # [n, n_ff]
    float* u        # [n, n_ff]
    float* cs       # RoPE cos/sin per token [n, n_rot]
    float* scores   # per thread [n_threads_max, n_ctx]
    uint8_t* aq     # quantized activations [n, max act row bytes]


cdef class Forward:
    """Weights and scratch of one model; `eval` runs a batch through it."""

    cdef LayerT* layers
    cdef WeightT tok_embd
    cdef WeightT output
    cdef const float* output_norm
    cdef const float* rope_freqs
    cdef Py_ssize_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot
    cdef int rope_mode, act
    cdef float eps, embd_scale, attn_scale, attn_softcap, final_softcap
    cdef Py_ssize_t ubatch, n_ctx_max, threads_max
    cdef Scratch s
    cdef bint profiling
    cdef double prof[N_PROF]
    cdef double last_mark
    cdef object _keep            # Python objects whose buffers the pointers above point into
    cdef object _scratch_arrays

    def __cinit__(self):
        self.layers = NULL

    def __dealloc__(self):
        if self.layers != NULL:
            free(self.layers)

    def __init__(self, dict hp, dict tensors, list layers, Py_ssize_t ubatch, Py_ssize_t n_ctx_max,
                 int threads_max):
        """hp: hyper-parameters; tensors: global weights; layers: one dict per layer.

        Weight entries are (uint8 buffer, ggml type, rows, cols, row_bytes); vector entries are
        float32 contiguous arrays or None. The caller has validated shapes against the config.
        """
        self._keep = []
        self.n_layer = len(layers)
        self.n_embd = hp["n_embd"]
        self.n_head = hp["n_head"]
        self.n_head_kv = hp["n_head_kv"]
        self.head_dim = hp["head_dim"]
        self.n_ff = hp["n_ff"]
        self.n_vocab = hp["n_vocab"]
        self.n_rot = hp["n_rot"]
        self.rope_mode = hp["rope_mode"]
        self.act = ACT_GELU if hp["activation"] == "gelu" else ACT_SILU
        self.eps = hp["rms_eps"]
        self.embd_scale = hp["embd_scale"]
        self.attn_scale = hp["attn_scale"]
        self.attn_softcap = hp["attn_softcap"]
        self.final_softcap = hp["final_softcap"]
        self.tok_embd = self._weight(tensors["token_embd"])
        self.output = self._weight(tensors["output"])
        self.output_norm = self._vec(tensors["output_norm"])
        self.rope_freqs = self._vec(tensors.get("rope_freqs"))

        self.layers = <LayerT*> calloc(self.n_layer, sizeof(LayerT))
        if self.layers == NULL:
            raise MemoryError()
        cdef LayerT* L
        for i, d in enumerate(layers):
            L = &self.layers[i]
            L.attn_norm = self._vec(d["attn_norm"])
            L.wq = self._weight(d["attn_q"])
            L.wk = self._weight(d["attn_k"])
            L.wv = self._weight(d["attn_v"])
            L.wo = self._weight(d["attn_output"])
            L.bq = self._vec(d.get("attn_q_bias"))
            L.bk = self._vec(d.get("attn_k_bias"))
            L.bv = self._vec(d.get("attn_v_bias"))
            L.q_norm = self._vec(d.get("attn_q_norm"))
            L.k_norm = self._vec(d.get("attn_k_norm"))
            L.post_attn_norm = self._vec(d.get("post_attention_norm"))
            L.ffn_norm = self._vec(d["ffn_norm"])
            L.gate = self._weight(d["ffn_gate"])
            L.up = self._weight(d["ffn_up"])
            L.down = self._weight(d["ffn_down"])
            L.post_ffn_norm = self._vec(d.get("post_ffw_norm"))
            L.window = d["window"]
            L.rope_base = d["rope_base"]
            L.rope_freq_scale = d["rope_freq_scale"]
        self._alloc_scratch(ubatch, n_ctx_max, threads_max)

    cdef WeightT _weight(self, tuple spec) except *:
        cdef WeightT w
        buf, wtype, rows, cols, row_bytes = spec
        cdef const uint8_t[::1] mv = buf
        if mv.shape[0] < rows * row_bytes:
            raise ValueError("weight buffer smaller than its rows")
        if act_format(wtype) < 0:
            raise ValueError(f"no kernel for GGML type {wtype}")
        self._keep.append(buf)
        w.data = &mv[0]
        w.type = wtype
        w.rows = rows
        w.cols = cols
        w.row_bytes = row_bytes
        return w

    cdef const float* _vec(self, object arr) except? NULL:
        if arr is None:
            return NULL
        cdef const float[::1] mv = arr
        self._keep.append(arr)
        return &mv[0]

    def _alloc_scratch(self, Py_ssize_t ubatch, Py_ssize_t n_ctx_max, int threads_max):
        cdef Py_ssize_t n = ubatch
        cdef Py_ssize_t qw = self.n_head * self.head_dim
        cdef Py_ssize_t kvw = self.n_head_kv * self.head_dim
        cdef Py_ssize_t widest = max(self.n_embd, qw, self.n_ff)
        # The float32 activation format is the widest (4 bytes a value); quantized ones are smaller.
        cdef Py_ssize_t aq_row = max(act_row_bytes(0, widest), 4 * widest)
        self.ubatch = ubatch
        self.n_ctx_max = n_ctx_max
        self.threads_max = max(1, threads_max)
        arrays = {
            "x": np.zeros(n * self.n_embd, np.float32),
            "xn": np.zeros(n * max(self.n_embd, qw), np.float32),
            "q": np.zeros(n * qw, np.float32),
            "k": np.zeros(n * kvw, np.float32),
            "v": np.zeros(n * kvw, np.float32),
            "att": np.zeros(n * qw, np.float32),
            "o": np.zeros(n * self.n_embd, np.float32),
            "g": np.zeros(n * self.n_ff, np.float32),
            "u": np.zeros(n * self.n_ff, np.float32),
            "cs": np.zeros(n * max(self.n_rot, 2), np.float32),
            "scores": np.zeros(self.threads_max * n_ctx_max, np.float32),
            "aq": np.zeros(n * aq_row + 64, np.uint8),
        }
        self._scratch_arrays = arrays
        cdef float[::1] f
        f = arrays["x"]; self.s.x = &f[0]
        f = arrays["xn"]; self.s.xn = &f[0]
        f = arrays["q"]; self.s.q = &f[0]
        f = arrays["k"]; self.s.k = &f[0]
        f = arrays["v"]; self.s.v = &f[0]
        f = arrays["att"]; self.s.att = &f[0]
        f = arrays["o"]; self.s.o = &f[0]
        f = arrays["g"]; self.s.g = &f[0]
        f = arrays["u"]; self.s.u = &f[0]
        f = arrays["cs"]; self.s.cs = &f[0]
        f = arrays["scores"]; self.s.scores = &f[0]
        cdef uint8_t[::1] b = arrays["aq"]
        self.s.aq = &b[0]

    @property
    def ubatch_size(self) -> int:
        return self.ubatch

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
        cdef Py_ssize_t i, start, stop, r
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
        if (k_cache.shape[0] != self.n_layer or k_cache.shape[2] != self.n_head_kv
                or k_cache.shape[4] != self.head_dim or k_cache.size == 0):
            raise ValueError("KV cache shape does not match the model")
        cdef Py_ssize_t n_seq = k_cache.shape[1], n_ctx = k_cache.shape[3]
        cdef bint kv_f16 = k_cache.dtype == np.float16
        cdef uint8_t[::1] kbytes = k_cache.reshape(-1).view(np.uint8)
        cdef uint8_t[::1] vbytes = v_cache.reshape(-1).view(np.uint8)
        if n_ctx > self.n_ctx_max:
            raise ValueError("KV cache longer than the scratch was sized for")
        cdef Py_ssize_t width = self.n_embd if hidden else self.n_vocab
        if logits.shape[0] != logit_rows.shape[0] or (logit_rows.shape[0] and logits.shape[1] != width):
            raise ValueError("logits buffer does not match logit_rows")
        for i in range(n):
            if tokens[i] < 0 or tokens[i] >= self.n_vocab:
                raise ValueError(f"token id {tokens[i]} outside the vocabulary (0..{self.n_vocab - 1})")
            if pos[i] < 0 or pos[i] >= n_ctx:
                raise ValueError(f"position {pos[i]} outside the context (0..{n_ctx - 1})")
            if seq[i] < 0 or seq[i] >= n_seq:
                raise ValueError(f"sequence {seq[i]} outside the cache (0..{n_seq - 1})")
        for i in range(logit_rows.shape[0]):
            if logit_rows[i] < 0 or logit_rows[i] >= n or (i and logit_rows[i] <= logit_rows[i - 1]):
                raise ValueError("logit_rows must be ascending indices into the batch")
        nthreads = max(1, min(nthreads, self.threads_max))
        if n == 0:
            return
        cdef char* kc = <char*>&kbytes[0]
        cdef char* vc = <char*>&vbytes[0]
        cdef float* lg = &logits[0, 0] if logit_rows.shape[0] else NULL
        cdef Py_ssize_t lr = 0, lr_end
        start = 0
        while start < n:
            # Deep into a long prompt a micro-batch's attention work grows with the position: shrink the
            # micro-batch (to 16 tokens at least, never above ubatch) so each stays short, and Ctrl-C,
            # checked between micro-batches, stays prompt.
            stop = min(n, start + min(self.ubatch, max(16, UBATCH_ATTN_BUDGET // max(1, pos[start]))))
            lr_end = lr
            while lr_end < logit_rows.shape[0] and logit_rows[lr_end] < stop:
                lr_end += 1
            with nogil:
                self._ubatch(&tokens[start], &pos[start], &seq[start], stop - start, kc, vc, kv_f16, n_seq, n_ctx,
                             &logit_rows[lr] if lr_end > lr else NULL, lr_end - lr, start,
                             lg + lr * width if lr_end > lr else NULL, hidden, nthreads)
            lr = lr_end
            start = stop
            # A long prompt is many micro-batches: let Ctrl-C through between them.
            if start < n and PyErr_CheckSignals() != 0:
                raise KeyboardInterrupt

    cdef void _matmul(self, const WeightT* w, const float* x, Py_ssize_t ldx, Py_ssize_t n, float* y,
                      int nthreads, int kind) noexcept nogil:
        """y[t, :] = w @ x[t, :] for t < n: quantize the rows for this weight's format, then multiply."""
        cdef RowJob job
        self._lap(P_ELEM)
        _quant_rows(&job, w, x, ldx, self.s.aq, n, nthreads)
        self._lap(P_QUANT)
        matmul(w.data, w.type, w.rows, w.cols, self.s.aq, n, y, w.rows, nthreads)
        self._lap(kind)

    cdef void _matmul_same_input(self, const WeightT* w, float* y, Py_ssize_t n, int* last_fmt,
                                 int nthreads, int kind) noexcept nogil:
        """Like _matmul on s.xn, reusing the quantized rows when the previous call had the same format."""
        cdef int fmt = act_format(w.type)
        cdef RowJob job
        self._lap(P_ELEM)
        if fmt != last_fmt[0]:
            _quant_rows(&job, w, self.s.xn, w.cols, self.s.aq, n, nthreads)
            last_fmt[0] = fmt
            self._lap(P_QUANT)
        matmul(w.data, w.type, w.rows, w.cols, self.s.aq, n, y, w.rows, nthreads)
        self._lap(kind)

    cdef void _ubatch(self, const int32_t* tokens, const int32_t* pos, const int32_t* seq, Py_ssize_t n,
                      char* kc, char* vc, bint kv_f16, Py_ssize_t n_seq, Py_ssize_t n_ctx,
                      const int32_t* logit_rows, Py_ssize_t n_logits, Py_ssize_t row0, float* logits,
                      bint hidden, int nthreads) noexcept nogil:
        cdef Py_ssize_t E = self.n_embd, HD = self.head_dim, NH = self.n_head, NKV = self.n_head_kv
        cdef Py_ssize_t QW = NH * HD, F = self.n_ff, R = self.n_rot
        cdef Py_ssize_t group = NH // NKV
        cdef Py_ssize_t t, l, j
        cdef Py_ssize_t layer_stride = n_seq * NKV * n_ctx * HD
        cdef Py_ssize_t seq_stride = NKV * n_ctx * HD
        cdef Py_ssize_t head_stride = n_ctx * HD
        cdef Scratch* s = &self.s
        cdef LayerT* L
        cdef int fmt
        cdef float base = 0.0, fscale = 0.0
        cdef Py_ssize_t es = 2 if kv_f16 else 4  # bytes per cached value
        cdef char* kl
        cdef char* vl
        cdef AttnCtx actx
        cdef RowJob rj
        rj.eps = self.eps
        rj.w2 = NULL
        rj.q = s.q
        rj.k = s.k
        rj.v = s.v
        rj.cs = s.cs
        rj.n_head = NH
        rj.n_head_kv = NKV
        rj.head_dim = HD
        rj.n_rot = R
        rj.rope_mode = self.rope_mode
        rj.pos = pos
        rj.seq = seq
        rj.seq_stride = seq_stride
        rj.head_stride = head_stride
        rj.kv_f16 = kv_f16
        rj.es = es
        actx.kv_f16 = kv_f16
        actx.es = es
        actx.q = s.q
        actx.att = s.att
        actx.scores = s.scores
        actx.n_head = NH
        actx.head_dim = HD
        actx.group = group
        actx.scale = self.attn_scale
        actx.softcap = self.attn_softcap
        actx.pos = pos
        actx.seq = seq
        actx.seq_stride = seq_stride
        actx.head_stride = head_stride
        actx.n_ctx = n_ctx
        actx.n_items = n * NH

        if self.profiling:
            self.last_mark = _now()
        # Token embeddings.
        for t in range(n):
            dequantize_row(self.tok_embd.type, self.tok_embd.data + tokens[t] * self.tok_embd.row_bytes,
                           s.x + t * E, E)
            if self.embd_scale != 1.0:
                scale_inplace(s.x + t * E, self.embd_scale, E)

        for l in range(self.n_layer):
            L = &self.layers[l]
            kl = kc + l * layer_stride * es
            vl = vc + l * layer_stride * es
            if n <= KV_WARM_TOKENS:
                _warm_kv(kl, vl, es, pos, seq, n, NKV, HD, seq_stride, head_stride, L.window)
            # Attention block.
            _norm_rows(&rj, s.x, L.attn_norm, s.xn, E, n, nthreads)
            fmt = -1
            self._matmul_same_input(&L.wq, s.q, n, &fmt, nthreads, P_MM_QKV)
            self._matmul_same_input(&L.wk, s.k, n, &fmt, nthreads, P_MM_QKV)
            self._matmul_same_input(&L.wv, s.v, n, &fmt, nthreads, P_MM_QKV)
            if L.rope_base != base or L.rope_freq_scale != fscale:
                base = L.rope_base
                fscale = L.rope_freq_scale
                for t in range(n):
                    rope_table(s.cs + t * R, R, pos[t], base, fscale, self.rope_freqs)
            # Biases, q/k norms, RoPE; K/V rows into the cache (tokens write distinct rows).
            rj.kind = ROW_QKV
            rj.L = L
            rj.kl = kl
            rj.vl = vl
            _rows(&rj, n, nthreads)
            # Every (token, head) pair attends independently.
            self._lap(P_ELEM)
            actx.window = L.window
            actx.kl = kl
            actx.vl = vl
            # Chunks of several items: one claim per item would bounce the counter's cache line.
            parallel_for(_attend_task, &actx, n * NH, max(1, n * NH // (8 * nthreads)), nthreads)
            self._lap(P_ATTN)
            self._matmul(&L.wo, s.att, QW, n, s.o, nthreads, P_MM_O)
            # x += post_attn_norm(o), then the feed-forward block's input norm, in one pass per token.
            _residual_rows(&rj, s.x, s.o, L.post_attn_norm, L.ffn_norm, s.xn, E, n, nthreads)

            # Feed-forward block.
            fmt = -1
            self._matmul_same_input(&L.gate, s.g, n, &fmt, nthreads, P_MM_UP)
            self._matmul_same_input(&L.up, s.u, n, &fmt, nthreads, P_MM_UP)
            rj.kind = ROW_ACT
            rj.src = s.u
            rj.dst = s.g
            rj.dim = F
            rj.act = self.act
            _rows(&rj, n, nthreads)
            self._matmul(&L.down, s.g, F, n, s.o, nthreads, P_MM_DOWN)
            _residual_rows(&rj, s.x, s.o, L.post_ffn_norm, NULL, NULL, E, n, nthreads)

        if n_logits == 0:
            self._lap(P_ELEM)
            return
        if hidden:
            for j in range(n_logits):
                rmsnorm(s.x + (logit_rows[j] - row0) * E, self.output_norm, logits + j * E, E, self.eps)
            self._lap(P_ELEM)
            return
        # Output head, only for the rows whose logits are wanted.
        for j in range(n_logits):
            t = logit_rows[j] - row0
            rmsnorm(s.x + t * E, self.output_norm, s.xn + j * E, E, self.eps)
        self._matmul(&self.output, s.xn, E, n_logits, logits, nthreads, P_MM_OUT)
        if self.final_softcap > 0.0:
            for j in range(n_logits * self.n_vocab):
                logits[j] = self.final_softcap * tanhf(logits[j] / self.final_softcap)
        self._lap(P_ELEM)


# The per-token work between the matrix products (norms, RoPE, residuals, activation quantization) as one
# job type on the thread team: rows are independent, so a prompt's tokens split over the threads like the
# matmul rows do. (A single decoded token runs inline: parallel_for does not split one item.)
cdef enum:
    ROW_NORM = 0    # dst[t] = rmsnorm(src[t]) * w
    ROW_QUANT = 1   # aq[t] = src[t] quantized for weight type wtype
    ROW_ACT = 2     # dst[t] = act(dst[t]) * src[t]   (gate, up)
    ROW_RESID = 3   # src[t] = post-norm(src[t]) with w (if any); dst[t] += src[t]; then, if w2, xn[t] = rmsnorm(dst[t]) * w2
    ROW_QKV = 4     # q/k/v biases, q/k norms, RoPE, K/V rows into the cache


ctypedef struct RowJob:
    int kind
    const float* src
    float* dst
    float* xn
    const float* w
    const float* w2
    Py_ssize_t ld_src
    Py_ssize_t dim
    float eps
    int wtype
    uint8_t* aq
    Py_ssize_t rb
    int act
    # ROW_QKV
    const LayerT* L
    float* q
    float* k
    float* v
    const float* cs
    Py_ssize_t n_head, n_head_kv, head_dim, n_rot
    int rope_mode
    const int32_t* pos
    const int32_t* seq
    char* kl              # this layer's K cache (float32 or half values, es bytes each)
    char* vl
    Py_ssize_t seq_stride, head_stride   # in values
    bint kv_f16
    Py_ssize_t es


cdef void _rows_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    cdef RowJob* j = <RowJob*> ctx
    cdef Py_ssize_t t, h, D = j.dim, QW, KVW, HD, off
    cdef const LayerT* L
    for t in range(begin, end):
        if j.kind == ROW_NORM:
            rmsnorm(j.src + t * D, j.w, j.dst + t * D, D, j.eps)
        elif j.kind == ROW_QUANT:
            quantize_act_row(j.wtype, j.src + t * j.ld_src, j.aq + t * j.rb, D)
        elif j.kind == ROW_ACT:
            if j.act == ACT_GELU:
                gelu_mul(j.dst + t * D, j.src + t * D, D)
            else:
                silu_mul(j.dst + t * D, j.src + t * D, D)
        elif j.kind == ROW_RESID:
            if j.w != NULL:
                rmsnorm(j.src + t * D, j.w, <float*>(j.src + t * D), D, j.eps)
            add_inplace(j.dst + t * D, j.src + t * D, D)
            if j.w2 != NULL:
                rmsnorm(j.dst + t * D, j.w2, j.xn + t * D, D, j.eps)
        else:
            L = j.L
            HD = j.head_dim
            QW = j.n_head * HD
            KVW = j.n_head_kv * HD
            if L.bq != NULL:
                add_inplace(j.q + t * QW, L.bq, QW)
                add_inplace(j.k + t * KVW, L.bk, KVW)
                add_inplace(j.v + t * KVW, L.bv, KVW)
            if L.q_norm != NULL:
                rmsnorm_heads(j.q + t * QW, L.q_norm, j.n_head, HD, j.eps)
                rmsnorm_heads(j.k + t * KVW, L.k_norm, j.n_head_kv, HD, j.eps)
            rope(j.q + t * QW, j.n_head, HD, j.n_rot, j.cs + t * j.n_rot, j.rope_mode)
            rope(j.k + t * KVW, j.n_head_kv, HD, j.n_rot, j.cs + t * j.n_rot, j.rope_mode)
            for h in range(j.n_head_kv):
                off = (j.seq[t] * j.seq_stride + h * j.head_stride + j.pos[t] * HD) * j.es
                store_kv_row(j.kl + off, j.k + t * KVW + h * HD, HD, j.kv_f16)
                store_kv_row(j.vl + off, j.v + t * KVW + h * HD, HD, j.kv_f16)


# Tokens per claim: about four claims per thread, at least ROW_MIN_TOKENS tokens each, so that a few
# decoded tokens (a server step) stay on one thread unless splitting them pays for the hand-off.
cdef enum:
    ROW_MIN_TOKENS = 4


cdef inline void _rows(RowJob* job, Py_ssize_t n, int nthreads) noexcept nogil:
    parallel_for(_rows_task, job, n, max(<Py_ssize_t>ROW_MIN_TOKENS, n // (4 * nthreads)), nthreads)


cdef inline void _norm_rows(RowJob* job, const float* x, const float* w, float* out, Py_ssize_t dim,
                            Py_ssize_t n, int nthreads) noexcept nogil:
    job.kind = ROW_NORM
    job.src = x
    job.w = w
    job.dst = out
    job.dim = dim
    _rows(job, n, nthreads)


cdef inline void _quant_rows(RowJob* job, const WeightT* w, const float* x, Py_ssize_t ldx, uint8_t* aq,
                             Py_ssize_t n, int nthreads) noexcept nogil:
    job.kind = ROW_QUANT
    job.wtype = w.type
    job.src = x
    job.ld_src = ldx
    job.dim = w.cols
    job.aq = aq
    job.rb = act_row_bytes(w.type, w.cols)
    _rows(job, n, nthreads)


cdef inline void _residual_rows(RowJob* job, float* x, float* o, const float* post_norm,
                                const float* next_norm, float* xn, Py_ssize_t dim, Py_ssize_t n,
                                int nthreads) noexcept nogil:
    job.kind = ROW_RESID
    job.src = o
    job.dst = x
    job.w = post_norm
    job.w2 = next_norm
    job.xn = xn
    job.dim = dim
    _rows(job, n, nthreads)


# Decoding reads each layer's cached K/V rows once per token, and the weights that stream through memory
# between two tokens evict them from every cache level: without help, attention waits on DRAM for short
# runs of rows (a few KB per head) that the hardware prefetchers barely start on. So at the top of each
# layer, the rows this batch will attend over are requested into L2, while the norm and the q/k/v
# products run. Prompt batches (more than KV_WARM_TOKENS tokens) reuse their rows from cache anyway.
cdef enum:
    UBATCH_ATTN_BUDGET = 262144  # tokens x position per micro-batch: 256 tokens at position 1024
    KV_WARM_TOKENS = 16
    KV_WARM_BYTES = 786432  # at most this much per layer: L2 is 1 MB on the machines we measure


cdef void _warm_kv(const char* kl, const char* vl, Py_ssize_t es, const int32_t* pos, const int32_t* seq,
                   Py_ssize_t n, Py_ssize_t nkv, Py_ssize_t hd, Py_ssize_t seq_stride, Py_ssize_t head_stride,
                   Py_ssize_t window) noexcept nogil:
    cdef Py_ssize_t t, h, first, nbytes, b, off
    cdef Py_ssize_t budget = KV_WARM_BYTES
    for t in range(n):
        first = 0
        if window > 0 and pos[t] - window + 1 > 0:
            first = pos[t] - window + 1
        nbytes = (pos[t] - first) * hd * es  # the rows before this token's own
        for h in range(nkv):
            budget -= 2 * nbytes
            if budget < 0:
                return
            off = (seq[t] * seq_stride + h * head_stride + first * hd) * es
            for b in range(0, nbytes, 64):
                lc_prefetch_l2(kl + off + b)
                lc_prefetch_l2(vl + off + b)


ctypedef struct AttnCtx:
    float* q              # [n, n_head * head_dim]
    float* att            # [n, n_head * head_dim] output
    float* scores         # per thread [threads, n_ctx]
    const int32_t* pos
    const int32_t* seq
    const char* kl        # this layer's K cache (float32 or half values, es bytes each)
    const char* vl
    bint kv_f16
    Py_ssize_t es
    Py_ssize_t window
    Py_ssize_t seq_stride
    Py_ssize_t head_stride
    Py_ssize_t n_ctx
    Py_ssize_t n_head
    Py_ssize_t head_dim
    Py_ssize_t group
    Py_ssize_t n_items
    float scale
    float softcap


# The cached rows one KV group reads (its first ATTN_PF_BYTES of K and of V) are requested into L1 while
# the group before it computes: the q heads of a group run back to back on the same rows, so a group's
# compute is about as long as fetching the next group's rows (5 KB each of K and V at 40 positions, f16).
# Without it decode attention waited on memory: 8 sequences at 40 positions, 2.1 ms a step where the
# arithmetic takes 0.4. Longer rows stream on with the hardware prefetchers.
cdef enum:
    ATTN_PF_BYTES = 8192


cdef inline Py_ssize_t _first_pos(const AttnCtx* c, Py_ssize_t p) noexcept nogil:
    if c.window > 0 and p - c.window + 1 > 0:
        return p - c.window + 1
    return 0


cdef inline void _prefetch_group(const AttnCtx* c, Py_ssize_t item) noexcept nogil:
    cdef Py_ssize_t t = item // c.n_head, h = item % c.n_head, p = c.pos[t], first = _first_pos(c, p), b
    cdef Py_ssize_t off = (c.seq[t] * c.seq_stride + (h // c.group) * c.head_stride + first * c.head_dim) * c.es
    cdef Py_ssize_t nbytes = min(<Py_ssize_t>ATTN_PF_BYTES, (p - first + 1) * c.head_dim * c.es)
    for b in range(0, nbytes, 64):
        lc_prefetch(c.kl + off + b)
        lc_prefetch(c.vl + off + b)


cdef void _attend_task(void* ctx, int64_t begin, int64_t end, int tid) noexcept nogil:
    """Attention for (token, head) items begin..end-1 of a micro-batch."""
    cdef AttnCtx* c = <AttnCtx*> ctx
    cdef Py_ssize_t NH = c.n_head, HD = c.head_dim, item, t, h, p, first, off
    cdef float* scores = c.scores + tid * c.n_ctx
    for item in range(begin, end):
        t = item // NH
        h = item % NH
        if h % c.group == 0 and item + c.group < c.n_items:
            _prefetch_group(c, item + c.group)
        p = c.pos[t]
        first = _first_pos(c, p)
        off = c.seq[t] * c.seq_stride + (h // c.group) * c.head_stride
        attend(c.q + t * NH * HD + h * HD, c.kl + off * c.es, c.vl + off * c.es, first, p, HD, c.scale, c.softcap,
               scores, c.att + t * NH * HD + h * HD, c.kv_f16)
