"""Hugging Face Gemma 4 checkpoints -> GGUF gemma4 (filled in below)."""

from __future__ import annotations

from typing import Any

HF_SPECS: dict[str, Any] = {}
