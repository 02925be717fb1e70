"""`llamacy convert`: Hugging Face checkpoints and GGUF files into a GGUF file of the type you want.

    from llamacy.convert import convert
    summary = convert("path/to/hf-model-dir", "model-q4_k_m.gguf", "q4_k_m")

Modules: pipeline (the loop), hf + hf_tokenizer + safetensors_io (Hugging Face sources), gguf_requant (GGUF
sources), mixtures (target types and per-tensor rules), writer (temporary file, renamed when complete). The
quantization itself is llamacy.kernels.quantize (Cython, ggml's reference quantizers).
"""

from llamacy.convert.mixtures import ALIASES, TARGETS, Target, target
from llamacy.convert.pipeline import Summary, convert

__all__ = ["ALIASES", "TARGETS", "Summary", "Target", "convert", "target"]
