"""One murmur node: a trainer thread, a gossip worker, links to neighbours and a server.

Usage::

    node = await Node.create(cfg)
    async with node:
        await node.wait_failed()   # or until a signal

Start-up: resume from the state dir's newest usable checkpoint if there is one (a damaged one
is moved aside, see node/daemon/checkpoint.py); serve; introduce ourselves through the members the
checkpoint remembers, then the join addresses, then the members announced on the MQTT broker
(with discovery), which checks the task fingerprint and brings the member list; a fresh joiner
then pulls the current model from a neighbour so that it starts near consensus; links to the
neighbours open, and training starts once enough members are known. From then on SWIM keeps
the member view current, and the neighbours follow it.

The node is an assembly of parts, each in its own module and given only what it uses:
the state-dir keeper (statedir.py: checkpoints, summary, revocations file), the joiner
(joiner.py: finding the swarm, pulling its model), the start of training (startup.py), the round
scheduler (rounds.py), the status builder (status_builder.py), and the service's port
(port.py, what node/daemon/service.py sees of the node). Parts tell each other of changes and
failures through one :class:`Signals` (signals.py). Time and randomness come from one
:class:`Runtime` (node/runtime.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import torch

from gossip.budget import ByteBudget
from gossip.codecs import AutoCodec, Codec
from gossip.messages import TaskFingerprint
from gossip.outer import OuterNesterov
from gossip.replicas import GossipState, UpdateGuard
from gossip.upload_cap import BUDGET_CHARGE
from node.config import NodeConfig
from node.daemon.budget_keeper import BudgetKeeper
from node.daemon.checkpoint import CHECKPOINT_FILE, Checkpoint
from node.daemon.device import resolve_device
from node.daemon.flat import FlatParams
from node.daemon.gossiper import Gossiper
from node.daemon.inbound import Inbound
from node.daemon.joiner import Joiner
from node.daemon.pause import PULL_AFTER_PAUSE_S, Pauser
from node.daemon.peers import JoinError, Peers
from node.daemon.port import DaemonPort
from node.daemon.reporting import EvalRecorder, serve_metrics
from node.daemon.rounds import RoundScheduler
from node.daemon.service import NodeService
from node.daemon.signals import Phase, Signals
from node.daemon.startup import wait_to_train
from node.daemon.statedir import (
    METRICS_FILE,
    SUMMARY_FILE,
    StateKeeper,
    check_resumable,
    keep_revocations,
    remembered,
    restore,
    revocations_path,
)
from node.daemon.status_builder import StatusBuilder
from node.daemon.trainer import EvalResult, Rollback, Trainer
from node.runtime import Runtime, WallClock
from node.security.identity import Identity, load_or_create_identity
from node.security.pki import load_tls
from node.security.signing import (
    MemberVerifier,
    RecordScreen,
    certificate_der,
    public_key_der,
    record_signer,
)
from node.tasks.base import Shard, Task, load_task
from node.telemetry.console import Summary
from node.telemetry.events import Counters, MetricsLog
from node.telemetry.metrics import MetricsServer
from node.telemetry.mqtt import MqttBridge
from node.telemetry.status import NodeStatus
from node.transport.base import Transport
from node.transport.grpc import GrpcTransport, GrpcTransportConfig

__all__ = ["METRICS_FILE", "PULL_AFTER_PAUSE_S", "SUMMARY_FILE", "JoinError", "Node"]

log = logging.getLogger(__name__)


def _advertised(bound: str) -> str:
    """The bound address, with a wildcard host replaced by this machine's primary address."""
    host, _, port = bound.rpartition(":")
    if host not in ("0.0.0.0", "[::]", "::", ""):
        return bound
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it only picks a route
        return f"{s.getsockname()[0]}:{port}"
    return f"127.0.0.1:{port}"


def _max_message_bytes(numel: int, codec: Codec) -> int:
    """A delta of the whole model in the swarm's codec (under auto's set, its largest) plus
    headroom for headers (and for snapshot and model chunks, a MiB each): larger input is
    refused by gRPC itself."""
    members = codec.members.values() if isinstance(codec, AutoCodec) else (codec,)
    return max(c.encoded_nbytes(numel) for c in members) + (1 << 20)


class Node:
    """Build with :meth:`create`; it does the I/O that construction needs."""

    def __init__(
        self,
        cfg: NodeConfig,
        identity: Identity,
        task: Task,
        device: torch.device,
        transport: Transport,
        runtime: Runtime,
        resume: Checkpoint | None = None,
        ca_pem: bytes | None = None,
        resume_path: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.identity = identity
        self.node_id = identity.node_id
        self.device = device
        self.task = task
        self.transport = transport
        self.runtime = runtime
        clock = self.clock = runtime.clock
        task.model.to(device)
        self.flat = FlatParams(task.model)
        g = cfg.gossip
        codec = g.swarm_codec()
        self.fingerprint = TaskFingerprint.of(self.flat.specs, codec)
        self.resumed = resume
        if resume is not None:
            resume_path = resume_path or cfg.state_dir / CHECKPOINT_FILE
            check_resumable(resume, self.fingerprint, cfg, resume_path)
            task.model.load_state_dict(resume.model)
            log.info("resuming from %s at step %d", resume_path, int(resume.meta["step"]))
        self.model_lock = threading.Lock()
        rounding = torch.Generator(device=device).manual_seed(runtime.rng.getrandbits(62))
        self.state = GossipState(
            self.flat.flat,
            codec,
            clock,
            rounding,
            session=runtime.rng.getrandbits(62),
            # With robust mixing a snapshot must also agree with a second member.
            guard=UpdateGuard(consistency=1.0 if g.robust else None),
            per_link=g.pace == "link",
        )
        if resume is not None:
            self.state.public.copy_(resume.public)
        budget_cfg = g.budget_config
        #: The byte budget (None: none), on the wall clock: its periods are the calendar's.
        self.budget = (
            ByteBudget(budget_cfg, WallClock(), BUDGET_CHARGE) if budget_cfg is not None else None
        )
        self.budget_keeper = (
            BudgetKeeper(self.budget, cfg.state_dir, runtime.sleep)
            if self.budget is not None
            else None
        )
        if self.budget_keeper is not None:
            self.budget_keeper.load()
        self.gossiper = Gossiper(
            self.node_id,
            self.state,
            self.flat,
            self.model_lock,
            g.step_size,
            g.silence_limit_s,
            clock,
            robust=g.robust,
            byzantine_fraction=g.byzantine_fraction,
            attack=g.attack,
            outer=OuterNesterov(g.outer_lr, g.outer_momentum) if g.outer_lr else None,
            trigger=g.trigger_config,
            budget=self.budget,
            link_gamma=g.link_gamma,
            schedule=g.schedule_config,
        )
        if resume is not None:  # the neighbours hold no public copy of ours to name
            self.gossiper.start_digest = b""
        self.phase = Phase()
        self.signals = signals = Signals(self.node_id[:8])
        trainer_cfg = dataclasses.replace(cfg.trainer, seed=cfg.seed * 1_000_003 + cfg.shard_index)
        self.trainer = Trainer(
            task,
            device,
            self.model_lock,
            trainer_cfg,
            after_step=self._after_step,
            on_eval=signals.on_loop(self._on_eval),
            on_done=signals.on_loop(self._on_training_done),
            start_step=int(resume.meta["step"]) if resume else 0,
            on_rollback=signals.on_loop(self._rolled_back),
            clock=clock,
            # The trainer's thread observes (thread-safe); the counters come next, before it runs.
            on_step_time=lambda seconds: self.counters.histograms.step_seconds.observe(seconds),
        )
        if resume is not None and resume.optimizer is not None:
            self.trainer.optimizer.load_state_dict(dict(resume.optimizer))
        if resume is not None and resume.schedule is not None and self.trainer.schedule:
            self.trainer.schedule.load_state_dict(dict(resume.schedule))
        self.counters = Counters()
        #: Which member records enter the view (admission by the CA: node/security/signing.py).
        self.verifier = MemberVerifier(ca_pem, self.counters.rejected)
        if isinstance(transport, GrpcTransport):
            transport.screen = RecordScreen(self.verifier, clock)
        self.peers = Peers(
            self.node_id,
            self.fingerprint,
            transport,
            self.gossiper,
            self.counters,
            g,
            cfg.membership,
            # Above any incarnation an earlier run of this node had (it restarts later).
            incarnation=time.time_ns() // 1_000_000,
            runtime=runtime,
            spawn=signals.spawn,
            on_view_change=signals.changed,
            on_links_change=self._links_changed,
            signing=(record_signer(identity), public_key_der(identity), self.verifier),
            ca_pem=ca_pem,
            on_revocations=functools.partial(keep_revocations, revocations_path(cfg)),
            budget=self.budget,
        )
        self.peers.compute_s = self._compute_s
        self.keeper = StateKeeper(
            cfg,
            self.node_id,
            self.fingerprint,
            task,
            self.model_lock,
            self.trainer,
            self.state,
            self.peers.swim,
            self.gossiper,
            resume,
            runtime.sleep,
        )
        self.rounds = RoundScheduler(
            g.local_steps,
            self.gossiper,
            self.peers,
            self.trainer,
            self.counters,
            signals,
            runtime,
            g.max_local_steps,
        )
        self.joiner = Joiner(
            cfg,
            self.node_id,
            [m["address"] for m in remembered(resume, self.node_id)],
            self.peers,
            transport,
            self.flat,
            self.gossiper,
            self.state.guard or UpdateGuard(),
            device,
            self.counters,
            runtime,
        )
        self.evals = EvalRecorder(
            self.node_id, self.trainer, self.counters, self.peers, self.gossiper, signals
        )
        self.status_builder = StatusBuilder(
            cfg, self.node_id, device, self.trainer, self.peers, self.gossiper, self.counters, clock
        )
        inbound = Inbound(
            self.state,
            self.counters,
            clock,
            accepting=self.phase.accepting,
            on_replicas=self.gossiper.published,
        )
        port = DaemonPort(
            self.node_id,
            self.fingerprint,
            self.peers,
            self.gossiper,
            self.trainer,
            signals,
            self.status,
            lambda action: self.control(action),
        )
        self.service = NodeService(port, inbound)
        p = cfg.power
        #: When the node is paused: its device's policy and the hand (node/daemon/pause.py).
        self.pauser = Pauser(p.policy, p.sysfs_root, p.poll_interval_s, runtime, self._paused)
        self.status_builder.pauser = self.pauser
        self.address = ""
        self.metrics: MetricsLog | None = None
        self.metrics_server: MetricsServer | None = None
        self.mqtt: MqttBridge | None = None
        #: Set once the trainer has stopped for good (budget spent, or failed).
        self.training_finished = asyncio.Event()
        self._stopped = False

    @classmethod
    async def create(
        cls,
        cfg: NodeConfig,
        transport: Transport | None = None,
        runtime: Runtime | None = None,
    ) -> Node:
        """Load the identity and its certificate, the device and the task; nothing starts yet.

        Args:
            runtime: the node's time and randomness; by default the running loop's clock and
                an RNG seeded by the operating system.

        Raises:
            ValueError: the device, the task or a valid certificate cannot be had.
            FileNotFoundError: the TLS files are missing (and ``cfg.insecure`` is not set).
        """
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # The key that names the node is the one its certificate was issued for.
        key_dir = cfg.tls_dir or cfg.state_dir
        tls = None if cfg.insecure else await asyncio.to_thread(load_tls, key_dir)
        identity = await asyncio.to_thread(load_or_create_identity, key_dir)
        device = resolve_device(cfg.device)
        factory = load_task(cfg.task)
        # Seed right before the factory so that every node builds the same initial model.
        torch.manual_seed(cfg.seed)
        task = factory(Shard(cfg.shard_index, cfg.shard_count, cfg.alpha, cfg.seed))
        if transport is None:
            numel = sum(p.numel() for p in task.model.parameters())
            g = cfg.gossip
            limit = _max_message_bytes(numel, g.swarm_codec())
            transport = GrpcTransport(GrpcTransportConfig(limit, tls))
        resume, resume_path = await asyncio.to_thread(restore, cfg, task)
        ca_pem = tls.ca_pem if tls else None
        runtime = runtime or Runtime.on_loop()
        node = cls(cfg, identity, task, device, transport, runtime, resume, ca_pem, resume_path)
        if tls is not None:  # the CA's proof of this node's id rides on its member records
            node.peers.swim.certificate = certificate_der(tls.cert_pem)
        return node

    @property
    def ready(self) -> bool:
        """Serving and joined: the node takes messages."""
        return self.phase.ready

    @property
    def closing(self) -> bool:
        """Stopping: the node takes no more messages."""
        return self.phase.closing

    @property
    def failure(self) -> BaseException | None:
        return self.signals.failure

    # -- lifecycle ----------------------------------------------------------------------------

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Serve, join, and start training once enough members are known.

        Raises:
            JoinError: every join address refused us or stayed silent.
            OSError: the listen address cannot be bound.
        """
        self.signals.bind(asyncio.get_running_loop())
        bound = await self.transport.serve(self.service, self.cfg.listen)
        self.address = self.cfg.advertise or _advertised(bound)
        self.peers.set_address(self.address)
        self.status_builder.address = self.address
        self.peers.membership.start()
        self.metrics_server = serve_metrics(
            self.cfg, self.status, self.readiness, self.counters.histograms
        )
        self.metrics = MetricsLog(self.cfg.state_dir / METRICS_FILE)
        self.keeper.metrics = self.joiner.metrics = self.evals.metrics = self.metrics
        self.metrics.write(
            "start",
            node_id=self.node_id,
            address=self.address,
            # What the report judges this task by (node/tasks/base.py Metric).
            metric=self.task.metric,
            target=self.task.target,
        )
        self.phase.ready = True
        log.info(
            "node %s listening on %s (device %s, codec %s, %d parameters)",
            self.node_id[:8],
            self.address,
            self.device,
            self.cfg.gossip.codec,
            self.flat.numel,
        )
        mqtt = self.cfg.mqtt_config()
        if mqtt is not None:
            # Before joining: with discovery, the broker may be how this node finds the swarm.
            self.mqtt = MqttBridge(
                mqtt,
                self.node_id,
                self.address,
                self.status,
                self.runtime,
                self._join_announced,
            )
            self.mqtt.start()
        helper = await self.joiner.find_swarm(self.mqtt)
        if self.mqtt is not None:
            self.mqtt.follow()
        if helper is not None and self.resumed is None:
            await self.joiner.pull_model(helper)
        await self.peers.start_links()
        spawn = self.signals.spawn
        spawn(self._start_training(), "starter")
        spawn(self.keeper.checkpoint_periodically(), "checkpoints")
        if self.budget_keeper is not None:
            spawn(self.budget_keeper.run(), "budget")
        if self.pauser.policy.active:
            spawn(self.pauser.run(), "power")
        if self.peers.ca_pem is not None:
            spawn(self.keeper.watch_revocations(self.peers.adopt_revocations), "revocations")

    async def _join_announced(self, node_id: str, address: str) -> None:
        if not self.closing:
            await self.joiner.join_announced(node_id, address)

    async def _start_training(self) -> None:
        s = self.signals
        await wait_to_train(self.cfg, self.node_id, self.peers, self.gossiper, s, self.clock)
        if self.cfg.summary_interval_s > 0:
            summary = Summary(self.status, self.cfg.summary_interval_s)
            s.spawn(summary.run(), "summary")
        self.trainer.start()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop training and gossip, close the network, then write the final checkpoint.

        The order matters: first nothing may change the model any more (trainer, then gossip
        rounds), then nothing may arrive (server), and only then is the state written, so the
        checkpoint is one consistent moment.
        """
        if self._stopped:
            return
        self._stopped = True
        if self.ready:
            # First, while everything still runs: the neighbours drop us and pick others now,
            # instead of suspecting us for the length of a suspicion timeout.
            await self.peers.leave()
        if self.mqtt is not None:
            # Offline on the broker as soon as the swarm knows; the goodbye's last status needs
            # the gossip worker, which stops below.
            await self.mqtt.stop()
        self.phase.closing = True
        if self.metrics_server is not None:
            # On a thread: shutting the server down waits for a scrape that may be waiting
            # for this event loop.
            await asyncio.to_thread(self.metrics_server.stop)
        await self.pauser.stop()
        self.trainer.request_stop()
        await asyncio.to_thread(self.trainer.join)
        await self.signals.cancel_tasks()
        await self.peers.stop()
        await self.transport.close(grace_s)
        await asyncio.to_thread(self.gossiper.close)
        if self.budget_keeper is not None:
            await asyncio.to_thread(self.budget_keeper.save)
        if self.ready:
            await self.keeper.write_final_state(3 * 4 * self.flat.numel, self.status_builder.build)
        if self.metrics is not None:
            self.metrics.close()
        log.info("node %s stopped at step %d", self.node_id[:8], self.trainer.step)

    async def wait_failed(self) -> BaseException:
        """Returns the error that stopped this node's work (training diverged, say)."""
        return await self.signals.wait_failed()

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds, re-checking whenever the node's state changes
        (a round made or received, a step evaluated, a member learned, training finished).

        Raises:
            TimeoutError: it did not hold within ``timeout_s``.
        """
        await self.signals.wait_until(predicate, timeout_s)

    def notify_change(self) -> None:
        """Wake every :meth:`wait_until` (event loop only)."""
        self.signals.changed()

    # -- what the trainer and the links tell the node -------------------------------------------

    def _after_step(self, step: int) -> None:
        self.rounds.after_step(step)

    def _compute_s(self) -> float:
        """Seconds of training between two rounds (``local_steps`` steps at the trainer's
        pace): what a round on a link never takes less than, for ``--compress auto``."""
        rate = self.trainer.samples_per_s
        if rate <= 0:
            return 0.0
        return self.cfg.gossip.local_steps * self.trainer.task.batch_size / rate

    def _links_changed(self) -> None:
        self.rounds.links_changed()

    def _rolled_back(self, rollback: Rollback) -> None:
        """Event loop: the trainer went back to its last finite state."""
        self.keeper.rolled_back(rollback, record=not self.closing)
        self.notify_change()

    def _on_eval(self, result: EvalResult) -> None:
        self.notify_change()
        self.evals.evaluated(result, record=not self.closing)

    def _on_training_done(self) -> None:
        self.training_finished.set()
        self.notify_change()
        if self.trainer.error is not None:
            self.signals.fail(self.trainer.error)
            return
        if not self.closing:
            log.info("node %s finished training at step %d", self.node_id[:8], self.trainer.step)
            interval_s = self.cfg.gossip.idle_round_interval_s
            if interval_s is not None:  # None: no rounds once training is over
                self.signals.spawn(self.rounds.idle_gossip(interval_s), "idle-gossip")

    # -- pausing ------------------------------------------------------------------------------

    async def control(self, action: str) -> tuple[bool, str]:
        """``pause`` or ``resume`` by hand, or ``query``; returns whether the node is paused
        (or pausing: the change takes effect in moments, a resume's pull in longer), and why.
        A resume by hand ends only a pause by hand."""
        if action in ("pause", "resume") and not self.closing:
            self.pauser.by_hand(action == "pause")
        return self.pauser.paused, self.pauser.reason

    async def _paused(self, paused: bool, lasted_s: float) -> None:
        """Event loop: the pauser says the node pauses (or resumes after ``lasted_s``).

        Paused, the node takes no steps and makes no rounds; its record says it is paused, so
        every member's topology leaves it out (it keeps no links) while it still answers SWIM.
        On resume after a long pause it first pulls the swarm's model (from members that are
        not paused), then comes back into the topology, then trains.
        """
        if self.closing:
            return
        if paused:
            self.trainer.pause()
            await self.peers.set_paused(True)
        else:
            if lasted_s >= PULL_AFTER_PAUSE_S:
                helper = self._catch_up_helper()
                if helper is not None:
                    await self.joiner.pull_model(helper)
            await self.peers.set_paused(False)
            self.trainer.resume()
        if self.metrics is not None:
            self.metrics.write(
                "pause" if paused else "resume",
                reason=self.pauser.reason,
                step=self.trainer.step,
                paused_s=lasted_s,
            )
        self.notify_change()

    def _catch_up_helper(self) -> str | None:
        """A member to pull the model from after a pause: live, dialable, not paused."""
        view = self.peers.view
        skip = view.unreachable | view.paused | {self.node_id}
        found = [m.address for m in view.members if m.node_id not in skip]
        return self.runtime.rng.choice(found) if found else None

    # -- status and state ---------------------------------------------------------------------

    def readiness(self) -> str | None:
        """None once the node has joined, is training (or trained) and every link of its is up;
        else why not, on one line (``/readyz``; event loop only)."""
        return self.status_builder.readiness(self.closing)

    async def status(self) -> NodeStatus:
        return await self.status_builder.status()

    async def write_checkpoint(self) -> None:
        """Write the checkpoint now (atomically: a crash at any moment leaves a readable one),
        unless the node has nothing worth keeping yet."""
        await self.keeper.write_checkpoint()
