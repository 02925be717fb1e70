"""Which type each tensor gets: the target types and llama-quantize's per-tensor rules.

A target (`--type`) is a llama.cpp file type (general.file_type) and its default tensor type. As in
llama-quantize (llama-quant.cpp: tensor_allows_quantization, llama_tensor_get_type_impl,
tensor_type_fallback), a tensor is quantized only if it is a 2-D+ "*weight" that is not a norm; the others
keep their type (F32 from a Hugging Face checkpoint). For quantized targets the file type's mixture rules
then move some tensors to more bits:

- output.weight, and token_embd.weight when the head is tied to it: Q6_K (kept at Q8_0 for q8_0; Q8_0 when
  its rows are not a whole number of the default type's blocks);
- attn_v.weight / ffn_down.weight on the "use_more_bits" layers (the first and last eighth of the layers
  and every third one between): Q6_K for q4_k_m and q5_k_m; other per-type tweaks for q2_k, q3_k_*, q4_k_s.
  The layers are counted as llama-quantize counts them: attn_v's among the attn_v-like tensors (attn_v,
  and, since llama.cpp's category refactor (#19770), the fused attn_qkv and MLA's attn_kv_b, which also
  take attn_v's rules: the delta-net layers' attn_qkv of qwen3next / qwen35), ffn_down's among the file's
  block_count layers (n_layer_all: multi-token-prediction blocks included, ModelFacts.n_layer);
- then, whatever was chosen, a row length that is not a multiple of the type's block size falls back:
  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0, and to F16 if even that does not fit.

Mixture-of-experts models: the router (ffn_gate_inp) is never quantized; the stacked experts
(ffn_*_exps) and shared experts (ffn_*_shexp) fall under the ffn_* rules, with the layer read from the
tensor's name (llama.cpp's layer_info when n_expert > 1); an 8-expert model (Mixtral) gets Q8_0 for
attn_k and attn_v and Q5_K for attn_output in the q2_k, q3_k_s/m and q4_k_s/m mixtures.

`pure` (llama-quantize --pure) skips the mixture rules but keeps the two others. models.md ("Converting")
lists the rules for the users.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from llamacy.ggml_types import BLOCK_LAYOUT, GGMLType
from llamacy.gguf_names import LlamaFileType

T = GGMLType


@dataclass(frozen=True)
class Target:
    name: str
    file_type: LlamaFileType
    default: GGMLType
    help: str


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("f32", LlamaFileType.ALL_F32, T.F32, "32-bit floats, lossless"),
        Target("f16", LlamaFileType.MOSTLY_F16, T.F16, "16-bit floats"),
        Target("bf16", LlamaFileType.MOSTLY_BF16, T.BF16, "bfloat16"),
        Target("q8_0", LlamaFileType.MOSTLY_Q8_0, T.Q8_0, "8.5 bits per weight"),
        Target("q5_1", LlamaFileType.MOSTLY_Q5_1, T.Q5_1, "6 bpw"),
        Target("q5_0", LlamaFileType.MOSTLY_Q5_0, T.Q5_0, "5.5 bpw"),
        Target("q4_1", LlamaFileType.MOSTLY_Q4_1, T.Q4_1, "5 bpw"),
        Target("q4_0", LlamaFileType.MOSTLY_Q4_0, T.Q4_0, "4.5 bpw"),
        Target("q6_k", LlamaFileType.MOSTLY_Q6_K, T.Q6_K, "6.6 bpw"),
        Target("q5_k_m", LlamaFileType.MOSTLY_Q5_K_M, T.Q5_K, "Q5_K, Q6_K on attn_v/ffn_down of some layers"),
        Target("q5_k_s", LlamaFileType.MOSTLY_Q5_K_S, T.Q5_K, "Q5_K"),
        Target("q4_k_m", LlamaFileType.MOSTLY_Q4_K_M, T.Q4_K, "Q4_K, Q6_K on attn_v/ffn_down of some layers"),
        Target(
            "q4_k_s", LlamaFileType.MOSTLY_Q4_K_S, T.Q4_K, "Q4_K, Q5_K on the first layers' attn_v/ffn_down"
        ),
        Target("q3_k_l", LlamaFileType.MOSTLY_Q3_K_L, T.Q3_K, "Q3_K, Q5_K on attn_v/attn_output/ffn_down"),
        Target(
            "q3_k_m", LlamaFileType.MOSTLY_Q3_K_M, T.Q3_K, "Q3_K, Q4_K/Q5_K on attn_v/attn_output/ffn_down"
        ),
        Target("q3_k_s", LlamaFileType.MOSTLY_Q3_K_S, T.Q3_K, "Q3_K"),
        Target("q2_k", LlamaFileType.MOSTLY_Q2_K, T.Q2_K, "Q2_K, Q3_K/Q4_K on attn_v/attn_output/ffn_down"),
    )
}
# llama-quantize's aliases: a bare K-quant name means its _M mixture.
ALIASES = {"q4_k": "q4_k_m", "q5_k": "q5_k_m", "q3_k": "q3_k_m"}


def target(name: str) -> Target:
    """The target named `name` (case-insensitive; q4_k means q4_k_m as in llama-quantize)."""
    key = name.lower()
    key = ALIASES.get(key, key)
    if key not in TARGETS:
        names = ", ".join([*TARGETS, *ALIASES])
        raise KeyError(f"unknown type {name!r}; choose one of: {names}")
    return TARGETS[key]


@dataclass(frozen=True)
class ModelFacts:
    """What the rules look at besides the tensor: the architecture and attention shape."""

    arch: str
    n_layer: int  # every block of the file (block_count, llama.cpp's n_layer_all): MTP blocks included
    n_head: int
    n_head_kv: int
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // max(1, self.n_head_kv)

    @property
    def is_70b(self) -> bool:
        # llama.cpp's LLM_TYPE_70B for these architectures: 80 layers.
        return self.n_layer == 80 and self.arch in ("llama", "qwen2")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order: shape[-1] is the row length (GGUF ne[0])
    keep: int  # the type written when the tensor is not quantized


def allows_quantization(name: str, n_dims: int) -> bool:
    """llama.cpp tensor_allows_quantization, for the tensors of the architectures we convert."""
    if n_dims < 2 or not name.endswith("weight"):
        return False
    # llama-quantize also keeps the (small, 2-D) convolutions of recurrent layers as they are.
    return "_norm.weight" not in name and "ffn_gate_inp.weight" not in name and "ssm_conv1d" not in name


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name == "token_embd.weight":
        return "token_embd"
    # llama-quant.cpp's category_is_attn_v: a fused QKV (and MLA's kv_b) is attn_v-like, counted and typed as
    # attn_v (its own ATTENTION_QKV rule comes after that test in llama_tensor_get_type_impl: never reached).
    if "attn_qkv.weight" in name or "attn_kv_b.weight" in name:
        return "attn_v"
    for cat in ("attn_v.weight", "attn_k.weight", "attn_q.weight", "attn_output.weight"):
        if cat in name:
            return cat.split(".")[0]
    for cat in ("ffn_up", "ffn_gate", "ffn_down"):
        if cat in name:
            return cat
    return "other"


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def _is_quantized(t: int) -> bool:
    return t not in (T.F32, T.F16, T.BF16)


_FALLBACK = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0}


def _fallback(t: int, ncols: int) -> int:
    """tensor_type_fallback: a type whose blocks fit the row length. The legacy 32-value types have no
    fallback in llama.cpp (it refuses the tensor); we use F16 for them, as llama.cpp does when even the
    fallback does not fit."""
    if ncols % BLOCK_LAYOUT[t][0] == 0:
        return t
    t = _FALLBACK.get(t, T.F16)
    return t if ncols % BLOCK_LAYOUT[t][0] == 0 else T.F16


_BLOCK_RE = re.compile(r"blk\.(\d+)\.")


def _layer(name: str) -> int:
    m = _BLOCK_RE.match(name)
    return int(m.group(1)) if m else -1


def choose_types(
    tensors: Sequence[TensorSpec], tgt: Target, facts: ModelFacts, pure: bool = False
) -> list[int]:
    """The GGML type of each tensor in the output file, in the order given."""
    ft = tgt.file_type
    tied = not any(t.name == "output.weight" for t in tensors)
    # llama.cpp walks the tensors sorted by (layer, name) and counts attn_v / ffn_* tensors as it goes:
    # the counters, not the names, give the layer index the rules see.
    order = sorted(range(len(tensors)), key=lambda i: (_layer(tensors[i].name), tensors[i].name))
    counters = {"attn_v": 0, "ffn_down": 0}
    n_attn_v = sum(1 for t in tensors if _category(t.name) == "attn_v")
    result: list[int] = [0] * len(tensors)
    for i in order:
        spec = tensors[i]
        if not allows_quantization(spec.name, len(spec.shape)):
            result[i] = spec.keep
            continue
        new = int(tgt.default)
        if _is_quantized(new):
            cat = _category(spec.name)
            if not pure:
                if facts.n_expert > 1 and cat == "ffn_down":
                    # Experts are not one ffn_down a layer: the layer comes from the name.
                    counters["ffn_down"] = _layer(spec.name)
                new = _mixture_rule(new, cat, spec, ft, facts, tied, counters, n_attn_v)
            if cat in counters:
                counters[cat] += 1
            new = _fallback(new, spec.shape[-1])
        result[i] = new
    return result


def _mixture_rule(
    new: int,
    cat: str,
    spec: TensorSpec,
    ft: LlamaFileType,
    facts: ModelFacts,
    tied: bool,
    counters: dict[str, int],
    n_attn_v: int,
) -> int:
    """llama_tensor_get_type_impl for the file types of TARGETS (no IQ types, no Falcon)."""
    F = LlamaFileType
    if cat == "output" or (tied and cat == "token_embd"):
        if spec.shape[-1] % BLOCK_LAYOUT[new][0] != 0:
            return T.Q8_0
        return new if new == T.Q8_0 else T.Q6_K
    if cat == "attn_v":
        i, n = counters["attn_v"], n_attn_v
        if ft == F.MOSTLY_Q2_K:
            new = T.Q4_K if facts.n_gqa >= 4 else T.Q3_K
        elif ft == F.MOSTLY_Q3_K_M:
            new = T.Q5_K if i < 2 else T.Q4_K
        elif ft == F.MOSTLY_Q3_K_L:
            new = T.Q5_K
        elif ft in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M) and _use_more_bits(i, n):
            new = T.Q6_K
        elif ft == F.MOSTLY_Q4_K_S and i < 4:
            new = T.Q5_K
        if facts.is_70b and new in (T.Q3_K, T.Q4_K):
            new = T.Q5_K
        if facts.n_expert == 8:
            new = T.Q8_0  # llama.cpp: "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
        return new
    if cat == "attn_k":
        return T.Q8_0 if facts.n_expert == 8 else new
    if cat == "ffn_down":
        i, n = counters["ffn_down"], facts.n_layer
        if ft == F.MOSTLY_Q2_K:
            new = T.Q3_K
        elif ft == F.MOSTLY_Q3_K_M:
            new = T.Q5_K if i < n // 16 else T.Q4_K
        elif ft == F.MOSTLY_Q3_K_L:
            new = T.Q5_K
        elif ft in (F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M):
            if _use_more_bits(i, n):
                new = T.Q6_K
        elif ft == F.MOSTLY_Q4_K_S and i < n // 8:
            new = T.Q5_K
        return new
    if cat == "attn_output" and facts.n_expert == 8:
        eight = (F.MOSTLY_Q2_K, F.MOSTLY_Q3_K_S, F.MOSTLY_Q3_K_M, F.MOSTLY_Q4_K_S, F.MOSTLY_Q4_K_M)
        return T.Q5_K if ft in eight else new
    if cat == "attn_output":
        if ft == F.MOSTLY_Q2_K:
            new = T.Q3_K
        elif ft == F.MOSTLY_Q3_K_M:
            new = T.Q4_K
        elif ft == F.MOSTLY_Q3_K_L:
            new = T.Q5_K
        return new
    return new
