"""Virtual time for asyncio tests: a loop whose clock jumps to its next timer instead of sleeping.

:class:`VirtualLoop` is a :class:`asyncio.SelectorEventLoop` whose ``time()`` is virtual and starts
at 0. Its selector first polls the real file descriptors (the loop's self-pipe, which threads
use to call back); when none is ready and the loop would sleep until its next timer, the clock
moves to that timer at once instead. Everything that waits on the loop (``asyncio.sleep``,
``asyncio.timeout``, ``call_at``) then costs no wall time, and since a node's
:class:`~node.runtime.Runtime` reads the loop's clock, every part of the node runs on the same
virtual time. A loop with no timer and nothing to read blocks for real, as any loop would
(pytest's timeout then fails the test).

A test is an ``async def`` marked ``@virtual``, which runs it with :func:`run` on a loop of its
own (pytest sees a plain function, so pytest-asyncio's loop is not involved). It waits for what
it expects with :func:`run_until`, which says how long that took in virtual seconds and fails
loudly at a virtual deadline.

Why not looptime (nolar's pytest plugin, which does the same for pytest-asyncio's loops; tried
first): its clock counts whole microseconds, and asyncio runs a timer due within its clock
resolution (1 ns) of now without sleeping. The membership loop arms a timer for each SWIM
deadline; one a rounding error ahead (3.6e-15 s) fired without the clock moving, the loop found
its deadline not reached and armed it again, and since virtual time moves only when the loop
would sleep, the test spun forever. This loop has no resolution: the clock moves to just past
the next timer, so a deadline is reached when its timer fires. It also jumps at once, where
looptime spins 42 idle cycles before each jump: 60 virtual seconds of 10 ms polls took 1.2 to
2.4 s of wall time there (load average 7), a few hundredths of that here.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from node.runtime import LoopClock, Runtime

__all__ = ["POLL_S", "VirtualLoop", "run", "run_until", "runtime", "virtual", "virtual_now"]

T = TypeVar("T")
P = ParamSpec("P")

#: How often :func:`run_until` looks at its condition, in virtual seconds: below the SWIM period
#: and the links' back-off, so a time is measured to within it. Exact times come from the events
#: themselves (a handler that notes ``virtual_now()``).
POLL_S = 0.01


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        loop = self.loop
        if ready or loop is None or loop.has_ready():
            return ready
        if timeout is None:  # no timer at all: only a thread or real I/O can wake the loop
            return super().select(None)
        # Nothing can run before the next timer (a timeout of 0 with nothing ready: one is due
        # at exactly now, which a loop without resolution runs once the clock has passed it).
        loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (see the module's docstring)."""

    def __init__(self) -> None:
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        # Timers run only once the clock has passed them, so that a deadline is reached when
        # its timer fires (asyncio's default lets one run up to 1 ns early).
        self._clock_resolution = 0.0

    def time(self) -> float:
        return self._now

    def has_ready(self) -> bool:
        """Whether callbacks wait to run now (then the clock must not move)."""
        return bool(self._ready)  # type: ignore[attr-defined]

    def advance(self, timeout: float) -> None:
        """Move the clock past the next timer (``timeout`` from now, as the loop computed it)."""
        scheduled: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        target = self._now + timeout
        if scheduled:
            target = max(target, scheduled[0].when())
        self._now = math.nextafter(target, math.inf)


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to the end on a fresh :class:`VirtualLoop`."""
    with asyncio.Runner(loop_factory=VirtualLoop) as runner:
        return runner.run(main)


def virtual(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """Make an ``async def`` test run on virtual time (keeping its parameters for pytest)."""

    @functools.wraps(test)
    def on_virtual_time(*args: P.args, **kwargs: P.kwargs) -> None:
        run(test(*args, **kwargs))

    return on_virtual_time


def virtual_now() -> float:
    """The running loop's time: virtual seconds since :func:`run` started."""
    return asyncio.get_running_loop().time()


def runtime(seed: int) -> Runtime:
    """A node's runtime on the running loop with a seeded RNG: every choice repeats.

    Raises:
        AssertionError: the loop is not a :class:`VirtualLoop` (mark the test ``@virtual``).
    """
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualLoop), "mark the test @virtual (tests/vtime.py)"
    return Runtime(LoopClock(loop), asyncio.sleep, random.Random(seed))


async def run_until(
    condition: Callable[[], bool],
    within_s: float,
    what: str = "the condition",
    poll_s: float = POLL_S,
) -> float:
    """Let the loop run until ``condition()`` holds; returns the virtual seconds that took (to
    within ``poll_s``).

    Raises:
        AssertionError: it did not hold within ``within_s`` virtual seconds (saying ``what``).
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + within_s
    while not condition():
        if loop.time() >= deadline:
            raise AssertionError(f"{what} did not hold within {within_s:g} virtual seconds")
        await asyncio.sleep(poll_s)
    return loop.time() - start
