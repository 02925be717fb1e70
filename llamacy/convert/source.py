"""What a conversion reads from: a model's tensors (as float32 rows on demand) and its metadata.

Two kinds of source implement this: a Hugging Face checkpoint directory (hf.py) and a GGUF file
(gguf_requant.py). The pipeline (pipeline.py) only sees this interface.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llamacy.convert.mixtures import ModelFacts

if TYPE_CHECKING:  # annotations only: importing gguf whole costs start-up (llamacy.gguf_names)
    from gguf import GGUFWriter


@dataclass
class SourceTensor:
    name: str  # the GGUF tensor name
    shape: tuple[int, ...]  # numpy order: shape[-1] is the row length
    type: int  # GGML type of the data as the source stores it
    # Rows [start, stop) of the tensor (1-D tensors are one row) as a float32 [stop - start, row] array.
    read_rows: Callable[[int, int], np.ndarray]
    # The stored bytes, when they can be written unchanged (a GGUF tensor whose type is kept).
    raw: Callable[[], np.ndarray] | None = None

    @property
    def n_rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class Source(ABC):
    """An open model to convert. Use as a context manager (closes its files)."""

    path: Path
    facts: ModelFacts
    tensors: list[SourceTensor]

    @property
    @abstractmethod
    def size_on_disk(self) -> int:
        """Bytes of the source's files (for the summary)."""

    @abstractmethod
    def keep_type(self, tensor: SourceTensor) -> int:
        """The type a tensor is written in when it is not quantized (1-D tensors, norms)."""

    @abstractmethod
    def add_metadata(self, writer: GGUFWriter, file_type: int) -> None:
        """Every metadata key of the output file except general.architecture (the writer's own)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
