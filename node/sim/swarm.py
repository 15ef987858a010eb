"""A simulated swarm: N :class:`SimNode` on one event queue and one modelled network.

At time 0 every node knows every other (a swarm whose joins have settled: no start-up news is
left to piggyback), links open with a snapshot each, as after a join, and training starts.
Churn, if any, then takes nodes away (announced or silent) and brings new ones, which join
through a random live member and pull the model from a neighbour before they link and train.

This module holds the swarm: building it, its nodes and network, churn and pauses, and the
run, which samples the swarm every ``eval_every_s``. Beside it, node/sim/sampling.py holds what
a sample and the run's summary are and how they are measured (``Sample`` and ``Summary`` are
importable from here too), and node/sim/pulls.py how a joiner, or a node back from a long
pause, pulls the model.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import math
import random
import time
from collections.abc import Callable, Iterator

import torch

from gossip.clock import ManualClock
from gossip.events import EventQueue, LinkLatency, Network
from gossip.relays import relay_order
from gossip.swim import SwimMessage
from gossip.topology import block_region
from node.sim.config import SimConfig
from node.sim.decodes import sharing_decodes
from node.sim.nat import Reachability
from node.sim.node import SimNode
from node.sim.pulls import Pulls
from node.sim.sampling import Gauge, Sample, Summary, Turnover, partial_views
from node.sim.world import Resuming
from node.tasks.base import Shard, Task, load_task

__all__ = ["Sample", "Simulation", "Summary"]


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
        #: Nodes that came and went, and what the departed sent.
        self.turnover = Turnover()
        #: Model pulls, of joiners and of nodes back from a long pause.
        self.pulls = Pulls(self.events, self.network, self.rng, self.nodes)
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
        # The probe is built after the nodes: building a task reseeds torch, so this order is
        # part of what a seed reproduces.
        self.gauge = Gauge(cfg, self._task(0, 0), self.turnover, self.nat, self._started)
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
        self.turnover.depart(node)
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
        self.turnover.joined += 1
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
            self.pulls.pull(node, sources[0] if sources else helper)

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
        """``node`` resumes after a long pause: it pulls the model first (node/sim/pulls.py)."""
        self.pulls.after_pause(node)

    @property
    def pull_bytes(self) -> int:
        """Bytes of every model pulled so far."""
        return self.pulls.nbytes

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

    def sample(self) -> Sample:
        """The swarm now (live nodes that train, are not paused and do not attack)."""
        return self.gauge.sample(self.clock.now(), list(self.nodes.values()), self.events.processed)

    def partial_views(self) -> int:
        """Training nodes whose view of live members is not exactly the nodes that are up."""
        return partial_views(list(self.nodes.values()))

    def summary(self) -> Summary:
        """When the swarm first got there, by the samples so far."""
        return self.gauge.summary(self.samples, list(self.nodes.values()))

    @property
    def metric(self) -> str:
        """What the swarm is judged by: the task's metric (accuracy, loss or perplexity)."""
        return self.gauge.metric

    @property
    def target(self) -> float | None:
        """The value of ``metric`` counted as reached (None: none)."""
        return self.gauge.target


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
