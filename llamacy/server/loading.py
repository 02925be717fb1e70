"""Loading a model for serving: the Llama, its chat template, a started scheduler.

load = ModelLoader(n_ctx=2048, n_parallel=4)
registry = ModelRegistry(specs, load, max_memory=...)   # calls load(spec) on a model's first use
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llamacy.server.models import ModelSpec, ServedModel


@dataclass(frozen=True)
class ModelLoader:
    """The serving options every model is loaded with (`llamacy serve`'s)."""

    n_ctx: int | None = None  # per sequence; None: min(model's, the engine's default)
    n_threads: int | None = None
    kv_type: str = "f16"
    n_parallel: int = 4
    queue_size: int = 64
    chat_template: Path | None = None  # a Jinja file instead of each model's own
    draft_model: str | None = None  # drafts for requests with speculate "draft" (same vocabulary)

    def __call__(self, spec: ModelSpec) -> ServedModel:
        from llamacy.chat_template import ChatTemplate
        from llamacy.engine import Llama
        from llamacy.scheduler import Scheduler

        # The weights are bound once, by the Llama; the scheduler's batched Model is the only one built.
        llm = Llama(
            spec.source, n_ctx=self.n_ctx, n_threads=self.n_threads, kv_type=self.kv_type, repack="load"
        )
        template = ChatTemplate.from_model(llm.metadata, llm.tokenizer, override=self.chat_template)
        draft = None
        if self.draft_model is not None:
            draft = Llama(
                self.draft_model,
                n_ctx=llm.n_ctx,
                n_threads=self.n_threads,
                kv_type=self.kv_type,
                repack="load",
            )
        scheduler = Scheduler(
            llm, n_parallel=self.n_parallel, n_ctx=llm.n_ctx, queue_size=self.queue_size, draft=draft
        )
        return ServedModel(spec.name, scheduler.start(), template)
