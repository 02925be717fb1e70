"""Bind a GGUF file's tensors to the layer loop: find each tensor its architecture declares (archs/), check
its shape and type, and hand the layer loop typed records (Matrix, vectors, ModelWeights) under the field
names it reads (binding.pyx maps each onto the C record, and refuses a name it does not know).

Weights stay in the memory-mapped file; only the small norm and bias vectors are copied (to float32).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from llamacy.errors import UnsupportedModelError
from llamacy.ggml_types import BLOCK_LAYOUT, COMPUTE_TYPES, GGMLType, type_name
from llamacy.model.archs.base import EXPERTS, MATRIX, TensorSpec
from llamacy.model.config import LayerSpec, ModelConfig

Vector = np.ndarray  # float32, contiguous

# Fields read a row at a time (dequantize_row: token embeddings), never through a product: never repacked.
ROW_READ_FIELDS = frozenset({"token_embd", "per_layer_token_embd"})


@dataclass(frozen=True, slots=True)
class Matrix:
    """`rows` stored rows of `cols` values of GGML type `type`, in place in the file's mapping, or
    repacked at load (layout: repack.py's LAYOUT_*, 0 for the file's own)."""

    data: Any  # a uint8 buffer of at least rows * row_bytes bytes
    type: int
    rows: int
    cols: int
    row_bytes: int
    layout: int = 0


@dataclass(frozen=True, slots=True)
class ModelWeights:
    """Every tensor an architecture declares, bound: model-level fields (token_embd, output, output_norm,
    rope_freqs …) and, per layer, its fields (wq, attn_norm …) with its recipe. A field the architecture
    declares optional and the file lacks is None; `output` is token_embd itself when the head is tied."""

    fields: dict[str, Matrix | Vector | None]
    layers: list[dict[str, Matrix | Vector | None]]
    specs: list[LayerSpec]
    # The matrices bound as stored that are to be repacked between evaluations (bind(defer=True)).
    deferred: Any = None


class WeightBinder:
    """Binds the tensors an architecture declares (archs/): each found by its GGUF name, its shape and
    type checked; a required one missing, or a tensor in the file that no declaration reads (which the
    engine would silently ignore), is a one-line error naming it."""

    def __init__(
        self, gguf: Any, cfg: ModelConfig, repack: bool | None = None, threads: int | None = None
    ) -> None:
        """repack: rewrite the matrices whose kernels read another layout faster (repack.py); None: where
        this CPU has such kernels and LLAMACY_REPACK is not 0. threads: for that (None: all cores)."""
        self.gguf = gguf
        self.tensors = gguf.tensors
        self.cfg = cfg
        self.source = str(gguf.path)
        self.repack = repack
        self.threads = threads
        self._file: tuple | None = None  # the file's identity, for sharing repacked matrices (bind)
        self._to_repack: list[tuple[dict, str, str]] = []  # (fields, field, tensor name), for bind's end
        self._idle: set[str] = set()  # the tensors among them whose deferred packing waits for idle time

    def _tensor(self, name: str, optional: bool = False) -> Any:
        t = self.tensors.get(name)
        if t is None and not optional:
            raise UnsupportedModelError(f"{self.source}: tensor {name} is missing")
        return t

    def matrix(self, name: str, rows: int, cols: int, optional: bool = False) -> Matrix | None:
        t = self._tensor(name, optional)
        if t is None:
            return None
        if tuple(t.shape) != (rows, cols):
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has shape {t.shape}, expected {(rows, cols)}"
            )
        return self._as_matrix(name, t, rows, cols)

    def _as_matrix(self, name: str, t: Any, rows: int, cols: int) -> Matrix:
        if t.type not in COMPUTE_TYPES:
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has type {type_name(t.type)}, which llamacy cannot compute with yet"
            )
        return Matrix(t.data, int(t.type), rows, cols, t.n_bytes // rows)

    def experts(self, name: str, rows: int, cols: int, optional: bool = False) -> Matrix | None:
        """A 3-D [n_expert, rows, cols] tensor as one matrix of n_expert * rows rows."""
        n = self.cfg.n_expert
        t = self._tensor(name, optional)
        if t is None:
            return None
        if tuple(t.shape) != (n, rows, cols):
            raise UnsupportedModelError(
                f"{self.source}: tensor {name} has shape {t.shape}, expected {(n, rows, cols)}"
            )
        flat = _Flat(t.data, t.type, (n * rows, cols), t.n_bytes)
        return self._as_matrix(name, flat, n * rows, cols)

    def vector(
        self, name: str, n: int, optional: bool = False, shape: tuple[int, ...] | None = None
    ) -> np.ndarray | None:
        """A float vector of n values; shape: the 2-D shape a tensor read flat must have (ssm_conv1d)."""
        t = self._tensor(name, optional)
        if t is None:
            return None
        # A [1, n] matrix is a vector (qwen2moe's shared-expert gate), as is a declared 2-D shape.
        if tuple(t.shape) in ((1, n), shape):
            t = _Flat(t.data, t.type, (n,), t.n_bytes)
        elif shape is not None:
            raise UnsupportedModelError(f"{self.source}: tensor {name} has shape {t.shape}, expected {shape}")
        if tuple(t.shape) != (n,):
            raise UnsupportedModelError(f"{self.source}: tensor {name} has shape {t.shape}, expected {(n,)}")
        if t.type == GGMLType.F32:
            return np.frombuffer(t.data, dtype=np.float32).copy()
        if t.type == GGMLType.F16:
            return np.frombuffer(t.data, dtype=np.float16).astype(np.float32)
        if t.type == GGMLType.BF16:
            raw = np.frombuffer(t.data, dtype=np.uint16).astype(np.uint32) << 16
            return raw.view(np.float32).copy()
        if t.type in COMPUTE_TYPES and n % BLOCK_LAYOUT[t.type][0] == 0:
            # A quantized vector: llama-quantize quantizes a [1, n] tensor such as ffn_gate_inp_shexp.
            from llamacy.kernels.quantize import dequantize

            return dequantize(int(t.type), t.data, (n,), 1).reshape(n)
        raise UnsupportedModelError(f"{self.source}: vector {name} has unsupported type {type_name(t.type)}")

    def bind(self, defer: bool = False) -> ModelWeights:
        """defer: where matrices are to be repacked, bind them as stored and leave the repacking to
        ModelWeights.deferred (repack.py's DeferredRepack), which evaluations advance."""
        from llamacy.model.archs import ARCHITECTURES

        self._repack_setting()
        c = self.cfg
        arch = ARCHITECTURES[c.arch]
        used: set[str] = set()
        model_specs = arch.model_tensors(c)
        fields = self._bind_all(model_specs, used, defer)
        if fields.get("output") is None:
            fields["output"] = fields["token_embd"]  # tied embeddings
            if self.repack and isinstance(fields["output"], Matrix):
                # the head's products read tiles; the embedding's rows stay in the file's layout (row reads)
                name = next(spec.name for spec in model_specs if spec.field == "token_embd")
                self._to_repack.append((fields, "output", name))
        layers = [self._bind_all(arch.layer_tensors(c, il), used, defer) for il in range(c.n_layer)]
        deferred = None
        if self._to_repack and defer:
            deferred = self._deferred(fields)
        elif self._to_repack:
            self._repack_all()
        ignored = arch.ignored_prefixes(c)
        unread = sorted(n for n in set(self.tensors) - used if not (ignored and n.startswith(ignored)))
        if unread:
            raise UnsupportedModelError(
                f"{self.source}: tensor {unread[0]} is not part of a {c.arch} model as llamacy runs it"
                + (f" (and {len(unread) - 1} more)" if len(unread) > 1 else "")
            )
        return ModelWeights(fields, layers, c.layers, deferred)

    def _repack_setting(self) -> None:
        """Settle whether matrices are repacked (None: where this CPU has such kernels and LLAMACY_REPACK
        is not 0) and, if so, the file's identity that repacked matrices are shared under."""
        from llamacy.model.repack import repack_enabled

        if self.repack is None:
            self.repack = repack_enabled()
        if self.repack:
            self._file = _file_identity(self.source)

    def bind_block(
        self, model_specs: list[TensorSpec], layer_specs: list[TensorSpec]
    ) -> tuple[dict[str, Matrix | Vector | None], dict[str, Matrix | Vector | None]]:
        """A block bound apart from the model (a multi-token-prediction block, model/mtp.py): its
        model-level fields and its layer's, each found and checked, and repacked now where the model's
        matrices would be (the block is one layer: no deferring)."""
        self._repack_setting()
        used: set[str] = set()
        fields = self._bind_all(model_specs, used, False)
        layer = self._bind_all(layer_specs, used, False)
        if self._to_repack:
            self._repack_all()
        return fields, layer

    def _bind_all(
        self, specs: list[TensorSpec], used: set[str], defer: bool
    ) -> dict[str, Matrix | Vector | None]:
        out: dict[str, Matrix | Vector | None] = {}
        for spec in specs:
            if spec.field in out:
                raise ValueError(f"{self.cfg.arch}: field {spec.field} declared twice")
            out[spec.field] = self._bind(spec)
            used.add(spec.name)
            if self.repack and out[spec.field] is not None and self._repackable(spec):
                self._to_repack.append((out, spec.field, spec.name))
                if spec.kind == EXPERTS and defer:
                    # Deferred, a stack (a layer's experts, ~100 MB in a 30B MoE) waits for idle time: each
                    # evaluation packs at least one matrix, and a stack takes longer than a MoE decode step.
                    self._idle.add(spec.name)
        return out

    def _repackable(self, spec: TensorSpec) -> bool:
        """Whether a bound tensor goes into tiles: a product's matrix, and an expert stack where
        repack.experts_repackable allows."""
        if spec.field in ROW_READ_FIELDS:
            return False
        if spec.kind == MATRIX:
            return True
        if spec.kind == EXPERTS:
            from llamacy.model.repack import experts_repackable

            return experts_repackable(spec.shape[1])
        return False

    def _requests(self) -> list[tuple]:
        """repack_matrices' request for each matrix in self._to_repack, in its order."""
        release = bool(getattr(self.gguf, "releasable", False))
        requests = []
        for out, field, name in self._to_repack:
            m = out[field]
            requests.append((m.type, m.rows, m.cols, m.data, self._source_key(self.tensors[name]), release))
        return requests

    def _deferred(self, model_fields: dict) -> Any:
        """The matrices to repack, handed to a DeferredRepack: the layers' in order, then the model's own
        (the output head, the largest, last: a load that packs until its tokenizer is ready stops at the
        end of the matrix in hand), then the expert stacks, which wait for idle time."""
        from llamacy.model import default_threads
        from llamacy.model.repack import DeferredRepack

        entries = [
            (name in self._idle, (out, field, request))
            for (out, field, name), request in zip(self._to_repack, self._requests(), strict=True)
        ]
        # Stable: the layers keep their order; the expert stacks, for idle time, come last.
        entries.sort(key=lambda entry: (entry[0], entry[1][0] is model_fields))
        self._to_repack = []
        idle = sum(is_idle for is_idle, _ in entries)
        return DeferredRepack([entry for _, entry in entries], self.threads or default_threads(), idle=idle)

    def _repack_all(self) -> None:
        """Every matrix a product reads into the layout its kernel reads fastest (repack.py), in one pass;
        the file pages each replaced are given back."""
        from llamacy.model import default_threads
        from llamacy.model.repack import repack_matrices

        requests = self._requests()
        todo, self._to_repack = self._to_repack, []
        made = repack_matrices(requests, self.threads or default_threads())
        for (out, field, _), got in zip(todo, made, strict=True):
            if got is not None:
                out[field] = replace(out[field], data=got[0], layout=got[1])

    def _source_key(self, t: Any) -> tuple | None:
        """Where tensor t's bytes come from (file, size, mtime, part, offset); None if that is unknown."""
        offset = getattr(t, "offset", None)
        if self._file is None or offset is None:
            return None
        return (*self._file, getattr(t, "part", 0), offset)

    def _bind(self, spec: TensorSpec) -> Matrix | Vector | None:
        if spec.kind == MATRIX:
            return self.matrix(spec.name, *spec.shape, optional=spec.optional)
        if spec.kind == EXPERTS:
            return self.experts(spec.name, spec.shape[1], spec.shape[2], optional=spec.optional)
        if len(spec.shape) == 2:
            return self.vector(spec.name, spec.shape[0] * spec.shape[1], spec.optional, spec.shape)
        return self.vector(spec.name, spec.shape[0], optional=spec.optional)


def decode_weight_bytes(tensors: dict[str, Any], skip: tuple[str, ...] = ()) -> int:
    """Weight bytes one decode step reads: every tensor once, except an untied token embedding, of which it
    reads one row (with a tied one the output head reads all of it). skip: name prefixes of tensors the
    step does not run (a file's multi-token-prediction blocks)."""
    total = 0
    for name, t in tensors.items():
        if skip and name.startswith(skip):
            continue
        if name == "token_embd.weight" and "output.weight" in tensors:
            total += t.n_bytes // (t.n_elements // t.shape[-1])  # one row
        else:
            total += t.n_bytes
    return total


def _file_identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class _Flat:
    """A tensor seen with another shape of the same rows (3-D experts as 2-D, [1, n] as [n])."""

    data: Any
    type: int
    shape: tuple[int, ...]
    n_bytes: int
