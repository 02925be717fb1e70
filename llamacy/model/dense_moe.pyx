# cython: language_level=3
"""Gemma 4's feed-forward block (26B-A4B; llama.cpp's gemma4 graph, transformers' Gemma4TextDecoderLayer):
    mlp = post_ffw_norm_1(gated_ffn(ffn_norm(x)))
    moe = post_ffw_norm_2(experts(pre_ffw_norm_2(x)))   routed by rmsnorm(x) / sqrt(n_embd) * gate_inp.scale
    out = mlp + moe        (the layer loop then applies post_ffw_norm and adds out to x)
The router: softmax over every expert, the top k renormalised over those k, each then scaled by its expert's
output scale (ffn_down_exps.scale)."""

from libc.math cimport sqrtf

from llamacy.kernels.ops cimport add_inplace, rmsnorm, scale_inplace
from llamacy.model.ffn cimport dense_ffn
from llamacy.model.layout cimport LayerT, Scratch
from llamacy.model.moe cimport MoeJob, moe_experts
from llamacy.model.products cimport P_ELEM, P_MOE, Products, lap


cdef void dense_moe_ffn(Products* pr, MoeJob* M, const LayerT* L, const Scratch* s, Py_ssize_t n_embd,
                        Py_ssize_t n, int nthreads) noexcept nogil:
    cdef Py_ssize_t E = n_embd, t, i
    cdef float eps = M.hp.rms_eps, inv = 1.0 / sqrtf(<float>E)
    cdef float* mlp = M.b1
    cdef float* rin = M.b2
    cdef float* xn2 = M.b3
    dense_ffn(pr, L, s, E, n, nthreads)
    for t in range(n):
        rmsnorm(s.o + t * E, L.post_ffn_norm_1, mlp + t * E, E, eps)
        rmsnorm(s.x + t * E, NULL, rin + t * E, E, eps)
        scale_inplace(rin + t * E, inv, E)
        for i in range(E):
            rin[t * E + i] *= L.gate_inp_scale[i]
        rmsnorm(s.x + t * E, L.pre_ffn_norm_2, xn2 + t * E, E, eps)
    lap(pr, P_ELEM)
    moe_experts(M, pr.rj, L, rin, xn2, s.aq, s.o, n, nthreads)
    lap(pr, P_MOE)
    for t in range(n):
        rmsnorm(s.o + t * E, L.post_ffn_norm_2, s.o + t * E, E, eps)
        add_inplace(s.o + t * E, mlp + t * E, E)
