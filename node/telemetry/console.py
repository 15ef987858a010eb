"""What a node tells its operator in its log, beside what it does: a periodic one-line summary,
countdowns beside its waits, and progress for checkpoints too big to write in a blink.

Everything here reads (a status, a clock, a file size) and logs; nothing decides anything.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from node.telemetry.progress import TRANSFER_TICKS, TickerConfig, TransferProgress, announce
from node.telemetry.status import NodeStatus, format_summary

__all__ = ["CheckpointProgress", "Summary", "with_countdown"]

log = logging.getLogger(__name__)

T = TypeVar("T")


class Summary:
    """A node's periodic one-line summary (:func:`node.telemetry.status.format_summary`): rates over
    the interval, never the same line twice in a row.

    Args:
        status: the node's status now (a read).
        interval_s: seconds between two lines.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        status: Callable[[], Awaitable[NodeStatus]],
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._status = status
        self.interval_s = interval_s
        self._clock = clock
        self._started = clock()
        self._before: NodeStatus | None = None
        self._before_at = self._started
        self._last_line = ""

    def line(self, status: NodeStatus, now: float) -> str | None:
        """The summary of ``status`` at ``now``; None when it would repeat the last one."""
        text = format_summary(status, self._before, now - self._before_at)
        self._before, self._before_at = status, now
        if text == self._last_line:
            return None
        self._last_line = text
        return text

    async def run(self) -> None:
        """Log a line every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            text = self.line(await self._status(), self._clock())
            if text is not None:
                log.info("%s", text)


async def with_countdown(
    work: Awaitable[T],
    describe: Callable[[], str | None],
    ticks: TickerConfig,
) -> T:
    """Await ``work`` while :func:`node.telemetry.progress.announce` logs ``describe()``."""
    teller = asyncio.create_task(announce(describe, log, ticks), name="countdown")
    try:
        return await work
    finally:
        teller.cancel()
        await asyncio.gather(teller, return_exceptions=True)


@dataclass
class CheckpointProgress:
    """Progress lines for checkpoint writes that last: a write is one big system call, so
    the estimate of what is left comes from the rate of the write before it.

    Args:
        path: the checkpoint file (its size is the estimate of the next write's before the
            first capture).
        poll_s: how often the event loop looks at a write in progress.
    """

    path: Path
    poll_s: float = 0.25
    ticks: TickerConfig = TRANSFER_TICKS
    #: Bytes per second of the last write; None before the first.
    rate: float | None = None

    def estimate(self, fallback: int) -> int:
        """Bytes the next write will take: the last checkpoint's size, else ``fallback``."""
        try:
            return self.path.stat().st_size or fallback
        except OSError:
            return fallback

    async def run(self, what: str, nbytes: int, write: Callable[[], T], final: bool) -> T:
        """Run ``write`` on a thread, logging progress while it lasts; the final write
        (one per life, and what a stopping node waits for) always says how long it took."""
        progress = TransferProgress(what, nbytes, log, ticks=self.ticks)
        job = asyncio.ensure_future(asyncio.to_thread(write))
        while not job.done():
            await asyncio.wait({job}, timeout=self.poll_s)
            if not job.done():
                progress.tick(self.rate)
        result = job.result()
        self.rate = progress.rate()
        if final or progress.spoke:
            log.info("%s: %s", what, progress.done())
        return result
