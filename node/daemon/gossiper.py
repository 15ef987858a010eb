"""The node's gossip state behind one worker thread.

Every read and write of the :class:`GossipState` and of the node's :class:`Mixer` runs on a
single-thread executor: the event loop never blocks on tensor math, and the state needs no lock
of its own because only that thread touches it. The parameters are shared with the trainer, so
the two places that touch them (the copy the delta is made from, and the consensus step) take
``model_lock``, briefly. Reads (:meth:`Gossiper.neighbour_views`, what a status shows) change
nothing: only a round decides who is in the mix.
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

from gossip.budget import ByteBudget
from gossip.clock import Clock
from gossip.digest import model_digest
from gossip.messages import Delta, SnapshotHeader
from gossip.mixing import MixConfig, Mixer, Round
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState
from gossip.schedules import LinkPlan, ScheduleConfig
from gossip.trigger import TriggerConfig
from node.daemon.flat import FlatParams

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
    codec: str = ""  # what this node's deltas to it are encoded with


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
    outer: DiLoCo's outer step on each round's local change, before the mix (None: plain gossip).
    trigger: make a round only when it is worth its bytes (gossip/trigger.py); None: always.
    budget: the byte budget (gossip/budget.py): heartbeats only while it is ahead of its
        allowance. Needs ``trigger``.
    schedule: a time-varying schedule over the links (gossip/schedules.py); None: none.
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
        trigger: TriggerConfig | None = None,
        budget: ByteBudget | None = None,
        link_gamma: Mapping[str, float] | None = None,
        schedule: ScheduleConfig | None = None,
    ) -> None:
        self.node_id = node_id
        self.state = state
        self.flat = flat
        self.model_lock = model_lock
        self.clock = clock
        self.mixer = Mixer(
            state,
            MixConfig(
                gamma,
                silence_limit_s,
                robust,
                byzantine_fraction,
                attack,
                trigger,
                link_gamma,
                schedule,
            ),
            outer,
            torch.Generator(device=state.device).manual_seed(0),
            budget,
        )
        #: The digest of the model this node started from (gossip/digest.py): a snapshot of
        #: it goes by name, since at start-up the neighbours hold it too (b"": none goes by
        #: name; the node resumed from a checkpoint, or pulled a trained model's values).
        self.start_digest = model_digest(state.public)
        #: The neighbours whose public copy this node holds, as the worker last published it
        #: (an immutable set, so the event loop may read it without touching the state).
        self.replicated: frozenset[str] = frozenset()
        #: What the last round made and decided (weights, who is out of the mix); None before.
        self.last_round: Round | None = None
        #: Under ``auto``, each link's codec as the event loop last chose it (node/daemon/
        #: peers.py); replaced whole, never changed in place, so the worker may read it.
        self.link_codecs: Mapping[str, str] = {}
        #: Under ``auto`` with one public copy, the rounds' codec as the event loop last chose
        #: it (None: not chosen yet, or not auto).
        self.round_codec: str | None = None
        self._degree = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gossip")

    async def _on_worker(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker, where nothing else touches the gossip state meanwhile."""
        return await self._on_worker(fn)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def published(self) -> None:
        """Worker only: publish what the event loop may read of the state (call after a
        change of the replicas)."""
        self.replicated = frozenset(self.state.replicas)

    # -- neighbours ---------------------------------------------------------------------------

    def apply_neighbours(self, neighbours: frozenset[str], plan: LinkPlan | None = None) -> None:
        """Worker only: mix with exactly these neighbours; replicas of others are dropped
        (``plan``: what the topology says of each link, see Mixer.set_neighbours)."""
        self.mixer.set_neighbours(neighbours, plan)
        self._degree = len(neighbours)
        self.published()

    async def set_neighbours(self, neighbours: Iterable[str]) -> None:
        """Mix with exactly these neighbours; replicas of others are dropped."""
        new = frozenset(neighbours)
        await self._on_worker(lambda: self.apply_neighbours(new))

    @property
    def silenced(self) -> frozenset[str]:
        """Neighbours out of the mix because they have been silent too long (as the last round
        found them)."""
        return self.mixer.silenced

    @property
    def numel(self) -> int:
        """Values in the model (and so in every snapshot of x̂)."""
        return self.state.numel

    @property
    def degree(self) -> int:
        return self._degree

    @property
    def outer(self) -> OuterNesterov | None:
        return self.mixer.outer

    # -- rounds -------------------------------------------------------------------------------

    def submit_round(
        self, step: int, ready: frozenset[str] = frozenset()
    ) -> Future[Delta | Mapping[str, Delta] | None]:
        """Queue one gossip round on the worker; callable from any thread.

        The round is x += γ Σ w (x̂_j - x̂), then q = Q(x - x̂), x̂ += q (gossip/mixing.py's
        :class:`Mixer`); its result is q, or None when there is no neighbour to send it to (a
        new neighbour starts from a snapshot, so skipping costs nothing) or when the trigger
        finds the round not worth its bytes (x - x̂ keeps the change for a later round).
        With a copy per link (``--pace link``) the round goes to the links in ``ready`` only,
        and its result is each one's delta, by neighbour.
        """

        def work() -> Delta | Mapping[str, Delta] | None:
            self.state.set_link_codecs(self.link_codecs)
            if self.round_codec is not None:
                self.state.set_round_codec(self.round_codec)
            made = self.mixer.round(self.flat.flat, self.model_lock, ready)
            if made is None:
                return None
            self.last_round = made
            _log_decisions(made)
            session, degree = self.state.session, self._degree
            if made.links:
                return {
                    peer: Delta(self.node_id, session, seq, step, payload, degree)
                    for peer, (seq, payload) in made.links.items()
                }
            return Delta(self.node_id, session, made.seq, step, made.payload, degree)

        return self._pool.submit(work)

    async def snapshot(
        self, peer: str = "", may_name: bool = False
    ) -> tuple[SnapshotHeader, torch.Tensor]:
        """x̂ as a host tensor with its header, for a neighbour that needs to (re)start a
        replica; with a copy per link, that link's copy, started afresh at the model. With
        ``may_name``, a snapshot of the model the node started from is named by its digest
        (the header says it; the values are still returned)."""

        def work() -> tuple[SnapshotHeader, torch.Tensor]:
            if self.state.per_link:
                with self.model_lock:
                    x = self.flat.flat.detach().clone()
                seq, values = self.state.snapshot_for(peer, x)
            else:
                seq, values = self.state.snapshot()
            named = b""
            if (
                may_name
                and self.start_digest
                and (digest := model_digest(values)) == self.start_digest
            ):
                named = digest
            header = SnapshotHeader(
                self.node_id, self.state.session, seq, values.numel(), self._degree, digest=named
            )
            return header, values.cpu()

        return await self._on_worker(work)

    async def model_copy(self) -> torch.Tensor:
        """The model's parameters now, as one host vector (for a joiner that pulls them)."""

        def work() -> torch.Tensor:
            with self.model_lock:
                return self.flat.flat.detach().to("cpu", copy=True)

        return await self._on_worker(work)

    async def adopt(self, values: torch.Tensor, session: int, held: bool = False) -> None:
        """Take ``values`` (a neighbour's model) as this node's model and public copy, and start
        a new log so that neighbours resync from it. ``held``: the swarm holds that model (a
        pull answered by name), so snapshots of it may go by name; a model whose values came
        is one the neighbours' public copies left behind."""

        def work() -> None:
            with self.model_lock:
                self.flat.flat.copy_(values)
            self.state.restart(self.flat.flat.detach(), session)  # copied into x̂
            self.start_digest = model_digest(self.state.public) if held else b""

        await self._on_worker(work)

    async def neighbour_views(self) -> dict[str, NeighbourView]:
        """How each neighbour stands now; a read, which changes nothing the rounds decide."""

        def work() -> dict[str, NeighbourView]:
            mix = self.mixer.weights()
            with self.model_lock:
                x = self.flat.flat.clone()
            views = {}
            for peer in self.mixer.neighbours:
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
                    codec=self.state.codec_for(peer).name,
                )
            return views

        return await self._on_worker(work)


def _log_decisions(made: Round) -> None:
    """Log who left or re-entered the mix in a round (the round decided it; this only tells)."""
    for peer, silent_s in made.went_silent.items():
        log.warning("%s silent for %.1f s: out of the mix till it speaks", peer, silent_s)
    for peer in made.spoke_again:
        log.info("%s speaks again: back in the mix", peer)
    for peer, score in made.newly_evicted.items():
        log.warning("evicting %s from the mix: anomaly score %.2f", peer, score)
    for peer, score in made.readmitted.items():
        log.warning("%s is back in the mix: anomaly score %.2f", peer, score)
