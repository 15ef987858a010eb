"""The failure-detector half of SWIM (:class:`gossip.swim.Swim`): probes, ping-reqs, nacks
and the end of suspicions.

Each probe period (stretched by the local health multiplier, Lifeguard §4.1) a member pings one
member; without an ack by the ping timeout it asks ``indirect_probes`` helpers to ping it too
and pings it once more itself; a helper whose own ping goes unanswered says so with a nack. A
probe with no ack by the end of its period accuses the target, signed. Suspects are probed too:
once soon after we hear of them (every other probe at most, so that the round robin that finds
crashes goes on), and once more shortly before the suspicion would end, which it does only if
that last probe failed as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gossip.lifeguard import LocalHealth
from gossip.swim_messages import Kind, MemberRecord, Outgoing, Status, SwimMessage
from gossip.swim_view import MemberTable, _Entry

__all__ = ["FailureDetector"]

NodeId = str


@dataclass
class _Probe:
    target: NodeId
    incarnation: int
    seq: int
    started: float
    timeout_s: float
    period_s: float
    indirect_sent: bool = False
    nacks: int = 0


@dataclass
class _Relay:
    """A ping sent on behalf of ``requester``, whose ack goes back to it under ``seq``."""

    requester_address: str
    seq: int
    target: NodeId
    nack_at: float
    expires: float
    nacked: bool = False


class FailureDetector(MemberTable):
    """A base of :class:`gossip.swim.Swim`, which provides the attributes declared here."""

    sign: Callable[[bytes], bytes] | None
    leaving: bool

    def _init_detector(self) -> None:
        self._probe: _Probe | None = None
        self._relays: dict[int, _Relay] = {}
        self._next_probe = self.clock.now()
        self._checked_last = False
        #: The local health multiplier (Lifeguard §4.1).
        self.health = LocalHealth(self.cfg.max_health)

    def _message(
        self, kind: Kind, address: str, seq: int, target: NodeId = "", to: NodeId = ""
    ) -> Outgoing:
        raise NotImplementedError

    def _next_seq(self) -> int:
        raise NotImplementedError

    # -- messages -----------------------------------------------------------------------------

    def _on_ping_req(self, msg: SwimMessage) -> list[Outgoing]:
        target = self.record(msg.target)
        if target is None or not target.live or target.node_id == self.node_id:
            return []
        seq = self._next_seq()
        now = self.clock.now()
        self._relays[seq] = _Relay(
            msg.sender_address,
            msg.seq,
            msg.target,
            now + self.cfg.ping_timeout_s,
            now + self.cfg.period_s,
        )
        return [self._message(Kind.PING, target.address, seq, to=target.node_id)]

    def _on_nack(self, msg: SwimMessage) -> None:
        probe = self._probe
        if probe is not None and msg.seq == probe.seq and msg.target == probe.target:
            probe.nacks += 1

    def _on_ack(self, msg: SwimMessage) -> list[Outgoing]:
        """An ack: for our own probe, or one we relay for someone else."""
        if self._probe is not None and msg.seq == self._probe.seq:
            self._probe = None
            self.health.apply(-1)
            return []
        relay = self._relays.pop(msg.seq, None)
        if relay is not None:
            return [self._message(Kind.ACK, relay.requester_address, relay.seq, relay.target)]
        return []

    # -- timers -------------------------------------------------------------------------------

    def _detector_tick(self, now: float) -> list[Outgoing]:
        out: list[Outgoing] = []
        probe = self._probe
        if probe is not None and not probe.indirect_sent and now >= probe.started + probe.timeout_s:
            probe.indirect_sent = True
            out += self._ping_reqs(probe)
        if probe is not None and now >= probe.started + probe.period_s:
            self._probe = None
            self._probe_failed(probe)
        if self._probe is None and now >= self._next_probe and not self.leaving:
            out += self._start_probe(now)
        for seq, relay in list(self._relays.items()):
            if not relay.nacked and now >= relay.nack_at:
                relay.nacked = True
                out.append(
                    self._message(Kind.NACK, relay.requester_address, relay.seq, relay.target)
                )
            if now >= relay.expires:
                del self._relays[seq]
        self._expire_suspicions(now)
        return out

    def _detector_deadlines(self) -> list[float]:
        times = [] if self.leaving else [self._next_probe]
        if self._probe is not None:
            if not self._probe.indirect_sent:
                times.append(self._probe.started + self._probe.timeout_s)
            times.append(self._probe.started + self._probe.period_s)
        times += [r.nack_at if not r.nacked else r.expires for r in self._relays.values()]
        n = len(self._members) + 1
        now = self.clock.now()
        lead_s = self._final_check_s()
        for entry in map(self._members.__getitem__, self._suspects):
            deadline = self._suspicion_deadline(entry, n)
            # A deadline passed waits for our last probe, whose own timers are above.
            times += [t for t in (deadline - lead_s, deadline) if t > now]
        return times

    def _accuse(self, entry: _Entry) -> None:
        """Our own probe of the member failed: accuse it, signed, and count ourselves."""
        if self.node_id in entry.accusers:
            return
        accusation = replace(
            entry.record, status=Status.SUSPECT, accuser=self.node_id, accuser_signature=b""
        )
        if self.sign is not None:
            accusation = replace(accusation, accuser_signature=self.sign(accusation.accusation()))
        self._apply(accusation, None, own=True)

    def _probe_failed(self, probe: _Probe) -> None:
        # No nack from any helper either says that our own messages get lost (Lifeguard
        # §4.1). One nack is proof enough that we hear: the helpers that did not nack may be
        # across a partition, and counting each (as memberlist does) slows the side that can
        # still talk to itself, which then heals late.
        if probe.nacks == 0:
            self.health.apply(1)
        entry = self._members.get(probe.target)
        if (
            entry is not None
            and entry.record.live
            and entry.record.incarnation == probe.incarnation
        ):
            self._accuse(entry)
            self._members[probe.target].failed_at = self.clock.now()

    def _start_probe(self, now: float) -> list[Outgoing]:
        period_s = self.health.scale(self.cfg.period_s)
        self._next_probe = now + period_s
        target = self._next_target()
        if target is None:
            return []
        timeout_s = self.health.scale(self.cfg.ping_timeout_s)
        self._probe = _Probe(
            target.node_id, target.incarnation, self._next_seq(), now, timeout_s, period_s
        )
        return [self._message(Kind.PING, target.address, self._probe.seq, to=target.node_id)]

    def _next_target(self) -> MemberRecord | None:
        """A suspect we have not probed yet or whose suspicion is about to end, else round
        robin over a shuffled list, reshuffled each pass (SWIM §4.3).

        Probing a suspect ourselves means its answer, which carries its refutation, reaches us
        directly instead of depending on gossip that may die out before it gets here; and a
        suspicion ends in death only after a last probe of our own failed too.
        """
        now = self.clock.now()
        n = len(self._members) + 1
        lead_s = self._final_check_s()
        final, first = [], []
        for entry in map(self._members.__getitem__, self._suspects):
            deadline = self._suspicion_deadline(entry, n)
            if entry.probed_at < deadline - lead_s <= now:
                final.append((deadline, entry))
            elif entry.probed_at == -math.inf:
                first.append((deadline, entry))
        # Final checks first; first checks every other probe at most, so that the round robin
        # that finds crashes is not starved when loss makes many suspects.
        due = final or (first if not self._checked_last else [])
        self._checked_last = bool(due)
        if due:
            _, entry = min(due, key=lambda d: d[0])
            entry.probed_at = now
            return entry.record
        for _ in range(2):
            while self._order:
                record = self.record(self._order.pop())
                if record is not None and record.live and record.node_id != self.node_id:
                    return record
            self._order = [e.record.node_id for e in self._members.values() if e.record.live]
            self.rng.shuffle(self._order)
        return None

    def _ping_reqs(self, probe: _Probe) -> list[Outgoing]:
        helpers = [
            e.record
            for e in self._members.values()
            if e.record.status is Status.ALIVE and e.record.node_id != probe.target
        ]
        chosen = self.rng.sample(helpers, min(self.cfg.indirect_probes, len(helpers)))
        out = [self._message(Kind.PING_REQ, h.address, probe.seq, probe.target) for h in chosen]
        # And the target itself once more, as memberlist's fallback ping does: a lost ping or
        # ack is the likeliest reason for the silence.
        target = self._members.get(probe.target)
        if target is not None:
            out.append(self._message(Kind.PING, target.record.address, probe.seq, to=probe.target))
        return out

    def _final_check_s(self) -> float:
        """How long before a suspicion ends we probe the suspect once more: time for the probe
        to fail before the deadline."""
        return 2 * self.health.scale(self.cfg.period_s)

    def _expire_suspicions(self, now: float) -> None:
        """A suspicion whose time is up ends in death, once our own last probe failed too."""
        n = len(self._members) + 1
        lead_s = self._final_check_s()
        for node_id in list(self._suspects):
            entry = self._members[node_id]
            deadline = self._suspicion_deadline(entry, n)
            # Dead only if our own last probe failed too; until then the suspect is due a
            # probe (_next_target), and the deadline waits for it.
            if now >= deadline and entry.failed_at >= deadline - lead_s:
                self._set(entry, replace(entry.record, status=Status.DEAD), suspect=False)
