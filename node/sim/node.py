"""One simulated node: what a daemon keeps and decides, driven by simulated time.

It keeps only what a real node keeps: its task shard and model, the optimizer's state, the
public copy x̂ and its neighbours' replicas (``GossipState``), its SWIM state and one link
machine per neighbour. What it decides and checks it does with the daemon's code:
``train_step`` for a local step, ``RoundPacer`` for when to gossip, the ``Mixer`` for the round
(plain, robust, or an attacker's, with the outer step or without), the ``Neighbourhood`` for
whom to link to and when to start training (both directions of every edge up, as the daemon
waits), SWIM for who is there, the link machine (through ``SimLink``) for what each link sends,
and the ``Inbound`` path for what it takes. What the daemon does on threads and an event loop
happens here as events on the simulation's queue; a step takes ``step_time_s`` of simulated
time.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator

import torch

from gossip.budget import ByteBudget
from gossip.codec_choice import LinkCodecs
from gossip.codecs import AutoCodec
from gossip.digest import model_digest
from gossip.link import LinkConfig, round_pace
from gossip.membership import MemberView
from gossip.messages import PROTOCOL_VERSION, Delta, Member, SnapshotHeader
from gossip.mixing import MixConfig, Mixer
from gossip.outer import OuterNesterov
from gossip.pacing import RoundPacer
from gossip.refusals import Reason
from gossip.relays import choose_relays
from gossip.replicas import GossipState, UpdateGuard
from gossip.swim import MemberRecord, Outgoing, Swim, SwimMessage
from gossip.upload_cap import BUDGET_CHARGE, UploadCap
from node.daemon.dialout import PROBE_EVERY_S, PROBE_MISSES, PROBE_TIMEOUT_S
from node.daemon.flat import FlatParams
from node.daemon.inbound import Inbound
from node.daemon.neighbourhood import Neighbourhood
from node.daemon.pause import PULL_AFTER_PAUSE_S
from node.daemon.peers import LEAVE_FANOUT
from node.daemon.steps import run_here
from node.daemon.trainer import batches, train_step
from node.sim.link import SimLink
from node.sim.world import World
from node.tasks.base import Task
from node.telemetry.events import Counters
from node.transport import wire
from node.transport.base import Rejected

__all__ = ["SimNode"]

CPU = torch.device("cpu")
#: The sizes of a P-256 public key (DER SubjectPublicKeyInfo) and of an ECDSA signature (DER).
FAKE_PUBLIC_KEY = bytes(91)
FAKE_SIGNATURE = bytes(71)


class SimNode:
    """Args:
    sim: the simulation it lives in (clock, event queue, network, configuration).
    node_id, address: shaped like a real node's (32 hex characters; an IPv4 host:port), so
        that messages carrying them weigh what they weigh on the wire.
    shard: the index of its training shard.
    task: its task, built as the daemon builds it (same seed: same initial model).
    step_s: simulated seconds per local step (its speed).
    attack: testing robustness: what this node publishes instead of its model (None: honest).
    budgeted: ``gossip.byte_budget`` applies to this node (SimConfig.budgeted_fraction).
    """

    def __init__(
        self,
        sim: World,
        node_id: str,
        address: str,
        shard: int,
        task: Task,
        step_s: float,
        session: int,
        incarnation: int,
        rng: random.Random,
        attack: str | None = None,
        budgeted: bool = True,
    ) -> None:
        cfg = sim.cfg
        g = cfg.gossip
        self.sim = sim
        self.node_id = node_id
        self.address = address
        self.shard = shard
        self.task = task
        self.step_s = step_s
        self.flat = FlatParams(task.model)
        self.optimizer = task.make_optimizer()
        self.schedule = task.make_schedule(self.optimizer, cfg.steps)
        self._batches: Iterator[tuple[torch.Tensor, ...]] = batches(
            task, CPU, cfg.seed * 1_000_003 + shard
        )
        rounding = torch.Generator().manual_seed(rng.getrandbits(62))
        guard = UpdateGuard(consistency=1.0 if g.robust else None)  # as the daemon's
        self.state = GossipState(
            self.flat.flat,
            sim.codec,
            sim.clock,
            rounding,
            session,
            guard,
            per_link=sim.cfg.gossip.pace == "link",
        )
        self.swim = Swim(
            node_id,
            self.address,
            incarnation,
            cfg.membership,
            sim.clock,
            rng,
            # Records carry a key and a signature of a real node's sizes, so that membership
            # messages weigh what they do on the wire; nothing checks them (no crypto cost).
            sign=lambda claim: FAKE_SIGNATURE,
            public_key=FAKE_PUBLIC_KEY,
        )
        self.view = MemberView(self.swim)
        self.pacer = RoundPacer(g.local_steps, g.max_local_steps)
        self.attack = attack
        outer = OuterNesterov(g.outer_lr, g.outer_momentum) if g.outer_lr else None
        mix = MixConfig(
            g.step_size,
            g.silence_limit_s,
            g.robust,
            g.byzantine_fraction,
            attack,
            g.trigger_config,
            g.link_gamma,
            g.schedule_config,
        )
        #: Under ``--compress auto``, each link's codec from its meter, as the daemon's.
        self.codecs = LinkCodecs(self.state.numel) if g.codec == AutoCodec.name else None
        budget_cfg = g.budget_config
        #: The byte budget (gossip/budget.py) on the simulation's clock; its links spend it.
        self.budget = (
            ByteBudget(budget_cfg, sim.clock, BUDGET_CHARGE)
            if budget_cfg is not None and budgeted
            else None
        )
        #: The digest of the model the node started from: a snapshot of it goes by name, as
        #: the daemon's (node/daemon/gossiper.py).
        self.start_digest = model_digest(self.state.public)
        #: The upload cap (gossip/upload_cap.py): its links' models wait for it, as the daemon's.
        self.upload_cap = (
            UploadCap(g.max_upload_rate, sim.clock.now()) if g.max_upload_rate is not None else None
        )
        self.mixer = Mixer(self.state, mix, outer, budget=self.budget)
        self.link_cfg = LinkConfig(queue=g.link_queue, call_timeout_s=g.call_timeout_s)
        self.neighbourhood: Neighbourhood[SimLink] = Neighbourhood(
            self.view,
            g,
            self._open_link,
            SimLink.close,
            lambda peer: self.send_swim([self.swim.ping(peer.address)]),
            self.mixer.set_neighbours,
        )
        self.counters = Counters()
        #: Every neighbour this node's anomaly score evicted, once per eviction (robust mixing).
        self.evictions: list[str] = []
        self.inbound = Inbound(self.state, self.counters, sim.clock)
        self.swim_bytes = 0
        #: Nobody can dial this node (node/sim/nat.py): it names relays.
        self.behind_nat = False
        #: Addresses of members nobody can dial -> their relays, from this node's view.
        self.routes: dict[str, tuple[str, ...]] = {}
        self._misses: dict[str, int] = {}
        self._failed: set[str] = set()
        #: The live members' addresses (by id, and as a set), as this node's view has them.
        self._addresses: dict[str, str] = {}
        self._live: set[str] = set()
        self.step = 0
        self.loss = float("nan")
        #: Paused (SimConfig.paused_fraction): a member, out of the topology, idle.
        self.paused = False
        self._paused_at = 0.0
        # Each pause ends the chain of step (or idle round) events; a resume starts a new one.
        self._chain = 0
        self.alive = True
        self.training = False
        #: Linked, and waiting for every edge to be up both ways before it trains.
        self.waiting = False
        #: Whom a joiner pulled its starting model from.
        self.pulled_from: str | None = None
        self._dead_streams: dict[str, tuple[str, int]] = {}
        self._sizes: tuple[int, tuple[int, int]] = (-1, (0, 0))

    @property
    def links(self) -> dict[str, SimLink]:
        return self.neighbourhood.links

    @property
    def neighbours(self) -> frozenset[str]:
        return self.neighbourhood.neighbours

    @property
    def linking(self) -> bool:
        return self.neighbourhood.linking

    @property
    def degree(self) -> int:
        return len(self.neighbours)

    @property
    def model(self) -> torch.Tensor:
        return self.flat.flat

    # -- wire sizes, from the daemon's wire module --------------------------------------------

    def delta_nbytes(self, delta: Delta) -> tuple[int, int]:
        """(serialized size, size with an fp32 payload); the same delta goes to every link."""
        if self._sizes[0] != delta.seq:
            nbytes = wire.delta_nbytes(delta)
            # wire.delta_fp32_nbytes, without serializing the shell a second time.
            fp32 = nbytes - delta.payload.nbytes + 4 * delta.payload.numel
            self._sizes = (delta.seq, (nbytes, fp32))
        return self._sizes[1]

    def snapshot_nbytes(self, header: SnapshotHeader) -> int:
        return wire.snapshot_nbytes(header)

    # -- lifecycle ----------------------------------------------------------------------------

    def start_links(self) -> None:
        """The node has its starting model: link to the neighbours, and train once every edge
        is up both ways (or after ``wait_timeout_s``), as the daemon does."""
        run_here(self.neighbourhood.start_linking())
        self._read_view()
        self._follow_view()
        self.waiting = True
        self.sim.events.after(self.sim.cfg.wait_timeout_s, self._start_training)
        self.check_ready()

    def check_ready(self) -> None:
        """Start training if the node waits for its links and they are all up both ways."""
        # Everyone it knows from the start, or from its join, is a member: the daemon's
        # default wait_members of 1 is met; what it waits for is its edges.
        if self.waiting and self.neighbourhood.ready(1, 1, self.state.replicas):
            self._start_training()

    def _start_training(self) -> None:
        if not self.waiting or not self.alive:
            return
        self.waiting = False
        self.training = True
        if self.paused:
            return  # the resume starts the steps
        self._go_on()

    def _go_on(self) -> None:
        """Start a chain of steps, or of idle rounds once the step budget is spent."""
        budget = self.sim.cfg.steps
        if budget is not None and self.step >= budget:  # gossip alone, as a spent node
            self._next_idle_round()
        else:
            self._after(self.step_s, self._local_step)

    def _after(self, delay_s: float, what: Callable[[], None]) -> None:
        """``what`` in ``delay_s``, unless a pause comes first."""
        chain = self._chain

        def fire() -> None:
            if chain == self._chain:
                what()

        self.sim.events.after(delay_s, fire)

    def _open_link(self, peer: Member) -> SimLink:
        link = SimLink(self, peer, self.link_cfg)
        link.pump()
        return link

    def stop(self) -> None:
        """Gone (crashed, or after saying so): nothing of it runs any more."""
        self.alive = False
        self.training = False
        self.waiting = False
        for link in self.links.values():
            link.close()
        self.sim.events.cancel_timer(self.address)

    def leave(self) -> None:
        """Tell the neighbours first, then a few others, that this node leaves; then stop."""
        self.send_swim(self.swim.leave(LEAVE_FANOUT, list(self.links)))
        self.stop()

    # -- training and rounds ------------------------------------------------------------------

    def _local_step(self) -> None:
        if not self.training:
            return
        budget = self.sim.cfg.steps
        if self.pacer.held(self.step):
            self.try_round()
            if self.pacer.held(self.step):
                # Held at the bound on local steps (node/daemon/rounds.py). The daemon is
                # released the moment its links go idle; here a link turns idle by time as
                # well as by events, so the node looks again a step's time later: its hold
                # lasts at most one step longer than the daemon's would.
                self.counters.held_s += self.step_s
                self._after(self.step_s, self._local_step)
                return
        inputs, targets = next(self._batches)
        self.loss = train_step(self.task, self.optimizer, inputs, targets, self.schedule)
        self.step += 1
        if self.pacer.due(self.step):
            self.try_round()
        if budget is None or self.step < budget:
            self._after(self.step_s, self._local_step)
        else:
            self._next_idle_round()

    def _next_idle_round(self) -> None:
        interval_s = self.sim.cfg.gossip.idle_round_interval_s
        if interval_s is not None:  # None: no rounds once training is over, as the daemon
            self._after(interval_s, self._idle_round)

    def _idle_round(self) -> None:
        """After training: keep mixing toward the swarm, on a timer, as the daemon does."""
        if not self.training:
            return
        self.try_round()
        self._next_idle_round()

    def try_round(self) -> bool:
        """Make a round when the links can take it (``round_pace``, RoundPacer); offer it to
        every link, or with a copy per link each ready link its own delta.

        The daemon tells the pacer whenever a link may have turned busy or idle; here nothing
        happens between two events, so asking the links when a round is due is the same.
        """
        machines = {peer: link.machine for peer, link in self.links.items()}
        idle, ready = round_pace(machines, self.sim.events.now(), self.state.per_link)
        self.pacer.links_idle = idle
        if not self.pacer.begin(self.step):
            return False
        if self.codecs is not None:
            meters = {peer: m.meter for peer, m in machines.items()}
            compute_s = self.step_s * self.sim.cfg.gossip.local_steps
            now = self.sim.events.now()
            if self.state.per_link:
                self.state.set_link_codecs(self.codecs.update(meters, compute_s, now))
            else:
                self.state.set_round_codec(self.codecs.update_all(meters, compute_s, now))
        try:
            made = self.mixer.round(self.flat.flat, ready=ready)
            if made is None:
                return False
            self.counters.rounds += 1
            self.evictions.extend(made.newly_evicted)
            session, step, degree = self.state.session, self.step, self.degree
            if made.links:
                for peer, (seq, payload) in made.links.items():
                    self.links[peer].offer(Delta(self.node_id, session, seq, step, payload, degree))
                return True
            delta = Delta(self.node_id, session, made.seq, step, made.payload, degree)
            for link in list(self.links.values()):
                link.offer(delta)
            return True
        finally:
            self.pacer.end()

    # -- inbound: the daemon's path (node/daemon/inbound.py) ---------------------------------

    def rpc_push_delta(self, delta: Delta, stream: tuple[str, int], nbytes: int) -> int:
        """Raises Rejected as the daemon's service does; a stream that was refused once is
        dead, and what else arrives on it is dropped unread, as gRPC drops it."""
        if self._dead_streams.get(delta.sender) == stream:
            raise Rejected(Reason.GAP, "the stream was closed")
        try:
            return run_here(self.inbound.push_delta(delta, nbytes))
        except Rejected:
            self._dead_streams[delta.sender] = stream
            raise

    def rpc_push_snapshot(self, header: SnapshotHeader, values: torch.Tensor, nbytes: int) -> int:
        seq = run_here(self.inbound.push_snapshot(header, values, nbytes))
        self.check_ready()
        return seq

    # -- membership ---------------------------------------------------------------------------

    def send_swim(self, outgoing: Iterable[Outgoing]) -> None:
        sim = self.sim
        for out in outgoing:
            message = out.message
            nbytes = wire.swim_nbytes(message, PROTOCOL_VERSION)
            self.swim_bytes += nbytes
            relays = self.routes.get(out.address)
            if relays and not sim.holds_session(out.address, self.address):
                sim.relay_swim(self.address, out.address, relays, nbytes, message)
                continue
            sim.network.send(
                self.address, out.address, nbytes, sim.swim_delivery(out.address, message)
            )

    def receive_swim(self, message: SwimMessage) -> None:
        self.send_swim(self.swim.receive(message))
        self.after_swim()

    def tick_swim(self) -> None:
        if self.swim.next_deadline() <= self.sim.clock.now():
            self.send_swim(self.swim.tick())
        self.after_swim()

    def after_swim(self) -> None:
        """React to what changed (the daemon's membership task), and keep the timer set."""
        if not self.alive:
            return
        changes = self.swim.drain_changes()
        if changes:
            for record in changes:
                self._note(record)
            self.update_topology()
        self.sim.events.timer(self.address, self.swim.next_deadline(), self.tick_swim)

    def update_topology(self) -> None:
        """Derive the neighbours from the view; open and close links to match; and follow
        the view's relays (the daemon's Peers._follow_view)."""
        run_here(self.neighbourhood.update())
        self._follow_view()
        self.check_ready()

    def _read_view(self) -> None:
        """The live members' addresses and the routes to those behind NAT, from the whole view
        (then kept up to date from each change: a thousand nodes each rereading a view of a
        thousand on every change is what a simulation of them cannot afford)."""
        self._addresses.clear()
        self._live.clear()
        self.routes.clear()
        for record in self.swim.live_members():
            self._note(record)

    def _note(self, record: MemberRecord) -> None:
        if record.node_id == self.node_id:
            return
        old = self._addresses.pop(record.node_id, None)
        if old is not None:
            self._live.discard(old)
            self.routes.pop(old, None)
        if record.live:
            self._addresses[record.node_id] = record.address
            self._live.add(record.address)
            if record.relays:
                self.routes[record.address] = record.relays

    def _follow_view(self) -> None:
        if self.behind_nat:
            relays = choose_relays(self.swim.relays, self.sessions() & self._live)
            if relays:
                self.swim.set_relays(relays)

    # -- behind NAT ---------------------------------------------------------------------------

    def go_behind_nat(self, relays: tuple[str, ...]) -> None:
        """From now on nobody can dial this node: it names ``relays`` (members it joined
        through), then its neighbours as they come, and probes the relays it names."""
        self.behind_nat = True
        self.swim.set_relays(relays)
        self.sim.events.after(PROBE_EVERY_S, self._probe_relays)

    def _probe_relays(self) -> None:
        """The daemon's probes (node/daemon/dialout.py): one through each relay; a relay
        whose host is gone (a crash here is silent) fails it, known a timeout later."""
        if not self.alive:
            return
        gone = [r for r in self.swim.relays if self.sim.live_node(r) is None]
        for relay in self.swim.relays:
            if relay not in gone:
                self._misses.pop(relay, None)

        def verdict() -> None:
            for relay in gone:
                self._misses[relay] = misses = self._misses.get(relay, 0) + 1
                if misses >= PROBE_MISSES:
                    self._failed.add(relay)
            if gone and self.alive:
                self._follow_view()

        self.sim.events.after(PROBE_TIMEOUT_S, verdict)
        self.sim.events.after(PROBE_EVERY_S, self._probe_relays)

    def sessions(self) -> set[str]:
        """The members this node holds dial-out sessions to and trusts (behind NAT): its
        neighbours and the relays it names, less those whose probes failed."""
        if not self.behind_nat:
            return set()
        near = {m.address for m in map(self.view.get, self.neighbourhood.neighbours) if m}
        return (near | set(self.swim.relays)) - self._failed

    # -- pausing (the daemon's node/daemon/node.py _paused) -------------------------------------

    def pause(self) -> None:
        """Paused: no steps and no rounds; the record says so (the neighbours hear it at once),
        so every topology leaves this node out; membership goes on."""
        if self.paused or not self.alive:
            return
        self.paused = True
        self._paused_at = self.sim.clock.now()
        self._chain += 1
        if self.swim.set_paused(True):
            told = [m.address for m in map(self.view.get, self.neighbourhood.neighbours) if m]
            self.send_swim([self.swim.ping(address) for address in told])
        self.update_topology()

    def resume(self) -> None:
        """Back: after a long pause through a pull of the swarm's model first."""
        if not self.paused or not self.alive:
            return
        if self.sim.clock.now() - self._paused_at >= PULL_AFTER_PAUSE_S:
            self.sim.pull_after_pause(self)
        else:
            self.come_back()

    def come_back(self) -> None:
        """Into the topology again (new neighbours are greeted with our record), and on with
        the steps."""
        if not self.paused or not self.alive:
            return
        self.paused = False
        self.swim.set_paused(False)
        self.update_topology()
        if self.training:
            self._go_on()

    # -- joining ------------------------------------------------------------------------------

    def adopt(self, values: torch.Tensor, session: int, held: bool = False) -> None:
        """Take a pulled model as this node's model and public copy, in a new log; ``held``:
        the pull named it (the daemon's ``Gossiper.adopt``)."""
        self.flat.flat.copy_(values)
        self.state.restart(self.flat.flat.detach(), session)
        self.start_digest = model_digest(self.state.public) if held else b""

    # -- what a sample of the swarm reads ------------------------------------------------------

    def tensor_bytes(self) -> int:
        """Bytes of the tensors this node keeps: shard, model, optimizer state, x̂, replicas."""
        total = sum(t.numel() * t.element_size() for t in _shard_tensors(self.task))
        total += self.flat.flat.numel() * 4 + self.state.public.numel() * 4
        total += sum(r.value.numel() * 4 for r in self.state.replicas.values())
        for group in self.optimizer.state.values():
            total += sum(
                v.numel() * v.element_size() for v in group.values() if isinstance(v, torch.Tensor)
            )
        return total


def _shard_tensors(task: Task) -> list[torch.Tensor]:
    tensors = getattr(task.train, "tensors", ())
    return [t for t in tensors if isinstance(t, torch.Tensor)]
