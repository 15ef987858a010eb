"""A simulated swarm: N :class:`SimNode` on one event queue and one modelled network.

At time 0 every node knows every other (a swarm whose joins have settled: no start-up news is
left to piggyback), links open with a snapshot each, as after a join, and training starts.
Churn, if any, then takes nodes away (announced or silent) and brings new ones, which join
through a random live member and pull the model from a neighbour before they link and train.

Every ``eval_every_s`` the swarm is sampled: consensus distance (cheap: one stack of the
models), the accuracy of the averaged model and of every node's own (the expensive part, on
the task's shared held-out set), bytes and rounds per node.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from gossip.clock import ManualClock
from gossip.digest import model_digest
from gossip.events import EventQueue, LinkLatency, Network
from gossip.relays import relay_order
from gossip.simulate import consensus_distance
from gossip.swim import SwimMessage
from gossip.topology import block_region
from node.daemon.flat import FlatParams
from node.sim.config import SimConfig
from node.sim.decodes import sharing_decodes
from node.sim.link import REPLY_BYTES
from node.sim.nat import Reachability
from node.sim.node import CPU, SimNode
from node.sim.world import Resuming
from node.tasks.base import Shard, Task, evaluate_task, load_task
from node.transport import wire

__all__ = ["Sample", "Simulation", "Summary"]


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


class Simulation:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.clock = ManualClock()
        self.events = EventQueue(self.clock)
        self.rng = random.Random(cfg.seed)
        lo, hi = cfg.net.latency_s
        #: Each node's region, by address (cfg.net.regions; empty: none).
        self.regions: dict[str, str] = {}
        latency: Callable[[str, str], float] = LinkLatency(lo, hi, cfg.seed)
        slowdown = None
        if cfg.net.regions:
            latency, slowdown = self._across_regions(latency, cfg.net.cross_region_slowdown)
        self.network = Network(
            self.events,
            latency,
            cfg.net.bandwidth_bps,
            cfg.net.loss,
            random.Random(cfg.seed + 1),
            slowdown,
        )
        self.codec = sharing_decodes(cfg.gossip.swarm_codec())
        self.factory = load_task(cfg.task)
        self.nodes: dict[str, SimNode] = {}
        #: Nodes gone, and what they sent (a departed node's model and data are let go).
        self.departed = 0
        self._gone_bytes = 0
        self._gone_swim_bytes = 0
        self.joined = 0
        self.pull_bytes = 0
        self._count = 0
        self._free_shards: list[int] = []
        self._started = time.perf_counter()
        # Drawn apart from the rest, so that a run with attackers differs only by them.
        picked = random.Random(cfg.seed + 2).sample(range(cfg.nodes), cfg.attacker_count)
        self.attackers = frozenset(picked)
        #: Who has the byte budget (SimConfig.budgeted_fraction), also drawn apart.
        self._budget_rng = random.Random(cfg.seed + 3)
        #: The group of each node's address while the network is split (cfg.net.partition).
        self.groups: dict[str, int] = {}
        split = cfg.net.partition
        if split is not None:
            self.network.split(lambda a: self.groups.get(a, -1), split.at_s, split.for_s)
        for i in range(cfg.nodes):
            self._make_node(shard=i, attack=cfg.gossip.attack if i in self.attackers else None)
        #: Who is behind NAT, and what relays passed on.
        self.nat = Reachability(cfg.net.behind_nat, cfg.seed)
        behind = self.nat.initial(cfg.nodes)
        nodes = list(self.nodes.values())
        reachable = [n.address for i, n in enumerate(nodes) if i not in behind]
        for i in sorted(behind):
            nodes[i].go_behind_nat(self.nat.first_relays(reachable))
        everyone = [n.swim.me for n in self.nodes.values()]
        for n in self.nodes.values():
            n.swim.merge(everyone)
            n.swim.drain_changes()
            n.swim.clear_updates()
        for n in self.nodes.values():
            n.start_links()  # and trains once its edges are up both ways
            n.after_swim()
        if cfg.paused_fraction > 0:  # each node paused with that chance from the start
            for n in list(self.nodes.values()):
                self._pauses(n, paused=self.rng.random() < cfg.paused_fraction)
        self._probe = self._task(0, 0)
        self._probe_flat = FlatParams(self._probe.model)
        #: What the swarm is judged by, and the value counted as reached.
        self.metric = self._probe.metric
        self.target = (
            cfg.target_accuracy
            if self.metric == "accuracy"
            else cfg.target_loss
            if cfg.target_loss is not None
            else self._probe.target
        )
        self.samples: list[Sample] = []
        churn = cfg.churn
        for rate, what in (
            (churn.leave_per_min, self._leave),
            (churn.crash_per_min, self._crash),
            (churn.join_per_min, self._join),
        ):
            if rate > 0:
                self._poisson(rate * cfg.nodes / 60.0, what)

    def _across_regions(
        self, latency: Callable[[str, str], float], factor: float
    ) -> tuple[Callable[[str, str], float], Callable[[str, str], float]]:
        """The delay and the slowdown of each link when those between regions are ``factor``
        times slower."""

        def slowdown(src: str, dst: str) -> float:
            return factor if self.regions.get(src) != self.regions.get(dst) else 1.0

        def delay(src: str, dst: str) -> float:
            return latency(src, dst) * slowdown(src, dst)

        return delay, slowdown

    # -- nodes --------------------------------------------------------------------------------

    def _task(self, index: int, shard: int) -> Task:
        cfg = self.cfg
        # Seeded right before the factory, as the daemon does, so that every node builds the
        # same initial model; or a model of its own, to measure consensus from afar.
        torch.manual_seed(cfg.seed * 7919 + index + 1 if cfg.independent_init else cfg.seed)
        return self.factory(Shard(shard, cfg.nodes, cfg.alpha, cfg.seed))

    def _make_node(self, shard: int, attack: str | None = None) -> SimNode:
        cfg = self.cfg
        index = self._count
        self._count += 1
        step_s = cfg.step_time_s
        if self.rng.random() < cfg.stragglers:
            step_s *= cfg.straggler_slowdown
        if cfg.speed_spread:
            step_s *= math.exp(self.rng.gauss(0.0, cfg.speed_spread))
        address = f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}:7070"
        if cfg.net.partition is not None:
            groups = cfg.net.partition.groups
            first = index < cfg.nodes
            self.groups[address] = index * groups // cfg.nodes if first else index % groups
        if cfg.net.regions:
            self.regions[address] = block_region(index, cfg.nodes, cfg.net.regions)
        node = SimNode(
            self,
            hashlib.sha256(f"murmur-sim|{cfg.seed}|{index}".encode()).hexdigest()[:32],
            address,
            shard,
            self._task(index, shard),
            step_s,
            session=self.rng.getrandbits(62),
            incarnation=1,
            rng=random.Random(self.rng.getrandbits(62)),
            attack=attack,
            budgeted=cfg.budgeted_fraction >= 1
            or self._budget_rng.random() < cfg.budgeted_fraction,
        )
        node.swim.region = self.regions.get(address, "")
        self.nodes[node.address] = node
        return node

    def live_node(self, address: str) -> SimNode | None:
        node = self.nodes.get(address)
        return node if node is not None and node.alive else None

    def swim_delivery(self, address: str, message: SwimMessage) -> Callable[[], None]:
        def deliver() -> None:
            node = self.live_node(address)
            if node is not None:
                node.receive_swim(message)

        return deliver

    def holds_session(self, address: str, member: str) -> bool:
        """Whether the node at ``address`` (behind NAT) holds a session to ``member``."""
        node = self.live_node(address)
        return node is not None and member in node.sessions()

    def relay_swim(
        self, src: str, dst: str, relays: tuple[str, ...], nbytes: int, message: SwimMessage
    ) -> None:
        """A membership message for a node behind NAT, through the first of its relays that
        is up in the sender's own order (``relay_order``, as the daemon's; a relay that is down
        refuses the connection at once); lost when none is."""
        order = relay_order(relays, dst, None, src.encode())
        relay = next((r for r in order if self.live_node(r) is not None), None)
        if relay is None:
            return

        def at_relay() -> None:
            if self.live_node(relay) is not None:
                self.nat.relayed(dst, relay, nbytes)
                self.network.send(relay, dst, nbytes, self.swim_delivery(dst, message))

        self.network.send(src, relay, nbytes, at_relay)

    # -- churn --------------------------------------------------------------------------------

    def _poisson(self, per_s: float, what: Callable[[], None]) -> None:
        def fire() -> None:
            what()
            self.events.after(self.rng.expovariate(per_s), fire)

        self.events.after(self.rng.expovariate(per_s), fire)

    def _pick_live(self) -> SimNode | None:
        live = [n for n in self.nodes.values() if n.training]
        return self.rng.choice(live) if len(live) > 1 else None

    def _depart(self, node: SimNode) -> None:
        del self.nodes[node.address]
        self.departed += 1
        self._gone_bytes += node.counters.bytes_sent
        self._gone_swim_bytes += node.swim_bytes
        self._free_shards.append(node.shard)

    def _leave(self) -> None:
        node = self._pick_live()
        if node is not None:
            self.leave(node)

    def _crash(self) -> None:
        node = self._pick_live()
        if node is not None:
            self.crash(node)

    def _join(self) -> None:
        helper = self._pick_live()
        if helper is not None:
            self.join(helper)

    def leave(self, node: SimNode) -> None:
        """``node`` says it leaves (SWIM's LEFT, to its neighbours first) and stops."""
        node.leave()
        self._depart(node)

    def crash(self, node: SimNode) -> None:
        """``node`` stops without a word: its host vanished."""
        node.stop()
        self._depart(node)

    def join(self, helper: SimNode) -> SimNode:
        """A new node says hello to ``helper`` (one round trip), learns the member list, pulls
        the model from a neighbour (else from ``helper``), then links and trains."""
        if self._free_shards:
            shard = self._free_shards.pop(self.rng.randrange(len(self._free_shards)))
        else:
            shard = self.rng.randrange(self.cfg.nodes)
        node = self._make_node(shard)
        self.joined += 1
        if self.cfg.paused_fraction > 0:
            self._pauses(node, paused=False)
        if self.nat.joiner():  # it joins through a member others can dial, its first relay
            dialable = [n for n in self.nodes.values() if n.training and not n.behind_nat]
            if helper.behind_nat and dialable:
                helper = self.rng.choice(dialable)
            node.go_behind_nat((helper.address,))

        def introduced() -> None:
            if not helper.alive or not node.alive:
                return
            node.swim.merge(helper.swim.records())
            node.swim.drain_changes()
            helper.swim.merge([node.swim.me])
            helper.after_swim()
            g = self.cfg.gossip
            near = list(node.view.neighbours(g.topology, degree=g.degree, seed=g.seed).values())
            self.rng.shuffle(near)
            sources = [s for m in near if (s := self.live_node(m.address)) and s.training]
            self._pull(node, sources[0] if sources else helper)

        rtt = 2 * self.network.latency(node.address, helper.address)
        self.events.after(rtt, introduced)
        return node

    # -- pauses ------------------------------------------------------------------------------

    def _pauses(self, node: SimNode, paused: bool) -> None:
        """``node`` alternates between running and paused from now on, each for an exponential
        time, so that ``paused_fraction`` of the time it is paused."""
        cfg = self.cfg
        mean_paused = cfg.pause_mean_s
        mean_running = mean_paused * (1 - cfg.paused_fraction) / cfg.paused_fraction

        def toggle() -> None:
            if not node.alive:
                return
            if node.paused:
                node.resume()
                self.events.after(self.rng.expovariate(1 / mean_running), toggle)
            else:
                node.pause()
                self.events.after(self.rng.expovariate(1 / mean_paused), toggle)

        if paused:
            node.pause()
        self.events.after(
            self.rng.expovariate(1 / (mean_paused if paused else mean_running)), toggle
        )

    def pull_after_pause(self, node: Resuming) -> None:
        sources = self._sources()
        sim_node = self.nodes.get(node.address)
        if not sources or sim_node is None:
            node.come_back()
            return
        self._pull(sim_node, self.rng.choice(sources), then=node.come_back)

    def _sources(self) -> list[SimNode]:
        """Nodes a model may be pulled from: training, and not paused."""
        return [n for n in self.nodes.values() if n.training and not n.paused]

    def _pull(self, node: SimNode, source: SimNode, then: Callable[[], None] | None = None) -> None:
        """``node`` pulls ``source``'s model (another's, should ``source`` go meanwhile), then
        links and trains, as a joiner (or, with ``then``, does that instead)."""

        def at_source() -> None:
            if not node.alive:
                return
            if not source.alive:
                self._pull(node, self.rng.choice(self._sources() or [node]), then)
                return
            values = source.flat.flat.clone()
            node.pulled_from = source.node_id
            nbytes = wire.model_nbytes(values.numel(), source.step)
            held = model_digest(values) == model_digest(node.flat.flat)
            if held:  # the joiner named it: one chunk says it is the same (gossip/digest.py)
                nbytes = wire.same_model_nbytes(values.numel(), source.step)
            self.pull_bytes += nbytes

            def send() -> None:
                self.network.send(
                    source.address, node.address, nbytes, lambda: pulled(values, held), lossy=False
                )

            cap = source.upload_cap
            if cap is None:
                send()
                return
            # Served in chunks at the cap's pace, as the daemon's port serves it: it is all
            # there once the last chunk may go.
            now = self.events.now()
            self.events.at(
                cap.reserve(nbytes, now) + max(0.0, nbytes - cap.capacity) / cap.model_rate, send
            )

        def pulled(values: torch.Tensor, held: bool) -> None:
            if not node.alive:
                return
            node.adopt(values, self.rng.getrandbits(62), held)
            if then is not None:
                then()
                return
            node.start_links()  # and trains once its edges are up both ways, as the daemon
            node.after_swim()

        self.network.send(node.address, source.address, REPLY_BYTES, at_source, lossy=False)

    # -- running and sampling -----------------------------------------------------------------

    def run(self, on_sample: Callable[[Sample], None] = lambda s: None) -> Summary:
        """Run to ``duration_s``, sampling every ``eval_every_s`` (and at 0 and the end)."""
        cfg = self.cfg
        t = 0.0
        with _collector_out_of_the_way():
            while True:
                self.events.run_until(t)
                sample = self.sample()
                self.samples.append(sample)
                on_sample(sample)
                if t >= cfg.duration_s:
                    break
                t = min(t + cfg.eval_every_s, cfg.duration_s)
        return self.summary()

    def _evaluate(self, task: Task) -> tuple[float, float]:
        return evaluate_task(task, CPU)

    def _reached(self, accuracy: float, loss: float) -> bool:
        if self.target is None:
            return False
        if self.metric == "accuracy":
            return accuracy >= self.target
        return loss <= self.target

    def sample(self) -> Sample:
        live = [n for n in self.nodes.values() if n.training and not n.paused and n.attack is None]
        everyone = list(self.nodes.values())
        slots = max(1, len(everyone) + self.departed)
        models = {n.node_id: n.flat.flat for n in live}
        if live:
            mean = torch.stack(list(models.values())).mean(dim=0)
            cd = consensus_distance(models)
            self._probe_flat.flat.copy_(mean)
            avg_loss, avg = self._evaluate(self._probe)
            evals = [self._evaluate(n.task) for n in live]
            losses, accs = [e[0] for e in evals], [e[1] for e in evals]
            rel = cd / max(float(mean.double().pow(2).sum()), 1e-30)
        else:
            cd = rel = avg = avg_loss = math.nan
            accs = losses = [math.nan]
        return Sample(
            t=self.clock.now(),
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
            bytes_per_node=(sum(n.counters.bytes_sent for n in everyone) + self._gone_bytes)
            / slots,
            swim_bytes_per_node=(sum(n.swim_bytes for n in everyone) + self._gone_swim_bytes)
            / slots,
            rounds_per_node=sum(n.counters.rounds for n in live) / max(1, len(live)),
            steps_per_node=sum(n.step for n in live) / max(1, len(live)),
            joined=self.joined,
            departed=self.departed,
            wall_s=time.perf_counter() - self._started,
            events=self.events.processed,
            partial_views=self.partial_views(),
            relayed_bytes_per_node=self.nat.relayed_bytes / slots,
            busiest_relay_share=self.nat.busiest_relay_share(),
            behind_nat=sum(n.behind_nat for n in live),
            paused=sum(n.paused for n in everyone),
            **self._evictions(live),
        )

    def _evictions(self, live: list[SimNode]) -> dict[str, int]:
        attackers = {n.node_id for n in self.nodes.values() if n.attack is not None}
        evicted = [peer for n in live for peer in n.evictions]
        bad = sum(peer in attackers for peer in evicted)
        return {"evicted_honest": len(evicted) - bad, "evicted_attackers": bad}

    def partial_views(self) -> int:
        """Training nodes whose view of live members is not exactly the nodes that are up."""
        up = sorted(n.node_id for n in self.nodes.values() if n.alive)
        return sum(
            [r.node_id for r in n.swim.live_members()] != up
            for n in self.nodes.values()
            if n.training
        )

    def summary(self) -> Summary:
        cfg = self.cfg
        samples = self.samples

        def first(ok: Callable[[Sample], bool]) -> Sample | None:
            return next((s for s in samples if s.t > 0 and ok(s)), None)

        consensus = first(lambda s: s.relative_distance <= cfg.consensus_threshold)
        target_avg = first(lambda s: self._reached(s.avg_accuracy, s.avg_loss))
        target_worst = first(lambda s: self._reached(s.worst_accuracy, s.worst_loss))
        final = samples[-1]
        live = [n for n in self.nodes.values() if n.training]
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


@contextlib.contextmanager
def _collector_out_of_the_way() -> Iterator[None]:
    """A built swarm holds millions of long-lived objects (member records, tensors, links),
    which Python's cyclic collector would walk again at every full collection, and its events
    make young objects by the million; this took a sixth of a run's time. While the swarm runs,
    what exists when it starts is frozen out of the collector's way and young collections come
    less often; both are undone at the end."""
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)  # the defaults are 700, 10, 10
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
