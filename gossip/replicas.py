"""Compressed gossip with error feedback: the replicas of the neighbours' copies and the mix.

Node i keeps its model x_i, a public copy x̂_i (what its neighbours believe x_i is) and a replica
x̂_j of each neighbour's public copy. This is CHOCO-Gossip (Koloskova, Stich and Jaggi, ICML 2019,
Algorithm 1), made asynchronous:

* sending: q = Q(x_i - x̂_i); x̂_i += q; the same q goes to every neighbour with sequence number
  ``seq``. x̂_i moves only by what was sent, so the compression error stays in x_i - x̂_i and is
  sent later: that is the error feedback.
* receiving q_j with ``seq = r + 1`` (r the replica's number): x̂_j += q_j. A replica is a
  replicated log of the sender's public copy and stays bit-identical to it; a gap, a sender never
  heard from, or a sender that restarted (a new ``session``) needs a snapshot of x̂_j (exact
  float32) before deltas apply again.
* mixing: x_i += γ Σ_j w_ij (x̂_j - x̂_i).

With ``per_link`` (the daemon's ``--pace link``) node i keeps a public copy x̂_ij per link
instead, which only j replicates (gossip/pairwise.py shows it in lock-step): a delta goes to one
neighbour, what a link did not send stays in x_i - x̂_ij for that link's next delta, so a slow
link carries the change of many rounds in one message while the fast ones keep their pace, and
the mix uses each link's own copy: x_i += γ Σ_j w_ij (x̂_ji - x̂_ij). The receiving side is the
same in both modes: a replica is the copy its sender keeps for this node.

Sending Q(x_i) itself instead, without the public copies, leaves a floor of quantization noise
that consensus never gets below (see tests/gossip/test_sync_gossip.py).

Three modules hold it:

* gossip/public_copy.py, the sending half: x̂_i (or x̂_ij), its deltas and the codec of each;
* this one, :class:`GossipState`: that half plus the peers, their replicas, the receiving of
  deltas and snapshots, and the mix;
* gossip/update_guard.py, what a neighbour's update must pass before it changes a replica
  (:class:`UpdateGuard`): besides its shape and finite values, a delta or snapshot may not put
  the replica absurdly far from this node's own public copy, since mixing would carry the
  node's model most of the way there; and the errors a refused message raises.

The guard's names and :class:`LinkCopy` are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gossip.clock import Clock
from gossip.codecs import Codec, CodecError, Encoded, NonFiniteError, all_finite
from gossip.public_copy import LinkCopy, PublicCopy
from gossip.update_guard import (
    GossipError,
    ImplausibleUpdate,
    SequenceGap,
    StaleSequence,
    UnknownPeer,
    UpdateGuard,
    agreeing_pair,
    relative_distance,
)

__all__ = [
    "GossipError",
    "GossipState",
    "ImplausibleUpdate",
    "LinkCopy",
    "Replica",
    "SequenceGap",
    "StaleSequence",
    "UnknownPeer",
    "UpdateGuard",
    "agreeing_pair",
    "relative_distance",
]

NodeId = str

#: Dropped peers' replicas kept for their return: a view flickers over one or two peers at a
#: time while members arrive, and each kept copy costs a model's size.
MAX_PARKED = 2


@dataclass
class Replica:
    """What this node knows of one neighbour's public copy."""

    value: torch.Tensor  # (numel,) float32, bit-identical to the sender's x̂ at ``seq``
    session: int
    seq: int
    last_heard: float
    step: int = 0
    degree: int = 0  # the sender's number of neighbours, as it last said
    codec: str = ""  # the codec of its last delta ("" before the first)
    #: Taken back from the parked copies (:meth:`GossipState.set_peers`) and not followed by
    #: a delta since: the sender's copy may have moved on meanwhile (rounds to its other
    #: neighbours), so the replica stays out of the mix until the sender's stream goes on from
    #: it (a delta in sequence) or replaces it (a snapshot).
    unconfirmed: bool = False


class GossipState(PublicCopy):
    """Node i's half of compressed gossip: its public copy (:class:`PublicCopy`, which sends)
    and the replicas of its neighbours' copies (which it receives), and the mix of the two.

    Not thread-safe: the node calls it from one thread at a time.

    Args:
        initial: x_i at the start; the public copy starts equal to it.
        codec: the compression operator Q.
        clock: where ``last_heard`` times come from.
        generator: randomness for stochastic rounding (on ``initial``'s device).
        session: names this run's log of deltas; draw a new one at every start.
        guard: what updates may do to a replica (None: anything finite; the daemon and the
            simulator both guard).
        per_link: keep a public copy per link (:meth:`make_link_delta`, :meth:`snapshot_for`).
            ``public`` is then x as the node's last round saw it (:meth:`note_model`): the
            reference of the guard and of the trigger, and the copy of a link not yet opened.
    """

    def __init__(
        self,
        initial: torch.Tensor,
        codec: Codec,
        clock: Clock,
        generator: torch.Generator | None = None,
        session: int = 0,
        guard: UpdateGuard | None = None,
        per_link: bool = False,
    ) -> None:
        super().__init__(initial, codec, generator, session, per_link)
        self.guard = guard
        #: The largest distance, in norms of x̂_i, that an accepted update put a replica at
        #: (how close honest traffic comes to ``guard.max_distance``).
        self.largest_move = 0.0
        self.clock = clock
        self.replicas: dict[NodeId, Replica] = {}
        self._peers: set[NodeId] = set()
        #: Replicas of peers that the view dropped, kept (oldest first, at most
        #: ``MAX_PARKED``, and no more than there are peers) in case the view takes them back:
        #: see :meth:`set_peers`.
        self._parked: dict[NodeId, Replica] = {}

    # -- peers --------------------------------------------------------------------------------

    @property
    def peers(self) -> frozenset[NodeId]:
        return frozenset(self._peers)

    def admit(self, peer: NodeId) -> None:
        """Accept messages from ``peer`` from now on (its first must be a snapshot)."""
        self._peers.add(peer)

    def forget(self, peer: NodeId) -> None:
        """Stop accepting ``peer`` and drop its replica."""
        self._peers.discard(peer)
        self.replicas.pop(peer, None)
        self.copies.pop(peer, None)
        self.link_codecs.pop(peer, None)

    def set_peers(self, peers: frozenset[NodeId]) -> frozenset[NodeId]:
        """Exchange with exactly ``peers``: forget the others, admit the new ones.

        A peer taken back gets its replica back as it was when the view dropped it. The sender
        cannot know that our view dropped it for a while (its own view may never have), so it
        sends no new snapshot: before training its link streams nothing at all, and a start
        that waits for every neighbour's copy would wait for that sender to train (issue 13's
        start-up stall). Anything the sender sent meanwhile was refused, which made it resync,
        and its snapshot replaces the copy; a delta that does not follow it is a gap, repaired
        the same way. But a sender whose view dropped us too sent us nothing while its copy
        moved on with its other links' rounds: a copy parked at start-up and taken back when
        members leave is the sender's model of seconds or minutes ago. So the copy comes back
        ``unconfirmed``, held (it counts for the start-up gate) but out of the mix until the
        sender's next delta follows it or its snapshot replaces it.

        Returns:
            The peers forgotten.
        """
        gone = frozenset(self._peers - peers)
        for peer in sorted(gone):
            replica = self.replicas.get(peer)
            self.forget(peer)
            if replica is not None:
                self._parked[peer] = replica
        for peer in peers - self._peers:
            self.admit(peer)
            parked = self._parked.pop(peer, None)
            if parked is not None:
                parked.unconfirmed = True
                self.replicas[peer] = parked
        while len(self._parked) > min(MAX_PARKED, len(self._peers)):  # each is a model's size
            del self._parked[next(iter(self._parked))]
        return gone

    def set_link_codecs(self, chosen: Mapping[NodeId, str]) -> None:
        """:meth:`set_link_codec` for each of ``chosen`` that is a peer now (a pick made
        for a link that has closed since is dropped)."""
        for peer, name in chosen.items():
            if peer in self._peers:
                self.set_link_codec(peer, name)

    # -- receiving ----------------------------------------------------------------------------

    def check_delta(self, peer: NodeId, session: int, seq: int, payload: Encoded) -> None:
        """Everything :meth:`receive_delta` checks before it decodes; raises on the first fault."""
        if peer not in self._peers:
            raise UnknownPeer(f"{peer} is not a peer of this node")
        if payload.numel != self.numel:
            raise CodecError(f"delta has {payload.numel} values, the model has {self.numel}")
        self.codec.validate(payload)
        replica = self.replicas.get(peer)
        if replica is None or replica.session != session:
            raise SequenceGap(peer, None, seq)
        if seq <= replica.seq:
            raise StaleSequence(f"delta seq {seq} from {peer} is not after {replica.seq}")
        if seq != replica.seq + 1:
            raise SequenceGap(peer, replica.seq + 1, seq)

    def receive_delta(
        self,
        peer: NodeId,
        session: int,
        seq: int,
        payload: Encoded,
        step: int = 0,
        degree: int = 0,
    ) -> int:
        """Apply q_j to the replica of ``peer``; returns the replica's new sequence number.

        Raises:
            UnknownPeer, SequenceGap, StaleSequence, CodecError: and nothing changes.
        """
        self.check_delta(peer, session, seq, payload)
        value = self.codec.decode(payload, self.device)  # validates values before any change
        replica = self.replicas[peer]
        value += replica.value  # into the decoded buffer: the replica changes only if finite
        if not all_finite(value):
            raise NonFiniteError(f"the delta from {peer} would overflow its replica")
        self._check_plausible(peer, value, "delta")
        replica.value = value
        replica.seq = seq
        replica.step = step
        replica.degree = degree
        replica.codec = payload.codec
        replica.last_heard = self.clock.now()
        replica.unconfirmed = False
        return seq

    def check_snapshot(self, peer: NodeId, session: int, seq: int, numel: int) -> None:
        if peer not in self._peers:
            raise UnknownPeer(f"{peer} is not a peer of this node")
        if numel != self.numel:
            raise CodecError(f"snapshot has {numel} values, the model has {self.numel}")
        replica = self.replicas.get(peer)
        if replica is not None and replica.session == session and seq < replica.seq:
            raise StaleSequence(f"snapshot seq {seq} from {peer} is older than {replica.seq}")

    def receive_snapshot(
        self,
        peer: NodeId,
        session: int,
        seq: int,
        values: torch.Tensor,
        step: int = 0,
        degree: int = 0,
    ) -> int:
        """Replace the replica of ``peer`` with its public copy at ``seq``.

        Raises:
            UnknownPeer, StaleSequence, CodecError: and nothing changes.
        """
        self.check_snapshot(peer, session, seq, values.numel())
        if values.dtype != torch.float32 or values.dim() != 1:
            raise CodecError("a snapshot is a flat float32 vector")
        if not all_finite(values):
            raise CodecError("snapshot holds non-finite values")
        self._check_plausible(peer, values, "snapshot")
        self._check_consistent(peer, values)
        self.replicas[peer] = Replica(
            values.to(self.device, copy=True), session, seq, self.clock.now(), step, degree
        )
        return seq

    def _check_plausible(self, peer: NodeId, values: torch.Tensor, what: str) -> None:
        guard = self.guard
        if guard is None:
            return
        ratio = guard.check_plausible(peer, values, self.public, what)
        self.largest_move = max(self.largest_move, ratio)

    def _check_consistent(self, peer: NodeId, values: torch.Tensor) -> None:
        """With ``guard.consistency``: :meth:`UpdateGuard.check_consistent` against the other
        neighbours' replicas."""
        guard = self.guard
        if guard is None or guard.consistency is None:
            return
        others = [r.value for p, r in self.replicas.items() if p != peer]
        guard.check_consistent(peer, values, self.public, others)

    def silent_for(self, peer: NodeId) -> float | None:
        """Seconds since ``peer`` was last heard from, or None if it never was."""
        replica = self.replicas.get(peer)
        return None if replica is None else self.clock.now() - replica.last_heard

    # -- mixing -------------------------------------------------------------------------------

    def consensus_step(
        self, x: torch.Tensor, gamma: float, weights: Mapping[NodeId, float]
    ) -> torch.Tensor:
        """x += γ Σ_j w_ij (x̂_j - x̂_i) (x̂_ij for x̂_i with ``per_link``), in place, over the
        neighbours in ``weights``.

        Neighbours without a replica are left out; their weight stays with x_i, so each row of
        the mixing matrix still sums to one. The sum runs in the order of the neighbours' ids,
        not of ``weights``: float sums depend on their order, and a dict built from a set
        follows the process's string hashing, so one seed gives one result in every process.

        Returns:
            x, updated in place.
        """
        pull = self.pull(weights)
        if pull is not None:
            x.add_(pull.to(x.dtype), alpha=gamma)
        return x

    def pull(self, weights: Mapping[NodeId, float]) -> torch.Tensor | None:
        """Σ_j w_ij (x̂_j - x̂_i) over the neighbours in ``weights`` that hold a replica, summed
        in the order of their ids; None when none takes part."""
        pull = torch.zeros_like(self.public)
        total = 0.0
        for peer in sorted(weights):
            w = weights[peer]
            replica = self.replicas.get(peer)
            if replica is None or w == 0.0:
                continue
            pull.add_(replica.value, alpha=w)
            if self.per_link:
                pull.add_(self.own(peer), alpha=-w)
            total += w
        if not total:
            return None
        return pull if self.per_link else pull.add_(self.public, alpha=-total)
