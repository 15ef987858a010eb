"""Small asyncio helpers the node's tasks share."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended.

    ``with suppress(CancelledError): await task`` would also swallow a cancellation of the
    caller that arrives while it waits, leaving the caller running when it was told to stop;
    this re-raises that one.
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
