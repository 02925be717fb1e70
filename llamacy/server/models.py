"""The models a server answers for, by name: each with its scheduler and chat template.

    models = ModelRegistry.single("tiny", scheduler, template)
    served = models.get(body.model)      # None: the default model; unknown: APIError 404 listing the known

A leaf under the routes: it knows schedulers and templates, nothing about HTTP state or endpoints.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from llamacy.scheduler import Scheduler
from llamacy.server.errors import APIError
from llamacy.server.mailbox import LoopMailbox


@dataclass
class ServedModel:
    """One loaded model as the routes see it."""

    name: str
    scheduler: Scheduler
    template: Any  # llamacy.chat_template.ChatTemplate, or None: chat completions answer 501
    _mailbox: LoopMailbox | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tokenizer(self) -> Any:
        return self.scheduler.tokenizer

    def mailbox(self) -> LoopMailbox:
        """The running loop's mailbox, registered with the scheduler the first time."""
        loop = asyncio.get_running_loop()
        with self._lock:
            box = self._mailbox
            if box is None or box.loop is not loop:
                box = self._mailbox = LoopMailbox(loop)
                self.scheduler.add_step_hook(box.flush)
        return box


class ModelRegistry:
    """Served models by name; the first one is the default (a request without `model`)."""

    def __init__(self, models: list[ServedModel]) -> None:
        if not models:
            raise ValueError("a server needs at least one model")
        self._models = {m.name: m for m in models}
        self.default_name = models[0].name

    @classmethod
    def single(cls, name: str, scheduler: Scheduler, template: Any = None) -> ModelRegistry:
        return cls([ServedModel(name, scheduler, template)])

    def names(self) -> list[str]:
        return list(self._models)

    def loaded(self) -> list[ServedModel]:
        return list(self._models.values())

    def get(self, name: str | None) -> ServedModel:
        """The model a request names (None: the default); APIError 404 naming the known ones."""
        served = self._models.get(name if name is not None else self.default_name)
        if served is None:
            known = ", ".join(self.names())
            raise APIError(
                404, f"model {name!r} not found; known models: {known}", "model_not_found", "model"
            )
        return served
