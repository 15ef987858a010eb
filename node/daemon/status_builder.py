"""A node's status and readiness, read from its parts: a read changes nothing the node does."""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

import torch

from gossip.clock import Clock
from node.config import NodeConfig
from node.daemon.gossiper import Gossiper, NeighbourView
from node.daemon.peers import Peers
from node.daemon.trainer import Trainer
from node.telemetry.events import Counters
from node.telemetry.status import NeighbourStatus, NodeStatus, summarise_members

__all__ = ["StatusBuilder"]


class _Pause(Protocol):
    @property
    def paused(self) -> bool: ...

    @property
    def reason(self) -> str: ...


class StatusBuilder:
    """Args:
    cfg: the codec and the step budget the status names.
    node_id: whose status this is.
    device: where the node trains.
    trainer: steps, losses, the last evaluation, whether training started or failed.
    peers: the members, the links and their figures.
    gossiper: the neighbours' replicas as the worker sees them.
    counters: the node's totals.
    clock: the age of the last evaluation.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        node_id: str,
        device: torch.device,
        trainer: Trainer,
        peers: Peers,
        gossiper: Gossiper,
        counters: Counters,
        clock: Clock,
    ) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.device = device
        self.trainer = trainer
        self.peers = peers
        self.gossiper = gossiper
        self.counters = counters
        self.clock = clock
        #: Set by the node once it serves.
        self.address = ""
        #: Whether the node is paused, and why (set by the node; None: never paused).
        self.pauser: _Pause | None = None

    def readiness(self, closing: bool) -> str | None:
        """None once the node has joined, is training (or trained) and every link of its is up;
        else why not, on one line (``/readyz``; event loop only)."""
        hood = self.peers.neighbourhood
        if closing:
            return "stopping"
        if not self.trainer.started:
            return "not training yet: joining, or waiting for members and links"
        if self.trainer.error is not None:
            return f"training failed: {self.trainer.error}"
        if hood.links_up() < len(hood.links):
            return f"links: {hood.links_up()} of {len(hood.links)} up"
        return None

    async def status(self) -> NodeStatus:
        return self.build(await self.gossiper.neighbour_views())

    def build(self, views: dict[str, NeighbourView] | None = None) -> NodeStatus:
        """The node's figures; without ``views`` (after the worker stopped) links' only."""
        neighbours = []
        regions = self.peers.view.regions
        for peer_id in sorted(views or self.peers.links):
            v = (views or {}).get(peer_id, NeighbourView(-1, -1.0, False, -1.0, 0.0))
            link = self.peers.links.get(peer_id)
            member = self.peers.view.get(peer_id)
            neighbours.append(
                NeighbourStatus(
                    node_id=peer_id,
                    address=member.address if member else "",
                    replica_seq=v.replica_seq,
                    silent_s=v.silent_s,
                    in_mix=v.in_mix,
                    bytes_sent=link.stats.bytes_sent if link else 0,
                    deltas_sent=link.stats.deltas_sent if link else 0,
                    snapshots_sent=link.stats.snapshots_sent if link else 0,
                    distance_rms=v.distance_rms,
                    weight=v.weight,
                    bytes_received=self.counters.received_from.get(peer_id, 0),
                    region=regions.get(peer_id, ""),
                    codec=v.codec,
                )
            )
        ev = self.trainer.last_eval
        c = self.counters
        members, member_counts = summarise_members(self.peers.swim.records(), self.node_id)
        sessions, relayed = self.peers.transport.session_figures()
        status = NodeStatus(
            node_id=self.node_id,
            address=self.address,
            device=str(self.device),
            codec=self.cfg.gossip.codec,
            step=self.trainer.step,
            step_budget=self.cfg.trainer.steps or 0,
            training_done=self.trainer.done.is_set(),
            train_loss=self.trainer.loss,
            # -1: none yet, or a task judged by its loss (its accuracy is NaN).
            eval_accuracy=ev.accuracy if ev and math.isfinite(ev.accuracy) else -1.0,
            eval_loss=ev.loss if ev else math.nan,
            eval_step=ev.step if ev else -1,
            eval_age_s=self.clock.now() - ev.time if ev else -1.0,
            rounds=c.rounds,
            rounds_skipped=c.rounds_skipped,
            held_s=c.held_s,
            bytes_sent=c.bytes_sent,
            bytes_sent_fp32=c.bytes_sent_fp32,
            bytes_received=c.bytes_received,
            samples_per_s=self.trainer.samples_per_s,
            samples=self.trainer.samples,
            neighbours=tuple(neighbours),
            members=members,
            rejected=dict(c.rejected),
            member_counts=member_counts,
            sessions=sessions,
            relayed_bytes=relayed,
            relay_faults=self.peers.dialout.faults,
            region=self.peers.swim.region,
        )
        if self.pauser is not None and self.pauser.paused:
            status = dataclasses.replace(status, paused=True, pause_reason=self.pauser.reason)
        budget = self.peers.outflow.budget if self.peers.outflow is not None else None
        if budget is None:
            return status
        return dataclasses.replace(
            status,
            budget_bytes=budget.cfg.nbytes,
            budget_period_s=budget.cfg.period_s,
            budget_left_bytes=int(budget.remaining),
            budget_resets_in_s=budget.resets_in,
        )
