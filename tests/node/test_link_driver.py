"""The link driver (node/daemon/links.py's PeerLink) on virtual time over the in-memory transport.

The receiving side is the daemon's one inbound path (node/daemon/inbound.py over a real gossip
state), served as node/daemon/service.py serves it, minus the gossip worker thread: its state
work runs on the loop (``run_here``), so virtual time never waits for a thread.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
import torch

from gossip.codecs import get_codec
from gossip.digest import model_digest
from gossip.link import LinkConfig
from gossip.messages import Delta, Member, SnapshotHeader
from gossip.replicas import GossipState
from node.daemon.inbound import Inbound
from node.daemon.links import PeerLink
from node.daemon.steps import run_here
from node.runtime import LoopClock, Runtime
from node.telemetry.events import Counters
from node.transport import wire_sizes
from node.transport.base import SnapshotChunk
from node.transport.memory import MemoryNetwork, MemoryTransport, SeededFaults
from tests.node.drivers import Refusing, cases, faults
from tests.vtime import run_until, runtime, virtual, virtual_now

NUMEL = 300
SENDER, RECEIVER = "s" * 32, "r" * 32
ROUNDS = 60
#: The node's rounds come no faster than this when links keep up (idle rounds are slower).
ROUND_S = 0.05


class Receiver(Refusing):
    """A node's receiving side: the one inbound path over a real gossip state."""

    def __init__(self) -> None:
        self.state = GossipState(torch.zeros(NUMEL), get_codec("int8", 64), self._clock())
        self.state.admit(SENDER)
        self.inbound = Inbound(self.state, Counters(), self._clock())
        #: (virtual time, seq) of each delta applied and each snapshot taken.
        self.deltas: list[tuple[float, int]] = []
        self.snapshots: list[tuple[float, int]] = []

    @staticmethod
    def _clock() -> LoopClock:
        return LoopClock(asyncio.get_running_loop())

    async def rpc_push_delta(self, delta: Delta) -> int:
        seq = run_here(self.inbound.push_delta(delta, wire_sizes.delta_nbytes(delta)))
        self.deltas.append((virtual_now(), seq))
        return seq

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        run_here(self.inbound.open_snapshot(header))
        data = b"".join([chunk.data async for chunk in chunks])
        # A named snapshot carries no values: the inbound path takes the model it names.
        values = torch.frombuffer(bytearray(data), dtype=torch.float32) if data else torch.empty(0)
        seq = run_here(
            self.inbound.apply_snapshot(header, values, wire_sizes.snapshot_nbytes(header))
        )
        self.snapshots.append((virtual_now(), seq))
        return seq


class Sender:
    """A node's sending side: its gossip state, whose rounds the link carries. ``start``: the
    model it starts from, whose snapshots it names by digest (None: zeros, never named)."""

    def __init__(self, rt: Runtime, start: torch.Tensor | None = None) -> None:
        self.start = start
        initial = torch.zeros(NUMEL) if start is None else start.clone()
        self.state = GossipState(
            initial, get_codec("int8", 64), rt.clock, torch.Generator().manual_seed(1)
        )
        self.x = initial.clone()
        self._noise = torch.Generator().manual_seed(2)

    def round(self) -> Delta:
        self.x += torch.randn(NUMEL, generator=self._noise)
        seq, payload = self.state.make_delta(self.x)
        return Delta(SENDER, self.state.session, seq, seq, payload, degree=1)

    async def snapshot(self, may_name: bool) -> tuple[SnapshotHeader, torch.Tensor]:
        seq, values = self.state.snapshot()
        named = b""
        if may_name and self.start is not None and torch.equal(values, self.start):
            named = model_digest(values)
        return SnapshotHeader(SENDER, self.state.session, seq, NUMEL, 1, digest=named), values


async def connect(
    network: MemoryNetwork, cfg: LinkConfig, seed: int = 0, start: torch.Tensor | None = None
) -> tuple[Sender, Receiver, PeerLink]:
    receiver = Receiver()
    address = await MemoryTransport(network).serve(receiver, "mem:0")
    out = MemoryTransport(network)
    await out.serve(Refusing(), "mem:0")
    rt = runtime(seed)
    sender = Sender(rt, start)
    link = PeerLink(Member(RECEIVER, address), out, sender.snapshot, cfg, Counters(), rt)
    return sender, receiver, link


def replica_is_public_copy(sender: Sender, receiver: Receiver) -> bool:
    replica = receiver.state.replicas.get(SENDER)
    return (
        replica is not None
        and replica.seq == sender.state.seq
        and torch.equal(replica.value, sender.state.public)
    )


@virtual
@cases
async def test_every_round_lands_and_a_refusal_is_repaired_by_one_snapshot(
    loss: float, order: str
) -> None:
    """Every round reaches the replica, as a delta or inside a later snapshot; the replica ends
    equal to the sender's public copy bit for bit; a gap (the receiver lost its replica) is
    repaired by a snapshot sent at once, and without loss by nothing else."""
    net = faults(loss, order, seed=3)
    sender, receiver, link = await connect(MemoryNetwork(net.drop, net.delay), LinkConfig())
    link.start()
    try:
        await run_until(lambda: link.healthy, 5.0, "the first snapshot")
        dropped_at = -1.0
        for r in range(1, ROUNDS + 1):
            link.offer(sender.round())
            if r == ROUNDS // 2:  # the receiver loses the replica: the next delta is a gap
                del receiver.state.replicas[SENDER]
                dropped_at = virtual_now()
            # As the node paces its rounds: the next one when the link is not busy.
            await run_until(lambda: not link.busy, 30.0, "the link to keep up")
            await asyncio.sleep(ROUND_S)  # the round interval itself, in virtual time: no wait
        took = await run_until(
            lambda: replica_is_public_copy(sender, receiver), 60.0, "the replica to catch up"
        )
        landed = {seq for _, seq in receiver.deltas}
        covered = {s for _, top in receiver.snapshots for s in range(1, top + 1)}
        assert landed | covered == set(range(1, ROUNDS + 1))
        resyncs = [seq for t, seq in receiver.snapshots if t > dropped_at]
        assert resyncs
        assert resyncs[0] >= ROUNDS // 2
        stats = link.stats
        assert stats.deltas_sent >= len(receiver.deltas)
        if loss == 0.0:
            assert len(receiver.snapshots) == 2  # the first, and the one after the gap
            assert stats.failures == 0  # a gap is repaired at once, not backed off
            assert len(receiver.deltas) == ROUNDS - 1  # all but the one refused for the gap
        else:
            assert net.lost > 0
            # A lost delta breaks the stream; each loss costs one failure and one snapshot.
            assert stats.failures >= 1
            assert len(receiver.snapshots) >= 2 + 1
        print(
            f"loss {loss} {order}: {virtual_now():.1f} virtual s, caught up {took:.2f} s after"
            f" the last round; {net.lost} lost, {stats.failures} failures,"
            f" {len(receiver.snapshots)} snapshots, {len(receiver.deltas)} deltas applied"
        )
    finally:
        await link.stop()


@virtual
@pytest.mark.parametrize("order", ["in-order", "reordered"])
async def test_back_off_doubles_with_each_failure_up_to_its_cap_and_resets_once_it_works(
    order: str,
) -> None:
    """While the peer cannot be reached, attempt k waits backoff_min_s * 2**k (capped at
    backoff_max_s) times a jitter in [0.5, 1]; once a snapshot is answered the back-off starts
    over from backoff_min_s."""
    cfg = LinkConfig(backoff_min_s=0.1, backoff_max_s=2.0)
    down = True
    attempts: list[float] = []
    net = faults(0.0, order)

    def drop(caller: str, callee: str, message: object) -> bool:
        if isinstance(message, SnapshotHeader) and callee != sender_address:
            attempts.append(virtual_now())
            return down
        return net.drop(caller, callee, message)

    sender_address = ""
    network = MemoryNetwork(drop, net.delay)
    sender, receiver, link = await connect(network, cfg)
    assert isinstance(link.transport, MemoryTransport)
    sender_address = link.transport.address
    link.start()
    try:
        await run_until(lambda: len(attempts) >= 10, 60.0, "ten attempts")
        gaps = [b - a for a, b in itertools.pairwise(attempts)]
        # Each failure is immediate (nothing listens), so a gap is the back-off alone.
        for k, gap in enumerate(gaps[:9]):
            full = min(cfg.backoff_min_s * 2**k, cfg.backoff_max_s)
            assert 0.5 * full - 1e-6 <= gap <= full + 1e-6, (k, gap, full)
        assert sum(gaps[5:9]) > 4 * 0.5 * cfg.backoff_max_s * 0.99  # it reached the cap
        down = False
        await run_until(lambda: link.healthy, 5.0, "the link to come up")
        assert receiver.snapshots  # the snapshot got through
        link.offer(sender.round())
        await run_until(lambda: bool(receiver.deltas), 5.0, "a delta")
        down = True
        link.offer(sender.round())  # a delta still goes; the snapshot after it fails
        del receiver.state.replicas[SENDER]
        link.offer(sender.round())
        before = len(attempts)
        await run_until(lambda: len(attempts) >= before + 3, 10.0, "three more attempts")
        after = [b - a for a, b in zip(attempts[before:], attempts[before + 1 :], strict=False)]
        # Starting over: the first waits at most backoff_min_s, the second at most twice that.
        assert after[0] <= cfg.backoff_min_s + 1e-6, after
        assert after[1] <= 2 * cfg.backoff_min_s + 1e-6, after
    finally:
        await link.stop()


@virtual
async def test_a_seeded_link_repeats_its_back_off_exactly() -> None:
    """The jitter comes from the runtime's RNG: the same seed gives the same schedule."""

    async def schedule(seed: int) -> list[float]:
        attempts: list[float] = []

        def drop(caller: str, callee: str, message: object) -> bool:
            if isinstance(message, SnapshotHeader):
                attempts.append(virtual_now())
            return True

        _, _, link = await connect(MemoryNetwork(drop), LinkConfig(), seed)
        start = virtual_now()
        link.start()
        try:
            await run_until(lambda: len(attempts) >= 6, 30.0, "six attempts")
        finally:
            await link.stop()
        return [t - start for t in attempts[:6]]

    first, again, other = await schedule(7), await schedule(7), await schedule(8)
    assert first == pytest.approx(again, abs=1e-9)
    assert first != pytest.approx(other, abs=1e-9)


def test_seeded_faults_refuse_a_loss_rate_outside_0_to_1() -> None:
    with pytest.raises(ValueError, match="loss"):
        SeededFaults(loss=1.0)
    with pytest.raises(ValueError, match="delay_s"):
        SeededFaults(delay_s=(0.2, 0.1))


@virtual
@pytest.mark.parametrize("held", [True, False])
async def test_a_snapshot_of_the_starting_model_goes_by_name_or_whole_when_refused(
    held: bool,
) -> None:
    """The receiver holds zeros: a sender that starts there names its first snapshot and the
    name is taken; one that starts elsewhere names it, is refused (``unknown_base``, counted
    nowhere), and sends the values at once. Either way the replica ends exact."""
    start = torch.zeros(NUMEL) if held else torch.ones(NUMEL)
    sender, receiver, link = await connect(MemoryNetwork(), LinkConfig(), start=start)
    link.start()
    try:
        await run_until(lambda: link.healthy, 5.0, "the first snapshot")
        assert replica_is_public_copy(sender, receiver)
        assert link.stats.named == int(held)
        assert link.machine.may_name is held
        assert link.stats.snapshots_sent == link.counters.snapshots_sent == 1
        assert 0 < link.counters.snapshot_bytes_sent == link.counters.bytes_sent
        link.offer(sender.round())
        await run_until(lambda: replica_is_public_copy(sender, receiver), 5.0, "a delta")
        assert receiver.inbound.counters.rejected == {}
        assert link.stats.failures == 0
    finally:
        await link.stop()
