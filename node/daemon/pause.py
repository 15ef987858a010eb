"""When a node is paused: its device's policy, read from sysfs every few seconds, and the hand
(``murmur ctl pause|resume``, SIGUSR1 and SIGUSR2).

The node is paused while any reason holds: each rule of the policy (node/daemon/power.py) and
the hand are reasons of their own, so ``murmur ctl resume`` ends a pause by hand and leaves a
battery pause standing (its answer says so). What a pause does to the node is the node's
business (node/daemon/node.py): the :class:`Pauser` only tells it, once per change, and never
tells it twice at once: a resume that first pulls the swarm's model ends before the next change
is told.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

from node.daemon.power import DeviceReading, PausePolicy, minute_of_day, read_device
from node.runtime import Runtime

__all__ = ["HAND", "PULL_AFTER_PAUSE_S", "Pauser"]

log = logging.getLogger(__name__)

#: A pause at least this long ends with a pull of the swarm's model, as a joiner's start does:
#: the swarm has moved on, and mixing back from that far would take many rounds and pull the
#: neighbours back meanwhile. A shorter one only resyncs its links. The daemon and the
#: simulator both follow it.
PULL_AFTER_PAUSE_S = 10.0

#: The reason a pause by hand is kept under.
HAND = "hand"


class Pauser:
    """Args:
    policy: the device policy (one that sets no rule reads nothing).
    root: the sysfs root the policy reads (tests give a fake tree).
    poll_s: seconds between two readings.
    runtime: the node's clock and sleep.
    on_change: told ``(paused, seconds the pause lasted)`` on the event loop whenever the node
        goes from running to paused or back (the seconds are 0 when it pauses).
    read: reads the device (tests may give another).
    now_minute: the local time of day in minutes (tests may give another).
    """

    def __init__(
        self,
        policy: PausePolicy,
        root: Path,
        poll_s: float,
        runtime: Runtime,
        on_change: Callable[[bool, float], Awaitable[None]],
        read: Callable[[Path], DeviceReading] = read_device,
        now_minute: Callable[[], int] = lambda: minute_of_day(datetime.now()),
    ) -> None:
        self.policy = policy
        self.root = root
        self.poll_s = poll_s
        self._runtime = runtime
        self._on_change = on_change
        self._read = read
        self._now_minute = now_minute
        #: Why the node is paused now, by reason (empty: it runs).
        self.reasons: dict[str, str] = {}
        #: What the node was last told: paused or not.
        self._told = False
        self._paused_at = 0.0
        self._lock = asyncio.Lock()
        self._telling: set[asyncio.Task[None]] = set()
        #: The last reading of the device (None: none taken yet, or the policy reads nothing).
        self.reading: DeviceReading | None = None

    @property
    def paused(self) -> bool:
        return bool(self.reasons)

    @property
    def reason(self) -> str:
        """Why the node is paused, one reason after another; empty when it is not."""
        return "; ".join(self.reasons[k] for k in sorted(self.reasons))

    def by_hand(self, paused: bool) -> None:
        """Pause or resume by hand. Returns at once: the node is told in a task of its own
        (a resume may first pull the model, which can take minutes on a slow link, and the
        one who asked should not wait for that); :meth:`settled` waits for it."""
        if paused:
            self.reasons[HAND] = "paused by hand (murmur ctl pause, SIGUSR1)"
        else:
            self.reasons.pop(HAND, None)
        task = asyncio.get_running_loop().create_task(self._tell())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def settled(self) -> None:
        """Wait until the node has been told of every change asked by hand so far."""
        while self._telling:
            await asyncio.gather(*self._telling)

    async def stop(self) -> None:
        """Cancel what is being told (the node stops)."""
        for task in list(self._telling):
            task.cancel()
        await asyncio.gather(*self._telling, return_exceptions=True)

    async def check(self) -> None:
        """Read the device once and follow the policy."""
        if not self.policy.active:
            return
        first = self.reading is None
        try:
            self.reading = await asyncio.to_thread(self._read, self.root)
        except OSError as err:  # read_device skips what it cannot read; this is the unforeseen
            log.warning("could not read the device's state under %s: %s", self.root, err)
            return
        if first:
            self._say_first(self.reading)
        held = frozenset(self.reasons)
        found = self.policy.reasons(self.reading, self._now_minute(), held)
        for key in list(self.reasons):
            if key != HAND and key not in found:
                del self.reasons[key]
        self.reasons.update(found)
        await self._tell()

    def _say_first(self, reading: DeviceReading) -> None:
        """Say what the policy reads, once, and warn of a rule the device gives nothing to
        (a battery rule where no battery is listed never pauses the node)."""
        p = self.policy
        battery = "no battery" if reading.battery_pct is None else f"{reading.battery_pct:.0f}%"
        temp = "no thermal zone" if reading.temp_c is None else f"{reading.temp_c:.1f} °C"
        power = "on AC" if reading.on_ac else "on battery"
        log.info("device under %s: %s, battery %s, %s", self.root, power, battery, temp)
        if p.battery_below is not None and reading.battery_pct is None:
            log.warning(
                "--pause-on-battery-below is set, but %s lists no battery: it never pauses",
                self.root / "class" / "power_supply",
            )
        if p.above_temp is not None and reading.temp_c is None:
            log.warning(
                "--pause-above-temp is set, but %s has no readable zone: it never pauses",
                self.root / "class" / "thermal",
            )

    async def run(self) -> None:
        """Follow the policy until cancelled."""
        while True:
            await self.check()
            await self._runtime.sleep(self.poll_s)

    async def _tell(self) -> None:
        async with self._lock:
            paused = self.paused
            if paused == self._told:
                return
            now = self._runtime.clock.now()
            if paused:
                log.warning("pausing: %s", self.reason)
                self._paused_at = now
                await self._on_change(True, 0.0)
            else:
                lasted = now - self._paused_at
                log.warning("resuming after a pause of %.1f s", lasted)
                await self._on_change(False, lasted)
            self._told = paused
