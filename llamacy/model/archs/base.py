"""What an architecture file declares, and the shared builders it composes.

An architecture is one module under llamacy/model/archs/ holding one `Architecture` subclass:
- `config(metadata, source)`: its hyper-parameters as a ModelConfig, with a recipe per layer
  (`LayerSpec`: which mixer, which feed-forward, which norm, which memory);
- `layer_tensors(cfg, il)` / `model_tensors(cfg)`: every tensor it reads, as `TensorSpec`s naming the
  field the layer loop binds it to, its GGUF name (from the `gguf` package's own table, never a literal),
  its shape and whether it may be absent;
- `hf`: the Hugging Face classes it converts from (convert/hf.py's `ArchSpec`s), or none.

The builders below are the pieces architectures share (an attention block's tensors, a gated FFN's, a
mixture's), as llama.cpp's model files compose shared graph builders.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from llamacy.gguf_names import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
from llamacy.gguf_names import MODEL_TENSOR as T

if TYPE_CHECKING:
    from llamacy.convert.hf_spec import ArchSpec
    from llamacy.model.config import ModelConfig

MATRIX, VECTOR, EXPERTS = "matrix", "vector", "experts"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One tensor an architecture reads: bound to `field` of the layer loop's record (layout.pxd's LayerT,
    or the model-level fields), found in the file as `name`, with `shape` as [rows, cols] for a matrix,
    [n] for a vector, [n_expert, rows, cols] for stacked experts."""

    field: str
    name: str
    kind: str
    shape: tuple[int, ...]
    optional: bool = False
    tensor: T | None = None  # the gguf table's entry the name came from (checked against the arch's list)


def tensor_name(tensor: T, il: int | None = None, suffix: str = "weight") -> str:
    """The GGUF name of a tensor as the gguf package's table spells it (`blk.{il}.attn_q.weight`)."""
    base = TENSOR_NAMES[tensor]
    base = base.format(bid=il) if il is not None else base
    return f"{base}.{suffix}" if suffix else base  # suffix "": a bare name (blk.N.ssm_a)


def mat(field: str, tensor: T, il: int | None, rows: int, cols: int, optional: bool = False) -> TensorSpec:
    return TensorSpec(field, tensor_name(tensor, il), MATRIX, (rows, cols), optional, tensor)


def vec(
    field: str, tensor: T, il: int | None, n: int, optional: bool = False, suffix: str = "weight"
) -> TensorSpec:
    return TensorSpec(field, tensor_name(tensor, il, suffix), VECTOR, (n,), optional, tensor)


def vec2d(field: str, tensor: T, il: int, rows: int, cols: int) -> TensorSpec:
    """A 2-D float tensor read as one flat vector of rows * cols values (ssm_conv1d [channels, kernel])."""
    return TensorSpec(field, tensor_name(tensor, il), VECTOR, (rows, cols), False, tensor)


def experts(field: str, tensor: T, il: int, n_expert: int, rows: int, cols: int) -> TensorSpec:
    return TensorSpec(field, tensor_name(tensor, il), EXPERTS, (n_expert, rows, cols), False, tensor)


# -- shared builders ----------------------------------------------------------------------------------


def attention_tensors(
    cfg: ModelConfig,
    il: int,
    bias: bool = False,
    qk_norm: bool = False,
    out_bias: bool = False,
    optional_bias: bool = False,
) -> list[TensorSpec]:
    """Q/K/V/O projections of an attention mixer (with q/k/v biases, an output bias, per-head q/k norms).
    optional_bias: the biases are read where the file has them."""
    E, HD = cfg.n_embd, cfg.head_dim
    QW, KVW = cfg.n_head * HD, cfg.kv_width
    specs = [
        mat("wq", T.ATTN_Q, il, QW, E),
        mat("wk", T.ATTN_K, il, KVW, E),
        mat("wv", T.ATTN_V, il, KVW, E),
        mat("wo", T.ATTN_OUT, il, E, QW),
    ]
    if bias:
        specs += [
            vec("bq", T.ATTN_Q, il, QW, optional_bias, suffix="bias"),
            vec("bk", T.ATTN_K, il, KVW, optional_bias, suffix="bias"),
            vec("bv", T.ATTN_V, il, KVW, optional_bias, suffix="bias"),
        ]
    if out_bias:
        specs.append(vec("bo", T.ATTN_OUT, il, E, optional_bias, suffix="bias"))
    if qk_norm:
        specs += [vec("q_norm", T.ATTN_Q_NORM, il, HD), vec("k_norm", T.ATTN_K_NORM, il, HD)]
    return specs


def norm_tensors(field: str, tensor: T, il: int | None, n: int, with_bias: bool) -> list[TensorSpec]:
    """A norm's weight, and its bias for LayerNorm (field + "_b")."""
    specs = [vec(field, tensor, il, n)]
    if with_bias:
        specs.append(vec(field + "_b", tensor, il, n, suffix="bias"))
    return specs


def gated_ffn_tensors(cfg: ModelConfig, il: int) -> list[TensorSpec]:
    E, F = cfg.n_embd, cfg.n_ff
    return [
        mat("gate", T.FFN_GATE, il, F, E),
        mat("up", T.FFN_UP, il, F, E),
        mat("down", T.FFN_DOWN, il, E, F),
    ]


def ungated_ffn_tensors(cfg: ModelConfig, il: int, optional_bias: bool = False) -> list[TensorSpec]:
    """up and down; with optional_bias, their biases where the file has them."""
    E, F = cfg.n_embd, cfg.n_ff
    specs = [mat("up", T.FFN_UP, il, F, E), mat("down", T.FFN_DOWN, il, E, F)]
    if optional_bias:
        specs += [
            vec("up_b", T.FFN_UP, il, F, True, suffix="bias"),
            vec("down_b", T.FFN_DOWN, il, E, True, suffix="bias"),
        ]
    return specs


def moe_tensors(cfg: ModelConfig, il: int) -> list[TensorSpec]:
    """A router and stacked experts; a shared expert and its sigmoid gate when n_ff_shexp > 0."""
    E, NE, FE, FS = cfg.n_embd, cfg.n_expert, cfg.n_ff_exp, cfg.n_ff_shexp
    specs = [
        mat("gate_inp", T.FFN_GATE_INP, il, NE, E),
        experts("gate_exps", T.FFN_GATE_EXP, il, NE, FE, E),
        experts("up_exps", T.FFN_UP_EXP, il, NE, FE, E),
        experts("down_exps", T.FFN_DOWN_EXP, il, NE, E, FE),
    ]
    if FS:
        specs += [
            mat("gate_shexp", T.FFN_GATE_SHEXP, il, FS, E),
            mat("up_shexp", T.FFN_UP_SHEXP, il, FS, E),
            mat("down_shexp", T.FFN_DOWN_SHEXP, il, E, FS),
            vec("gate_inp_shexp", T.FFN_GATE_INP_SHEXP, il, E),
        ]
    return specs


def output_tensors(cfg: ModelConfig, norm_bias: bool = False) -> list[TensorSpec]:
    """Embeddings, final norm, output head (absent: tied to the embeddings), Llama 3.1 rope factors."""
    E, V = cfg.n_embd, cfg.n_vocab
    return [
        mat("token_embd", T.TOKEN_EMBD, None, V, E),
        mat("output", T.OUTPUT, None, V, E, optional=True),
        *norm_tensors("output_norm", T.OUTPUT_NORM, None, E, norm_bias),
        vec("rope_freqs", T.ROPE_FREQS, None, cfg.n_rot // 2, optional=True),
    ]


class Architecture:
    """One architecture: subclasses set `name` (GGUF general.architecture) and implement `config` and
    `layer_tensors`; `hf` lists the Hugging Face classes converted to it."""

    name: ClassVar[str]
    hf: ClassVar[dict[str, ArchSpec]] = {}
    output_norm_bias: ClassVar[bool] = False  # a LayerNorm at the end (with bias)

    def config(self, md: dict[str, Any], source: str) -> ModelConfig:
        raise NotImplementedError

    def layer_tensors(self, cfg: ModelConfig, il: int) -> list[TensorSpec]:
        raise NotImplementedError

    def model_tensors(self, cfg: ModelConfig) -> list[TensorSpec]:
        # Llama 3.1-style rope factors only where the gguf table gives the architecture that tensor.
        specs = output_tensors(cfg, self.output_norm_bias)
        return [s for s in specs if s.tensor != T.ROPE_FREQS or T.ROPE_FREQS in self.gguf_tensors]

    def ignored_prefixes(self, cfg: ModelConfig) -> tuple[str, ...]:
        """Name prefixes of tensors the file holds but the model does not run, so not bound: the
        multi-token-prediction blocks after the last layer (cfg.n_nextn; llama.cpp's converter writes them
        and counts them in block_count). Anything else unread stays an error (weights.py)."""
        return tuple(f"blk.{il}." for il in range(cfg.n_layer, cfg.n_layer + cfg.n_nextn))

    @property
    def gguf_tensors(self) -> list[T]:
        """The tensors the gguf package lists for this architecture: every spec must be one of them."""
        return MODEL_TENSORS[MODEL_ARCH[self.name.upper()]]
