"""The view half of SWIM (:class:`gossip.swim.Swim`): what one member holds of the others, and
the rules by which a record from elsewhere changes it.

* A record that is not news (an older incarnation, or at the same one a status that does not
  outrank what is held) changes nothing, and costs no signature check.
* An accusation (suspect or dead) names its accuser, whose signature it carries; each accuser
  counts once, and a death heard from others is a suspicion here, which this member's own
  timer and last probe must see through (:mod:`gossip.swim_probe`).
* The view, the update queue and the members new to us that one relayer may introduce are
  bounded; what is over is dropped and counted in ``refused``.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gossip.clock import Clock
from gossip.dissemination import UpdateQueue
from gossip.lifeguard import RelayerRate, suspicion_timeout_s
from gossip.swim_config import SwimConfig
from gossip.swim_messages import ACCUSATIONS, MemberRecord, Status, supersedes

__all__ = ["MemberTable"]

NodeId = str


@dataclass
class _Entry:
    """One member as this member judges it. ``record.status`` is this member's verdict, and
    ``record`` is always one that others can check: the member's own, or an accusation of it."""

    record: MemberRecord
    changed_at: float
    suspect_since: float | None = None
    accusers: set[NodeId] = field(default_factory=set)  # distinct, at this incarnation
    probed_at: float = -math.inf  # our last probe of it since it became suspect
    failed_at: float = -math.inf  # when our last probe of it failed
    expelled: bool = False  # revoked: never pinged again


class MemberTable:
    """The members one SWIM member knows, by id, with the indexes its timers need.

    A base of :class:`gossip.swim.Swim`, which provides the attributes declared here and the
    protocol's side: this member's own record (``me``) and its answer to records about itself.
    """

    node_id: NodeId
    cfg: SwimConfig
    clock: Clock
    rng: random.Random
    verify: Callable[[MemberRecord], bool] | None
    check_signature: Callable[[bytes, bytes, bytes], bool] | None

    def _init_table(self) -> None:
        self._members: dict[NodeId, _Entry] = {}
        # Indexes into _members, so that timers cost what the suspects and the departed number,
        # not what the swarm does (a simulator runs a thousand members in one process). _gone
        # is in the order members left the view, oldest first.
        self._suspects: dict[NodeId, None] = {}
        self._gone: dict[NodeId, None] = {}
        self._dissemination = UpdateQueue(self.cfg.max_pending)
        self._changes: list[MemberRecord] = []
        #: The round-robin probe order; a member back in the view is put in it at once.
        self._order: list[NodeId] = []
        #: Addresses of members just back from the dead (the protocol swaps states with them).
        self._revived: list[str] = []
        self._new_members = RelayerRate(
            self.cfg.new_members_per_s, self.cfg.new_members_burst, self.cfg.max_members
        )
        #: Records dropped because a signature did not hold.
        self.forged = 0
        #: Records dropped for other reasons, by reason.
        self.refused: Counter[str] = Counter()

    @property
    def me(self) -> MemberRecord:
        raise NotImplementedError

    def _about_me(self, record: MemberRecord) -> None:
        raise NotImplementedError

    def record(self, node_id: NodeId) -> MemberRecord | None:
        if node_id == self.node_id:
            return self.me
        entry = self._members.get(node_id)
        return entry.record if entry else None

    def live_members(self) -> list[MemberRecord]:
        """Alive and suspect members, this one included, by id."""
        others = [e.record for e in self._members.values() if e.record.live]
        return sorted([self.me, *others], key=lambda r: r.node_id)

    def records(self) -> list[MemberRecord]:
        """Everything this member knows and may pass on, dead and departed included (for a
        joiner, and a push-pull), by id; revoked members are left out."""
        known = [e.record for e in self._members.values() if not e.expelled]
        return sorted([self.me, *known], key=lambda r: r.node_id)

    def pending_updates(self) -> list[MemberRecord]:
        """Updates still waiting to be piggybacked (for tests and figures)."""
        return list(self._dissemination)

    def clear_updates(self) -> None:
        """Drop every update still waiting to be piggybacked: for a member that starts in a
        swarm long settled, where everyone knows what they say (a simulator's start)."""
        self._dissemination.clear()

    def drain_changes(self) -> list[MemberRecord]:
        """Records whose status, address, relays, pause or region changed since the last call (the
        node reacts)."""
        changes, self._changes = self._changes, []
        return changes

    def merge(self, records: Iterable[MemberRecord], relayer: NodeId | None = None) -> None:
        """Apply membership updates, from piggybacking or from a hello.

        Args:
            relayer: who passed them on; the members new to us that it may introduce are
                rate-limited. None: records this member asked for (the answer to its own hello).
        """
        # Members' own records first, so that an accusation in the same batch (a joiner's
        # first list) finds its accuser known.
        for record in sorted(records, key=lambda r: r.status in ACCUSATIONS):
            self._apply(record, relayer)

    def _apply(self, record: MemberRecord, relayer: NodeId | None, own: bool = False) -> None:
        if record.node_id == self.node_id:
            self._about_me(record)
            return
        entry = self._members.get(record.node_id)
        if entry is None:
            if record.live and self._room_for_newcomer(relayer) and self._admit(record, own):
                suspect = record.status is Status.SUSPECT
                self._set(_Entry(record, self.clock.now()), record, suspect)
            # else news of the end of a stranger: nothing to forget
            return
        if not self._news(entry, record):
            if (
                supersedes(entry.record, record)
                and record.node_id not in self._dissemination
                and self._admit(record, own)
            ):
                # Someone still spreads old news (a suspicion already refuted, say): spread the
                # newer record again, so the old one dies out instead of outliving the answer.
                self._gossip(entry.record)
            return
        if not self._admit(record, own):
            return
        if record.status not in ACCUSATIONS:
            self._set(entry, record, suspect=False)
        elif record.incarnation > entry.record.incarnation or entry.record.status is Status.ALIVE:
            # Hearsay of death is a suspicion here: our own timer must see it through.
            self._set(entry, replace(record, status=Status.SUSPECT), suspect=True)
        else:  # one more accuser of a suspect
            entry.accusers.add(record.accuser)
            self._gossip(replace(record, status=Status.SUSPECT))

    def _news(self, entry: _Entry, record: MemberRecord) -> bool:
        """Whether ``record`` could change what we hold (checked before any signature)."""
        old = entry.record
        if record.incarnation != old.incarnation:
            return record.incarnation > old.incarnation
        if record.status in ACCUSATIONS:
            if old.status is Status.ALIVE:
                return True
            return old.status is Status.SUSPECT and record.accuser not in entry.accusers
        return supersedes(record, old)

    def _set(self, entry: _Entry, record: MemberRecord, suspect: bool) -> None:
        """Hold ``record`` as our verdict on its member, spread it, and note a change."""
        previous = entry.record if entry.record is not record else None
        now = self.clock.now()
        new = _Entry(record, now, now if suspect else None, expelled=entry.expelled)
        if suspect:
            new.accusers.add(record.accuser)
        self._set_entry(new)
        self._gossip(record)
        if record.live and (previous is None or not previous.live):
            # Probed in this pass, not after the next reshuffle (SWIM §4.3 inserts a newcomer
            # at a random place in the list).
            self._order.insert(self.rng.randint(0, len(self._order)), record.node_id)
            if previous is not None and previous.status is Status.DEAD:
                # Back from the dead, likely from across a partition that healed: swap states
                # with it now, so that each side learns the other's news in bulk.
                self._revived.append(record.address)
        if (
            previous is None
            or previous.status != record.status
            or previous.address != record.address
            or previous.relays != record.relays
            or previous.paused != record.paused
            or previous.region != record.region
        ):
            self._changes.append(record)

    def _room_for_newcomer(self, relayer: NodeId | None) -> bool:
        if relayer is not None and not self._new_members.take(relayer, self.clock.now()):
            self.refused["new members over the relayer's rate"] += 1
            return False
        if len(self._members) >= self.cfg.max_members:
            if not self._gone:
                self.refused["view full"] += 1
                return False
            self._forget(next(iter(self._gone)))  # the member longest dead or departed
        return True

    def _admit(self, record: MemberRecord, own: bool = False) -> bool:
        """The hooks' verdict on a record; ``own``: an accusation this member just made."""
        if own:
            return True
        if self.verify is not None and not self.verify(record):
            self.forged += 1
            return False
        if record.status not in ACCUSATIONS or self.check_signature is None:
            return True
        if record.accuser in ("", record.node_id):
            self.forged += 1  # an accusation names its accuser, and nobody accuses itself
            return False
        accuser = self.record(record.accuser)
        if accuser is None:
            self.refused["accuser unknown"] += 1
            return False
        if (
            accuser.node_id != self.node_id
            and self.verify is not None
            and not self.verify(accuser)  # a revoked accuser counts for nothing
        ) or not self.check_signature(
            accuser.public_key, record.accusation(), record.accuser_signature
        ):
            self.forged += 1
            return False
        return True

    def _set_entry(self, entry: _Entry) -> None:
        node_id = entry.record.node_id
        self._members[node_id] = entry
        if entry.suspect_since is None:
            self._suspects.pop(node_id, None)
        else:
            self._suspects[node_id] = None
        if entry.record.live:
            self._gone.pop(node_id, None)
        elif node_id not in self._gone:
            self._gone[node_id] = None

    def _forget(self, node_id: NodeId) -> None:
        del self._members[node_id]
        self._gone.pop(node_id, None)
        self._suspects.pop(node_id, None)
        self._dissemination.discard(node_id)

    def _gossip(self, record: MemberRecord) -> None:
        n = len(self._members) + 1
        # Queued again at the back: among updates sent equally often, the older goes first.
        if not self._dissemination.push(record, self.cfg.retransmit_limit(n)):
            self.refused["update queue full"] += 1

    def _piggyback(self, to: NodeId = "") -> tuple[MemberRecord, ...]:
        """Our own record, then the least-sent updates; each use counts against its budget.

        A member we write to that we hold suspect or dead is told so first, so that it can
        refute at once (the "buddy system" of Lifeguard, Dadgar et al. 2018, §4.3; for the
        dead, that is how a partition heals).
        """
        chosen = self._dissemination.take(self.cfg.max_piggyback)
        out = [self.me]
        entry = self._members.get(to)
        told = entry is not None and entry.record.status in ACCUSATIONS
        if entry is not None and told:
            out.append(entry.record)
        out += [record for record in chosen if not (told and record.node_id == to)]
        return tuple(out)

    def expel(self, node_id: NodeId) -> None:
        """Declare ``node_id`` dead for good here (it was revoked): its record goes, and with
        a ``verify`` that refuses it, it cannot come back."""
        entry = self._members.get(node_id)
        if entry is not None and entry.record.live:
            record = replace(entry.record, status=Status.DEAD)
            self._set_entry(_Entry(record, self.clock.now(), expelled=True))
            self._changes.append(record)

    def _suspicion_deadline(self, entry: _Entry, n: int) -> float:
        """When ``entry``'s suspicion ends: the dogpile's timeout (Lifeguard §4.2) after it
        began, shorter for each other accuser."""
        low = self.cfg.suspicion_timeout_s(n)
        timeout = suspicion_timeout_s(
            low,
            low * self.cfg.suspicion_max_mult,
            len(entry.accusers) - 1,
            self.cfg.expected_confirmations(n),
        )
        return (entry.suspect_since or 0.0) + timeout
