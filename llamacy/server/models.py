"""The models a server answers for, by name: loaded on first use, unloaded when idle or to make room.

    models = ModelRegistry([ModelSpec("smollm2-135m", "smollm2-135m", footprint)], load, max_memory=2 << 30)
    served = await models.acquire(body.model)   # None: the default (first) model; unknown: 404 naming them
                                                # (with one model served, any name is that model)

Each loaded model has its own scheduler. `max_memory` bounds the sum of the loaded models' footprints
(estimated before loading, see `llamacy serve`); to load one more, the least recently used idle models are
unloaded first. A model is busy (never unloaded) while a request holds it: from acquire until the HTTP
response ends (`holding()`, entered by the middleware), and while the scheduler has requests of it (so a
job outlives its POST). A request that needs room held by busy models waits up to ROOM_WAIT_S for them to
go idle before its 503: a stream the client has just closed lets go of its model only once the server has
noticed the disconnect and the scheduler has cancelled it at its next step, moments later.
With `idle_unload_s`, a thread unloads models idle that long.

A leaf under the routes: it knows schedulers and templates, nothing about HTTP state or endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from llamacy.errors import LlamacyError
from llamacy.scheduler import Scheduler
from llamacy.server.errors import APIError
from llamacy.server.mailbox import LoopMailbox

log = logging.getLogger("llamacy.server")

ROOM_WAIT_S = 2.0  # how long a load waits for busy models to go idle before answering 503


@dataclass(eq=False)
class ServedModel:
    """One loaded model as the routes see it."""

    name: str
    scheduler: Scheduler
    template: Any  # llamacy.chat_template.ChatTemplate, or None: chat completions answer 501
    _mailbox: LoopMailbox | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _holds: int = field(default=0, init=False, repr=False)  # requests holding it (acquire .. response end)
    _in_flight: int = field(default=0, init=False, repr=False)  # submitted to the scheduler, not finished
    last_active: float = field(default_factory=time.monotonic, init=False, repr=False)
    # Called (outside the lock) each time the model goes idle: the registry wakes loads waiting for room.
    on_idle: Callable[[], None] | None = field(default=None, init=False, repr=False)

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

    @property
    def busy(self) -> bool:
        return self._holds > 0 or self._in_flight > 0

    def _count(self, attr: str, delta: int) -> None:
        with self._lock:
            setattr(self, attr, getattr(self, attr) + delta)
            self.last_active = time.monotonic()
            went_idle = delta < 0 and not self.busy
        if went_idle and self.on_idle is not None:
            self.on_idle()

    def hold(self) -> None:
        self._count("_holds", 1)

    def release(self) -> None:
        self._count("_holds", -1)

    def submitted(self) -> None:
        """A request went to the scheduler (generation.submit); finished() when it ends."""
        self._count("_in_flight", 1)

    def finished(self) -> None:
        self._count("_in_flight", -1)


@dataclass(frozen=True)
class ModelSpec:
    """A model the server may load: its name in requests, where it comes from, what it will take."""

    name: str
    source: str  # a GGUF path or a catalog name, as given to `llamacy serve -m`
    footprint: int = 0  # estimated bytes once loaded (weights + KV caches); 0: not counted


Loader = Callable[[ModelSpec], ServedModel]  # loads a model and starts its scheduler

# The models the current HTTP request holds (set by the middleware for each request; None outside one).
_held: contextvars.ContextVar[list[ServedModel] | None] = contextvars.ContextVar("llamacy_held", default=None)


@contextlib.contextmanager
def holding() -> Iterator[Callable[[], None]]:
    """Around one HTTP request: the models it acquires stay loaded until the block ends, or until the
    function it yields is called (the middleware calls it just before the response's last message, so that
    a client that has read the whole response finds the models idle)."""
    held: list[ServedModel] = []
    token = _held.set(held)

    def release() -> None:
        while held:
            held.pop().release()

    try:
        yield release
    finally:
        _held.reset(token)
        release()


@dataclass
class _Entry:
    spec: ModelSpec
    served: ServedModel | None = None
    loading: bool = False
    load_lock: threading.Lock = field(default_factory=threading.Lock)


class ModelRegistry:
    """Served models by name; the first one is the default (a request without `model`). Thread-safe."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        load: Loader | None = None,
        max_memory: int | None = None,
        idle_unload_s: float | None = None,
        loaded: Sequence[ServedModel] = (),
    ) -> None:
        """`loaded`: models already loaded (their specs among `specs`); without `load`, nothing is loaded
        or unloaded by the registry and the schedulers belong to the caller."""
        if not specs:
            raise ValueError("a server needs at least one model")
        self._entries = {s.name: _Entry(s) for s in specs}
        if len(self._entries) != len(specs):
            raise ValueError("two models have the same name")
        for served in loaded:
            self._entries[served.name].served = served
            served.on_idle = self._notify_idle
        self.default_name = specs[0].name
        self._load = load
        self.max_memory = max_memory
        self.idle_unload_s = idle_unload_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when a loaded model goes idle
        self._closed = threading.Event()
        self._reaper: threading.Thread | None = None
        if idle_unload_s and load is not None:
            self._reaper = threading.Thread(target=self._reap, name="llamacy-model-reaper", daemon=True)
            self._reaper.start()

    @classmethod
    def single(cls, name: str, scheduler: Scheduler, template: Any = None) -> ModelRegistry:
        """One model, loaded and run by the caller (who starts and stops its scheduler)."""
        return cls([ModelSpec(name, name)], loaded=[ServedModel(name, scheduler, template)])

    # ---- lookups -------------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return list(self._entries)

    def specs(self) -> list[ModelSpec]:
        return [e.spec for e in self._entries.values()]

    def loaded(self) -> list[ServedModel]:
        with self._lock:
            return [e.served for e in self._entries.values() if e.served is not None]

    def is_loaded(self, name: str) -> bool:
        return self._entry(name).served is not None

    def _entry(self, name: str | None) -> _Entry:
        entry = self._entries.get(name if name is not None else self.default_name)
        if entry is None and len(self._entries) == 1:
            # One model served: whatever a client calls it, it means this one (llama-server does the
            # same; clients often send a fixed name such as "gpt-4o"). With several, a name must choose.
            entry = self._entries[self.default_name]
        if entry is None:
            known = ", ".join(self._entries)
            raise APIError(
                404, f"model {name!r} not found; known models: {known}", "model_not_found", "model"
            )
        return entry

    # ---- acquiring -----------------------------------------------------------------------------------

    async def acquire(self, name: str | None) -> ServedModel:
        """The model a request names (None: the default), loaded if it is not; held until the request
        ends. APIError 404 for an unknown name, 503 when it cannot be loaded now."""
        entry = self._entry(name)
        with self._lock:
            if entry.served is not None:
                return self._hold_locked(entry)
        try:
            return await run_in_threadpool(self.get, name)  # loading takes a while: not on the event loop
        except LlamacyError as e:
            raise APIError(
                500, f"model {entry.spec.name!r} could not be loaded: {e}", "model_load_failed"
            ) from None

    def get(self, name: str | None) -> ServedModel:
        """acquire() for synchronous code: loads the model on this thread if needed."""
        entry = self._entry(name)
        with self._lock:
            if entry.served is not None:
                return self._hold_locked(entry)
        with entry.load_lock:  # one load per model at a time; the others wait for it and share it
            with self._lock:
                if entry.served is not None:
                    return self._hold_locked(entry)
                if self._load is None:
                    raise APIError(503, f"model {entry.spec.name!r} is not loaded", "model_unavailable")
                victims = self._make_room_locked(entry.spec)
                entry.loading = True
            self._unload(victims)
            try:
                t0 = time.perf_counter()
                served = self._load(entry.spec)
                log.info("loaded %s in %.2f s", entry.spec.name, time.perf_counter() - t0)
            finally:
                with self._lock:
                    entry.loading = False
            served.on_idle = self._notify_idle
            with self._lock:
                entry.served = served
                return self._hold_locked(entry)

    def _notify_idle(self) -> None:
        with self._lock:
            self._idle.notify_all()

    def _hold_locked(self, entry: _Entry) -> ServedModel:
        served = entry.served
        assert served is not None
        held = _held.get()
        if held is not None:
            served.hold()
            held.append(served)
        else:
            served.last_active = time.monotonic()
        return served

    # ---- unloading -----------------------------------------------------------------------------------

    def _make_room_locked(self, spec: ModelSpec) -> list[ServedModel]:
        """Take out of service the least recently used idle models until `spec` fits the budget; they are
        returned for the caller to shut down (outside the lock). While busy models leave no room, wait up to
        ROOM_WAIT_S for them to go idle (the lock is let go meanwhile); then APIError 503."""
        if self.max_memory is None:
            return []
        deadline = time.monotonic() + ROOM_WAIT_S
        while True:
            used = sum(e.spec.footprint for e in self._entries.values() if e.served is not None or e.loading)
            idle = sorted(
                (e for e in self._entries.values() if e.served is not None and not e.served.busy),
                key=lambda e: e.served.last_active if e.served else 0.0,
            )
            chosen: list[_Entry] = []
            while used + spec.footprint > self.max_memory and idle:
                e = idle.pop(0)
                chosen.append(e)
                used -= e.spec.footprint
            if used + spec.footprint <= self.max_memory:
                victims = []
                for e in chosen:
                    assert e.served is not None
                    victims.append(e.served)
                    e.served = None
                return victims
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._idle.wait(left)
        busy = ", ".join(e.spec.name for e in self._entries.values() if e.served is not None or e.loading)
        raise APIError(
            503,
            f"not enough memory to load model {spec.name!r}: it needs {_mib(spec.footprint)} and "
            f"{_mib(used)} of the {_mib(self.max_memory)} budget (--max-memory) is held by busy "
            f"models ({busy}); retry later",
            "insufficient_memory",
            headers={"Retry-After": "5"},
        )

    def _unload(self, victims: list[ServedModel]) -> None:
        for served in victims:
            log.info("unloading %s", served.name)
            served.scheduler.shutdown()

    def _reap(self) -> None:
        """Unload models idle for idle_unload_s (checked a few times per period)."""
        assert self.idle_unload_s
        period = min(1.0, self.idle_unload_s / 4)
        while not self._closed.wait(period):
            now = time.monotonic()
            with self._lock:
                victims = []
                for e in self._entries.values():
                    s = e.served
                    if s is not None and not s.busy and now - s.last_active >= self.idle_unload_s:
                        victims.append(s)
                        e.served = None
            self._unload(victims)

    def close(self) -> None:
        """Stop the idle thread and shut down the schedulers the registry loaded."""
        self._closed.set()
        if self._reaper is not None:
            self._reaper.join()
        if self._load is None:
            return  # the schedulers belong to the caller
        with self._lock:
            victims = [e.served for e in self._entries.values() if e.served is not None]
            for e in self._entries.values():
                e.served = None
        self._unload(victims)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
