"""How a simulated swarm is measured: its ``Sample`` at a moment, and its ``Summary`` at the end.

A sample takes the consensus distance (cheap: one stack of the models), the held-out metric of
the averaged model and of every node's own (the expensive part, on the task's shared held-out
set), bytes and rounds per node. The swarm itself, and the loop that samples it every
``eval_every_s``, are in node/sim/swarm.py.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass

import torch

from gossip.simulate import consensus_distance
from node.daemon.flat import FlatParams
from node.sim.config import SimConfig
from node.sim.nat import Reachability
from node.sim.node import CPU, SimNode
from node.tasks.base import Task, evaluate_task

__all__ = ["Gauge", "Sample", "Summary", "Turnover", "partial_views"]


@dataclass(frozen=True)
class Sample:
    """The swarm at one moment of simulated time ``t`` (live nodes that train and do not
    attack)."""

    t: float
    live: int
    consensus_distance: float  # (1/n) Σ ||x_i - x̄||²
    relative_distance: float  # the same over ||x̄||²
    avg_accuracy: float  # of the averaged model x̄
    worst_accuracy: float  # of the worst node's own model
    best_accuracy: float  # of the best node's own model
    mean_accuracy: float  # of the nodes' own models, averaged
    avg_loss: float  # eval loss of the averaged model x̄
    worst_loss: float  # the highest eval loss of a node's own model
    mean_loss: float  # of the nodes' own models, averaged
    bytes_per_node: float  # gossip (deltas and snapshots) sent, as the daemon counts it
    swim_bytes_per_node: float  # membership messages sent
    rounds_per_node: float
    steps_per_node: float
    joined: int
    departed: int
    wall_s: float
    events: int
    #: Training nodes whose live view is not exactly the nodes that are up (0: one view).
    partial_views: int = 0
    #: Evictions so far by the honest nodes' anomaly scores (robust mixing), of an honest
    #: neighbour and of an attacker.
    evicted_honest: int = 0
    evicted_attackers: int = 0
    #: Membership bytes relays passed on for nodes behind NAT, over every node slot.
    relayed_bytes_per_node: float = 0.0
    #: Of the bytes relayed for a node behind NAT, the share its busiest relay carried (mean).
    busiest_relay_share: float = 0.0
    #: Nodes behind NAT among the live ones.
    behind_nat: int = 0
    #: Nodes paused now (SimConfig.paused_fraction); the other figures leave them out.
    paused: int = 0
    #: Snapshots sent (the first message of every new link), and their part of
    #: ``bytes_per_node``.
    snapshots_per_node: float = 0.0
    snapshot_bytes_per_node: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass(frozen=True)
class Summary:
    """When the swarm first got there (simulated seconds; None: not within the run)."""

    nodes: int
    topology: str
    codec: str
    duration_s: float
    consensus_s: float | None
    consensus_rounds: float | None
    target_avg_s: float | None
    target_worst_s: float | None
    target_rounds: float | None
    bytes_per_node: float
    bytes_per_node_per_round: float
    final: Sample
    wall_s: float
    events: int
    tensor_bytes_per_node: float
    #: Seconds from the end of the partition to the first sample with one view (None: no
    #: partition, or not within the run).
    healed_s: float | None = None
    #: What the targets are of: the task's metric (accuracy, loss or perplexity) and the value.
    metric: str = "accuracy"
    target: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self))


@dataclass
class Turnover:
    """Nodes that joined and departed so far, and what the departed sent: a departed node's
    model and data are let go, but its bytes still count, over every node slot."""

    joined: int = 0
    departed: int = 0
    gone_bytes: int = 0
    gone_snapshots: int = 0
    gone_snapshot_bytes: int = 0
    gone_swim_bytes: int = 0

    def depart(self, node: SimNode) -> None:
        self.departed += 1
        self.gone_bytes += node.counters.bytes_sent
        self.gone_snapshots += node.counters.snapshots_sent
        self.gone_snapshot_bytes += node.counters.snapshot_bytes_sent
        self.gone_swim_bytes += node.swim_bytes


class Gauge:
    """What a swarm is judged by, and how it is sampled and summed up.

    Args:
        cfg: the simulation's configuration (its targets and consensus threshold).
        probe: a task like the nodes' own, whose model is set to the average x̄ to evaluate it.
        turnover: who joined and departed (the swarm keeps it; a sample reads it).
        nat: who is behind NAT and what relays passed on (read likewise).
        started: when the simulation was built (``time.perf_counter``), for ``wall_s``.
    """

    def __init__(
        self,
        cfg: SimConfig,
        probe: Task,
        turnover: Turnover,
        nat: Reachability,
        started: float,
    ) -> None:
        self.cfg = cfg
        self._probe = probe
        self._probe_flat = FlatParams(probe.model)
        self._turnover = turnover
        self._nat = nat
        self._started = started
        #: What the swarm is judged by, and the value counted as reached.
        self.metric = probe.metric
        self.target = (
            cfg.target_accuracy
            if self.metric == "accuracy"
            else cfg.target_loss
            if cfg.target_loss is not None
            else probe.target
        )

    def _reached(self, accuracy: float, loss: float) -> bool:
        if self.target is None:
            return False
        if self.metric == "accuracy":
            return accuracy >= self.target
        return loss <= self.target

    def sample(self, t: float, nodes: Collection[SimNode], events: int) -> Sample:
        """The swarm of ``nodes`` (every node up) at simulated time ``t``, after ``events``."""
        live = [n for n in nodes if n.training and not n.paused and n.attack is None]
        everyone = list(nodes)
        gone = self._turnover
        slots = max(1, len(everyone) + gone.departed)

        def per_slot(count: Callable[[SimNode], int], departed: int) -> float:
            """A total over every node slot: the nodes up, and what the departed counted."""
            return (sum(count(n) for n in everyone) + departed) / slots

        models = {n.node_id: n.flat.flat for n in live}
        if live:
            mean = torch.stack(list(models.values())).mean(dim=0)
            cd = consensus_distance(models)
            self._probe_flat.flat.copy_(mean)
            avg_loss, avg = evaluate_task(self._probe, CPU)
            evals = [evaluate_task(n.task, CPU) for n in live]
            losses, accs = [e[0] for e in evals], [e[1] for e in evals]
            rel = cd / max(float(mean.double().pow(2).sum()), 1e-30)
        else:
            cd = rel = avg = avg_loss = math.nan
            accs = losses = [math.nan]
        return Sample(
            t=t,
            live=len(live),
            consensus_distance=cd,
            relative_distance=rel,
            avg_accuracy=avg,
            worst_accuracy=min(accs),
            best_accuracy=max(accs),
            mean_accuracy=sum(accs) / len(accs),
            avg_loss=avg_loss,
            worst_loss=max(losses),
            mean_loss=sum(losses) / len(losses),
            bytes_per_node=per_slot(lambda n: n.counters.bytes_sent, gone.gone_bytes),
            snapshots_per_node=per_slot(lambda n: n.counters.snapshots_sent, gone.gone_snapshots),
            snapshot_bytes_per_node=per_slot(
                lambda n: n.counters.snapshot_bytes_sent, gone.gone_snapshot_bytes
            ),
            swim_bytes_per_node=per_slot(lambda n: n.swim_bytes, gone.gone_swim_bytes),
            rounds_per_node=sum(n.counters.rounds for n in live) / max(1, len(live)),
            steps_per_node=sum(n.step for n in live) / max(1, len(live)),
            joined=gone.joined,
            departed=gone.departed,
            wall_s=time.perf_counter() - self._started,
            events=events,
            partial_views=partial_views(everyone),
            relayed_bytes_per_node=self._nat.relayed_bytes / slots,
            busiest_relay_share=self._nat.busiest_relay_share(),
            behind_nat=sum(n.behind_nat for n in live),
            paused=sum(n.paused for n in everyone),
            **_evictions(everyone, live),
        )

    def summary(self, samples: list[Sample], nodes: Collection[SimNode]) -> Summary:
        """When the swarm of ``nodes`` (every node up at the end) first got there, by
        ``samples``."""
        cfg = self.cfg

        def first(ok: Callable[[Sample], bool]) -> Sample | None:
            return next((s for s in samples if s.t > 0 and ok(s)), None)

        consensus = first(lambda s: s.relative_distance <= cfg.consensus_threshold)
        target_avg = first(lambda s: self._reached(s.avg_accuracy, s.avg_loss))
        target_worst = first(lambda s: self._reached(s.worst_accuracy, s.worst_loss))
        final = samples[-1]
        live = [n for n in nodes if n.training]
        split = cfg.net.partition
        healed = None
        if split is not None:
            end = split.at_s + split.for_s
            healed = next((s for s in samples if s.t >= end and s.partial_views == 0), None)
        return Summary(
            nodes=cfg.nodes,
            topology=cfg.gossip.topology,
            codec=cfg.gossip.codec,
            duration_s=final.t,
            consensus_s=consensus.t if consensus else None,
            consensus_rounds=consensus.rounds_per_node if consensus else None,
            target_avg_s=target_avg.t if target_avg else None,
            target_worst_s=target_worst.t if target_worst else None,
            target_rounds=target_avg.rounds_per_node if target_avg else None,
            bytes_per_node=final.bytes_per_node,
            bytes_per_node_per_round=final.bytes_per_node / max(final.rounds_per_node, 1e-9),
            final=final,
            wall_s=final.wall_s,
            events=final.events,
            tensor_bytes_per_node=sum(n.tensor_bytes() for n in live) / max(1, len(live)),
            healed_s=healed.t - (split.at_s + split.for_s) if healed and split else None,
            metric=self.metric,
            target=self.target,
        )


def partial_views(nodes: Collection[SimNode]) -> int:
    """Training nodes among ``nodes`` (every node up) whose view of live members is not exactly
    the nodes that are up."""
    up = sorted(n.node_id for n in nodes if n.alive)
    return sum([r.node_id for r in n.swim.live_members()] != up for n in nodes if n.training)


def _evictions(nodes: Collection[SimNode], live: list[SimNode]) -> dict[str, int]:
    attackers = {n.node_id for n in nodes if n.attack is not None}
    evicted = [peer for n in live for peer in n.evictions]
    bad = sum(peer in attackers for peer in evicted)
    return {"evicted_honest": len(evicted) - bad, "evicted_attackers": bad}
