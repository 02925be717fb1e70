"""`llamacy convert`: Hugging Face checkpoints and GGUF files into a GGUF file of the type you want.

    from llamacy.convert import convert
    summary = convert("path/to/hf-model-dir", "model-q4_k_m.gguf", "q4_k_m")

Modules: pipeline (the loop), hf + hf_tokenizer + safetensors_io (Hugging Face sources), gguf_requant (GGUF
sources), mixtures (target types and per-tensor rules), writer (temporary file, renamed when complete). The
quantization itself is llamacy.kernels.quantize (Cython, ggml's reference quantizers).
"""

from __future__ import annotations

from typing import Any

from llamacy.convert.mixtures import ALIASES, TARGETS, Target, target


def __getattr__(name: str) -> Any:
    # The pipeline imports the whole gguf package; the architecture tables import llamacy.convert.hf_spec at
    # every start, so the pipeline loads only when `convert` is asked for.
    if name in ("Summary", "convert"):
        from llamacy.convert import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ALIASES", "TARGETS", "Summary", "Target", "convert", "target"]
