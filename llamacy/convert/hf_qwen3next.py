"""Hugging Face Qwen3-Next / Qwen3.5 checkpoints -> qwen3next / qwen35 / qwen35moe GGUF (not yet)."""

from __future__ import annotations

from llamacy.convert.hf_spec import ArchSpec

QWEN3NEXT_HF: dict[str, ArchSpec] = {}
QWEN35_HF: dict[str, ArchSpec] = {}
QWEN35MOE_HF: dict[str, ArchSpec] = {}
