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

:class:`SimNode` is built from parts, each in its own module, as the daemon's node is: this
module holds what the node keeps and how it is wired, its lifecycle (linking, the wait for its
edges, leaving), the inbound path, pausing and adopting a pulled model; node/sim/training.py
its local steps and rounds (:class:`SimTrainer`); node/sim/membership.py its SWIM state, view
and relays behind NAT (:class:`SimMembership`); node/sim/link.py each link (:class:`SimLink`).
"""

from __future__ import annotations

import random

import torch

from gossip.budget import ByteBudget
from gossip.codecs import AutoCodec
from gossip.digest import model_digest
from gossip.link import LinkConfig
from gossip.link_codecs import LinkCodecs
from gossip.membership import MemberView
from gossip.messages import Delta, Member, SnapshotHeader
from gossip.mixing import MixConfig, Mixer
from gossip.outer import OuterNesterov
from gossip.refusals import Reason
from gossip.replicas import GossipState, UpdateGuard
from gossip.swim import Swim, SwimMessage
from gossip.upload_cap import BUDGET_CHARGE, UploadCap, bound_rate
from node.daemon.flat import FlatParams
from node.daemon.inbound import Inbound
from node.daemon.neighbourhood import Neighbourhood
from node.daemon.pause import PULL_AFTER_PAUSE_S
from node.daemon.peers import LEAVE_FANOUT
from node.daemon.steps import run_here
from node.daemon.trainer import batches
from node.sim.link import SimLink
from node.sim.membership import SimMembership
from node.sim.training import SimTrainer
from node.sim.world import World
from node.tasks.base import Task
from node.telemetry.events import Counters
from node.transport import wire_sizes
from node.transport.base import Rejected

__all__ = ["SimNode"]

CPU = torch.device("cpu")


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
        #: Its steps and rounds (node/sim/training.py).
        self.trainer = SimTrainer(self, batches(task, CPU, cfg.seed * 1_000_003 + shard))
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
        #: Its SWIM state and view, and its relays behind NAT (node/sim/membership.py).
        self.membership = SimMembership(self, incarnation, rng)
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
        budget_cfg = g.budget_config if budgeted else None
        #: Under ``--compress auto``, each link's codec from its meter, as the daemon's.
        self.codecs = (
            LinkCodecs(self.state.numel, model_rate=bound_rate(g.max_upload_rate, budget_cfg))
            if g.codec == AutoCodec.name
            else None
        )
        #: The byte budget (gossip/budget.py) on the simulation's clock; its links spend it.
        self.budget = (
            ByteBudget(budget_cfg, sim.clock, BUDGET_CHARGE) if budget_cfg is not None else None
        )
        #: The digest of the model the node started from: a snapshot of it goes by name, as
        #: the daemon's (node/daemon/gossiper.py).
        self.start_digest = model_digest(self.state.public)
        #: The upload cap (gossip/upload_cap.py): its links' models wait for it, as the daemon's.
        self.upload_cap = (
            UploadCap(g.max_upload_rate, sim.clock.now()) if g.max_upload_rate is not None else None
        )
        self.mixer = Mixer(self.state, mix, outer, budget=self.budget)
        self.link_cfg = LinkConfig(
            queue=g.link_queue, window_s=g.link_window_s, call_timeout_s=g.call_timeout_s
        )
        self.neighbourhood: Neighbourhood[SimLink] = Neighbourhood(
            self.view,
            g,
            self._open_link,
            SimLink.close,
            lambda peer: self.membership.send([self.swim.ping(peer.address)]),
            self.mixer.set_neighbours,
        )
        self.counters = Counters()
        self.inbound = Inbound(self.state, self.counters, sim.clock)
        #: Paused (SimConfig.paused_fraction): a member, out of the topology, idle.
        self.paused = False
        self._paused_at = 0.0
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

    @property
    def step(self) -> int:
        """Local steps taken."""
        return self.trainer.step

    @property
    def loss(self) -> float:
        """The last local step's loss (NaN before the first)."""
        return self.trainer.loss

    @property
    def evictions(self) -> list[str]:
        """Every neighbour this node's anomaly score evicted, once per eviction (robust mixing)."""
        return self.trainer.evictions

    # -- wire sizes, from the daemon's wire module --------------------------------------------

    def delta_nbytes(self, delta: Delta) -> tuple[int, int]:
        """(serialized size, size with an fp32 payload); the same delta goes to every link."""
        if self._sizes[0] != delta.seq:
            nbytes = wire_sizes.delta_nbytes(delta)
            # wire_sizes.delta_fp32_nbytes, without serializing the shell a second time.
            fp32 = nbytes - delta.payload.nbytes + 4 * delta.payload.numel
            self._sizes = (delta.seq, (nbytes, fp32))
        return self._sizes[1]

    def snapshot_nbytes(self, header: SnapshotHeader) -> int:
        return wire_sizes.snapshot_nbytes(header)

    # -- lifecycle ----------------------------------------------------------------------------

    def start_links(self) -> None:
        """The node has its starting model: link to the neighbours, and train once every edge
        is up both ways (or after ``wait_timeout_s``), as the daemon does."""
        run_here(self.neighbourhood.start_linking())
        self.membership.read_view()
        self.membership.follow_view()
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
        self.trainer.go_on()

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
        self.membership.send(self.swim.leave(LEAVE_FANOUT, list(self.links)))
        self.stop()

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

    # -- membership (node/sim/membership.py) --------------------------------------------------

    @property
    def swim(self) -> Swim:
        return self.membership.swim

    @property
    def view(self) -> MemberView:
        return self.membership.view

    @property
    def swim_bytes(self) -> int:
        """Bytes of the membership messages this node sent."""
        return self.membership.swim_bytes

    @property
    def behind_nat(self) -> bool:
        """Nobody can dial this node (node/sim/nat.py): it names relays."""
        return self.membership.behind_nat

    def receive_swim(self, message: SwimMessage) -> None:
        self.membership.receive(message)

    def after_swim(self) -> None:
        """React to what changed in the view, and keep SWIM's timer set."""
        self.membership.after_swim()

    def go_behind_nat(self, relays: tuple[str, ...]) -> None:
        """From now on nobody can dial this node: it names ``relays``, then its neighbours."""
        self.membership.go_behind_nat(relays)

    def sessions(self) -> set[str]:
        """The members this node holds dial-out sessions to and trusts (behind NAT)."""
        return self.membership.sessions()

    def update_topology(self) -> None:
        """Derive the neighbours from the view; open and close links to match; and follow
        the view's relays (the daemon's Peers._follow_view)."""
        run_here(self.neighbourhood.update())
        self.membership.follow_view()
        self.check_ready()

    # -- pausing (the daemon's node/daemon/node.py _paused) -------------------------------------

    def pause(self) -> None:
        """Paused: no steps and no rounds; the record says so (the neighbours hear it at once),
        so every topology leaves this node out; membership goes on."""
        if self.paused or not self.alive:
            return
        self.paused = True
        self._paused_at = self.sim.clock.now()
        self.trainer.halt()
        if self.swim.set_paused(True):
            # In id order: the order of the pings sets the order of events at one instant.
            near = sorted(self.neighbourhood.neighbours)
            told = [m.address for m in map(self.view.get, near) if m]
            self.membership.send([self.swim.ping(address) for address in told])
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
            self.trainer.go_on()

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
        for group in self.trainer.optimizer.state.values():
            total += sum(
                v.numel() * v.element_size() for v in group.values() if isinstance(v, torch.Tensor)
            )
        return total


def _shard_tensors(task: Task) -> list[torch.Tensor]:
    tensors = getattr(task.train, "tensors", ())
    return [t for t in tensors if isinstance(t, torch.Tensor)]
