"""Embeddings for the HTTP APIs (OpenAI's /v1/embeddings, Ollama's /api/embed and /api/embeddings): one
llamacy.embedding.Embedder per served model, made on first use, run off the event loop.

The embedder has its own one-sequence model over the scheduler's bound weights, so embedding does not
take a generation slot; its layer loop runs alone when the scheduler's thread team is busy.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.concurrency import run_in_threadpool

from llamacy.embedding import Embedder, l2_normalize
from llamacy.errors import LlamacyError
from llamacy.server.errors import APIError, from_engine_error
from llamacy.server.models import ServedModel

# By the scheduler's Model: the embedder reads the same weights, and goes when that model goes.
_embedders: weakref.WeakKeyDictionary[Any, Embedder] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _embedder(served: ServedModel) -> Embedder:
    model = served.scheduler.model
    with _lock:
        emb = _embedders.get(model)
        if emb is None:
            sched = served.scheduler
            emb = _embedders[model] = Embedder(
                model.gguf, model.cfg, sched.n_ctx, sched.n_threads, weights=model.weights
            )
        return emb


@dataclass
class Embedded:
    vectors: np.ndarray  # [inputs, dims] float32
    tokens: int  # tokens evaluated, over all inputs


def check_dimensions(served: ServedModel, dimensions: int | None) -> None:
    n_embd = served.scheduler.model.cfg.n_embd
    if dimensions is not None and not 1 <= dimensions <= n_embd:
        raise APIError(
            400,
            f"dimensions must be between 1 and {n_embd} for this model, got {dimensions}",
            "invalid_value",
        )


async def embed(
    served: ServedModel,
    token_lists: list[list[int]],
    normalize: bool = True,
    truncate: bool = False,
    dimensions: int | None = None,
) -> Embedded:
    """Vectors of the token lists. truncate: inputs longer than the context lose their end (else 400).
    dimensions: the first d components, unit length again when normalize (as OpenAI and Ollama do)."""
    check_dimensions(served, dimensions)
    if truncate:
        n_ctx = served.scheduler.n_ctx
        token_lists = [ids[:n_ctx] for ids in token_lists]
    emb = _embedder(served)
    try:
        vectors = await run_in_threadpool(emb.embed, token_lists, normalize)
    except LlamacyError as e:
        raise from_engine_error(e) from None
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
        if normalize:
            vectors = l2_normalize(vectors)
    return Embedded(vectors, sum(len(ids) for ids in token_lists))
