"""SWIM membership: who is in the swarm, without a coordinator.

A pure state machine after Das, Gupta and Motivala, "SWIM: Scalable Weakly-consistent
Infection-style Process Group Membership Protocol" (DSN 2002), with the suspicion mechanism of
its §4.2 and Lifeguard's refinements (Dadgar et al. 2018; see :mod:`gossip.lifeguard`):

* every probe period a member pings the next member of a shuffled round-robin list (§4.3);
* without an ack within the ping timeout it asks ``indirect_probes`` others to ping the target
  for it (ping-req), and pings it once more; a helper whose own ping goes unanswered says so
  (a nack);
* without any ack by the end of the period, the prober *accuses* the target: a suspicion,
  signed by the accuser, that spreads; a suspect that does not refute in time is dead to the
  member that holds the suspicion, after a timeout that shrinks with each other accuser
  (Lifeguard §4.2) and once a last probe of its own has failed too; the probe period and
  timeout stretch while this member itself misses acks (Lifeguard §4.1);
* a member refutes a suspicion of itself by raising its incarnation number;
* membership updates ride on every message (piggybacking), each sent about
  ``retransmit_mult * log10(n + 1)`` times.

Two mechanisms heal what gossip misses (memberlist and Serf do the same): every push-pull period
a member swaps its whole state with a random member, and now and then with one it holds dead (a
reconnect), until that one is forgotten. So a partition ends in one view: a reconnect tells a
member on the other side that it is believed dead, it refutes, and the answer carries the
refutation and its side's view back.

Accusations name their accuser, and a member counts each accuser once. Hearsay never kills: a
member that hears that another is dead takes it as one more suspicion, which its own timer must
see through, so one insider that re-sends death notices cannot keep a live member out of a view
while the member refutes. A record that is not news (by incarnation, then status) changes
nothing. What a member holds is bounded: the view (``max_members``), the update queue
(``max_pending``), the records taken from one message, and the members new to us that one
relayer may introduce per second; what is over is dropped and counted in :attr:`Swim.refused`.

The machine does no I/O: :meth:`Swim.tick` and :meth:`Swim.receive` return the messages to send,
and time comes from an injected clock. A node that leaves says so (``left``), which spreads like
death but is never suspected first. The view's rules live in :mod:`gossip.swim_view`, the
probes in :mod:`gossip.swim_probe`, the statuses and messages in :mod:`gossip.swim_messages`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gossip.clock import Clock
from gossip.swim_config import SwimConfig
from gossip.swim_messages import (
    ACCUSATIONS,
    FULL_STATE,
    LIVE,
    Kind,
    MemberRecord,
    Outgoing,
    Status,
    SwimMessage,
    supersedes,
)
from gossip.swim_probe import FailureDetector

__all__ = [
    "ACCUSATIONS",
    "LIVE",
    "Kind",
    "MemberRecord",
    "Outgoing",
    "Status",
    "Swim",
    "SwimConfig",
    "SwimMessage",
    "supersedes",
]

NodeId = str


@dataclass
class Swim(FailureDetector):
    """One member's view and its part in the protocol.

    Args:
        node_id, address: this member.
        incarnation: where this member's incarnation starts; a member that restarts must start
            above any incarnation it had before (the node uses its start time in milliseconds).
        rng: drives the probe order and the choice of helpers (seeded in tests).
    """

    node_id: NodeId
    address: str
    incarnation: int
    cfg: SwimConfig
    clock: Clock
    rng: random.Random = field(default_factory=random.Random)
    #: Signs this member's own records and accusations (with the key whose hash is its id).
    sign: Callable[[bytes], bytes] | None = None
    public_key: bytes = b""
    #: The CA's certificate for this member's key (DER), carried on its own records.
    certificate: bytes = b""
    #: Admits a record (its member's signature, and whatever else the node requires); every
    #: record passes through it, and those that fail are dropped (None: take all).
    verify: Callable[[MemberRecord], bool] | None = None
    #: Checks an accuser's signature: (its public key, the signed bytes, the signature). When
    #: set, an accusation must name a member we know and carry its signature; None: accusations
    #: are taken as they come (tests, the simulator).
    check_signature: Callable[[bytes, bytes, bytes], bool] | None = None
    #: Members that forward for this one when nobody can dial it (see MemberRecord.relays).
    relays: tuple[str, ...] = ()
    #: Paused: out of the topology, still a member (see MemberRecord.paused).
    paused: bool = False
    #: This member's region (see MemberRecord.region); fixed for the life of the process.
    region: str = ""

    def __post_init__(self) -> None:
        self._init_table()
        self._init_detector()
        now = self.clock.now()
        self._seq = 0
        # Staggered, so that members started together do not reconnect and swap in step.
        self._next_reconnect = now + self.cfg.reconnect_interval_s * self.rng.random()
        self._next_push_pull = now + self.cfg.push_pull_interval_s * self.rng.random()
        self._revival_push_pull_at = -math.inf
        self._refuted_at = -math.inf
        self.leaving = False
        #: Messages and piggybacked records sent, for traffic figures.
        self.sent_messages = 0
        self._signed: tuple[MemberRecord, MemberRecord] | None = None

    @property
    def me(self) -> MemberRecord:
        status = Status.LEFT if self.leaving else Status.ALIVE
        record = MemberRecord(
            self.node_id,
            self.address,
            self.incarnation,
            status,
            relays=self.relays,
            paused=self.paused,
            region=self.region,
        )
        if self.sign is None:
            return record
        if self._signed is None or self._signed[0] != record:  # signing is slow: once per change
            signed = replace(
                record,
                public_key=self.public_key,
                signature=self.sign(record.claim()),
                certificate=self.certificate,
            )
            self._signed = (record, signed)
        return self._signed[1]

    def set_relays(self, relays: tuple[str, ...]) -> bool:
        """Say that this member is reached through ``relays`` (none: directly), at a new
        incarnation so that the record supersedes the old one everywhere; it spreads as a
        refutation does, at the head of every message. Returns whether anything changed."""
        if relays == self.relays:
            return False
        self.relays = relays
        self.incarnation += 1
        return True

    def set_paused(self, paused: bool) -> bool:
        """Say that this member is paused (or no longer), at a new incarnation, as
        :meth:`set_relays` does. Returns whether anything changed."""
        if paused == self.paused:
            return False
        self.paused = paused
        self.incarnation += 1
        return True

    def _about_me(self, record: MemberRecord) -> None:
        if self.leaving or record.status is Status.ALIVE:
            return
        if record.incarnation > self.incarnation:
            # Only this member raises its incarnation: nobody knows one above it.
            self.refused["about us, from our future"] += 1
            return
        if record.incarnation < self.incarnation or not self._admit(record):
            return
        # Refute (SWIM §4.2): a newer incarnation of "alive" overrides the suspicion. It
        # needs no place in the update queue: every message starts with our own record.
        self.incarnation += 1
        now = self.clock.now()
        if now >= self._refuted_at + self.cfg.period_s:
            # Being suspected hints that we are slow (Lifeguard §4.1); counted once a period,
            # so that one accuser cannot push our probes to their slowest.
            self.health.apply(1)
            self._refuted_at = now

    def _message(
        self, kind: Kind, address: str, seq: int, target: NodeId = "", to: NodeId = ""
    ) -> Outgoing:
        self.sent_messages += 1
        updates = self._full_state() if kind in FULL_STATE else self._piggyback(to)
        return Outgoing(
            address, SwimMessage(kind, self.node_id, self.address, seq, target, updates)
        )

    def _full_state(self) -> tuple[MemberRecord, ...]:
        """What a push-pull carries: everything, or where that is over ``max_push_pull``, this
        member, then a random share of the live members, then of the others (another share
        each time, so that repeated push-pulls cover the view)."""
        records = self.records()
        room = self.cfg.max_push_pull
        if len(records) <= room:
            return tuple(records)
        others = [r for r in records if r.node_id != self.node_id]
        live = [r for r in others if r.live]
        gone = [r for r in others if not r.live]
        self.rng.shuffle(live)
        self.rng.shuffle(gone)
        return (self.me, *[*live, *gone][: room - 1])

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- the protocol -------------------------------------------------------------------------

    def receive(self, msg: SwimMessage) -> list[Outgoing]:
        """Handle one message; returns the messages it causes."""
        limit = self.cfg.max_push_pull if msg.kind in FULL_STATE else self.cfg.max_piggyback + 2
        if len(msg.updates) > limit:
            self.refused["records over a message's limit"] += len(msg.updates) - limit
        self.merge(msg.updates[:limit], relayer=msg.sender)
        if msg.kind is Kind.PING:
            return [self._message(Kind.ACK, msg.sender_address, msg.seq, self.node_id, msg.sender)]
        if msg.kind is Kind.PING_REQ:
            return self._on_ping_req(msg)
        if msg.kind is Kind.PUSH_PULL:
            return [self._message(Kind.PUSH_PULL_REPLY, msg.sender_address, msg.seq)]
        if msg.kind is Kind.NACK:
            self._on_nack(msg)
        elif msg.kind is Kind.ACK:
            return self._on_ack(msg)
        return []

    def tick(self) -> list[Outgoing]:
        """Advance timers: probes, indirect probes, nacks, suspicion timeouts, reconnects and
        push-pulls. Returns what to send."""
        now = self.clock.now()
        out = self._detector_tick(now)
        if not self.leaving:
            out += self._reconnect(now) + self._push_pull(now)
            if self._revived and now >= self._revival_push_pull_at + self.cfg.period_s:
                self._revival_push_pull_at = now
                out.append(self._message(Kind.PUSH_PULL, self._revived[-1], self._next_seq()))
        self._revived.clear()
        for node_id in list(self._gone):  # oldest first
            if now < self._members[node_id].changed_at + self.cfg.forget_after_s:
                break
            self._forget(node_id)
        return out

    def _reconnect(self, now: float) -> list[Outgoing]:
        """Push-pull with one member we hold dead, now and then: it may be back, or on the far
        side of a partition that has healed (Serf rejoins failed members the same way). Each
        member does so with probability dead / live, so that swarm-wide each dead member gets
        about one attempt per interval, as in Serf.

        A push-pull, not a ping: each side learns what the other holds of it and of everyone
        it knows, so both sides' members are suspected where they were dead, probed, and
        refute, instead of waiting to meet one by one."""
        if now < self._next_reconnect:
            return []
        self._next_reconnect = now + self.cfg.reconnect_interval_s
        dead = [
            e.record
            for e in map(self._members.__getitem__, self._gone)
            if e.record.status is Status.DEAD and not e.expelled
        ]
        live = len(self._members) - len(self._gone)
        if not dead or self.rng.random() >= len(dead) / max(live, 1):
            return []
        target = self.rng.choice(dead)
        return [self._message(Kind.PUSH_PULL, target.address, self._next_seq())]

    def _push_pull(self, now: float) -> list[Outgoing]:
        """Swap whole states with a random live member (memberlist's push-pull): it repairs
        whatever piggybacking missed, and tells each side what the other holds of it."""
        if now < self._next_push_pull:
            return []
        n = len(self._members) + 1
        self._next_push_pull = now + self.cfg.push_pull_period_s(n)
        alive = [e.record for e in self._members.values() if e.record.status is Status.ALIVE]
        if not alive:
            return []
        partner = self.rng.choice(alive)
        return [self._message(Kind.PUSH_PULL, partner.address, self._next_seq())]

    def next_deadline(self) -> float:
        """The next time :meth:`tick` has something to do."""
        times = [math.inf, *self._detector_deadlines()]
        if not self.leaving:
            times += [self._next_reconnect, self._next_push_pull]
            if self._revived:
                times.append(self._revival_push_pull_at + self.cfg.period_s)
        return min(times)

    def ping(self, address: str) -> Outgoing:
        """A ping outside the probe schedule (to check an address someone gave); its ack is
        ignored, but the call that carries it shows whether, and who, answers there."""
        return self._message(Kind.PING, address, self._next_seq())

    def leave(self, fanout: int, first: Iterable[NodeId] = ()) -> list[Outgoing]:
        """Announce departure to the members in ``first`` and to others, ``fanout`` in all
        (or every live member if fewer); then stop probing."""
        self.leaving = True
        live = {e.record.node_id: e.record for e in self._members.values() if e.record.live}
        chosen = [live[i] for i in first if i in live]
        rest = [r for i, r in live.items() if i not in set(first)]
        chosen += self.rng.sample(rest, max(0, min(fanout - len(chosen), len(rest))))
        self._dissemination.clear()
        return [self._message(Kind.PING, r.address, self._next_seq()) for r in chosen]
