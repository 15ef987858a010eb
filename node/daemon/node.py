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

A node that never started training (its start failed, or it was stopped while waiting) writes
no checkpoint, and a node whose training diverged keeps its last finite one: what is on disk is
always a state worth resuming from.

Gossip rounds follow the trainer's steps (at least ``local_steps`` apart, and only when the
links have carried the previous round) and, once the step budget is spent, a slow timer, so
that a finished node keeps pulling toward the swarm and serving its model until it is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import json
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVarTuple

import torch

from gossip.codecs import get_codec
from gossip.messages import Delta, ParamSpec, TaskFingerprint
from gossip.mixing import RoundPacer
from gossip.outer import OuterNesterov
from gossip.refusals import REFUSALS
from gossip.replicas import GossipState, UpdateGuard, agreeing_pair, relative_distance
from node.config import NodeConfig
from node.daemon.checkpoint import (
    CHECKPOINT_FILE,
    PREVIOUS_FILE,
    Checkpoint,
    atomic_write,
    check_fits,
    remove_stale_temp_files,
    restore_latest,
    save_checkpoint,
)
from node.daemon.device import resolve_device
from node.daemon.flat import FlatParams
from node.daemon.gossiper import Gossiper, NeighbourView
from node.daemon.links import transfer_timeout_s
from node.daemon.peers import JoinError, Peers
from node.daemon.service import NodeService
from node.daemon.trainer import Diverged, EvalResult, Rollback, Trainer
from node.daemon.transfer import receive_model
from node.security.identity import Identity, load_or_create_identity, write_atomic
from node.security.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE, load_tls
from node.security.revocation import REVOKED_FILE, Revocations, read_revocations_file
from node.security.signing import (
    MemberVerifier,
    RecordScreen,
    certificate_der,
    public_key_der,
    record_signer,
)
from node.tasks.base import Shard, Task, load_task
from node.telemetry.console import CheckpointProgress, Summary, checkpoint_nbytes, with_countdown
from node.telemetry.events import Counters, MetricsLog, json_safe
from node.telemetry.metrics import MetricsServer, MetricsTls, metrics_host
from node.telemetry.mqtt import MqttBridge
from node.telemetry.progress import TickerConfig, fmt_duration, fmt_size
from node.telemetry.status import NeighbourStatus, NodeStatus, status_to_json, summarise_members
from node.transport.base import Reason, Rejected, Transport, Unreachable
from node.transport.grpc import GrpcTransport, GrpcTransportConfig

__all__ = ["JoinError", "MonotonicClock", "Node"]

log = logging.getLogger(__name__)

Ts = TypeVarTuple("Ts")

SUMMARY_FILE = "summary.json"
#: Models a joiner pulls at most, looking for two that agree.
MAX_PULLS = 3
#: How often a node looks for a new revocation list in its state dir.
REVOCATIONS_POLL_S = 2.0
#: A join that has not answered in 2 s says so, then ever less often (7, 17, 37, 67 s...).
_JOIN_TICKS = TickerConfig(first_s=2.0, every_s=5.0, growth=2.0, max_s=30.0)
#: The wait for members says what it waits for at once, then ever less often.
_WAIT_TICKS = TickerConfig(first_s=0.0, every_s=5.0, growth=2.0, max_s=30.0)
METRICS_FILE = "metrics.jsonl"
#: How long the members a checkpoint remembers get to answer when join addresses or the broker
#: come after them: a live member answers within a round trip (an answer under way may take up
#: to the call timeout), and dead ones must not hold up the rest for long.
REJOIN_TIMEOUT_S = 5.0


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()


def _advertised(bound: str) -> str:
    """The bound address, with a wildcard host replaced by this machine's primary address."""
    host, _, port = bound.rpartition(":")
    if host not in ("0.0.0.0", "[::]", "::", ""):
        return bound
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it only picks a route
        return f"{s.getsockname()[0]}:{port}"
    return f"127.0.0.1:{port}"


def _max_message_bytes(numel: int, codec: str, block_size: int) -> int:
    """A delta of the whole model in the swarm's codec plus headroom for headers (and for
    snapshot and model chunks, a MiB each): larger input is refused by gRPC itself."""
    return get_codec(codec, block_size).encoded_nbytes(numel) + (1 << 20)


class Node:
    """Build with :meth:`create`; it does the I/O that construction needs."""

    def __init__(
        self,
        cfg: NodeConfig,
        identity: Identity,
        task: Task,
        device: torch.device,
        transport: Transport,
        clock: MonotonicClock,
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
        task.model.to(device)
        self.flat = FlatParams(task.model)
        g = cfg.gossip
        codec = get_codec(g.codec, g.block_size, g.compress_fraction)
        self.fingerprint = TaskFingerprint.of(self.flat.specs, codec)
        self.resumed = resume
        if resume is not None:
            resume_path = resume_path or cfg.state_dir / CHECKPOINT_FILE
            _check_resumable(resume, self.fingerprint, cfg, resume_path)
            task.model.load_state_dict(resume.model)
            log.info("resuming from %s at step %d", resume_path, int(resume.meta["step"]))
        self.model_lock = threading.Lock()
        rounding = torch.Generator(device=device).manual_seed(random.getrandbits(62))
        self.state = GossipState(
            self.flat.flat,
            codec,
            clock,
            rounding,
            session=random.getrandbits(62),
            # With robust mixing a snapshot must also agree with a second member.
            guard=UpdateGuard(consistency=1.0 if g.robust else None),
        )
        if resume is not None:
            self.state.public.copy_(resume.public)
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
        )
        trainer_cfg = dataclasses.replace(cfg.trainer, seed=cfg.seed * 1_000_003 + cfg.shard_index)
        self.trainer = Trainer(
            task,
            device,
            self.model_lock,
            trainer_cfg,
            after_step=self._after_step,
            on_eval=self._on_loop(self._on_eval),
            on_done=self._on_loop(self._on_training_done),
            start_step=int(resume.meta["step"]) if resume else 0,
            on_rollback=self._on_loop(self._rolled_back),
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
        self.service = NodeService(self)
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
            clock=clock,
            spawn=self._spawn,
            on_view_change=self._view_changed,
            on_links_change=self._links_changed,
            signing=(record_signer(identity), public_key_der(identity), self.verifier),
            ca_pem=ca_pem,
            on_revocations=self._keep_revocations,
        )
        self.address = ""
        self.ready = False
        self.closing = False
        self.failure: BaseException | None = None
        self.metrics: MetricsLog | None = None
        self.metrics_server: MetricsServer | None = None
        self.mqtt: MqttBridge | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Round pacing, shared by the trainer thread and the event loop (hence the lock).
        self._round_lock = threading.Lock()
        self._pacer = RoundPacer(g.local_steps)
        self._failed = asyncio.Event()
        self._change = asyncio.Event()  # replaced by a fresh one at every change
        #: Set once the trainer has stopped for good (budget spent, or failed).
        self.training_finished = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._checkpoint_lock = threading.Lock()
        self._final_written = False
        self._save_failing = False  # a write failed (a full disk): warn once, not every time
        self._checkpoint_progress = CheckpointProgress(cfg.state_dir / CHECKPOINT_FILE)
        #: The last evaluation written to the metrics log (step, accuracy, loss to 4 digits).
        self._logged_eval: tuple[int, float, str] | None = None

    @classmethod
    async def create(
        cls,
        cfg: NodeConfig,
        transport: Transport | None = None,
        clock: MonotonicClock | None = None,
    ) -> Node:
        """Load the identity and its certificate, the device and the task; nothing starts yet.

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
            limit = _max_message_bytes(numel, g.codec, g.block_size)
            transport = GrpcTransport(GrpcTransportConfig(limit, tls))
        resume, resume_path = await asyncio.to_thread(_restore, cfg, task)
        ca_pem = tls.ca_pem if tls else None
        clock = clock or MonotonicClock()
        node = cls(cfg, identity, task, device, transport, clock, resume, ca_pem, resume_path)
        if tls is not None:  # the CA's proof of this node's id rides on its member records
            node.peers.swim.certificate = certificate_der(tls.cert_pem)
        return node

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
        self._loop = asyncio.get_running_loop()
        bound = await self.transport.serve(self.service, self.cfg.listen)
        self.address = self.cfg.advertise or _advertised(bound)
        self.peers.set_address(self.address)
        self.peers.membership.start()
        if self.cfg.metrics_port is not None:
            key_dir = self.cfg.tls_dir or self.cfg.state_dir
            tls = MetricsTls(key_dir / CERT_FILE, key_dir / KEY_FILE, key_dir / CA_CERT_FILE)
            host = self.cfg.metrics_host or metrics_host(self.cfg.listen)
            port = self.cfg.metrics_port
            try:
                self.metrics_server = MetricsServer.start(
                    self.status, host, port, tls if self.cfg.metrics_tls else None, self.readiness
                )
            except OSError as err:
                raise OSError(f"cannot serve metrics on {host}:{port}: {err.strerror}") from err
        self.metrics = MetricsLog(self.cfg.state_dir / METRICS_FILE)
        self.metrics.write(
            "start",
            node_id=self.node_id,
            address=self.address,
            # What the report judges this task by (node/tasks/base.py Metric).
            metric=self.task.metric,
            target=self.task.target,
        )
        self.ready = True
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
                mqtt, self.node_id, self.address, self.status, self._join_announced
            )
            self.mqtt.start()
        helper = await self._find_swarm()
        if self.mqtt is not None:
            self.mqtt.follow()
        if helper is not None and self.resumed is None:
            await self._pull_model(helper)
        await self.peers.start_links()
        self._spawn(self._start_training(), "starter")
        self._spawn(self._checkpoint_periodically(), "checkpoints")
        if self.peers.ca_pem is not None:
            self._spawn(self._watch_revocations(), "revocations")

    def _remembered(self) -> list[dict[str, str]]:
        """The other members the checkpoint we resumed from knew."""
        members = self.resumed.meta.get("members", []) if self.resumed is not None else []
        return [m for m in members if m["node_id"] != self.node_id]

    async def _find_swarm(self) -> str | None:
        """Join the swarm: through the members the checkpoint remembers first (they were live
        when it was written; a ``--join`` seed may be gone), then every join address, then the
        members announced on the MQTT broker (with discovery).

        Returns:
            The address that took us; None to start alone: there was nothing to try (this is
            the swarm's first node), or no join address was given and nobody answered (the
            swarm may be gone, or this was its first node).

        Raises:
            JoinError: a join address (or an announced member) refused us for good, or join
                addresses were given and every way to the swarm failed.
        """
        discovery = self.mqtt is not None and self.mqtt.cfg.discovery
        failed: list[str] = []
        remembered = [m["address"] for m in self._remembered()]
        if remembered:
            more = bool(self.cfg.join) or discovery
            timeout_s = self.cfg.wait_timeout_s
            try:
                return await self._join(
                    remembered, min(REJOIN_TIMEOUT_S, timeout_s) if more else timeout_s
                )
            except JoinError as err:
                failed.append(f"the {len(remembered)} remembered member(s): {err}")
                log.warning(
                    "could not rejoin through the %d member(s) the checkpoint remembers (%s)%s",
                    len(remembered),
                    err,
                    "" if more else "; going on alone",
                )
        if self.cfg.join:
            try:
                return await self._join(self.cfg.join, self.cfg.wait_timeout_s)
            except JoinError as err:
                cause = err.__cause__
                if isinstance(cause, Rejected) and cause.reason not in _BUSY:
                    raise  # a refusal is an answer: this swarm will not have us
                failed.append(f"--join {', '.join(self.cfg.join)}: {err}")
        if discovery:
            helper = await self._join_through_broker()
            if helper is not None:
                return helper
            failed.append("MQTT discovery: no announced member took us")
        if self.cfg.join:
            raise JoinError("could not join the swarm through any of: " + "; ".join(failed))
        return None

    async def _join_through_broker(self) -> str | None:
        """Join through the members announced on the MQTT broker; alone if none is (this is the
        swarm's first node) or none answers (stale announcements). A refusal is an answer, as
        with ``--join``: this swarm will not have us."""
        assert self.mqtt is not None
        announced = await self.mqtt.announced()
        if not announced:
            log.info("no members announced on the MQTT broker; this node starts the swarm")
            return None
        try:
            return await self._join(announced, self.cfg.wait_timeout_s)
        except JoinError as err:
            if isinstance(err.__cause__, Rejected) and err.__cause__.reason in _FOR_GOOD:
                raise
            log.warning("no member announced on the MQTT broker answered (%s); alone", err)
            return None

    async def _join(self, addresses: Sequence[str], timeout_s: float) -> str:
        """:meth:`Peers.join` within ``timeout_s``, with a countdown in the log while no
        address answers."""
        deadline = time.monotonic() + timeout_s
        shown = ", ".join(addresses[:3]) + (
            f" and {len(addresses) - 3} more" if len(addresses) > 3 else ""
        )

        def describe() -> str:
            left = fmt_duration(max(0.0, deadline - time.monotonic()))
            return (
                f"node {self.node_id[:8]} joining through {shown}: no answer yet, "
                f"giving up in {left}"
            )

        join = self.peers.join(addresses, timeout_s)
        return await with_countdown(join, describe, _JOIN_TICKS)

    async def _join_announced(self, node_id: str, address: str) -> None:
        """A member announced on the MQTT broker: join it unless it is known already, which
        also merges parts of a swarm that started apart."""
        if node_id in self.peers.view or self.closing:
            return
        try:
            await self.peers.join([address], self.cfg.gossip.call_timeout_s)
        except JoinError as err:
            log.warning("could not join %s, announced on the MQTT broker: %s", node_id[:8], err)

    async def _pull_model(self, helper: str) -> None:
        """Start from the swarm's current model: pull it from the node we joined through and
        from neighbours (then other members), chunk by chunk, each into a buffer of its own, and
        adopt one only once a second member's model agrees with it (``agreeing_pair``).

        A member that serves a poisoned model (1e38 everywhere, a scaled copy) is outvoted: the
        joiner pulls from another member until two agree, at most ``MAX_PULLS`` in all. With no
        second member to ask (a swarm of one), the one model is adopted if it is plausible
        beside the node's own initial model (``UpdateGuard``), as a snapshot would be. The
        node's own model is replaced only by a whole model that passed, so a transfer that fails
        or is refused changes nothing; training then starts from the initial model, which costs
        time but loses nothing.
        """
        neighbours = [m.address for m in map(self.peers.view.get, self._neighbour_ids()) if m]
        others = [m.address for m in self.peers.view.members if m.node_id != self.node_id]
        random.shuffle(neighbours)
        random.shuffle(others)
        # The helper first: it answered a moment ago.
        candidates = list(dict.fromkeys([helper, *neighbours, *others]))
        numel = self.flat.numel
        pulled: list[tuple[str, torch.Tensor, int]] = []
        started = time.monotonic()
        for address in candidates:
            if len(pulled) >= MAX_PULLS:
                break
            log.info("pulling the swarm's model (%.1f MB) from %s", 4 * numel / 1e6, address)
            timeout_s = transfer_timeout_s(self.cfg.gossip.call_timeout_s, 4 * numel)
            chunks = self.transport.call_pull_model(address, self.node_id, timeout_s)
            try:
                buffer, step = await receive_model(chunks, numel, address)
            except (Rejected, Unreachable) as err:
                log.warning("could not pull the model from %s: %s", address, err)
                continue
            pulled.append((address, buffer, step))
            pair = agreeing_pair([b for _, b, _ in pulled])
            if pair is not None:
                (source, values, step), (second, _, _) = pulled[pair[0]], pulled[pair[1]]
                for address_, _, _ in pulled:
                    if address_ not in (source, second):
                        log.warning("the model pulled from %s agrees with no other", address_)
                await self._adopt_pulled(values, source, step, started, agreed_with=second)
                return
        if len(pulled) == 1 and len(candidates) == 1:  # no second member to ask
            source, values, step = pulled[0]
            initial = self.flat.flat.detach().cpu()
            guard = self.state.guard or UpdateGuard()
            if relative_distance(values, initial, guard.floor_rms) <= guard.max_distance:
                await self._adopt_pulled(values, source, step, started, agreed_with=None)
                return
        self.counters.rejected[str(Reason.IMPLAUSIBLE)] += len(pulled)
        log.warning(
            "could not pull a model that a second member's agrees with (%d pulled of %d "
            "members asked); starting from the initial one",
            len(pulled),
            len(candidates),
        )

    async def _adopt_pulled(
        self, values: torch.Tensor, source: str, step: int, started: float, agreed_with: str | None
    ) -> None:
        await self.gossiper.adopt(values.to(self.device), random.getrandbits(62))
        elapsed = time.monotonic() - started
        nbytes = 4 * values.numel()
        log.info(
            "started from the model of %s (its step %d%s): %s in %s (%s/s)",
            source,
            step,
            f"; {agreed_with}'s agrees" if agreed_with else "",
            fmt_size(nbytes),
            fmt_duration(elapsed),
            fmt_size(nbytes / elapsed) if elapsed > 0 else "-",
        )
        if self.metrics is not None:
            self.metrics.write(
                "pulled_model", source=source, source_step=step, agreed_with=agreed_with
            )

    def _neighbour_ids(self) -> list[str]:
        g = self.cfg.gossip
        return list(self.peers.view.neighbours(g.topology, degree=g.degree, seed=g.seed))

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
        self.closing = True
        if self.metrics_server is not None:
            # On a thread: shutting the server down waits for a scrape that may be waiting
            # for this event loop.
            await asyncio.to_thread(self.metrics_server.stop)
        self.trainer.request_stop()
        await asyncio.to_thread(self.trainer.join)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.peers.stop()
        await self.transport.close(grace_s)
        await asyncio.to_thread(self.gossiper.close)
        if self.ready:
            await self._checkpoint_progress.run(
                f"node {self.node_id[:8]} writing the final checkpoint",
                self._checkpoint_progress.estimate(3 * 4 * self.flat.numel),
                self._write_final_state,
                final=True,
            )
        if self.metrics is not None:
            self.metrics.close()
        log.info("node %s stopped at step %d", self.node_id[:8], self.trainer.step)

    async def wait_failed(self) -> BaseException:
        """Returns the error that stopped this node's work (training diverged, say)."""
        await self._failed.wait()
        assert self.failure is not None
        return self.failure

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Wait until ``predicate()`` holds, re-checking whenever the node's state changes
        (a round made or received, a step evaluated, a member learned, training finished).

        Raises:
            TimeoutError: it did not hold within ``timeout_s``.
        """

        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._change.wait()

    def notify_change(self) -> None:
        """Wake every :meth:`wait_until` (event loop only)."""
        change, self._change = self._change, asyncio.Event()
        change.set()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())  # type: ignore[arg-type]

    def _view_changed(self) -> None:
        self.notify_change()

    def _fail(self, err: BaseException) -> None:
        if self.failure is None:
            log.error("node %s failed: %s", self.node_id[:8], err)
            self.failure = err
            self._failed.set()

    # -- training and gossip ------------------------------------------------------------------

    def _on_loop(self, fn: Callable[[*Ts], None]) -> Callable[[*Ts], None]:
        """Wrap a callback so that another thread hands it to the event loop."""

        def call(*args: *Ts) -> None:
            loop = self._loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # the loop closed in between
                    loop.call_soon_threadsafe(fn, *args)

        return call

    async def _start_training(self) -> None:
        """Start once ``wait_members`` members are known and every edge is up both ways (each
        neighbour took our public copy and sent us its own), so no node trains its first steps
        alone; after ``wait_timeout_s``, start anyway.

        A neighbour that took our copy but never sends its own (a wedged or hostile member)
        holds the start only for a grace period once every edge of ours is up:
        ``snapshot_grace_s``, or as long as our own edges took if that is longer (its copy is
        as big as ours, so on a slow link it may well take as long to arrive).
        """
        want = self.cfg.wait_members
        hood = self.peers.neighbourhood
        started = time.monotonic()
        deadline = started + self.cfg.wait_timeout_s
        grace_end: float | None = None
        gave_up: list[str] = []  # what was still missing when the grace ran out

        def missing() -> list[str]:
            """What training still waits for: members, then both directions of every edge
            (they took our public copy, and we hold theirs). Read from what the worker
            published of the replicas: the event loop never reads the gossip state."""
            links = hood.links
            members = len(self.peers.view)
            waiting = []
            if members < want:
                waiting.append(f"members ({members} of {want} known)")
            replicated = self.gossiper.replicated
            down = hood.down(replicated)
            if down:
                edges = ", ".join(
                    f"{p[:8]}: ours {links[p].progress()}, "
                    f"theirs {'received' if p in replicated else 'not received'}"
                    for p in sorted(down)
                )
                waiting.append(f"links ({len(links) - len(down)} of {len(links)} up; {edges})")
            return waiting

        def ready() -> bool:
            """Nothing is missing, or only neighbours' copies are and their grace is over."""
            nonlocal grace_end, gave_up
            if not missing():
                return True
            now = time.monotonic()
            if (
                grace_end is None
                and len(self.peers.view) >= want
                and hood.links_up() == len(hood.links)
            ):
                grace = max(self.cfg.snapshot_grace_s, now - started)
                grace_end = now + grace
                asyncio.get_running_loop().call_later(grace, self.notify_change)
            if grace_end is None or now < grace_end:
                return False
            # Said as decided here: the worker publishes the replicas from its own thread, so
            # a later look may see another moment.
            gave_up = missing()
            return True

        def describe() -> str | None:
            waiting = missing()
            if not waiting:
                return None
            until = deadline if grace_end is None else min(deadline, grace_end)
            left = fmt_duration(max(0.0, until - time.monotonic()))
            return (
                f"node {self.node_id[:8]} waiting for {' and '.join(waiting)}; "
                f"training starts anyway in {left}"
            )

        try:
            waited = self.wait_until(ready, self.cfg.wait_timeout_s)
            await with_countdown(waited, describe, _WAIT_TICKS)
        except TimeoutError:
            log.warning(
                "node %s starts training with %d of %d members, %d of %d links up (still "
                "waiting for %s)",
                self.node_id[:8],
                len(self.peers.view),
                want,
                hood.links_up(),
                len(hood.links),
                " and ".join(missing()) or "nothing",
            )
        else:
            if gave_up:
                log.warning(
                    "node %s starts training after %.1f s without waiting longer for its "
                    "neighbours' copies (still waiting for %s); an edge counts once its copy "
                    "arrives",
                    self.node_id[:8],
                    time.monotonic() - started,
                    " and ".join(gave_up),
                )
            else:
                log.info(
                    "node %s starts training: %d members, %d links up both ways, after %.1f s",
                    self.node_id[:8],
                    len(self.peers.view),
                    len(hood.links),
                    time.monotonic() - started,
                )
        if self.cfg.summary_interval_s > 0:
            summary = Summary(self.status, self.cfg.summary_interval_s)
            self._spawn(summary.run(), "summary")
        self.trainer.start()

    def _after_step(self, step: int) -> None:
        """Trainer thread: start a gossip round if one is due and the links can take it."""
        with self._round_lock:
            due = self._pacer.due(step)
        if due:
            self._try_round(step)

    def _try_round(self, step: int) -> bool:
        """Start a round unless one is being made or a link is still busy; never blocks.

        Rounds are paced by the network: ``local_steps`` is the least number of steps between
        two rounds, and a round is skipped while the links still carry the last one. Skipping
        loses nothing (x - x̂ keeps what was not sent), whereas queueing rounds that the network
        cannot carry would only make every neighbour's replica staler.
        """
        with self._round_lock:
            if not self._pacer.begin(step):
                return False
        fut = self.gossiper.submit_round(step)
        fut.add_done_callback(self._on_loop(self._round_made))
        return True

    def _links_changed(self) -> None:
        """Event loop: a link may have become busy or idle."""
        idle = not self.peers.busy
        with self._round_lock:
            self._pacer.links_idle = idle
        if not self.trainer.running:
            self.notify_change()  # the start of training waits for links to come up

    def _round_made(self, fut: Future[Delta | None]) -> None:
        try:
            if fut.cancelled():
                return
            err = fut.exception()
            if err is not None:
                self._fail(err)
                return
            delta = fut.result()
            if delta is None:
                return
            self.counters.rounds += 1
            self.notify_change()
            self.peers.offer(delta)
        finally:
            with self._round_lock:
                self._pacer.end()
            self._links_changed()

    def _on_eval(self, result: EvalResult) -> None:
        self.notify_change()
        # After the budget the summary line carries the figures; a line per evaluation would
        # be one every few seconds for as long as the node runs.
        log.log(
            logging.DEBUG if result.after_budget else logging.INFO,
            "node %s step %d eval_loss %.4f eval_accuracy %.4f%s",
            self.node_id[:8],
            result.step,
            result.loss,
            result.accuracy,
            " (after the budget)" if result.after_budget else "",
        )
        # A model that gossip no longer moves evaluates the same every time: one record says it.
        key = (result.step, result.accuracy, f"{result.loss:.4g}")
        if self.metrics is not None and not self.closing and key != self._logged_eval:
            self._logged_eval = key
            self._spawn(self._log_eval(result), "log-eval")

    async def _log_eval(self, result: EvalResult) -> None:
        """One ``eval`` record of the metrics log, with this node's distance to its neighbours
        (the RMS of x_i - x̂_j averaged over the neighbours it has replicas of; -1 without).
        ``loss`` and ``accuracy`` are on the eval data; ``train_loss`` is the smoothed
        training loss; ``after_budget`` marks the evaluations made once the budget was spent."""
        views = await self.gossiper.neighbour_views()
        distances = [v.distance_rms for v in views.values() if v.distance_rms >= 0]
        if self.metrics is not None:
            self.metrics.write(
                "eval",
                step=result.step,
                loss=result.loss,
                accuracy=result.accuracy,
                train_loss=self.trainer.loss,
                after_budget=result.after_budget,
                rounds=self.counters.rounds,
                bytes_sent=self.counters.bytes_sent,
                bytes_sent_fp32=self.counters.bytes_sent_fp32,
                distance_rms=sum(distances) / len(distances) if distances else -1.0,
                members=len(self.peers.view),
            )

    def _on_training_done(self) -> None:
        self.training_finished.set()
        self.notify_change()
        if self.trainer.error is not None:
            self._fail(self.trainer.error)
            return
        if not self.closing:
            log.info("node %s finished training at step %d", self.node_id[:8], self.trainer.step)
            self._spawn(self._idle_gossip(), "idle-gossip")

    async def _idle_gossip(self) -> None:
        """After training: keep mixing toward the swarm, on a timer, until stopped."""
        while True:
            self._try_round(self.trainer.step)
            await asyncio.sleep(self.cfg.gossip.idle_round_interval_s)

    # -- status and state ---------------------------------------------------------------------

    def readiness(self) -> str | None:
        """None once the node has joined, is training (or trained) and every link of its is up;
        else why not, on one line (``/readyz``; event loop only)."""
        hood = self.peers.neighbourhood
        if self.closing:
            return "stopping"
        if not self.trainer.started:
            return "not training yet: joining, or waiting for members and links"
        if self.trainer.error is not None:
            return f"training failed: {self.trainer.error}"
        if hood.links_up() < len(hood.links):
            return f"links: {hood.links_up()} of {len(hood.links)} up"
        return None

    async def status(self) -> NodeStatus:
        return self._status(await self.gossiper.neighbour_views())

    def _status(self, views: dict[str, NeighbourView] | None = None) -> NodeStatus:
        """The node's figures; without ``views`` (after the worker stopped) links' only."""
        neighbours = []
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
                )
            )
        ev = self.trainer.last_eval
        c = self.counters
        members, member_counts = summarise_members(self.peers.swim.records(), self.node_id)
        return NodeStatus(
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
            eval_age_s=time.monotonic() - ev.time if ev else -1.0,
            rounds=c.rounds,
            bytes_sent=c.bytes_sent,
            bytes_sent_fp32=c.bytes_sent_fp32,
            bytes_received=c.bytes_received,
            samples_per_s=self.trainer.samples_per_s,
            samples=self.trainer.samples,
            neighbours=tuple(neighbours),
            members=members,
            rejected=dict(c.rejected),
            member_counts=member_counts,
        )

    def _capture(self) -> Checkpoint:
        """One consistent moment: the model and optimizer between two steps (the trainer holds
        the model lock for each), with the public copy and the step that go with them.

        Runs on the gossip worker, or after it stopped, so the public copy is not moving.
        """
        with self.model_lock:
            model = {
                k: v.detach().to("cpu", copy=True) for k, v in self.task.model.state_dict().items()
            }
            optimizer = copy.deepcopy(self.trainer.optimizer.state_dict())
            schedule = self.trainer.schedule
            schedule_state = copy.deepcopy(schedule.state_dict()) if schedule else None
            step = self.trainer.step
        members = [
            {"node_id": r.node_id, "address": r.address}
            for r in self.peers.swim.live_members()
            if r.node_id != self.node_id
        ]
        # Nobody known alive now (the swarm is away, say): a restart still tries whom we knew.
        members = members or self._remembered()
        meta = {
            "node_id": self.node_id,
            "step": step,
            "session": self.state.session,
            "seq": self.state.seq,
            "codec": self.cfg.gossip.codec,
            "fingerprint": self.fingerprint.digest(),
            "task": self.cfg.task,
            "shard": [self.cfg.shard_index, self.cfg.shard_count],
            "members": members,
        }
        public = self.state.public.to("cpu", copy=True)
        return Checkpoint(model, public, optimizer, meta, schedule_state)

    async def write_checkpoint(self) -> None:
        """Write the checkpoint now (atomically: a crash at any moment leaves a readable one),
        unless the node has nothing worth keeping (see :meth:`_save`)."""
        if not self._trained():
            return
        log.debug("node %s writing a checkpoint", self.node_id[:8])
        ckpt = await self.gossiper.run(self._capture)
        wrote = await self._checkpoint_progress.run(
            f"node {self.node_id[:8]} writing a checkpoint",
            checkpoint_nbytes(ckpt),
            lambda: self._save(ckpt),
            final=False,
        )
        if wrote and self.metrics is not None:
            self.metrics.write("checkpoint", step=int(ckpt.meta["step"]))

    def _trained(self) -> bool:
        """Whether this life of the node got to training (it joined, or started the swarm, and
        its members and links were ready or it stopped waiting for them). Before that, its
        state is the checkpoint it resumed from, or a model nobody trained: nothing to write."""
        return self.trainer.started

    def _save(self, ckpt: Checkpoint, final: bool = False) -> bool:
        """Write ``ckpt``, keeping the checkpoint before it; returns whether it wrote.

        It does not write once the final checkpoint is written (a periodic write that was
        under way when the node stopped must not land on top of it with an older state), nor
        a model that diverged: the last finite checkpoint stays. A write that fails (a full
        disk) leaves the old checkpoint, and warns once until a write succeeds again.
        """
        path = self.cfg.state_dir / CHECKPOINT_FILE
        with self._checkpoint_lock:
            if self._final_written:
                return False
            if isinstance(self.trainer.error, Diverged) or not ckpt.is_finite():
                log.error(
                    "node %s: the model is not finite (training diverged); %s stays as it was",
                    self.node_id[:8],
                    path,
                )
                return False
            try:
                save_checkpoint(path, ckpt, self.cfg.state_dir / PREVIOUS_FILE)
            except OSError as err:
                if not self._save_failing:
                    log.warning(
                        "could not write the checkpoint %s (%s); the old one stays, training "
                        "goes on, and this is not said again until a write succeeds",
                        path,
                        err.strerror or err,
                    )
                self._save_failing = True
                return False
            if self._save_failing:
                log.info("wrote the checkpoint %s again (step %d)", path, ckpt.meta["step"])
            self._save_failing = False
            self._final_written = final
            return True

    @property
    def _revocations_path(self) -> Path:
        """The one place a node reads (and keeps) its revocation list: the state dir, which is
        the node's own and writable, whatever ``--tls-dir`` says."""
        return self.cfg.state_dir / REVOKED_FILE

    async def _watch_revocations(self) -> None:
        """Look at ``revoked.json`` in the state dir every few seconds: an operator (or a
        deployment tool) drops a new list there, and this node adopts and spreads it."""
        seen = b""
        path = self._revocations_path
        stray = self.cfg.tls_dir / REVOKED_FILE if self.cfg.tls_dir else None
        if stray is not None and stray != path and stray.exists():
            log.warning("ignoring %s: revocation lists are read from %s", stray, path)
        while True:
            blob = await asyncio.to_thread(read_revocations_file, path)
            if blob != seen:
                seen = blob
                self.peers.adopt_revocations(blob, str(path))
            await asyncio.sleep(REVOCATIONS_POLL_S)

    def _keep_revocations(self, revocations: Revocations) -> None:
        """Keep an adopted list beside the certificate, so that a restart starts from it."""
        path = self._revocations_path
        with contextlib.suppress(OSError):
            if not path.exists() or path.read_bytes() != revocations.blob:
                write_atomic(path, revocations.blob, mode=0o644)

    async def _checkpoint_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.checkpoint_interval_s)
            await self.write_checkpoint()

    def _write_final_state(self) -> None:
        """The final checkpoint and summary, if this life got to training (a start that fails
        changes nothing on disk but the metrics log); the ``stop`` record in any case."""
        trained = self._trained()
        if trained:
            self._save(self._capture(), final=True)
        else:
            log.info("node %s never trained in this run: no checkpoint written", self.node_id[:8])
        # Strict JSON: a loss that is NaN (no step yet) is null.
        summary = json_safe(json.loads(status_to_json(self._status())))
        if trained:
            text = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False)
            try:
                atomic_write(self.cfg.state_dir / SUMMARY_FILE, text.encode())
            except OSError as err:
                log.warning("could not write %s: %s", SUMMARY_FILE, err.strerror or err)
        if self.metrics is not None:
            self.metrics.write("stop", **summary)

    def _rolled_back(self, rollback: Rollback) -> None:
        """Event loop: the trainer went back to its last finite state."""
        log.warning(
            "node %s: training loss became %s at step %d; rolled back to the model and "
            "optimizer of step %d (%d in a row, at most %d)",
            self.node_id[:8],
            rollback.loss,
            rollback.step,
            rollback.to_step,
            rollback.in_a_row,
            self.cfg.trainer.max_rollbacks,
        )
        if self.metrics is not None and not self.closing:
            self.metrics.write(
                "rollback", step=rollback.step, to_step=rollback.to_step, loss=rollback.loss
            )
        self.notify_change()


#: Refusals of a join that say "not now" rather than "not you" (gossip/refusals.py).
_BUSY = frozenset(r for r, c in REFUSALS.items() if c.retryable)
#: Refusals of a join that will not change by retrying.
_FOR_GOOD = frozenset(r for r, c in REFUSALS.items() if c.for_good)


def _check_resumable(
    ckpt: Checkpoint, fingerprint: TaskFingerprint, cfg: NodeConfig, path: Path
) -> None:
    """A checkpoint from another task or codec cannot be resumed: say so rather than guess.
    It is whole, and someone's: it is refused, not moved aside as a damaged one would be."""
    if ckpt.meta.get("fingerprint") != fingerprint.digest():
        raise ValueError(
            f"{path} holds a checkpoint of another task or codec "
            f"(task {ckpt.meta.get('task')!r}, codec {ckpt.meta.get('codec')!r}); "
            "use another --state-dir, or remove the checkpoint to start afresh"
        )


def _restore(cfg: NodeConfig, task: Task) -> tuple[Checkpoint | None, Path | None]:
    """The newest usable checkpoint in the state dir, after removing stale temporary files."""
    if not cfg.state_dir.is_dir():
        return None, None
    for tmp in remove_stale_temp_files(cfg.state_dir, (CHECKPOINT_FILE, SUMMARY_FILE)):
        log.info("removed %s, left by a write that was interrupted", tmp)
    specs = tuple(
        ParamSpec(name, tuple(p.shape), str(p.dtype).removeprefix("torch."))
        for name, p in task.model.named_parameters()
    )
    g = cfg.gossip
    fingerprint = TaskFingerprint.of(specs, get_codec(g.codec, g.block_size, g.compress_fraction))

    def check(ckpt: Checkpoint, path: Path) -> None:
        _check_resumable(ckpt, fingerprint, cfg, path)
        check_fits(ckpt, task.model, task.make_optimizer, path)

    return restore_latest(cfg.state_dir, check)
