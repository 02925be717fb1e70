"""A Hugging Face checkpoint directory as a conversion source.

config.json names the architecture class; the architecture file that lists the class in its `hf`
(llamacy/model/archs/) says how it converts (convert/hf_spec.py's ArchSpec): the GGUF architecture, the
tensor names, metadata keys and weight transformations that llama.cpp's convert_hf_to_gguf.py uses (Q/K
rows permuted for llama, norms stored as 1 + w for Gemma and Nemotron, …). Here is what all of them
share: reading the checkpoint, checking every tensor's shape against config.json, stacking experts,
Llama 3.1 rope factors, and the common metadata.

Everything the engine could not run the way Hugging Face does (biases where llamacy has none, other RoPE
scalings, other sliding-window patterns or attention scales) is refused with UnsupportedModelError rather
than converted into a file that would compute something else.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFWriter, RopeScalingType, size_label

from llamacy.convert.hf_moe import stacked_tensor
from llamacy.convert.hf_spec import ArchSpec, HFConfig
from llamacy.convert.hf_tokenizer import add_tokenizer
from llamacy.convert.mixtures import ModelFacts
from llamacy.convert.safetensors_io import Checkpoint
from llamacy.convert.source import Source, SourceTensor
from llamacy.errors import UnsupportedModelError, UsageError
from llamacy.ggml_types import GGMLType

# Buffers some checkpoints carry that are not weights.
_IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def hf_architectures() -> dict[str, ArchSpec]:
    """Hugging Face class -> conversion spec, from every architecture file's `hf`."""
    from llamacy.model.archs import ARCHITECTURES

    return {cls: spec for arch in ARCHITECTURES.values() for cls, spec in arch.hf.items()}


def load_config(directory: Path) -> tuple[HFConfig, ArchSpec]:
    path = directory / "config.json"
    if not path.is_file():
        raise UsageError(f"{directory}: no config.json (not a Hugging Face model directory)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read ({e})") from None
    classes = raw.get("architectures") or []
    known = hf_architectures()
    spec = next((known[c] for c in classes if c in known), None)
    if spec is None:
        raise UnsupportedModelError(
            f"{path}: architecture {', '.join(classes) or '(none)'} is not supported "
            f"(supported: {', '.join(known)})"
        )
    if spec.variant is not None:
        spec = spec.variant(raw)
    config = HFConfig(path, spec.config_view(raw))
    spec.check(config)
    return config, spec


class HFSource(Source):
    def __init__(self, directory: Path) -> None:
        self.path = directory
        self.config, self.spec = load_config(directory)
        c = self.config
        ex = self.spec.experts
        self.n_expert = c.positive(ex.count_key) if ex else 0
        self.n_ff_exp = c.positive(ex.width_key) if ex else 0
        if ex and not 1 <= c.positive("num_experts_per_tok") <= self.n_expert:
            raise UsageError(f"{c.path}: num_experts_per_tok must be 1..{self.n_expert}")
        # The per-layer names: the spec's, plus those its config switches on (biases, …).
        self.layer_map = {**self.spec.layer_map, **self.spec.optional_layers(c)}
        self.checkpoint = Checkpoint(directory)
        try:
            # Multi-token-prediction blocks are written as layers after the last one (as llama.cpp's files);
            # llama-quantize's per-layer rules count every block of the file, so the type rules see them too.
            self.n_nextn = self.spec.nextn_blocks(c, [self.spec.rename(n) for n in self.checkpoint])
            self.n_block = c.n_layer + self.n_nextn
            self.facts = ModelFacts(self.spec.arch, self.n_block, c.n_head, c.n_head_kv, self.n_expert)
            self.tied = bool(c.get("tie_word_embeddings", self.spec.tied_default))
            self.tensors = self._tensors()
        except BaseException:
            self.checkpoint.close()
            raise

    # -- tensors ---------------------------------------------------------------------------------------

    def _renamed(self, hf_name: str) -> str:
        """The name a checkpoint tensor converts as: the spec's renames (a multimodal checkpoint's text model,
        the multi-token-prediction blocks as layers after the last one)."""
        return self.spec.nextn_rename(self.config, self.spec.rename(hf_name))

    def _gguf_name(self, hf_name: str) -> str | None:
        """The GGUF name of a checkpoint tensor; None for tensors that are not written."""
        name = self._renamed(hf_name)
        if _IGNORED.search(name) or (name == "lm_head.weight" and self.tied):
            return None
        if name in self.spec.global_map:
            return self.spec.global_map[name]
        m = _LAYER_RE.match(name)
        if m and m.group(2) in self.layer_map:
            layer = int(m.group(1))
            if layer >= self.n_block:
                raise UsageError(f"{self.path}: tensor {hf_name} is past {self._layers_said()}")
            return f"blk.{layer}.{self.layer_map[m.group(2)]}"
        raise UnsupportedModelError(
            f"{self.path}: tensor {name!r} has no place in a GGUF {self.spec.arch} model"
        )

    def _layers_said(self) -> str:
        n = f"num_hidden_layers={self.config.n_layer}"
        return f"{n} and {self.n_nextn} multi-token-prediction blocks" if self.n_nextn else n

    def _hf_name(self, gguf_name: str) -> str:
        """The checkpoint name a GGUF tensor comes from (for messages)."""
        for hf, gguf in self.spec.global_map.items():
            if gguf == gguf_name:
                return hf
        layer, _, suffix = gguf_name.removeprefix("blk.").partition(".")
        if self.spec.experts and suffix.endswith("_exps.weight"):
            name = self.spec.experts.hf_name(int(layer), suffix.removesuffix(".weight"))
        else:
            hf_suffix = next((k for k, v in self.layer_map.items() if v == suffix), suffix)
            name = f"model.layers.{layer}.{hf_suffix}"
        # An MTP block's tensor is said as converted (the checkpoint names it mtp.*): which block it is.
        mtp = int(layer) - self.config.n_layer if layer.isdigit() else -1
        return f"{name} (multi-token-prediction block {mtp})" if mtp >= 0 else name

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config
        q, kv = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        per_layer = {
            "attn_norm.weight": (c.n_embd,),
            "attn_q.weight": (q, c.n_embd),
            "attn_k.weight": (kv, c.n_embd),
            "attn_v.weight": (kv, c.n_embd),
            "attn_output.weight": (c.n_embd, q),
            "attn_q.bias": (q,),
            "attn_k.bias": (kv,),
            "attn_v.bias": (kv,),
            "attn_q_norm.weight": (c.head_dim,),
            "attn_k_norm.weight": (c.head_dim,),
            "post_attention_norm.weight": (c.n_embd,),
            "ffn_norm.weight": (c.n_embd,),
            "post_ffw_norm.weight": (c.n_embd,),
            "ffn_gate.weight": (c.n_ff, c.n_embd),
            "ffn_up.weight": (c.n_ff, c.n_embd),
            "ffn_down.weight": (c.n_embd, c.n_ff),
            "ffn_gate_inp.weight": (self.n_expert, c.n_embd),
            "ffn_gate_exps.weight": (self.n_expert, self.n_ff_exp, c.n_embd),
            "ffn_up_exps.weight": (self.n_expert, self.n_ff_exp, c.n_embd),
            "ffn_down_exps.weight": (self.n_expert, c.n_embd, self.n_ff_exp),
        }
        per_layer.update(self.spec.shapes(c))
        suffixes = list(self.layer_map.values())
        if self.spec.experts:
            suffixes += [f"{stem}.weight" for stem in self.spec.experts.projections.values()]
        # In the order the file gets them: embeddings, layers, head (as llama.cpp's files).
        shapes = {"token_embd.weight": (c.n_vocab, c.n_embd), **self.spec.global_shapes(c)}
        self.optional: set[str] = set()
        for i in range(self.n_block):
            layer = {**per_layer, **self.spec.layer_shapes(c, i)}
            self.optional |= {f"blk.{i}.{s}" for s in self.spec.layer_optional(c, i)}
            for suffix in suffixes:
                if layer[suffix] is not None:
                    shapes[f"blk.{i}.{suffix}"] = layer[suffix]
        shapes["output_norm.weight"] = (c.n_embd,)
        if "output_norm.bias" in self.spec.global_map.values():
            shapes["output_norm.bias"] = per_layer["output_norm.bias"]
        if not self.tied:
            shapes["output.weight"] = (c.n_vocab, c.n_embd)
        return shapes

    def _tensors(self) -> list[SourceTensor]:
        expected = self._expected_shapes()
        found: dict[str, str] = {}  # GGUF name -> checkpoint name
        experts: dict[str, dict[int, str]] = {}  # stacked GGUF name -> expert -> checkpoint name
        skipped: dict[str, int] = {}
        for hf_name in self.checkpoint:
            reason = self.spec.skip(hf_name)
            if reason is not None:
                skipped[reason] = skipped.get(reason, 0) + 1
                continue
            stacked = self._expert_of(hf_name)
            if stacked is not None:
                name, e = stacked
                experts.setdefault(name, {})[e] = hf_name
                continue
            name = self._gguf_name(hf_name)
            if name is None:
                continue
            shape = self.checkpoint.tensors[hf_name].shape
            if name not in expected:
                raise UnsupportedModelError(f"{self.path}: tensor {hf_name!r} has no place in this model")
            if shape != expected[name]:
                raise UsageError(
                    f"{self.path}: {hf_name} has shape {list(shape)}, config.json implies {list(expected[name])}"
                )
            found[name] = hf_name
        for name, by_expert in experts.items():
            self._check_experts(name, by_expert, expected[name])
            found[name] = by_expert[0]
        for reason, count in skipped.items():
            print(f"{self.path}: {reason}: {count} tensors not converted", file=sys.stderr)
        missing = [n for n in expected if n not in found and n not in self.optional]
        if missing:
            raise UsageError(
                f"{self.path}: the checkpoint lacks {len(missing)} tensors (first: {self._hf_name(missing[0])})"
            )
        tensors = []
        for name in expected:
            if name in experts:
                tensors.append(self._stacked(name, experts[name]))
            elif name in found:
                tensors += self._rewritten(name, found[name])
        freqs = self._rope_freqs()
        if freqs is not None:
            tensors.insert(1, _array_tensor("rope_freqs.weight", freqs))
        for name, values in self.spec.extra_tensors(self.config):
            tensors.insert(1, _array_tensor(name, values))
        return tensors

    def _expert_of(self, hf_name: str) -> tuple[str, int] | None:
        """(stacked GGUF name, expert index) of one expert's matrix; None for other tensors."""
        m = _LAYER_RE.match(self._renamed(hf_name))
        ex = self.spec.experts
        e = ex.pattern.match(m.group(2)) if m and ex else None
        if m is None or ex is None or e is None:
            return None
        layer, expert = int(m.group(1)), int(e.group(1))
        if layer >= self.n_block or expert >= self.n_expert:
            raise UsageError(f"{self.path}: tensor {hf_name} is past the model's layers or experts")
        return f"blk.{layer}.{ex.projections[e.group(2)]}.weight", expert

    def _check_experts(self, name: str, by_expert: dict[int, str], shape: tuple[int, ...]) -> None:
        layer = int(name.split(".")[1])
        stem = name.split(".")[2]
        for e in range(self.n_expert):
            if e not in by_expert:
                raise UsageError(
                    f"{self.path}: the checkpoint lacks {self.spec.experts.hf_name(layer, stem, e)}"
                )
            got = self.checkpoint.tensors[by_expert[e]].shape
            if got != shape[1:]:
                raise UsageError(
                    f"{self.path}: {by_expert[e]} has shape {list(got)}, config.json implies {list(shape[1:])}"
                )

    def _stacked(self, name: str, by_expert: dict[int, str]) -> SourceTensor:
        first = self._tensor(name, by_expert[0])
        shape = (self.n_expert, *first.shape)
        return stacked_tensor(
            name, shape, first.type, lambda e, rows: self.checkpoint.read(by_expert[e], rows)
        )

    def _rewritten(self, name: str, hf_name: str) -> list[SourceTensor]:
        """The tensor as read, or what the spec's rewrite makes of it (each computed from the whole
        checkpoint tensor when its rows are first read, kept for the rows that follow)."""
        shape = self.checkpoint.tensors[hf_name].shape
        plan = self.spec.rewrite(self.config, name, shape)
        if plan is None:
            return [self._tensor(name, hf_name)]
        cache: dict[str, np.ndarray] = {}

        def source(
            out: str, out_shape: tuple[int, ...], fn: Callable[[np.ndarray], np.ndarray]
        ) -> SourceTensor:
            def read_rows(start: int, stop: int) -> np.ndarray:
                if out not in cache:
                    w = self.checkpoint.read(hf_name).astype(np.float32, copy=False).reshape(shape)
                    cache.clear()  # one tensor's outputs at a time: the writer reads them in order
                    cache[out] = np.ascontiguousarray(fn(w), dtype=np.float32).reshape(-1, out_shape[-1])
                return cache[out][start:stop]

            return SourceTensor(out, out_shape, int(GGMLType.F32), read_rows)

        return [source(out, out_shape, fn) for out, out_shape, fn in plan]

    def _tensor(self, name: str, hf_name: str) -> SourceTensor:
        ct = self.checkpoint.tensors[hf_name]
        shape = ct.shape
        src_type = {"F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16}.get(
            ct.dtype, GGMLType.F32
        )
        c = self.config
        transform: Callable[[np.ndarray], np.ndarray] | None = None
        if self.spec.permute_qk and name.endswith(("attn_q.weight", "attn_k.weight")):
            n_head = c.n_head if name.endswith("attn_q.weight") else c.n_head_kv
            transform = lambda w, n_head=n_head: permute_qk(w, n_head)  # noqa: E731
        elif self.spec.norm_plus_one and hf_name.endswith("norm.weight"):
            transform = lambda w: w + np.float32(1.0)  # noqa: E731

        def read_rows(start: int, stop: int) -> np.ndarray:
            if transform is None and len(shape) > 2:
                # A stacked 3-D tensor (Gemma 4's experts): rows start..stop of its [-1, cols] view, read
                # from the slabs of its first axis that hold them.
                per = math.prod(shape[1:-1])
                first, last = start // per, -(-stop // per)
                slab = self.checkpoint.read(hf_name, slice(first, last)).reshape(-1, shape[-1])
                return slab[start - first * per : stop - first * per]
            if transform is None and len(shape) > 1:
                return self.checkpoint.read(hf_name, slice(start, stop))
            # A 1-D tensor is one row; the Q/K permutation moves rows: read those whole.
            w = self.checkpoint.read(hf_name).reshape(-1, shape[-1])
            return (transform(w) if transform is not None else w)[start:stop]

        if name.endswith("ffn_gate_inp_shexp.weight"):
            shape = shape[1:]  # llama.cpp reads it as an n_embd vector
        return SourceTensor(name, shape, int(src_type), read_rows)

    def _rope_freqs(self) -> np.ndarray | None:
        """Llama 3.1-style RoPE scaling as per-dimension frequency divisors (convert_hf_to_gguf's
        LlamaModel.generate_extra_tensors)."""
        if not self.spec.permute_qk or self.config.rope_type != "llama3":
            return None
        theta, scaling = self.config.rope()
        base = float(theta or self.spec.rope_theta_default)
        dim = self.config.head_dim
        freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
        factor = float(scaling.get("factor", 8.0))
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        factors = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                factors.append(1.0)
            elif wavelen > low_wavelen:
                factors.append(factor)
            else:
                smooth = (old_ctx / wavelen - low) / (high - low)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        return np.array(factors, dtype=np.float32)

    @property
    def size_on_disk(self) -> int:
        return sum(f.stat().st_size for f in {t.file for t in self.checkpoint.tensors.values()})

    def keep_type(self, tensor: SourceTensor) -> int:
        return int(GGMLType.F32)  # convert_hf_to_gguf writes 1-D tensors and norms as F32

    # -- metadata --------------------------------------------------------------------------------------

    def add_metadata(self, w: GGUFWriter, file_type: int) -> None:
        c, arch = self.config, self.spec.arch
        n_params = sum(t.n_elements for t in self.tensors)
        w.add_type("model")
        w.add_name(str(c.get("_name_or_path") or self.path.name).rstrip("/").split("/")[-1])
        w.add_size_label(size_label(n_params, 0, 0, 0))
        if self.spec.vocab_size_key:
            w.add_vocab_size(c.n_vocab)
        w.add_context_length(c.positive("max_position_embeddings", self.spec.context_default))
        w.add_embedding_length(c.n_embd)
        w.add_block_count(self.n_block)
        ov = self.spec.overrides(c)
        w.add_feed_forward_length(ov.get("feed_forward_length", c.n_ff))
        w.add_head_count(c.n_head)
        w.add_head_count_kv(ov.get("head_count_kv", c.n_head_kv))
        theta, scaling = c.rope()
        w.add_rope_freq_base(float(theta or self.spec.rope_theta_default))
        w.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
        if self.spec.rope_dims is not None:
            w.add_rope_dimension_count(self.spec.rope_dims(c))
        if "key_length" in ov or "head_dim" in c.raw or self.spec.key_length:
            w.add_key_length(ov.get("key_length", c.head_dim))
            w.add_value_length(ov.get("key_length", c.head_dim))
        if self.n_expert:
            w.add_expert_count(self.n_expert)
            w.add_expert_used_count(c.positive("num_experts_per_tok"))
            if self.spec.experts.width_key != "intermediate_size":  # Mixtral's are feed_forward_length wide
                w.add_expert_feed_forward_length(self.n_ff_exp)
        if c.rope_type == "linear":
            w.add_rope_scaling_type(RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(float(scaling["factor"]))
        self.spec.metadata(w, c)
        if self.n_nextn:
            w.add_nextn_predict_layers(self.n_nextn)
        w.add_file_type(file_type)
        w.add_quantization_version(GGML_QUANT_VERSION)
        add_tokenizer(w, self.path, arch, c.n_vocab)
        self.spec.tokenizer(w, c)

    def close(self) -> None:
        self.checkpoint.close()


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: within each head, rows (0..d/2, d/2..d) interleaved so that
    rotating adjacent pairs equals Hugging Face's rotate_half on the original rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _array_tensor(name: str, values: np.ndarray) -> SourceTensor:
    data = np.ascontiguousarray(values, dtype=np.float32)
    return SourceTensor(name, data.shape, int(GGMLType.F32), lambda a, b: data.reshape(1, -1)[a:b])
