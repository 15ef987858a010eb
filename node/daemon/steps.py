"""Code written once for both runtimes that must partly run where the gossip state lives.

The gossip state has one owner thread in the daemon (the gossip worker, node/daemon/gossiper.py) and
none in the simulator, where everything runs on one thread. Code that checks a message on the
caller's side, applies it to the state, then counts it on the caller's side again (the inbound
path, the topology update) is written once as a generator of :data:`Steps`: it yields each piece
of work that touches the state, and is sent back the work's result (or has its exception thrown
in). The simulator runs such a generator with :func:`run_here`; the daemon with :func:`run_on`
and ``Gossiper.run``, which hops to the worker for each piece and back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

__all__ = ["Steps", "Work", "run_here", "run_on"]

T = TypeVar("T")

#: A piece of work that touches the gossip state.
Work = Callable[[], Any]
#: Code that yields its pieces of state work and returns a ``T``.
Steps = Generator[Work, Any, T]


def run_here(steps: Steps[T]) -> T:
    """Run ``steps`` to the end on this thread, each piece of work at once."""
    try:
        work = next(steps)
        while True:
            try:
                result = work()
            except Exception as err:
                work = steps.throw(err)
            else:
                work = steps.send(result)
    except StopIteration as done:
        value: T = done.value
        return value


async def run_on(steps: Steps[T], run: Callable[[Work], Awaitable[Any]]) -> T:
    """Run ``steps`` to the end, each piece of work through ``run`` (the gossip worker)."""
    try:
        work = next(steps)
        while True:
            try:
                result = await run(work)
            except Exception as err:
                work = steps.throw(err)
            else:
                work = steps.send(result)
    except StopIteration as done:
        value: T = done.value
        return value
