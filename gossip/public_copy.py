"""The sending half of compressed gossip: node i's public copy x̂_i and the deltas that move it.

Sending (CHOCO-Gossip, Koloskova, Stich and Jaggi, ICML 2019, Algorithm 1): q = Q(x_i - x̂_i);
x̂_i += q; the same q goes to every neighbour with sequence number ``seq``. x̂_i moves only by
what was sent, so the compression error stays in x_i - x̂_i and is sent later: that is the error
feedback. With ``per_link`` there is a copy x̂_ij per link (:class:`LinkCopy`), which only j
replicates, so each link sends what it has not sent yet at its own pace.

Under ``auto`` this half also knows which codec each delta goes with: one for all links
(:meth:`PublicCopy.set_round_codec`) or one per link (:meth:`PublicCopy.set_link_codec`).

:class:`gossip.replicas.GossipState` builds on it with the receiving half (the replicas of the
neighbours' copies) and the mix of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gossip.codecs import AutoCodec, Codec, Encoded

__all__ = ["LinkCopy", "PublicCopy"]

NodeId = str


@dataclass
class LinkCopy:
    """x̂_ij, with a copy per link: what neighbour j believes x_i is."""

    value: torch.Tensor
    seq: int


class PublicCopy:
    """Node i's public copy x̂_i (or, with ``per_link``, one x̂_ij per link) and its log of deltas.

    Not thread-safe: the node calls it from one thread at a time.

    Args:
        initial: x_i at the start; the public copy starts equal to it.
        codec: the compression operator Q.
        generator: randomness for stochastic rounding (on ``initial``'s device).
        session: names this run's log of deltas; draw a new one at every start.
        per_link: keep a public copy per link (:meth:`make_link_delta`, :meth:`snapshot_for`).
            ``public`` is then x as the node's last round saw it (:meth:`note_model`): the
            reference of the guard and of the trigger, and the copy of a link not yet opened.
    """

    def __init__(
        self,
        initial: torch.Tensor,
        codec: Codec,
        generator: torch.Generator | None = None,
        session: int = 0,
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
        self.codec = codec
        self.generator = generator
        self.public = initial.detach().clone()
        self.session = session
        self.seq = 0

    @property
    def numel(self) -> int:
        return self.public.numel()

    @property
    def device(self) -> torch.device:
        return self.public.device

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

    def note_model(self, x: torch.Tensor) -> None:
        """With ``per_link``: x as this round saw it becomes ``public`` (see the class)."""
        self.public.copy_(x)

    def own(self, peer: NodeId) -> torch.Tensor:
        """The copy of this node that ``peer`` holds: x̂_ij with ``per_link``, else x̂_i."""
        copy = self.copies.get(peer)
        return self.public if copy is None else copy.value

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
