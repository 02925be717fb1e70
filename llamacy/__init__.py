"""llamacy: a fast CPU inference engine for GGUF language models.

    from llamacy import Llama
    llm = Llama("model.gguf")              # or Llama() for the default model
    for piece in llm.generate("The capital of France is", max_tokens=16, temperature=0):
        print(piece, end="")

Imports are lazy so that `llamacy --help` and the first token come quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["GGUFError", "Llama", "LlamacyError", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from llamacy.engine import Llama
    from llamacy.errors import LlamacyError
    from llamacy.gguf import GGUFError
    from llamacy.sampling import SamplingParams


def __getattr__(name: str):
    if name == "Llama":
        from llamacy.engine import Llama

        return Llama
    if name == "LlamacyError":
        from llamacy.errors import LlamacyError

        return LlamacyError
    if name == "GGUFError":
        from llamacy.gguf import GGUFError

        return GGUFError
    if name == "SamplingParams":
        from llamacy.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'llamacy' has no attribute {name!r}")
