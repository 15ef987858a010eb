"""The node's gossip state behind one worker thread.

Every read and write of the :class:`GossipState` runs on a single-thread executor: the event loop
never blocks on tensor math, and the state needs no lock of its own because only that thread
touches it. The parameters are shared with the trainer, so the two places that touch them (the
copy the delta is made from, and the consensus step) take ``model_lock``, briefly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import torch

from gossip.clock import Clock
from gossip.messages import Delta, SnapshotHeader
from gossip.mixing import mixing_weights, send_and_mix
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState
from gossip.robust import AnomalyScore, clipped_consensus_step
from node.flat import FlatParams

__all__ = ["Gossiper", "NeighbourView"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class NeighbourView:
    replica_seq: int  # -1: no replica yet
    silent_s: float  # -1: never heard from
    in_mix: bool
    distance_rms: float  # RMS of x_i - x̂_j; -1 without a replica
    weight: float  # w_ij in this round's mix; 0 when out of it


class Gossiper:
    """Args:
    node_id: this node's id, the sender of its deltas.
    state: the gossip state machine (its public copy starts at the model's parameters).
    flat: the model's parameters as one vector.
    model_lock: held by the trainer during each step.
    gamma: consensus step size.
    silence_limit_s: a neighbour silent longer than this leaves the mix until it speaks.
    robust: mix by ClippedGossip (gossip/robust.py) and leave out neighbours whose anomaly
        score is over its threshold. Scoring keeps a copy of each neighbour's replica from the
        last round (the change since is its delta), so it doubles the replicas' memory.
    byzantine_fraction: δ of the clipping radius, with ``robust``.
    attack: testing only: publish a harmful target (see ``GossipConfig.attack``) instead of
        the model, through valid deltas, and do not mix.
    """

    def __init__(
        self,
        node_id: str,
        state: GossipState,
        flat: FlatParams,
        model_lock: threading.Lock,
        gamma: float,
        silence_limit_s: float,
        clock: Clock,
        robust: bool = False,
        byzantine_fraction: float = 0.25,
        attack: str | None = None,
        outer: OuterNesterov | None = None,
    ) -> None:
        self.node_id = node_id
        self.state = state
        self.flat = flat
        self.model_lock = model_lock
        self.gamma = gamma
        self.silence_limit_s = silence_limit_s
        self.clock = clock
        self._neighbours: frozenset[str] = frozenset()
        self.robust = robust
        self.byzantine_fraction = byzantine_fraction
        self.anomaly = AnomalyScore()
        self._evicted: frozenset[str] = frozenset()
        self._silenced: set[str] = set()  # neighbours out of the mix for their silence
        self._seen: dict[str, tuple[int, torch.Tensor]] = {}  # peer: (session, replica value)
        self.attack = attack
        #: DiLoCo's outer step on the change of each round (None: plain gossip).
        self.outer = outer
        self._attack_rng = torch.Generator(device=state.device).manual_seed(0)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gossip")

    async def _on_worker(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker, where nothing else touches the gossip state meanwhile."""
        return await self._on_worker(fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- neighbours ---------------------------------------------------------------------------

    async def set_neighbours(self, neighbours: Iterable[str]) -> None:
        """Mix with exactly these neighbours; replicas of others are dropped."""
        new = frozenset(neighbours)

        def work() -> None:
            for peer in self.state.set_peers(new):
                self.anomaly.forget(peer)
                self._seen.pop(peer, None)
            self._neighbours = new
            self._evicted &= new

        await self._on_worker(work)

    @property
    def silenced(self) -> frozenset[str]:
        """Neighbours out of the mix because they have been silent too long."""
        return frozenset(self._silenced)

    @property
    def degree(self) -> int:
        return len(self._neighbours)

    def _mixing_weights(self) -> dict[str, float]:
        weights = mixing_weights(self.state, self._neighbours, self.degree, self.silence_limit_s)
        self._note_silence(weights)
        return weights

    def _note_silence(self, weights: Mapping[str, float]) -> None:
        """Log the neighbours that leave the mix for their silence, and those back in it."""
        for peer in self._neighbours:
            silent = self.state.silent_for(peer)
            if silent is None:
                continue  # no replica yet: out of the mix, but not for its silence
            if peer not in weights:
                if peer not in self._silenced:
                    self._silenced.add(peer)
                    log.warning("%s silent for %.1f s: out of the mix till it speaks", peer, silent)
            elif peer in self._silenced:
                self._silenced.discard(peer)
                log.info("%s speaks again: back in the mix", peer)
        self._silenced &= self._neighbours

    def _score_neighbours(self) -> None:
        """Feed each neighbour's change since the last round to the anomaly score; log who
        enters or leaves the evicted set. A replica restarted by a new session is not a delta."""
        deltas = {}
        for peer in self._neighbours:
            replica = self.state.replicas.get(peer)
            if replica is None:
                continue
            seen = self._seen.get(peer)
            if seen is not None and seen[0] == replica.session:
                deltas[peer] = replica.value - seen[1]
            self._seen[peer] = (replica.session, replica.value.clone())
        self.anomaly.update(deltas)
        evicted = self.anomaly.evicted() & self._neighbours
        for peer in sorted(evicted - self._evicted):
            log.warning(
                "evicting %s from the mix: anomaly score %.2f", peer, self.anomaly.scores[peer]
            )
        for peer in sorted((self._evicted - evicted) & self._neighbours):
            log.warning(
                "%s is back in the mix: anomaly score %.2f", peer, self.anomaly.scores[peer]
            )
        self._evicted = evicted

    def _attack_target(self, x: torch.Tensor) -> torch.Tensor:
        """What an attacking node publishes instead of its model (testing only)."""
        if self.attack == "scale":
            return x * 10
        if self.attack == "flip":
            return -x
        if self.attack == "random":
            return x + torch.randn(x.shape, generator=self._attack_rng, device=x.device)
        raise ValueError(f"unknown attack {self.attack!r}")

    # -- rounds -------------------------------------------------------------------------------

    def submit_round(self, step: int) -> Future[Delta | None]:
        """Queue one gossip round on the worker; callable from any thread.

        The round is q = Q(x - x̂), x̂ += q, then x += γ Σ w (x̂_j - x̂); its result is q, or
        None when there is no neighbour to send it to (a new neighbour starts from a snapshot,
        so skipping costs nothing).
        """

        def work() -> Delta | None:
            if not self._neighbours:
                return None
            if self.attack is None and not self.robust:
                seq, payload = send_and_mix(
                    self.state,
                    self.flat.flat,
                    self.gamma,
                    self._neighbours,
                    self.silence_limit_s,
                    self.outer,
                    self.model_lock,
                    on_weights=self._note_silence,
                )
                return Delta(self.node_id, self.state.session, seq, step, payload, self.degree)
            with self.model_lock:
                x = self.flat.flat.clone()
            target = x if self.attack is None else self._attack_target(x)
            seq, payload = self.state.make_delta(target)  # compression runs outside the lock
            if self.attack is None:  # robust mixing
                self._score_neighbours()
                weights = self._mixing_weights()
                with self.model_lock:
                    clipped_consensus_step(
                        self.state,
                        self.flat.flat,
                        self.gamma,
                        weights,
                        self.byzantine_fraction,
                        self._evicted,
                    )
                    if self.outer is not None:
                        self.outer.step(self.flat.flat)
            return Delta(self.node_id, self.state.session, seq, step, payload, self.degree)

        return self._pool.submit(work)

    async def receive_delta(self, delta: Delta) -> int:
        """Raises the state machine's errors (GossipError, CodecError) unchanged."""
        d = delta
        return await self._on_worker(
            lambda: self.state.receive_delta(
                d.sender, d.session, d.seq, d.payload, d.step, d.degree
            )
        )

    async def check_snapshot(self, header: SnapshotHeader) -> None:
        """The checks a snapshot's header must pass before its values are worth receiving."""
        h = header
        await self._on_worker(
            lambda: self.state.check_snapshot(h.sender, h.session, h.seq, h.numel)
        )

    async def receive_snapshot(self, header: SnapshotHeader, values: torch.Tensor) -> int:
        h = header
        return await self._on_worker(
            lambda: self.state.receive_snapshot(h.sender, h.session, h.seq, values, 0, h.degree)
        )

    async def snapshot(self) -> tuple[SnapshotHeader, torch.Tensor]:
        """x̂ as a host tensor with its header, for a neighbour that needs to (re)start a replica."""

        def work() -> tuple[SnapshotHeader, torch.Tensor]:
            seq, values = self.state.snapshot()
            header = SnapshotHeader(
                self.node_id, self.state.session, seq, values.numel(), self.degree
            )
            return header, values.cpu()

        return await self._on_worker(work)

    async def model_copy(self) -> torch.Tensor:
        """The model's parameters now, as one host vector (for a joiner that pulls them)."""

        def work() -> torch.Tensor:
            with self.model_lock:
                return self.flat.flat.detach().to("cpu", copy=True)

        return await self._on_worker(work)

    async def adopt(self, values: torch.Tensor, session: int) -> None:
        """Take ``values`` (a neighbour's model) as this node's model and public copy, and start
        a new log so that neighbours resync from it."""

        def work() -> None:
            with self.model_lock:
                self.flat.flat.copy_(values)
            self.state.restart(self.flat.flat.detach(), session)  # copied into x̂

        await self._on_worker(work)

    async def neighbour_views(self) -> dict[str, NeighbourView]:
        def work() -> dict[str, NeighbourView]:
            mix = {p: w for p, w in self._mixing_weights().items() if p not in self._evicted}
            with self.model_lock:
                x = self.flat.flat.clone()
            views = {}
            for peer in self._neighbours:
                replica = self.state.replicas.get(peer)
                silent = self.state.silent_for(peer)
                views[peer] = NeighbourView(
                    replica_seq=-1 if replica is None else replica.seq,
                    silent_s=-1.0 if silent is None else silent,
                    in_mix=peer in mix,
                    weight=mix.get(peer, 0.0),
                    distance_rms=-1.0
                    if replica is None
                    else float((x - replica.value).pow(2).mean().sqrt()),
                )
            return views

        return await self._on_worker(work)
