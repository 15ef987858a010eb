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
neighbours open, and training starts once enough members are known (startup.py). From then on
SWIM keeps the member view current, and the neighbours follow it.

The node is an assembly of parts, each in its own module. Which parts, how they are built and
wired, and :meth:`Node.create` with the I/O that needs are in assembly.py (:class:`NodeParts`);
this module holds what the node does with them: start and stop, what it does when the trainer
reports, pausing, and its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from types import TracebackType

from node.daemon.assembly import NodeParts
from node.daemon.introductions import JoinError
from node.daemon.pause import PULL_AFTER_PAUSE_S
from node.daemon.reporting import serve_metrics
from node.daemon.startup import wait_to_train
from node.daemon.statedir import METRICS_FILE, SUMMARY_FILE
from node.daemon.trainer import EvalResult, Rollback
from node.telemetry.console import Summary
from node.telemetry.events import MetricsLog
from node.telemetry.mqtt import MqttBridge
from node.telemetry.status import NodeStatus

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


class Node(NodeParts):
    """Build with :meth:`create` (node/daemon/assembly.py); it does the I/O that construction
    needs."""

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

    # -- what the trainer tells the node ------------------------------------------------------

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
