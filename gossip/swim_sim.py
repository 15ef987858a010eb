"""Many SWIM members in one process, over a simulated network with delay and loss.

A discrete-event simulation on an injected clock: it jumps from one event (a delivery, or a
member's next timer) to the next, so hours of protocol time take seconds. Tests use it to check
failure detection and the absence of flapping; the benchmark uses it to measure both.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from gossip.clock import ManualClock
from gossip.swim import MemberRecord, Outgoing, Status, Swim, SwimConfig, SwimMessage

__all__ = ["SwimSimulation"]


@dataclass(frozen=True)
class _Delivery:
    at: float
    order: int
    address: str
    message: SwimMessage

    def __lt__(self, other: _Delivery) -> bool:
        return (self.at, self.order) < (other.at, other.order)


class SwimSimulation:
    """``n`` members that all know each other at time 0.

    Args:
        loss: probability that any one message is lost.
        latency_s: (min, max) of the uniform one-way delay.
        on_message: sees every message sent (for counting traffic).
        drop: loses the messages it returns True for (a broken link, say), besides ``loss``.
    """

    def __init__(
        self,
        n: int,
        cfg: SwimConfig,
        loss: float = 0.0,
        latency_s: tuple[float, float] = (0.001, 0.02),
        seed: int = 0,
        on_message: Callable[[Outgoing], None] | None = None,
        drop: Callable[[Outgoing], bool] | None = None,
    ) -> None:
        self.cfg = cfg
        self.loss = loss
        self.latency_s = latency_s
        self.clock = ManualClock()
        self.rng = random.Random(seed)
        self.on_message = on_message
        self.drop = drop
        self.members: dict[str, Swim] = {}
        self.down: set[str] = set()
        self._queue: list[_Delivery] = []
        self._order = itertools.count()
        for i in range(n):
            self.add(f"m{i:04d}", incarnation=1)
        everyone = [m.me for m in self.members.values()]
        for m in self.members.values():
            m.merge(everyone)
            m.drain_changes()

    def add(self, node_id: str, incarnation: int, join_through: str | None = None) -> Swim:
        address = f"sim://{node_id}"
        member = Swim(
            node_id, address, incarnation, self.cfg, self.clock, random.Random(self.rng.random())
        )
        self.members[address] = member
        self.down.discard(address)
        if join_through is not None:
            helper = self.members[join_through]
            member.merge(helper.records())
            helper.merge([member.me])
        return member

    def crash(self, address: str) -> None:
        """The member stops: it neither sends nor receives from now on."""
        self.down.add(address)

    def send(self, outgoing: list[Outgoing]) -> None:
        for out in outgoing:
            if self.on_message is not None:
                self.on_message(out)
            if self.rng.random() < self.loss or (self.drop is not None and self.drop(out)):
                continue
            at = self.clock.now() + self.rng.uniform(*self.latency_s)
            heapq.heappush(self._queue, _Delivery(at, next(self._order), out.address, out.message))

    def run_until(self, t_end: float, after_event: Callable[[], None] | None = None) -> None:
        """Process every delivery and timer up to ``t_end``."""
        while True:
            live = [m for a, m in self.members.items() if a not in self.down]
            next_timer = min((m.next_deadline() for m in live), default=math.inf)
            next_delivery = self._queue[0].at if self._queue else math.inf
            now = min(next_timer, next_delivery)
            if now > t_end:
                break
            self.clock.advance_to(max(now, self.clock.now()))
            if self._queue and self._queue[0].at <= self.clock.now():
                d = heapq.heappop(self._queue)
                target = self.members.get(d.address)
                if target is not None and d.address not in self.down:
                    self.send(target.receive(d.message))
            for m in live:
                if m.next_deadline() <= self.clock.now():
                    self.send(m.tick())
            if after_event is not None:
                after_event()
        self.clock.advance_to(max(t_end, self.clock.now()))

    def view(self, address: str) -> dict[str, MemberRecord]:
        return {r.node_id: r for r in self.members[address].records()}

    def status(self, address: str, node_id: str) -> Status | None:
        """What the member at ``address`` believes of ``node_id`` (None: never heard of it)."""
        record = self.members[address].record(node_id)
        return record.status if record else None

    def live_addresses(self) -> list[str]:
        return [a for a in self.members if a not in self.down]
