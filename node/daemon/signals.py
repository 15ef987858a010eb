"""What a node's parts tell each other without knowing each other: "something changed", "this
failed", and the background tasks whose failure is the node's.

Every part that changes what a waiter waits for (a round made, a member learned, a link up)
calls :meth:`Signals.changed`; whoever waits (a test, the start of training) calls
:meth:`Signals.wait_until`. A part whose work cannot go on calls :meth:`Signals.fail`, and the
node's owner learns it from :meth:`Signals.wait_failed`. Event loop only, except :meth:`on_loop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVarTuple

from gossip.refusals import Reason

__all__ = ["Phase", "Signals"]

log = logging.getLogger(__name__)

Ts = TypeVarTuple("Ts")


@dataclass
class Phase:
    """Where the node is in its life: serving and joined (``ready``), or stopping (``closing``).
    Written by the node's start and stop only; read by every part."""

    ready: bool = False
    closing: bool = False

    def accepting(self) -> Reason | None:
        """Why the node takes no messages now, or None (node/daemon/inbound.py)."""
        if self.closing:
            return Reason.SHUTTING_DOWN
        if not self.ready:
            return Reason.NOT_READY
        return None


class Signals:
    """Args:
    name: how the log names the node (the first characters of its id).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self.failure: BaseException | None = None
        self._failed = asyncio.Event()
        self._change = asyncio.Event()  # replaced by a fresh one at every change
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop that :meth:`on_loop` hands calls to (the node's, once it starts)."""
        self._loop = loop

    def changed(self) -> None:
        """Wake every :meth:`wait_until`."""
        change, self._change = self._change, asyncio.Event()
        change.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float | None) -> None:
        """Wait until ``predicate()`` holds, re-checking at every :meth:`changed`; ``timeout_s``
        None waits for ever.

        Raises:
            TimeoutError: it did not hold within ``timeout_s``.
        """
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._change.wait()

    def fail(self, err: BaseException) -> None:
        """The node's work cannot go on; the first error is the one that is kept."""
        if self.failure is None:
            log.error("node %s failed: %s", self._name, err)
            self.failure = err
            self._failed.set()

    async def wait_failed(self) -> BaseException:
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` in the background; if it raises, the node fails."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    async def cancel_tasks(self) -> None:
        """Cancel every background task and wait for them to end."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    def on_loop(self, fn: Callable[[*Ts], None]) -> Callable[[*Ts], None]:
        """Wrap a callback so that another thread (the trainer's, the worker's) hands it to the
        event loop; dropped before :meth:`bind` or after the loop closed."""

        def call(*args: *Ts) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed in between
                    loop.call_soon_threadsafe(fn, *args)

        return call
