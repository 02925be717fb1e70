"""Scheduler events on their way into an asyncio event loop: the per-loop mailbox and the per-call
bridge. A leaf module: the scheduler's thread posts here, the routes read here."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from llamacy.scheduler import Done, Event, Failed


class LoopMailbox:
    """Scheduler events on their way to one event loop, handed over once per scheduler step.

    The scheduler emits a step's events one sequence at a time; waking the loop for each (one self-pipe
    write, then the loop takes the GIL while the scheduler thread still samples the other sequences) made
    the two threads trade the GIL 8 times a step with 8 clients. Here events only queue up, and flush()
    (a scheduler step hook) passes the step's batch to the loop in one call, while the next step's math
    runs without the GIL.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[tuple[asyncio.Queue[Any], Any]] = []
        self._lock = threading.Lock()

    def post(self, queue: asyncio.Queue[Any], item: Any) -> None:
        with self._lock:
            self._items.append((queue, item))

    def flush(self) -> None:
        with self._lock:
            if not self._items:
                return
            items, self._items = self._items, []
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            self.loop.call_soon_threadsafe(self._deliver, items)

    @staticmethod
    def _deliver(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
        for queue, item in items:
            queue.put_nowait(item)


class EventBridge:
    """The events of one API call's requests (n choices: n requests), delivered on the scheduler thread,
    as (index, event) pairs on the event loop, in arrival order, until every request has ended."""

    def __init__(self, box: LoopMailbox, n: int = 1) -> None:
        self._box = box
        self._n = n
        self._queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

    def listener(self, index: int = 0) -> Callable[[Event], None]:
        return lambda ev: self._box.post(self._queue, (index, ev))

    async def __aiter__(self) -> AsyncIterator[tuple[int, Event]]:
        left = self._n
        while left:
            index, ev = await self._queue.get()
            yield index, ev
            if isinstance(ev, Done | Failed):
                left -= 1
