"""Push-sum (ratio consensus) over directed links, kept exact under message loss by running sums.

Node i holds a mass: a numerator x_i (a vector) and a weight w_i (a number); its estimate of the
mean is z_i = x_i / w_i. A round sends to peers P: x_i and w_i split into |P| + 1 equal parts, one
kept and one to each peer; a receiver adds what arrives. Nothing needs to come back in the same
round, so the links may be directed (a one-peer graph, an epidemic draw, a link much slower one
way), and Σ x and Σ w never change: Σ_i z_i w_i / Σ_i w_i stays the initial mean while every z_i
converges to it (Kempe, Dobra and Gehrke, 2003; SGP, Assran et al., 2019, trains on it).

A lost message would lose its mass, and with it the mean. So each directed link is a replicated
log, as a CHOCO replica is (gossip/replicas.py): the sender keeps σ_ij, everything it ever put on
the link, and the receiver ρ_ij, everything it took from it (Hadjicostis, Vaidya and
Domínguez-García's running sums). A message carries its increment and a sequence number; one that
does not follow the last (a message was lost) is refused, and the sender answers with its running
sums, from which the receiver takes σ_ij − ρ_ij: exactly the mass the lost messages carried. A
duplicate or an older message changes nothing. Between a loss and its resync the missing mass is
*in flight* (:func:`in_flight`): Σ_i x_i plus it is the initial total at every moment.

The running sums are float64 whatever the model's dtype, so that they stay exact to 1e-16 of
their size over millions of rounds; what travels each round is the increment alone.

Pure and synchronous, as the rest of the core: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "PushGap",
    "PushMessage",
    "PushResync",
    "PushSum",
    "PushSumError",
    "in_flight",
]

NodeId = str


class PushSumError(Exception):
    """A message refused; the state is unchanged when it is raised."""


class PushGap(PushSumError):
    """The message does not follow the link's last one: the sender's running sums are needed."""

    def __init__(self, sender: NodeId, expected: int, got: int) -> None:
        self.sender, self.expected, self.got = sender, expected, got
        super().__init__(f"gap on the link from {sender}: expected seq {expected}, got {got}")


@dataclass(frozen=True)
class PushMessage:
    """One round's share on the link ``sender`` → ``to``."""

    sender: NodeId
    to: NodeId
    seq: int
    value: torch.Tensor
    weight: float

    @property
    def nbytes(self) -> int:
        """What the share takes on the wire: its values and the weight (a float64)."""
        return self.value.numel() * self.value.element_size() + 8


@dataclass(frozen=True)
class PushResync:
    """The link's running sums at ``seq``: what the sender has put on it in all."""

    sender: NodeId
    to: NodeId
    seq: int
    value: torch.Tensor  # float64
    weight: float

    @property
    def nbytes(self) -> int:
        return self.value.numel() * 8 + 8


@dataclass
class _Link:
    seq: int
    value: torch.Tensor  # float64 running sum
    weight: float


class PushSum:
    """Node i's half of push-sum.

    Args:
        node: this node's id, stamped on what it sends.
        initial: x_i at the start (flat, float32 or float64); the estimate starts equal to it.
        weight: w_i at the start (1 for the plain mean).
    """

    def __init__(self, node: NodeId, initial: torch.Tensor, weight: float = 1.0) -> None:
        if initial.dim() != 1 or initial.dtype not in (torch.float32, torch.float64):
            raise ValueError("push-sum moves a flat float32 or float64 vector")
        if not weight > 0:
            raise ValueError(f"weight is {weight}: expected a positive number")
        self.node = node
        self.value = initial.detach().clone() * weight
        self.weight = float(weight)
        self._out: dict[NodeId, _Link] = {}
        self._in: dict[NodeId, _Link] = {}

    def _zero(self) -> torch.Tensor:
        return torch.zeros(self.value.numel(), dtype=torch.float64, device=self.value.device)

    def estimate(self) -> torch.Tensor:
        """z_i = x_i / w_i: this node's model."""
        return self.value / self.weight

    def local_change(self, delta: torch.Tensor) -> None:
        """The model z_i moved by ``delta`` (a training step): x_i += w_i · delta."""
        self.value.add_(delta.to(self.value.dtype), alpha=self.weight)

    # -- sending ------------------------------------------------------------------------------

    def send(self, peers: Sequence[NodeId]) -> list[PushMessage]:
        """Split the mass in ``len(peers) + 1`` parts; keep one, return one message per peer."""
        peers = list(dict.fromkeys(p for p in peers if p != self.node))
        if not peers:
            return []
        share = self.value / (len(peers) + 1)
        share_w = self.weight / (len(peers) + 1)
        messages = []
        for peer in peers:
            link = self._out.get(peer)
            if link is None:
                link = self._out[peer] = _Link(0, self._zero(), 0.0)
            link.seq += 1
            link.value += share
            link.weight += share_w
            messages.append(PushMessage(self.node, peer, link.seq, share.clone(), share_w))
            self.value -= share
            self.weight -= share_w
        return messages

    def resync(self, peer: NodeId) -> PushResync:
        """The running sums of the link to ``peer``, for a receiver that refused a gap."""
        link = self._out.get(peer)
        if link is None:
            return PushResync(self.node, peer, 0, self._zero(), 0.0)
        return PushResync(self.node, peer, link.seq, link.value.clone(), link.weight)

    # -- receiving ----------------------------------------------------------------------------

    def _link_in(self, sender: NodeId) -> _Link:
        link = self._in.get(sender)
        if link is None:
            link = self._in[sender] = _Link(0, self._zero(), 0.0)
        return link

    def receive(self, message: PushMessage) -> bool:
        """Add a share. False (nothing changes) for a duplicate or an older message.

        Raises:
            PushGap: a message before it was lost; apply the sender's :meth:`resync`.
            PushSumError: a message for another node, of the wrong size or not finite.
        """
        self._check(message.to, message.value, message.weight)
        link = self._link_in(message.sender)
        if message.seq <= link.seq:
            return False
        if message.seq != link.seq + 1:
            raise PushGap(message.sender, link.seq + 1, message.seq)
        link.seq = message.seq
        link.value += message.value
        link.weight += message.weight
        self.value += message.value.to(self.value.dtype)
        self.weight += message.weight
        return True

    def receive_resync(self, resync: PushResync) -> bool:
        """Take what the link carried that never arrived: σ − ρ. False for an older one."""
        self._check(resync.to, resync.value, resync.weight)
        link = self._link_in(resync.sender)
        if resync.seq <= link.seq:
            return False
        missing = resync.value.to(torch.float64) - link.value
        self.value += missing.to(self.value.dtype)
        self.weight += resync.weight - link.weight
        link.seq, link.value, link.weight = (
            resync.seq,
            resync.value.to(torch.float64),
            resync.weight,
        )
        return True

    def _check(self, to: NodeId, value: torch.Tensor, weight: float) -> None:
        if to != self.node:
            raise PushSumError(f"a message for {to} reached {self.node}")
        if value.dim() != 1 or value.numel() != self.value.numel():
            raise PushSumError(
                f"a share of {value.numel()} values; the model has {self.value.numel()}"
            )
        if not (weight >= 0 and bool(torch.isfinite(value).all()) and weight < float("inf")):
            raise PushSumError("a share with a negative or non-finite weight or values")

    # -- accounting ---------------------------------------------------------------------------

    def sent_on(self, peer: NodeId) -> tuple[int, torch.Tensor, float]:
        """(seq, σ, σ_w) of the link to ``peer`` (zeros before its first message)."""
        link = self._out.get(peer)
        return (0, self._zero(), 0.0) if link is None else (link.seq, link.value, link.weight)

    def taken_from(self, sender: NodeId) -> tuple[int, torch.Tensor, float]:
        """(seq, ρ, ρ_w) of the link from ``sender``."""
        link = self._in.get(sender)
        return (0, self._zero(), 0.0) if link is None else (link.seq, link.value, link.weight)

    @property
    def out_links(self) -> frozenset[NodeId]:
        return frozenset(self._out)


def in_flight(nodes: Mapping[NodeId, PushSum] | Iterable[PushSum]) -> tuple[torch.Tensor, float]:
    """Σ over every link of σ − ρ: the mass sent and not yet taken (float64), and its weight."""
    states = list(nodes.values()) if isinstance(nodes, Mapping) else list(nodes)
    if not states:
        return torch.zeros(0, dtype=torch.float64), 0.0
    by_id = {s.node: s for s in states}
    value = torch.zeros(states[0].value.numel(), dtype=torch.float64)
    weight = 0.0
    for s in states:
        for peer in s.out_links:
            _, sent, sent_w = s.sent_on(peer)
            value += sent.cpu()
            weight += sent_w
            receiver = by_id.get(peer)
            if receiver is not None:  # else all of it is in flight
                _, taken, taken_w = receiver.taken_from(s.node)
                value -= taken.cpu()
                weight -= taken_w
    return value, weight
