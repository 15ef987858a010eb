"""Compressed gossip with error feedback: the public copy, the replicas and the consensus step.

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

What a neighbour sends is checked before it changes a replica (:class:`UpdateGuard`): besides
its shape and finite values, a delta or snapshot may not put the replica absurdly far from this
node's own public copy, since mixing would carry the node's model most of the way there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gossip.clock import Clock
from gossip.codecs import AutoCodec, Codec, CodecError, Encoded, NonFiniteError, all_finite

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


class GossipError(Exception):
    """A message the state machine refuses; the state is unchanged when it is raised."""


class UnknownPeer(GossipError):
    """The sender is not a peer this node exchanges with."""


class SequenceGap(GossipError):
    """The delta does not follow the replica (or there is no replica): a snapshot is needed."""

    def __init__(self, peer: NodeId, expected: int | None, got: int) -> None:
        self.peer, self.expected, self.got = peer, expected, got
        want = "a snapshot first" if expected is None else f"seq {expected}"
        super().__init__(f"gap in deltas from {peer}: expected {want}, got seq {got}")


class StaleSequence(GossipError):
    """The message is not newer than the replica: a duplicate or a replay."""


class ImplausibleUpdate(GossipError):
    """A delta or snapshot that would put a replica absurdly far from this node's public copy
    (or, with ``UpdateGuard.consistency``, a snapshot that agrees with no other neighbour)."""


@dataclass(frozen=True)
class UpdateGuard:
    """What a neighbour's delta or snapshot may do to its replica x̂_j, judged against this
    node's public copy x̂_i (which tracks its model x_i).

    The rule: ``||x̂_j' - x̂_i|| <= max_distance * max(||x̂_i||, floor_rms * sqrt(n))`` for the
    replica x̂_j' that the update would make. Why it holds for honest traffic: CHOCO keeps each
    x̂_j within a few rounds' movement of x_j, and x_j within the consensus distance of x_i, so
    honest neighbours are a small fraction of the model's norm apart (the largest ratio in
    measured runs of every codec is in bench/RESULTS.md); even a fresh node still at the initial
    model is within a few norms of a trained one. Why it matters: mixing moves x_i by
    γ·w_ij·(x̂_j − x̂_i), so a replica 32 norms away would move the model several times its own
    size in one round, and a replica of 1e38 (which is finite) would overflow it. The bound is
    relative to this node's own copy, never to the sender's earlier updates, so a sender cannot
    raise it by growing its replica step by step. Robust mixing (ClippedGossip) then limits what
    a neighbour within the bound can do.

    Args:
        max_distance: the bound, in norms of x̂_i.
        floor_rms: the norm used for a model that is (nearly) zero, per value.
        consistency: with robust mixing, a snapshot must also lie within this many norms of
            x̂_i or of another neighbour's replica, when there is one ("consistent with a second
            member"); None: no such check.
    """

    max_distance: float = 32.0
    floor_rms: float = 1e-2
    consistency: float | None = None

    def __post_init__(self) -> None:
        if not self.max_distance > 0 or not self.floor_rms > 0:
            raise ValueError("max_distance and floor_rms must be positive")
        if self.consistency is not None and not self.consistency > 0:
            raise ValueError("consistency must be positive")


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


@dataclass
class LinkCopy:
    """x̂_ij, with a copy per link: what neighbour j believes x_i is."""

    value: torch.Tensor
    seq: int


class GossipState:
    """Node i's half of compressed gossip.

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
        if initial.dim() != 1 or initial.dtype != torch.float32:
            raise ValueError("the gossiped vector must be flat float32")
        self.per_link = per_link
        #: x̂_ij by neighbour, with ``per_link`` (a link's copy starts at its first snapshot).
        self.copies: dict[NodeId, LinkCopy] = {}
        #: The codec each link sends with, by neighbour, under ``auto`` (its initial otherwise).
        self.link_codecs: dict[NodeId, str] = {}
        #: Under ``auto`` without ``per_link``: the one codec of the rounds (None: its initial).
        self.round_codec: str | None = None
        self.guard = guard
        #: The largest distance, in norms of x̂_i, that an accepted update put a replica at
        #: (how close honest traffic comes to ``guard.max_distance``).
        self.largest_move = 0.0
        self.codec = codec
        self.clock = clock
        self.generator = generator
        self.public = initial.detach().clone()
        self.session = session
        self.seq = 0
        self.replicas: dict[NodeId, Replica] = {}
        self._peers: set[NodeId] = set()
        #: Replicas of peers that the view dropped, kept (oldest first, at most
        #: ``MAX_PARKED``, and no more than there are peers) in case the view takes them back:
        #: see :meth:`set_peers`.
        self._parked: dict[NodeId, Replica] = {}

    @property
    def numel(self) -> int:
        return self.public.numel()

    @property
    def device(self) -> torch.device:
        return self.public.device

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
        start-up stall). The parked copy is still the sender's x̂: anything the sender sent
        meanwhile was refused, which made it resync, and its snapshot replaces the copy; a
        delta that does not follow it is a gap, repaired the same way.

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
                self.replicas[peer] = parked
        while len(self._parked) > min(MAX_PARKED, len(self._peers)):  # each is a model's size
            del self._parked[next(iter(self._parked))]
        return gone

    # -- sending ------------------------------------------------------------------------------

    def make_delta(self, x: torch.Tensor) -> tuple[int, Encoded]:
        """q = Q(x - x̂); x̂ += q. Returns the new sequence number and q's encoding.

        Raises:
            NonFiniteError: x holds NaN or infinity (nothing changes).
        """
        compressed = self._rounds_codec().compress(x - self.public, self.generator)
        self.public += compressed.value
        self.seq += 1
        return self.seq, compressed.encoded

    def snapshot(self) -> tuple[int, torch.Tensor]:
        """(seq, a copy of x̂ at seq): what a neighbour needs to (re)start its replica."""
        return self.seq, self.public.clone()

    def snapshot_for(self, peer: NodeId, x: torch.Tensor) -> tuple[int, torch.Tensor]:
        """What ``peer`` needs to (re)start its replica: :meth:`snapshot`, or with
        ``per_link`` the link's copy started afresh at ``x`` (exact, so its next delta is only
        what changes after it). Its seq is above any this session sent on any link, so a
        neighbour that kept an older replica of ours never finds it stale."""
        if not self.per_link:
            return self.snapshot()
        self.seq += 1  # with per_link, the highest seq of any link
        copy = LinkCopy(x.detach().clone(), self.seq)
        self.copies[peer] = copy
        return copy.seq, copy.value.clone()

    def make_link_delta(self, peer: NodeId, x: torch.Tensor) -> tuple[int, Encoded] | None:
        """With ``per_link``: q = Q(x - x̂_ij); x̂_ij += q, for ``peer`` alone. Returns the
        link's new seq and q's encoding; None before the link's first snapshot.

        Raises:
            NonFiniteError: x holds NaN or infinity (nothing changes).
        """
        copy = self.copies.get(peer)
        if copy is None:
            return None
        compressed = self.codec_for(peer).compress(x - copy.value, self.generator)
        copy.value += compressed.value
        copy.seq += 1
        self.seq = max(self.seq, copy.seq)
        return copy.seq, compressed.encoded

    def codec_for(self, peer: NodeId) -> Codec:
        """The codec the link to ``peer`` sends with: under ``auto`` its own, or without
        ``per_link`` the rounds' one; else the node's."""
        if not self.per_link:
            return self._rounds_codec()
        if isinstance(self.codec, AutoCodec):
            name = self.link_codecs.get(peer)
            return self.codec.initial if name is None else self.codec.member(name)
        return self.codec

    def _rounds_codec(self) -> Codec:
        """The codec of :meth:`make_delta`'s deltas: the node's, or auto's pick for the rounds
        (its initial before the first pick)."""
        if isinstance(self.codec, AutoCodec):
            name = self.round_codec
            return self.codec.initial if name is None else self.codec.member(name)
        return self.codec

    def set_link_codec(self, peer: NodeId, name: str) -> None:
        """Under ``auto`` with ``per_link``: the link to ``peer`` sends its next deltas with
        ``name``. No snapshot is owed: each delta names its codec, and the link's copy and the
        neighbour's replica of it move by the same decoded values whatever codec made them.

        Raises:
            ValueError: not ``auto`` with a copy per link, or a codec auto does not choose.
        """
        if not (self.per_link and isinstance(self.codec, AutoCodec)):
            raise ValueError("only auto with a copy per link sends a codec per link")
        self.codec.member(name)
        self.link_codecs[peer] = name

    def set_round_codec(self, name: str) -> None:
        """Under ``auto`` without ``per_link``: the next rounds' deltas, one for every link, go
        with ``name``. No snapshot is owed: each delta names its codec, and x̂ and every
        neighbour's replica of it move by the same decoded values whatever codec made them.

        Raises:
            ValueError: not ``auto`` with one public copy, or a codec auto does not choose.
        """
        if self.per_link or not isinstance(self.codec, AutoCodec):
            raise ValueError("only auto with one public copy sends one codec for all links")
        self.codec.member(name)
        self.round_codec = name

    def set_link_codecs(self, chosen: Mapping[NodeId, str]) -> None:
        """:meth:`set_link_codec` for each of ``chosen`` that is a peer now (a pick made
        for a link that has closed since is dropped)."""
        for peer, name in chosen.items():
            if peer in self._peers:
                self.set_link_codec(peer, name)

    def note_model(self, x: torch.Tensor) -> None:
        """With ``per_link``: x as this round saw it becomes ``public`` (see the class)."""
        self.public.copy_(x)

    def own(self, peer: NodeId) -> torch.Tensor:
        """The copy of this node that ``peer`` holds: x̂_ij with ``per_link``, else x̂_i."""
        copy = self.copies.get(peer)
        return self.public if copy is None else copy.value

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

    def _distance(self, values: torch.Tensor, to: torch.Tensor, floor_rms: float) -> float:
        """||values - to|| in norms of ``to`` (at least ``floor_rms`` per value)."""
        diff = float(torch.linalg.vector_norm(values.to(to.device) - to))
        floor = floor_rms * math.sqrt(max(to.numel(), 1))
        return diff / max(float(torch.linalg.vector_norm(to)), floor)

    def _check_plausible(self, peer: NodeId, values: torch.Tensor, what: str) -> None:
        guard = self.guard
        if guard is None:
            return
        ratio = self._distance(values, self.public, guard.floor_rms)
        if not ratio <= guard.max_distance:  # also refuses NaN, which compares false
            raise ImplausibleUpdate(
                f"the {what} from {peer} would put its replica {ratio:.3g} times our model's "
                f"norm away from our model (at most {guard.max_distance:g})"
            )
        self.largest_move = max(self.largest_move, ratio)

    def _check_consistent(self, peer: NodeId, values: torch.Tensor) -> None:
        """With ``guard.consistency``: a snapshot must agree with this node's copy or with
        another neighbour's replica, when there is another to agree with."""
        guard = self.guard
        limit = guard.consistency if guard is not None else None
        if guard is None or limit is None:
            return
        others = [r.value for p, r in self.replicas.items() if p != peer]
        if not others:
            return
        refs = [self.public, *others]
        if any(self._distance(values, ref, guard.floor_rms) <= limit for ref in refs):
            return
        raise ImplausibleUpdate(
            f"the snapshot from {peer} is more than {limit:g} norms from our model and from "
            f"each of our {len(others)} other neighbours' models"
        )

    def restart(self, values: torch.Tensor, session: int) -> None:
        """Start a new log from ``values`` (a joiner that pulled the swarm's model): x̂ becomes
        ``values`` and neighbours resync with a snapshot, since the session changed."""
        if values.shape != self.public.shape or values.dtype != torch.float32:
            raise ValueError("restart values must be the flat float32 vector gossip moves")
        self.public.copy_(values)
        # A link's copy stays until its resync: the neighbour refuses the next delta, of the
        # new session, and the snapshot that repairs it starts the copy afresh.
        self.session = session
        self.seq = 0

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


def relative_distance(a: torch.Tensor, b: torch.Tensor, floor_rms: float = 1e-2) -> float:
    """||a - b|| over the larger of the two norms (at least ``floor_rms`` per value)."""
    floor = floor_rms * math.sqrt(max(a.numel(), 1))
    scale = max(float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b)), floor)
    return float(torch.linalg.vector_norm(a - b)) / scale


def agreeing_pair(
    models: list[torch.Tensor], tolerance: float = 0.5, floor_rms: float = 1e-2
) -> tuple[int, int] | None:
    """The first two of ``models`` (by the later one's place, then the earlier's) that agree:
    within ``tolerance`` of the larger norm of the two. None when no two do.

    A joiner adopts a pulled model only once a second member's agrees with it: honest members
    hold models a consensus distance apart, a few percent of their norm, while a poisoned one
    (1e38 everywhere, a scaled or sign-flipped copy) is at least about its own norm from any
    honest one. One poisoner among the members asked cannot make two models agree.
    """
    for j in range(1, len(models)):
        for i in range(j):
            if relative_distance(models[i], models[j], floor_rms) <= tolerance:
                return i, j
    return None
