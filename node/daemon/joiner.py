"""Finding the swarm and starting from its model.

A node introduces itself through the members its checkpoint remembers, then the join addresses,
then the members announced on the MQTT broker (with discovery); the member that takes it checks
the task fingerprint and brings the member list. A fresh joiner then pulls the current model
from members until two agree, so that it starts near consensus.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence

import torch

from gossip.digest import model_digest
from gossip.refusals import REFUSALS
from gossip.replicas import UpdateGuard, agreeing_pair, relative_distance
from node.config import NodeConfig
from node.daemon.flat import FlatParams
from node.daemon.gossiper import Gossiper
from node.daemon.introductions import JoinError
from node.daemon.links import transfer_timeout_s
from node.daemon.peers import Peers
from node.daemon.transfer import receive_model
from node.runtime import Runtime
from node.telemetry.console import with_countdown
from node.telemetry.events import Counters, MetricsLog
from node.telemetry.mqtt import MqttBridge
from node.telemetry.progress import TickerConfig, fmt_duration, fmt_size
from node.transport.base import Reason, Rejected, Transport, Unreachable

__all__ = ["MAX_PULLS", "REJOIN_TIMEOUT_S", "Joiner"]

log = logging.getLogger(__name__)

#: Models a joiner pulls at most, looking for two that agree.
MAX_PULLS = 3
#: A join that has not answered in 2 s says so, then ever less often (7, 17, 37, 67 s...).
_JOIN_TICKS = TickerConfig(first_s=2.0, every_s=5.0, growth=2.0, max_s=30.0)
#: How long the members a checkpoint remembers get to answer when join addresses or the broker
#: come after them: a live member answers within a round trip (an answer under way may take up
#: to the call timeout), and dead ones must not hold up the rest for long.
REJOIN_TIMEOUT_S = 5.0
#: Refusals of a join that say "not now" rather than "not you" (gossip/refusals.py).
_BUSY = frozenset(r for r, c in REFUSALS.items() if c.retryable)
#: Refusals of a join that will not change by retrying.
_FOR_GOOD = frozenset(r for r, c in REFUSALS.items() if c.for_good)


class Joiner:
    """Args:
    cfg: the join addresses and the wait and call timeouts.
    node_id: who joins.
    remembered: the addresses of the members the checkpoint we resumed from knew.
    peers: joins through an address, and the member view it brings.
    transport: pulls the model.
    flat: the node's own model (the initial one, before a pull).
    gossiper: adopts a pulled model as the node's own.
    guard: how far a lone pulled model may be from the initial one.
    device: where the adopted model lives.
    counters: counts the pulled models that no second one agreed with.
    runtime: the clock of the countdowns and the shuffle of whom to pull from.
    """

    def __init__(
        self,
        cfg: NodeConfig,
        node_id: str,
        remembered: Sequence[str],
        peers: Peers,
        transport: Transport,
        flat: FlatParams,
        gossiper: Gossiper,
        guard: UpdateGuard,
        device: torch.device,
        counters: Counters,
        runtime: Runtime,
    ) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.remembered = list(remembered)
        self.peers = peers
        self.transport = transport
        self.flat = flat
        self.gossiper = gossiper
        self.guard = guard
        self.device = device
        self.counters = counters
        self.runtime = runtime
        #: Set by the node when it starts: where the ``pulled_model`` record goes.
        self.metrics: MetricsLog | None = None

    async def find_swarm(self, mqtt: MqttBridge | None) -> str | None:
        """Join the swarm: through the members the checkpoint remembers first (they were live
        when it was written; a ``--join`` seed may be gone), then every join address, then the
        members announced on the MQTT broker ``mqtt`` (with discovery).

        Returns:
            The address that took us; None to start alone: there was nothing to try (this is
            the swarm's first node), or no join address was given and nobody answered (the
            swarm may be gone, or this was its first node).

        Raises:
            JoinError: a join address (or an announced member) refused us for good, or join
                addresses were given and every way to the swarm failed.
        """
        discovery = mqtt is not None and mqtt.cfg.discovery
        failed: list[str] = []
        remembered = self.remembered
        if remembered:
            more = bool(self.cfg.join) or discovery
            timeout_s = self.cfg.wait_timeout_s
            try:
                if more:  # the rest get their turn
                    timeout_s = (
                        REJOIN_TIMEOUT_S if timeout_s is None else min(REJOIN_TIMEOUT_S, timeout_s)
                    )
                return await self._join(remembered, timeout_s)
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
        if mqtt is not None and discovery:
            helper = await self._join_through_broker(mqtt)
            if helper is not None:
                return helper
            failed.append("MQTT discovery: no announced member took us")
        if self.cfg.join:
            raise JoinError("could not join the swarm through any of: " + "; ".join(failed))
        return None

    async def _join_through_broker(self, mqtt: MqttBridge) -> str | None:
        """Join through the members announced on the MQTT broker; alone if none is (this is the
        swarm's first node) or none answers (stale announcements). A refusal is an answer, as
        with ``--join``: this swarm will not have us."""
        announced = await mqtt.announced()
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

    async def _join(self, addresses: Sequence[str], timeout_s: float | None) -> str:
        """:meth:`Introductions.join` within ``timeout_s`` (None: for ever), with a countdown in the
        log while no address answers."""
        clock = self.runtime.clock
        deadline = math.inf if timeout_s is None else clock.now() + timeout_s
        shown = ", ".join(addresses[:3]) + (
            f" and {len(addresses) - 3} more" if len(addresses) > 3 else ""
        )

        def describe() -> str:
            if deadline == math.inf:
                return f"node {self.node_id[:8]} joining through {shown}: no answer yet"
            left = fmt_duration(max(0.0, deadline - clock.now()))
            return (
                f"node {self.node_id[:8]} joining through {shown}: no answer yet, "
                f"giving up in {left}"
            )

        join = self.peers.introductions.join(addresses, timeout_s)
        return await with_countdown(join, describe, _JOIN_TICKS)

    async def join_announced(self, node_id: str, address: str) -> None:
        """A member announced on the MQTT broker: join it unless it is known already, which
        also merges parts of a swarm that started apart."""
        if node_id in self.peers.view:
            return
        try:
            await self.peers.introductions.join([address], self.cfg.gossip.call_timeout_s)
        except JoinError as err:
            log.warning("could not join %s, announced on the MQTT broker: %s", node_id[:8], err)

    async def pull_model(self, helper: str) -> None:
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
        g = self.cfg.gossip
        view = self.peers.view
        ids = view.neighbours(g.topology, degree=g.degree, seed=g.seed)
        # Members nobody can dial serve pulls only down sessions, which a joiner does not hold;
        # a paused member's model is as old as its pause.
        unreachable = view.unreachable | view.paused
        neighbours = [m.address for m in map(view.get, ids) if m and m.node_id not in unreachable]
        others = [
            m.address
            for m in view.members
            if m.node_id != self.node_id and m.node_id not in unreachable
        ]
        self.runtime.rng.shuffle(neighbours)
        self.runtime.rng.shuffle(others)
        # The helper first: it answered a moment ago; but after the others if it is paused
        # (its model is as old as its pause) or cannot be dialled.
        stale = {m.address for m in map(view.get, unreachable) if m}
        ordered = list(dict.fromkeys([helper, *neighbours, *others]))
        candidates = [a for a in ordered if a not in stale] + [a for a in ordered if a in stale]
        numel = self.flat.numel
        pulled: list[tuple[str, torch.Tensor, int]] = []
        started = self.runtime.clock.now()
        # Named in the request: a member whose model is this one (the swarm's starting model,
        # at start-up) says so instead of sending it.
        initial = self.flat.flat.detach().to("cpu", copy=True)
        have = await asyncio.to_thread(model_digest, initial)
        for address in candidates:
            if len(pulled) >= MAX_PULLS:
                break
            log.info("pulling the swarm's model (%.1f MB) from %s", 4 * numel / 1e6, address)
            timeout_s = transfer_timeout_s(g.call_timeout_s, 4 * numel)
            chunks = self.transport.call_pull_model(address, self.node_id, timeout_s, have)
            try:
                buffer, step = await receive_model(chunks, numel, address, initial)
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
                await self._adopt(
                    values, source, step, started, second, torch.equal(values, initial)
                )
                return
        if len(pulled) == 1 and len(candidates) == 1:  # no second member to ask
            source, values, step = pulled[0]
            if relative_distance(values, initial, self.guard.floor_rms) <= self.guard.max_distance:
                await self._adopt(values, source, step, started, None, torch.equal(values, initial))
                return
        self.counters.rejected[str(Reason.IMPLAUSIBLE)] += len(pulled)
        log.warning(
            "could not pull a model that a second member's agrees with (%d pulled of %d "
            "members asked); starting from the initial one",
            len(pulled),
            len(candidates),
        )

    async def _adopt(
        self,
        values: torch.Tensor,
        source: str,
        step: int,
        started: float,
        agreed_with: str | None,
        kept: bool,
    ) -> None:
        """Take the pulled ``values``; ``kept``: they are the model this node held already."""
        await self.gossiper.adopt(
            values.to(self.device), self.runtime.rng.getrandbits(62), held=kept
        )
        elapsed = self.runtime.clock.now() - started
        nbytes = 4 * values.numel()
        if kept:
            log.info(
                "started from the model of %s (its step %d%s): the one this node holds, "
                "named by its digest (%s not sent)",
                source,
                step,
                f"; {agreed_with}'s agrees" if agreed_with else "",
                fmt_size(nbytes),
            )
        else:
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
                "pulled_model",
                source=source,
                source_step=step,
                agreed_with=agreed_with,
                named=kept,
            )
