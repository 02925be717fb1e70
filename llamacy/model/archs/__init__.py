"""The architectures llamacy runs: one module each, one registry.

To add one, write its module (an `Architecture` subclass: hyper-parameters, tensors, layer recipes,
Hugging Face conversion) and list it here; docs/architecture.md has the recipe.
"""

from __future__ import annotations

from typing import Any

from llamacy.errors import UnsupportedModelError
from llamacy.model.archs.base import Architecture
from llamacy.model.archs.gemma3 import Gemma3
from llamacy.model.archs.gemma4 import Gemma4
from llamacy.model.archs.llama import Llama
from llamacy.model.archs.nemotron import Nemotron
from llamacy.model.archs.nemotron_h import NemotronH, NemotronHMoe
from llamacy.model.archs.qwen2 import Qwen2
from llamacy.model.archs.qwen2moe import Qwen2Moe
from llamacy.model.archs.qwen3 import Qwen3
from llamacy.model.archs.qwen3moe import Qwen3Moe
from llamacy.model.archs.qwen3next import Qwen3Next, Qwen35, Qwen35Moe
from llamacy.model.config import ModelConfig

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        *(Llama(), Qwen2(), Qwen3(), Qwen2Moe(), Qwen3Moe(), Gemma3(), Gemma4(), Nemotron()),
        *(Qwen3Next(), Qwen35(), Qwen35Moe()),
        *(NemotronH(), NemotronHMoe()),
    )
}


def architecture(md: dict[str, Any], source: str) -> Architecture:
    """The architecture a file's metadata names; a one-line error for one llamacy does not run."""
    arch = md.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise UnsupportedModelError(
            f"{source}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[arch]


def config_from_metadata(md: dict[str, Any], source: str) -> ModelConfig:
    return architecture(md, source).config(md, source)
