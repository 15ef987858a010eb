"""A node's parts and their wiring: what :class:`node.daemon.node.Node` is built from.

The node is an assembly of parts, each in its own module and given only what it uses:
the state-dir keeper (statedir.py: checkpoints, summary, revocations file), the joiner
(joiner.py: finding the swarm, pulling its model), the round scheduler (rounds.py), the status
builder (status_builder.py), and the service's port (port.py, what node/daemon/service.py sees
of the node). Parts tell each other of changes and failures through one :class:`Signals`
(signals.py). Time and randomness come from one :class:`Runtime` (node/runtime.py).

:class:`NodeParts` builds and wires the parts (and :meth:`NodeParts.create` does the I/O that
needs); what the parts call back into, and the lifecycle, are the node's (node/daemon/node.py).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import functools
import logging
import threading
import time
from pathlib import Path
from typing import Self

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
from node.daemon.pause import Pauser
from node.daemon.peers import Peers
from node.daemon.port import DaemonPort
from node.daemon.reporting import EvalRecorder
from node.daemon.rounds import RoundScheduler
from node.daemon.service import NodeService
from node.daemon.signals import Phase, Signals
from node.daemon.statedir import (
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
from node.telemetry.events import Counters, MetricsLog
from node.telemetry.metrics import MetricsServer
from node.telemetry.mqtt import MqttBridge
from node.telemetry.status import NodeStatus
from node.transport.base import Transport
from node.transport.grpc import GrpcTransport, GrpcTransportConfig

__all__ = ["NodeParts"]

log = logging.getLogger(__name__)


def _max_message_bytes(numel: int, codec: Codec) -> int:
    """A delta of the whole model in the swarm's codec (under auto's set, its largest) plus
    headroom for headers (and for snapshot and model chunks, a MiB each): larger input is
    refused by gRPC itself."""
    members = codec.members.values() if isinstance(codec, AutoCodec) else (codec,)
    return max(c.encoded_nbytes(numel) for c in members) + (1 << 20)


class NodeParts(abc.ABC):
    """The parts of one node, wired to each other and to the node's answers (the abstract
    methods below, which :class:`node.daemon.node.Node` gives); nothing runs yet."""

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
        self.peers.trained = self.trainer.done.is_set
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
        # What start() fills in (node/daemon/node.py).
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
    ) -> Self:
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

    # -- late binding: a part built early calls one built after it ----------------------------

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

    # -- what the parts tell the node: its answers (node/daemon/node.py) ----------------------

    @abc.abstractmethod
    def _rolled_back(self, rollback: Rollback) -> None: ...

    @abc.abstractmethod
    def _on_eval(self, result: EvalResult) -> None: ...

    @abc.abstractmethod
    def _on_training_done(self) -> None: ...

    @abc.abstractmethod
    async def _paused(self, paused: bool, lasted_s: float) -> None: ...

    @abc.abstractmethod
    async def control(self, action: str) -> tuple[bool, str]: ...

    @abc.abstractmethod
    async def status(self) -> NodeStatus: ...
