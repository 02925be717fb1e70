"""Mixture-of-experts checkpoints: Hugging Face stores one matrix per expert, GGUF one 3-D tensor per layer.

The experts of a layer are stacked along a new first axis, [n_expert, rows, cols] (GGUF's ne reversed),
as convert_hf_to_gguf.py does: `blk.N.ffn_{gate,up,down}_exps.weight`. A stacked tensor reads its rows
expert by expert, so a conversion still holds only one chunk of rows in memory.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from llamacy.convert.source import SourceTensor


@dataclass(frozen=True)
class ExpertSpec:
    """Where an architecture keeps its experts: `model.layers.N.<prefix>.E.<projection>.weight`."""

    prefix: str  # "mlp.experts" (Qwen) or "block_sparse_moe.experts" (Mixtral)
    projections: dict[str, str]  # checkpoint projection -> GGUF stem
    count_key: str  # config.json's number of experts
    width_key: str  # config.json's expert feed-forward width

    @property
    def pattern(self) -> re.Pattern[str]:
        names = "|".join(re.escape(p) for p in self.projections)
        return re.compile(rf"^{re.escape(self.prefix)}\.(\d+)\.({names})\.weight$")

    def hf_name(self, layer: int, stem: str, expert: int = 0) -> str:
        proj = next(p for p, s in self.projections.items() if s == stem)
        return f"model.layers.{layer}.{self.prefix}.{expert}.{proj}.weight"


QWEN_EXPERTS = ExpertSpec(
    "mlp.experts",
    {"gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"},
    "num_experts",
    "moe_intermediate_size",
)
MIXTRAL_EXPERTS = ExpertSpec(
    "block_sparse_moe.experts",
    {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps"},
    "num_local_experts",
    "intermediate_size",
)


def stacked_tensor(
    name: str, shape: tuple[int, int, int], src_type: int, read_expert: Callable[[int, slice], np.ndarray]
) -> SourceTensor:
    """A [n_expert, rows, cols] tensor whose expert e's rows come from read_expert(e, row slice)."""
    _, rows, cols = shape

    def read_rows(start: int, stop: int) -> np.ndarray:
        parts = []
        r = start
        while r < stop:
            e, first = divmod(r, rows)
            last = min(rows, first + stop - r)
            parts.append(read_expert(e, slice(first, last)).reshape(-1, cols))
            r += last - first
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    return SourceTensor(name, shape, src_type, read_rows)
