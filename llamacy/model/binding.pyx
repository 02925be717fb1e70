# cython: language_level=3
"""Bound weights (llamacy.model.weights.ModelWeights) -> the C records the layer loop reads.

Each field an architecture declares is written into LayerT by name, through a table of the struct's
fields built here from the struct itself: a declared field the record does not have is an error at load
(never a pointer left NULL), and a test checks that every LayerT field is in the table.
"""

from libc.stdint cimport uint8_t
from libc.stdlib cimport calloc, free

from llamacy.kernels.quant cimport act_format
from llamacy.model.layout cimport (FFN_DENSE_MOE, FFN_GATED, FFN_MOE, FFN_MOE_UNGATED, FFN_NONE, FFN_UNGATED,
                                   MIXER_ATTENTION, MIXER_DELTANET, MIXER_MAMBA2, MIXER_NONE)

cdef LayerT _probe


cdef Py_ssize_t _at(void* field) noexcept:
    return <char*>field - <char*>&_probe


# LayerT's weight fields: name -> byte offset in the struct.
MATRICES = {
    "wq": _at(&_probe.wq), "wk": _at(&_probe.wk), "wv": _at(&_probe.wv), "wo": _at(&_probe.wo),
    "gate": _at(&_probe.gate), "up": _at(&_probe.up), "down": _at(&_probe.down),
    "gate_inp": _at(&_probe.gate_inp), "gate_exps": _at(&_probe.gate_exps), "up_exps": _at(&_probe.up_exps),
    "down_exps": _at(&_probe.down_exps), "gate_shexp": _at(&_probe.gate_shexp),
    "up_shexp": _at(&_probe.up_shexp), "down_shexp": _at(&_probe.down_shexp),
    "inp_gate": _at(&_probe.inp_gate), "proj": _at(&_probe.proj), "gate_up_exps": _at(&_probe.gate_up_exps),
    # gated delta-net (qwen3next, qwen35)
    "wqkv": _at(&_probe.wqkv), "wqkv_gate": _at(&_probe.wqkv_gate), "ssm_in": _at(&_probe.ssm_in),
    "ssm_ba": _at(&_probe.ssm_ba), "ssm_beta": _at(&_probe.ssm_beta), "ssm_alpha": _at(&_probe.ssm_alpha),
    "ssm_out": _at(&_probe.ssm_out),
    # Nemotron-H
    "latent_down": _at(&_probe.latent_down), "latent_up": _at(&_probe.latent_up),
}
VECTORS = {
    "attn_norm": _at(&_probe.attn_norm), "attn_norm_b": _at(&_probe.attn_norm_b),
    "bq": _at(&_probe.bq), "bk": _at(&_probe.bk), "bv": _at(&_probe.bv),
    "q_norm": _at(&_probe.q_norm), "k_norm": _at(&_probe.k_norm),
    "post_attn_norm": _at(&_probe.post_attn_norm), "ffn_norm": _at(&_probe.ffn_norm),
    "ffn_norm_b": _at(&_probe.ffn_norm_b), "post_ffn_norm": _at(&_probe.post_ffn_norm),
    "gate_inp_shexp": _at(&_probe.gate_inp_shexp), "bo": _at(&_probe.bo), "up_b": _at(&_probe.up_b),
    "down_b": _at(&_probe.down_b), "out_scale": _at(&_probe.out_scale),
    "pe_post_norm": _at(&_probe.pe_post_norm), "gate_inp_scale": _at(&_probe.gate_inp_scale),
    "down_exps_scale": _at(&_probe.down_exps_scale), "pre_ffn_norm_2": _at(&_probe.pre_ffn_norm_2),
    "post_ffn_norm_1": _at(&_probe.post_ffn_norm_1), "post_ffn_norm_2": _at(&_probe.post_ffn_norm_2),
    # gated delta-net (qwen3next, qwen35)
    "ssm_conv1d": _at(&_probe.ssm_conv1d), "ssm_dt": _at(&_probe.ssm_dt), "ssm_a": _at(&_probe.ssm_a),
    "ssm_norm": _at(&_probe.ssm_norm),
    # Nemotron-H (Mamba2's conv bias and D; the MoE's choice bias)
    "ssm_conv1d_b": _at(&_probe.ssm_conv1d_b), "ssm_d": _at(&_probe.ssm_d), "exp_probs_b": _at(&_probe.exp_probs_b),
}
# LayerT's fields set from the layer's recipe rather than from tensors.
SETTINGS = ("mixer", "ffn", "window", "rope_base", "rope_freq_scale", "n_head_kv", "head_dim", "n_rot",
            "kv_shared", "v_norm", "rope_freqs", "attn_gate")
_MIXERS = {"none": MIXER_NONE, "attention": MIXER_ATTENTION, "deltanet": MIXER_DELTANET, "mamba2": MIXER_MAMBA2}
_FFNS = {"none": FFN_NONE, "gated": FFN_GATED, "ungated": FFN_UNGATED, "moe": FFN_MOE,
         "dense_moe": FFN_DENSE_MOE, "moe_ungated": FFN_MOE_UNGATED}
# Model-level fields BoundWeights reads.
MODEL_FIELDS = ("token_embd", "output", "output_norm", "output_norm_b", "rope_freqs",
                "per_layer_token_embd", "per_layer_model_proj", "per_layer_proj_norm",
                "nextn_eh_proj", "nextn_enorm", "nextn_hnorm")


cdef class BoundWeights:
    """Pointers into a ModelWeights' buffers, valid while this object lives (it keeps the buffers)."""

    def __cinit__(self):
        self.layers = NULL

    def __dealloc__(self):
        if self.layers != NULL:
            free(self.layers)

    def __init__(self, weights, bint v_norm=False):
        """weights: a llamacy.model.weights.ModelWeights, shapes already checked against the config;
        v_norm: the model norms its V rows (ModelConfig.v_norm)."""
        self._keep = []
        unknown = set(weights.fields) - set(MODEL_FIELDS)
        if unknown:
            raise ValueError(f"no model-level field for {sorted(unknown)}")
        self.tok_embd = self._matrix(weights.fields["token_embd"])
        self.output = self._matrix(weights.fields["output"])
        self.output_norm = self._vector(weights.fields["output_norm"])
        self.output_norm_b = self._vector(weights.fields.get("output_norm_b"))
        self.rope_freqs = self._vector(weights.fields.get("rope_freqs"))
        self.pl_tok_embd = self._matrix(weights.fields.get("per_layer_token_embd"))
        self.pl_model_proj = self._matrix(weights.fields.get("per_layer_model_proj"))
        self.pl_proj_norm = self._vector(weights.fields.get("per_layer_proj_norm"))
        self.nextn_eh_proj = self._matrix(weights.fields.get("nextn_eh_proj"))
        self.nextn_enorm = self._vector(weights.fields.get("nextn_enorm"))
        self.nextn_hnorm = self._vector(weights.fields.get("nextn_hnorm"))
        if (self.nextn_eh_proj.rows == 0) != (self.nextn_enorm == NULL) or (
                (self.nextn_enorm == NULL) != (self.nextn_hnorm == NULL)):
            raise ValueError("a multi-token-prediction input needs eh_proj, enorm and hnorm together")
        self.n_layer = len(weights.layers)
        self.layers = <LayerT*> calloc(max(self.n_layer, 1), sizeof(LayerT))
        if self.layers == NULL:
            raise MemoryError()
        cdef LayerT* L
        cdef char* base
        for i, (fields, spec) in enumerate(zip(weights.layers, weights.specs)):
            L = &self.layers[i]
            base = <char*>L
            for name, value in fields.items():
                if name in MATRICES:
                    (<WeightT*>(base + <Py_ssize_t>MATRICES[name]))[0] = self._matrix(value)
                elif name in VECTORS:
                    (<const float**>(base + <Py_ssize_t>VECTORS[name]))[0] = self._vector(value)
                else:
                    raise ValueError(f"layer {i}: no LayerT field for tensor field {name!r}")
            L.mixer = _MIXERS[spec.mixer]
            L.ffn = _FFNS[spec.ffn]
            L.window = spec.window
            L.rope_base = spec.rope_base
            L.rope_freq_scale = spec.rope_freq_scale
            L.n_head_kv = spec.n_head_kv
            L.head_dim = spec.head_dim
            L.n_rot = spec.n_rot
            L.kv_shared = spec.kv_from >= 0
            L.v_norm = v_norm
            L.rope_freqs = spec.rope_freqs
            L.attn_gate = spec.attn_gate
            self._check_layer(i, L)

    cdef void _check_layer(self, Py_ssize_t i, const LayerT* L) except *:
        """The blocks a recipe runs have the tensors they read (the architecture declares them required;
        this keeps a declaration and a recipe that disagree from reaching the loop)."""
        missing = []
        # V = K where a layer has no V projection (Gemma 4's full layers); a shared-KV layer has neither.
        if L.mixer == MIXER_ATTENTION and (L.attn_norm == NULL or not (
                L.wq.rows and L.wo.rows and (L.kv_shared or (L.wk.rows and (L.wv.rows or L.v_norm))))):
            missing.append("attention")
        if L.mixer == MIXER_DELTANET and (L.attn_norm == NULL or not (
                (L.ssm_in.rows or (L.wqkv.rows and L.wqkv_gate.rows))
                and (L.ssm_ba.rows or (L.ssm_beta.rows and L.ssm_alpha.rows)) and L.ssm_out.rows
                and L.ssm_conv1d != NULL and L.ssm_dt != NULL and L.ssm_a != NULL and L.ssm_norm != NULL)):
            missing.append("delta-net")
        if L.ffn != FFN_NONE and L.ffn_norm == NULL:
            missing.append("ffn_norm")
        if (L.ffn == FFN_GATED or L.ffn == FFN_DENSE_MOE) and not (L.gate.rows and L.up.rows and L.down.rows):
            missing.append("gated feed-forward")
        if L.ffn == FFN_DENSE_MOE and not (
                L.gate_inp.rows and L.down_exps.rows and (L.gate_up_exps.rows or (L.gate_exps.rows and L.up_exps.rows))
                and L.gate_inp_scale != NULL and L.pre_ffn_norm_2 != NULL and L.post_ffn_norm_1 != NULL
                and L.post_ffn_norm_2 != NULL):
            missing.append("experts")
        if L.ffn == FFN_UNGATED and not (L.up.rows and L.down.rows):
            missing.append("feed-forward")
        if L.ffn == FFN_MOE and not (L.gate_inp.rows and L.gate_exps.rows and L.up_exps.rows
                                     and L.down_exps.rows):
            missing.append("experts")
        if L.mixer == MIXER_MAMBA2 and not (
                L.attn_norm != NULL and L.ssm_in.rows and L.ssm_out.rows and L.ssm_conv1d != NULL
                and L.ssm_dt != NULL and L.ssm_a != NULL and L.ssm_d != NULL and L.ssm_norm != NULL):
            missing.append("mamba2")
        if L.ffn == FFN_MOE_UNGATED and not (
                L.gate_inp.rows and L.up_exps.rows and L.down_exps.rows and L.exp_probs_b != NULL
                and L.up_shexp.rows and L.down_shexp.rows and (L.latent_down.rows == 0) == (L.latent_up.rows == 0)):
            missing.append("experts")
        if (L.bq == NULL) != (L.bk == NULL) or (L.bq == NULL) != (L.bv == NULL):
            missing.append("q/k/v biases")
        if (L.inp_gate.rows == 0) != (L.proj.rows == 0) or (L.inp_gate.rows and (
                L.pe_post_norm == NULL or self.pl_tok_embd.rows == 0 or self.pl_proj_norm == NULL)):
            missing.append("per-layer embeddings")
        if (L.q_norm == NULL) != (L.k_norm == NULL) and not L.kv_shared:
            missing.append("q/k norms")
        if missing:
            raise ValueError(f"layer {i}: the recipe's {', '.join(missing)} tensors are not bound")

    cdef WeightT _matrix(self, object m) except *:
        cdef WeightT w
        if m is None:  # a matrix this layer does not have: rows 0
            w.data = NULL
            w.type = 0
            w.layout = 0
            w.rows = 0
            w.cols = 0
            w.row_bytes = 0
            return w
        cdef const uint8_t[::1] mv = m.data
        if mv.shape[0] < m.rows * m.row_bytes:
            raise ValueError("weight buffer smaller than its rows")
        if act_format(m.type) < 0:
            raise ValueError(f"no kernel for GGML type {m.type}")
        self._keep.append(m.data)
        w.data = &mv[0]
        w.type = m.type
        w.layout = m.layout
        w.rows = m.rows
        w.cols = m.cols
        w.row_bytes = m.row_bytes
        return w

    cdef const float* _vector(self, object v) except? NULL:
        if v is None:
            return NULL
        cdef const float[::1] mv = v
        self._keep.append(v)
        return &mv[0]
