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
from llamacy.model.deltanet cimport DeltaSpace, deltanet_mixer
from llamacy.model.dense_moe cimport dense_moe_ffn
from llamacy.model.ffn cimport dense_ffn
from llamacy.model.layout cimport (ACT_GELU, ACT_RELU2, ACT_SILU, FFN_DENSE_MOE, FFN_MOE, FFN_MOE_UNGATED, FFN_NONE,
                                   HParams, KVRows, LayerT, MIXER_ATTENTION, MIXER_DELTANET, MIXER_MAMBA2, MIXER_NONE,
                                   NORM_LAYER, NORM_RMS, Scratch, StateRows, WeightT)
from llamacy.model.mamba2 cimport Mamba2Space, mamba2_mixer
from llamacy.model.moe cimport MoeJob, MoeSpace, moe_ffn
from llamacy.model.moe_ungated cimport moe_ungated_ffn
from llamacy.model.norms cimport norm_row
from llamacy.model.per_layer_embd cimport PleSpace
from llamacy.model.products cimport (N_PROF, P_ELEM, P_MM_OUT, P_MM_QKV, P_MOE, Products, lap, now, product)
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

_NO_ROWS = np.zeros(0, np.int32)  # eval's hidden_rows when none are asked for

# Deep into a long prompt a micro-batch's attention work grows with the position: micro-batches shrink so
# that tokens x position stays under this (256 tokens at position 1024), to 16 tokens at least.
cdef enum:
    UBATCH_ATTN_BUDGET = 262144
    UBATCH_MIN_TOKENS = 16


# One layer's memory as the loop reads it (memory.py's arrays): K and V rows, NULL for a layer without;
# a recurrent layer's states (NULL for others).
ctypedef struct LayerMem:
    char* k
    char* v
    Py_ssize_t slots
    Py_ssize_t ring
    Py_ssize_t row_bytes
    float* state
    Py_ssize_t floats
    Py_ssize_t conv


cdef void mark_snapshots(const int32_t* seq, Py_ssize_t n, Py_ssize_t n_snap, Py_ssize_t* count,
                         Py_ssize_t n_seq, uint8_t* snap) noexcept nogil:
    """snap[t] = 1 for the last n_snap tokens of every sequence with more than one token among the n
    (memory.py: the states a rejected draft goes back to); count is scratch of 2 * n_seq."""
    cdef Py_ssize_t t, s
    cdef Py_ssize_t* left = count + n_seq
    for s in range(n_seq):
        count[s] = 0
    for t in range(n):
        count[seq[t]] += 1
    for s in range(n_seq):
        left[s] = count[s]
    for t in range(n):
        s = seq[t]
        snap[t] = 1 if count[s] > 1 and left[s] <= n_snap else 0
        left[s] -= 1


cdef class Forward:
    """Weights and scratch of one model; `eval` runs a batch through it, reading and writing the memory
    bound with `bind_memory`."""

    cdef HParams hp
    cdef BoundWeights w
    cdef bint v_norm   # for rebind
    cdef bint nextn    # a multi-token-prediction block: its input is a token and a hidden state (mtp.py)
    cdef ScratchSpace scratch
    # The batch in flight: where its tokens meet a layer's memory, and the jobs that run on the thread team.
    cdef KVRows kv
    cdef StateRows sr
    cdef RowJob rj
    cdef AttnJob aj
    cdef Products pr
    cdef MoeSpace moe  # None for a dense model
    cdef MoeJob* mj    # its job; NULL for a dense model
    cdef PleSpace ple  # per-layer embeddings (Gemma 4 E2B/E4B); None without
    cdef DeltaSpace dn  # the gated delta-net's activations; None without such layers
    cdef Mamba2Space m2  # Mamba2 layers' activations (Nemotron-H); None without
    # The memory: one record per layer, the arrays behind them kept alive.
    cdef LayerMem* mem
    cdef object memory
    cdef Py_ssize_t n_seq, n_ctx
    # Recurrent layers: which tokens of the micro-batch keep snapshots, where their positions are recorded
    # (memory.snap_pos), and scratch for counting.
    cdef bint recurrent
    cdef object _snap_arrays
    cdef uint8_t* snap
    cdef int32_t* snap_pos
    cdef Py_ssize_t* seq_count

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
        self.v_norm = getattr(cfg, "v_norm", False)
        self.w = BoundWeights(weights, self.v_norm)
        # Sized for the widest layer. A mixture-of-experts model has no dense feed-forward: its activations
        # are MoeSpace's.
        wide = cfg.widest()
        only_moe = cfg.n_expert and all(f == "moe" for f in cfg.layer_ffn)
        # The activation rows products quantize (s.aq) are as wide as the widest input; a recurrent mixer's
        # output projection reads rows of ssm_d_inner values.
        # A multi-token-prediction block's input projection (mtp.py) reads rows of 2 n_embd values.
        self.nextn = weights.fields.get("nextn_eh_proj") is not None
        self.scratch = ScratchSpace(cfg.n_embd, max(wide["q"], getattr(cfg, "ssm_d_inner", 0),
                                                    2 * cfg.n_embd if self.nextn else 0), wide["kv"],
                                    wide["group"], 1 if only_moe else wide["n_ff"], wide["n_rot"], ubatch,
                                    n_ctx_max, threads_max, getattr(cfg, "attn_gate", False))
        self.dn = DeltaSpace(cfg, ubatch) if "deltanet" in getattr(cfg, "layer_mixer", ()) else None
        self.rj.hp = &self.hp
        self.rj.s = &self.scratch.s
        self.rj.kv = &self.kv
        self.aj.hp = &self.hp
        self.aj.s = &self.scratch.s
        self.aj.kv = &self.kv
        self.pr.rj = &self.rj
        self.kv.n_head_kv = self.hp.n_head_kv
        self.kv.head_dim = self.hp.head_dim
        self.ple = PleSpace(cfg, ubatch) if getattr(cfg, "n_embd_per_layer", 0) else None
        if (self.ple is None) != (self.w.pl_tok_embd.rows == 0):
            raise ValueError("per-layer embeddings bound without their width in the config, or the reverse")
        self.m2 = None
        if "mamba2" in cfg.layer_mixer:
            self.m2 = Mamba2Space(cfg, ubatch)
            self.m2.job.hp = &self.hp
        self.mj = NULL
        if cfg.n_expert:
            self.moe = MoeSpace(cfg, ubatch)
            self.mj = &self.moe.job
            self.mj.hp = &self.hp

    def rebind(self, weights):
        """The same model's weights bound again, after some of its matrices were swapped for ones in
        another layout (repack.py's DeferredRepack) that give the same numbers. Only between evaluations,
        from the thread that evaluates: eval reads self.w throughout."""
        self.w = BoundWeights(weights, self.v_norm)

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
        cdef float[::1] sb
        cdef Py_ssize_t l
        try:
            for l, lm in enumerate(memory.layers):
                mixer = self.w.layers[l].mixer
                if mixer == MIXER_ATTENTION and lm.k is None:
                    raise ValueError(f"layer {l} attends but its memory keeps no K/V rows")
                if mixer not in (MIXER_ATTENTION, MIXER_NONE):
                    if lm.state is None:
                        raise ValueError(f"layer {l} is recurrent but its memory keeps no state")
                    if lm.state.shape[:2] != (memory.n_seq, 1 + memory.n_snap) or lm.state.dtype != np.float32:
                        raise ValueError(f"layer {l}'s state has the wrong shape")
                    sb = lm.state.reshape(-1)
                    mem[l].state = &sb[0]
                    mem[l].floats = lm.state.shape[2]
                    mem[l].conv = lm.conv
                    continue
                if lm.k is None:
                    continue
                kb = lm.k.reshape(-1)
                vb = lm.v.reshape(-1)
                need = memory.n_seq * self.w.layers[l].n_head_kv * lm.slots * lm.row_bytes
                if kb.shape[0] < need or vb.shape[0] < need:
                    raise ValueError(f"layer {l}'s memory is smaller than its slots")
                mem[l].k = <char*>&kb[0]
                mem[l].v = <char*>&vb[0]
                mem[l].slots = lm.slots
                mem[l].ring = lm.ring
                mem[l].row_bytes = lm.row_bytes
        except BaseException:
            free(mem)
            raise
        if self.mem != NULL:
            free(self.mem)
        self.mem = mem
        self.memory = memory
        self.n_seq = memory.n_seq
        self.n_ctx = memory.n_ctx
        self.kv.fmt = memory.fmt
        self.aj.n_ctx = memory.n_ctx
        self.recurrent = bool(memory.recurrent)
        cdef uint8_t[::1] snap
        cdef int32_t[::1] tags
        cdef Py_ssize_t[::1] count
        if self.recurrent:
            if memory.snap_pos.shape != (memory.n_seq, max(memory.n_snap, 1)) or memory.snap_pos.dtype != np.int32:
                raise ValueError("memory's snapshot positions have the wrong shape")
            snap_arr = np.zeros(self.scratch.ubatch, np.uint8)
            count_arr = np.zeros(2 * memory.n_seq, np.intp)
            snap, tags, count = snap_arr, memory.snap_pos.reshape(-1), count_arr
            self._snap_arrays = (snap_arr, count_arr, memory.snap_pos)
            self.snap = &snap[0]
            self.snap_pos = &tags[0]
            self.seq_count = &count[0]
            self.sr.snap = self.snap
            self.sr.n_snap = memory.n_snap

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
             const int32_t[::1] logit_rows, float[:, ::1] logits, int nthreads, bint hidden=False,
             hidden_in=None, hidden_rows=None, hidden_out=None):
        """Evaluate tokens[i] at position pos[i] of sequence seq[i]; write their K/V rows into memory.

        logit_rows: indices into the batch whose logits are wanted, ascending; logits: [len, n_vocab].
        hidden: write the final hidden states (after output_norm) instead, [len, n_embd]; the output head
        is not run. hidden_rows / hidden_out: besides the logits, the final hidden states of these batch
        rows (ascending) into hidden_out [len, n_embd] (a multi-token-prediction drafter reads them).
        hidden_in: a multi-token-prediction block's second input, one hidden state per token [n, n_embd]
        (required by such a block, refused by any other model).
        """
        cdef Py_ssize_t n = tokens.shape[0]
        cdef Py_ssize_t i, start, stop
        cdef const float[:, ::1] h_in
        cdef const int32_t[::1] h_rows
        cdef float[:, ::1] h_out
        cdef const float* h_in_p = NULL
        cdef float* h_out_p = NULL
        cdef Py_ssize_t E = self.hp.n_embd
        if self.mem == NULL:
            raise ValueError("no memory bound (bind_memory)")
        if pos.shape[0] != n or seq.shape[0] != n:
            raise ValueError("tokens, pos and seq must have the same length")
        if (hidden_in is not None) != self.nextn:
            raise ValueError("a multi-token-prediction block takes hidden_in, and only it does")
        if hidden_in is not None:
            h_in = hidden_in
            if h_in.shape[0] != n or h_in.shape[1] != E:
                raise ValueError("hidden_in must be [len(tokens), n_embd]")
            if n:
                h_in_p = &h_in[0, 0]
        if (hidden_rows is None) != (hidden_out is None):
            raise ValueError("hidden_rows and hidden_out go together")
        if hidden_rows is not None:
            h_rows = hidden_rows
            h_out = hidden_out
            if h_out.shape[0] != h_rows.shape[0] or (h_rows.shape[0] and h_out.shape[1] != E):
                raise ValueError("hidden_out does not match hidden_rows")
            for i in range(h_rows.shape[0]):
                if h_rows[i] < 0 or h_rows[i] >= n or (i and h_rows[i] <= h_rows[i - 1]):
                    raise ValueError("hidden_rows must be ascending indices into the batch")
            if h_rows.shape[0]:
                h_out_p = &h_out[0, 0]
        else:
            h_rows = _NO_ROWS
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
        if self.recurrent:
            self._check_order(pos, seq)
        for i in range(logit_rows.shape[0]):
            if logit_rows[i] < 0 or logit_rows[i] >= n or (i and logit_rows[i] <= logit_rows[i - 1]):
                raise ValueError("logit_rows must be ascending indices into the batch")
        nthreads = max(1, min(nthreads, self.scratch.threads_max))
        if n == 0:
            return

        cdef float* lg = &logits[0, 0] if logit_rows.shape[0] else NULL
        cdef Py_ssize_t lr = 0, lr_end, hr = 0, hr_end
        start = 0
        while start < n:
            stop = min(n, start + min(self.scratch.ubatch,
                                      max(UBATCH_MIN_TOKENS, UBATCH_ATTN_BUDGET // max(1, pos[start]))))
            lr_end = lr
            while lr_end < logit_rows.shape[0] and logit_rows[lr_end] < stop:
                lr_end += 1
            hr_end = hr
            while hr_end < h_rows.shape[0] and h_rows[hr_end] < stop:
                hr_end += 1
            self.kv.pos = &pos[start]
            self.kv.seq = &seq[start]
            self.sr.pos = &pos[start]
            self.sr.seq = &seq[start]
            if self.recurrent:
                mark_snapshots(&seq[start], stop - start, self.sr.n_snap, self.seq_count, self.n_seq, self.snap)
            with nogil:
                self._ubatch(&tokens[start], stop - start, &logit_rows[lr] if lr_end > lr else NULL,
                             lr_end - lr, start, lg + lr * width if lr_end > lr else NULL, hidden, nthreads,
                             h_in_p + start * E if h_in_p != NULL else NULL,
                             &h_rows[hr] if hr_end > hr else NULL, hr_end - hr,
                             h_out_p + hr * E if hr_end > hr else NULL)
            if self.recurrent:
                for i in range(start, stop):
                    if self.snap[i - start]:
                        self.snap_pos[seq[i] * self.sr.n_snap + pos[i] % self.sr.n_snap] = pos[i]
            lr = lr_end
            hr = hr_end
            start = stop
            # A long prompt is many micro-batches: let Ctrl-C through between them.
            if start < n and PyErr_CheckSignals() != 0:
                raise KeyboardInterrupt

    def head(self, const float[:, ::1] normed, float[:, ::1] logits, int nthreads):
        """The output head alone over rows already normed (a multi-token-prediction drafter's own output,
        mtp.py): logits [n, n_vocab]."""
        cdef Py_ssize_t n = normed.shape[0]
        if normed.shape[1] != self.hp.n_embd or logits.shape[0] != n or logits.shape[1] != self.hp.n_vocab:
            raise ValueError("head: rows of n_embd values in, rows of n_vocab logits out")
        if n > self.scratch.ubatch:
            raise ValueError("head: more rows than a micro-batch")
        if n == 0:
            return
        nthreads = max(1, min(nthreads, self.scratch.threads_max))
        with nogil:
            self._logits(&normed[0, 0], n, &logits[0, 0], nthreads)

    def _check_order(self, const int32_t[::1] pos, const int32_t[::1] seq):
        """A recurrent state holds its sequence's last position only: each sequence's tokens must continue
        it, in order (a sequence at position 0 starts afresh)."""
        cdef Py_ssize_t i
        nxt = {}
        for i in range(pos.shape[0]):
            s = seq[i]
            want = nxt.get(s)
            if want is None:
                want = len(self.memory.tokens[s])
            if pos[i] != want and pos[i] != 0:
                raise ValueError(f"sequence {s}: position {pos[i]} does not continue its recurrent state "
                                 f"(at {want})")
            nxt[s] = pos[i] + 1

    cdef void _bind_state(self, Py_ssize_t l) noexcept nogil:
        """Point self.sr at layer l's states."""
        self.sr.state = self.mem[l].state
        self.sr.floats = self.mem[l].floats
        self.sr.conv = self.mem[l].conv

    cdef void _ubatch(self, const int32_t* tokens, Py_ssize_t n, const int32_t* out_rows, Py_ssize_t n_out,
                      Py_ssize_t row0, float* out, bint hidden, int nthreads, const float* h_in,
                      const int32_t* h_rows, Py_ssize_t n_h, float* h_out) noexcept nogil:
        """One micro-batch of n tokens (self.kv.pos/seq point at theirs) through every layer; then, for the
        batch rows out_rows (minus row0), logits or hidden states into out, and for the rows h_rows the
        hidden states into h_out. h_in: a multi-token-prediction block's hidden-state inputs, n rows."""
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
        if h_in != NULL:
            self._nextn_input(h_in, n, nthreads)
        self.aj.rope_base = 0.0  # RoPE tables are built per micro-batch
        self.aj.rope_freq_scale = 0.0
        self.aj.rope_n_rot = 0
        self.aj.rope_freqs = NULL
        if self.ple is not None:
            self.ple.inputs(pr, &self.w.pl_model_proj, self.w.pl_proj_norm, &self.w.pl_tok_embd, s, tokens, n,
                            nthreads)

        for l in range(self.w.n_layer):
            L = &self.w.layers[l]
            if L.mixer != MIXER_NONE:
                norm_rows(rj, s.x, L.attn_norm, L.attn_norm_b, s.xn, E, n, nthreads)
                if L.mixer == MIXER_ATTENTION:
                    kv.kl = self.mem[l].k
                    kv.vl = self.mem[l].v
                    kv.slots = self.mem[l].slots
                    kv.ring = self.mem[l].ring
                    kv.row_bytes = self.mem[l].row_bytes
                    kv.n_head_kv = L.n_head_kv
                    kv.head_dim = L.head_dim
                    warm_kv(kv, n, L.n_head_kv, L.window)
                    attention_mixer(pr, &self.aj, L, self.w.rope_freqs, n, nthreads)
                else:  # a recurrent mixer: its output into s.o, like attention's
                    self._bind_state(l)
                    if L.mixer == MIXER_DELTANET:
                        deltanet_mixer(pr, &self.dn.job, L, &self.sr, s.xn, E, s.o, n, nthreads)
                    elif L.mixer == MIXER_MAMBA2:
                        mamba2_mixer(pr, &self.m2.job, L, &self.sr, s.xn, s.o, n, nthreads)
                # x += post_attn_norm(o), then the feed-forward block's input norm, in one pass per token.
                if L.ffn != FFN_NONE:
                    residual_rows(rj, s.x, s.o, L.post_attn_norm, L.ffn_norm, L.ffn_norm_b, s.xn, E, n, nthreads)
                else:
                    residual_rows(rj, s.x, s.o, L.post_attn_norm, NULL, NULL, NULL, E, n, nthreads)
            elif L.ffn != FFN_NONE:
                norm_rows(rj, s.x, L.ffn_norm, L.ffn_norm_b, s.xn, E, n, nthreads)
            if L.ffn != FFN_NONE:
                if L.ffn == FFN_MOE:
                    lap(pr, P_ELEM)
                    moe_ffn(self.mj, rj, L, s.xn, s.aq, s.o, n, nthreads)
                    lap(pr, P_MOE)
                elif L.ffn == FFN_MOE_UNGATED:
                    lap(pr, P_ELEM)
                    moe_ungated_ffn(self.mj, rj, L, s.xn, s.aq, s.o, n, nthreads)
                    lap(pr, P_MOE)
                elif L.ffn == FFN_DENSE_MOE:
                    dense_moe_ffn(pr, self.mj, L, s, E, n, nthreads)
                else:
                    dense_ffn(pr, L, s, E, n, nthreads)
                residual_rows(rj, s.x, s.o, L.post_ffn_norm, NULL, NULL, NULL, E, n, nthreads)
            if L.inp_gate.rows:  # per-layer embeddings
                self.ple.block(pr, L, l, s, n, nthreads)
            if L.out_scale != NULL:  # the layer's output scaled (Gemma 4's layer_output_scale)
                for t in range(n):
                    scale_inplace(s.x + t * E, L.out_scale[0], E)

        for j in range(n_h):
            norm_row(hp.norm, s.x + (h_rows[j] - row0) * E, self.w.output_norm, self.w.output_norm_b,
                     h_out + j * E, E, hp.rms_eps)
        # The final norm, only for the rows whose output is wanted: straight into the output for hidden
        # states, into the output head's input for logits.
        normed = out if hidden else s.xn
        for j in range(n_out):
            norm_row(hp.norm, s.x + (out_rows[j] - row0) * E, self.w.output_norm, self.w.output_norm_b,
                     normed + j * E, E, hp.rms_eps)
        if n_out and not hidden:
            self._logits(s.xn, n_out, out, nthreads)
        lap(pr, P_ELEM)

    cdef void _logits(self, const float* normed, Py_ssize_t n, float* out, int nthreads) noexcept nogil:
        """The output head over n rows already normed, soft-capped where the model caps its logits."""
        cdef Py_ssize_t j
        cdef float cap = self.hp.final_softcap
        product(&self.pr, &self.w.output, normed, self.hp.n_embd, n, out, NULL, nthreads, P_MM_OUT)
        if cap > 0.0:
            for j in range(n * self.hp.n_vocab):
                out[j] = cap * tanhf(out[j] / cap)

    cdef void _nextn_input(self, const float* h_in, Py_ssize_t n, int nthreads) noexcept nogil:
        """A multi-token-prediction block's input (llama.cpp's qwen35.cpp graph_mtp): s.x holds the tokens'
        embeddings; x = eh_proj [enorm(x); hnorm(h)], the two halves side by side in s.xn."""
        cdef Py_ssize_t E = self.hp.n_embd, t
        cdef Scratch* s = &self.scratch.s
        for t in range(n):
            norm_row(NORM_RMS, s.x + t * E, self.w.nextn_enorm, NULL, s.xn + t * 2 * E, E, self.hp.rms_eps)
            norm_row(NORM_RMS, h_in + t * E, self.w.nextn_hnorm, NULL, s.xn + t * 2 * E + E, E, self.hp.rms_eps)
        product(&self.pr, &self.w.nextn_eh_proj, s.xn, 2 * E, n, s.x, NULL, nthreads, P_MM_QKV)
