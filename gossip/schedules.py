"""Time-varying peer schedules: whom a node sends to at round r, from the round and the view alone.

Both are directed: the sender picks its peers and the receiver takes whatever arrives, so they
pair with push-sum (gossip/pushsum.py), which keeps the mean when nobody sends back.

* **one-peer exponential** (Ying, Yuan, Chen, Hu, Pan and Yin, NeurIPS 2021): with the view on a
  ring in sorted order and τ = ⌈log2 n⌉, node i sends at round r to i + 2^(r mod τ) and, in the
  synchronous schedule, hears from i − 2^(r mod τ); each keeps half of its mass and sends half.
  Every round's mixing matrix is a circulant with two halves, so doubly stochastic, and for n a
  power of two the product of any τ consecutive rounds is exactly 11ᵀ/n: exact averaging in
  log2 n rounds with one message per node per round. For other n it is not exact, and the error
  falls by the second largest singular value of the τ-round product per τ rounds
  (:func:`one_peer_contraction` computes it; tests/gossip/test_schedules.py checks the rate).
* **epidemic** (Vos, Farhadkhani, Guerraoui, Kermarrec, Pires and Sharma, 2023, "EL-Oracle"):
  node i sends at round r to ``fanout`` peers drawn uniformly from the view, from a hash of a
  swarm-wide seed, i and r, so a draw is reproducible anywhere and differs between nodes and
  rounds.

Any two members that hold the same view agree on every node's peers at every round without a
word: there is no coordinator, and a receiver can check that a sender's round names it.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

import torch

__all__ = [
    "SCHEDULES",
    "epidemic_peers",
    "one_peer_contraction",
    "one_peer_matrix",
    "one_peer_offset",
    "one_peer_peer",
    "peers_at",
]

NodeId = str

SCHEDULES = ("one-peer-exponential", "epidemic")


def _order(view: Iterable[NodeId]) -> tuple[NodeId, ...]:
    order = tuple(sorted(set(view)))
    if not order:
        raise ValueError("a schedule needs at least one node")
    return order


def _period(n: int) -> int:
    """τ = ⌈log2 n⌉ (1 for n ≤ 2)."""
    return max(1, (n - 1).bit_length())


def one_peer_offset(n: int, round_: int) -> int:
    """2^(round mod τ): how far along the ring a node's peer is at ``round_``."""
    if n < 1 or round_ < 0:
        raise ValueError(f"need n ≥ 1 and round ≥ 0, got n={n}, round={round_}")
    return 1 << (round_ % _period(n))


def one_peer_peer(view: Iterable[NodeId], node: NodeId, round_: int) -> NodeId | None:
    """The peer ``node`` sends to at ``round_`` (None when it is alone)."""
    order = _order(view)
    n = len(order)
    if n < 2:
        return None
    pos = order.index(node)
    return order[(pos + one_peer_offset(n, round_)) % n]


def epidemic_peers(
    view: Iterable[NodeId], node: NodeId, round_: int, fanout: int, seed: int = 0
) -> tuple[NodeId, ...]:
    """The ``fanout`` peers (fewer when the view is smaller) ``node`` sends to at ``round_``,
    sorted: a uniform draw without replacement from the others in the view."""
    if fanout < 1:
        raise ValueError(f"fanout is {fanout}: expected at least 1")
    order = _order(view)
    others = [j for j in order if j != node]
    key = hashlib.blake2b(f"{seed}\0{node}\0{round_}".encode(), digest_size=8).digest()
    rng = random.Random(int.from_bytes(key, "big"))
    return tuple(sorted(rng.sample(others, min(fanout, len(others)))))


def peers_at(
    kind: str, view: Iterable[NodeId], node: NodeId, round_: int, *, fanout: int = 1, seed: int = 0
) -> tuple[NodeId, ...]:
    """The peers of ``node`` at ``round_`` under the schedule ``kind`` (one of
    :data:`SCHEDULES`)."""
    if kind == "one-peer-exponential":
        peer = one_peer_peer(view, node, round_)
        return () if peer is None else (peer,)
    if kind == "epidemic":
        return epidemic_peers(view, node, round_, fanout, seed)
    raise ValueError(f"unknown schedule {kind!r}; known: {', '.join(SCHEDULES)}")


def one_peer_matrix(n: int, round_: int) -> torch.Tensor:
    """W_r of the synchronous one-peer exponential schedule (float64): x_i ← ½ x_i + ½ x_(i−2^k),
    so row i takes half from itself and half from the node that sends to it."""
    w = torch.zeros(n, n, dtype=torch.float64)
    off = one_peer_offset(n, round_) % n
    for i in range(n):
        w[i, i] += 0.5
        w[i, (i - off) % n] += 0.5
    return w


def one_peer_contraction(n: int) -> float:
    """The factor by which one period (τ rounds) of the schedule shrinks the distance from the
    mean at worst: the largest singular value of W_(τ−1)…W_0 off the all-ones direction (0 for n
    a power of two)."""
    product = torch.eye(n, dtype=torch.float64)
    for r in range(_period(n)):
        product = one_peer_matrix(n, r) @ product
    centred = product - torch.full((n, n), 1.0 / n, dtype=torch.float64)
    return float(torch.linalg.matrix_norm(centred, ord=2))
