"""Many SWIM members in one process, over a simulated network with delay and loss.

A discrete-event simulation on :mod:`gossip.events`: deliveries are events, and so is each
member's next timer (``Swim.next_deadline``), so hours of protocol time take seconds and the
cost of an event does not grow with the number of members. Tests use it to check failure
detection and the absence of flapping; the benchmark uses it to measure both.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable

from gossip.clock import ManualClock
from gossip.events import EventQueue, Network
from gossip.swim import MemberRecord, Outgoing, Status, Swim, SwimConfig, SwimMessage

__all__ = ["SwimSimulation", "fake_signer", "fake_verify"]


def fake_signer(node_id: str) -> Callable[[bytes], bytes]:
    """Stands in for a member's key (the node uses ECDSA: node/security/signing.py): only the member
    with this id makes this signature, and anyone can check it."""
    return lambda data: hashlib.sha256(node_id.encode() + data).digest()


def fake_verify(record: MemberRecord) -> bool:
    return record.signature == fake_signer(record.node_id)(record.claim())


def fake_check_signature(public_key: bytes, data: bytes, signature: bytes) -> bool:
    """The accuser's check: in the fake scheme a member's public key is its id."""
    return signature == fake_signer(public_key.decode())(data)


class SwimSimulation:
    """``n`` members that all know each other at time 0.

    Args:
        loss: probability that any one message is lost.
        latency_s: (min, max) of the uniform one-way delay, drawn for every message.
        on_message: sees every message sent (for counting traffic).
        drop: loses the messages it returns True for (a broken link, say), besides ``loss``.
        signed: members sign their records and accusations and check others' (with
            :func:`fake_signer`), as nodes do with their keys.
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
        signed: bool = False,
    ) -> None:
        self.cfg = cfg
        self.loss = loss
        self.latency_s = latency_s
        self.clock = ManualClock()
        self.rng = random.Random(seed)
        self.events = EventQueue(self.clock)
        self.network = Network(
            self.events, lambda a, b: self.rng.uniform(*latency_s), loss=loss, rng=self.rng
        )
        self.on_message = on_message
        self.drop = drop
        self.signed = signed
        self.members: dict[str, Swim] = {}
        self.down: set[str] = set()
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
        if self.signed:
            member.sign, member.public_key = fake_signer(node_id), node_id.encode()
            member.verify, member.check_signature = fake_verify, fake_check_signature
        self.members[address] = member
        self.down.discard(address)
        self.events.cancel_timer(address)  # a restarted member's old timer is not its own
        if join_through is not None:
            helper = self.members[join_through]
            member.merge(helper.records())
            helper.merge([member.me])
        self._schedule(address)
        return member

    def crash(self, address: str) -> None:
        """The member stops: it neither sends nor receives from now on."""
        self.down.add(address)
        self.events.cancel_timer(address)

    def split(self, groups: Iterable[Iterable[str]], start_s: float, duration_s: float) -> None:
        """Partition the network into ``groups`` of addresses from ``start_s`` for
        ``duration_s`` seconds (an address in no group is cut off from everyone)."""
        group_of = {a: i for i, group in enumerate(groups) for a in group}
        self.network.split(lambda a: group_of.get(a, a), start_s, duration_s)

    def inject(self, address: str, message: SwimMessage) -> None:
        """Put ``message`` on the network to ``address``, from its sender's address, as if the
        sender had sent it (what an insider makes up, in tests)."""
        self.network.send(message.sender_address, address, 0, self._delivery(address, message))

    def send(self, outgoing: list[Outgoing]) -> None:
        for out in outgoing:
            if self.on_message is not None:
                self.on_message(out)
            if self.drop is not None and self.drop(out):
                continue
            self.network.send(
                out.message.sender_address, out.address, 0, self._delivery(out.address, out.message)
            )

    def _delivery(self, address: str, message: SwimMessage) -> Callable[[], None]:
        def deliver() -> None:
            target = self.members.get(address)
            if target is not None and address not in self.down:
                self.send(target.receive(message))
                self._schedule(address)

        return deliver

    def _schedule(self, address: str) -> None:
        """Make sure the member's next deadline is an event."""
        if address in self.down:
            return
        member = self.members[address]

        def tick() -> None:
            if address in self.down or self.members.get(address) is not member:
                return
            if member.next_deadline() <= self.clock.now():
                self.send(member.tick())
            self._schedule(address)

        self.events.timer(address, member.next_deadline(), tick)

    def run_until(self, t_end: float, after_event: Callable[[], None] | None = None) -> None:
        """Process every delivery and timer up to ``t_end``."""
        # Callers may have changed members between runs (a merge, a departure): their
        # deadlines may have moved.
        for address in self.live_addresses():
            self._schedule(address)
        self.events.run_until(t_end, after_event)

    def view(self, address: str) -> dict[str, MemberRecord]:
        return {r.node_id: r for r in self.members[address].records()}

    def status(self, address: str, node_id: str) -> Status | None:
        """What the member at ``address`` believes of ``node_id`` (None: never heard of it)."""
        record = self.members[address].record(node_id)
        return record.status if record else None

    def live_addresses(self) -> list[str]:
        return [a for a in self.members if a not in self.down]
