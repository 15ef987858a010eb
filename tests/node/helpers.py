"""Building nodes for tests: small budgets, port 0, state in a temporary folder."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
from cryptography.hazmat.primitives.asymmetric import ec

from gossip.messages import Delta, Hello, ModelChunk, SnapshotHeader
from gossip.swim import MemberRecord, Outgoing, Swim, SwimConfig, SwimMessage
from node.config import GossipConfig, NodeConfig
from node.daemon.node import Node
from node.daemon.trainer import TrainerConfig
from node.runtime import LoopClock
from node.security.identity import Identity
from node.security.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE, init_ca, issue_node
from node.security.signing import public_key_der, record_signer
from node.telemetry.status import NodeStatus
from node.transport.base import (
    ControlCaller,
    Reason,
    Rejected,
    SnapshotChunk,
    Transport,
    Unreachable,
)
from node.transport.grpc import GrpcTransport
from node.transport.memory import MemoryNetwork, MemoryTransport


def config(state_dir: Path, **overrides: Any) -> NodeConfig:
    """A digits node on loopback port 0; ``trainer.*`` and ``gossip.*`` keys reach the sections."""
    trainer = {
        k.removeprefix("trainer."): v for k, v in overrides.items() if k.startswith("trainer.")
    }
    gossip = {k.removeprefix("gossip."): v for k, v in overrides.items() if k.startswith("gossip.")}
    top = {k: v for k, v in overrides.items() if "." not in k}
    base = NodeConfig(
        listen="127.0.0.1:0",
        state_dir=state_dir,
        device="cpu",
        wait_timeout_s=30.0,
        insecure=True,  # over the in-memory transport; TLS has tests of its own
        trainer=TrainerConfig(steps=200, eval_every=100),
        gossip=GossipConfig(idle_round_interval_s=0.05),
    )
    return dataclasses.replace(
        base,
        **top,
        trainer=dataclasses.replace(base.trainer, **trainer),
        gossip=dataclasses.replace(base.gossip, **gossip),
    )


@asynccontextmanager
async def memory_swarm(
    tmp_path: Path,
    n: int,
    settings: dict[str, Any] | None = None,
    network: MemoryNetwork | None = None,
    each: Callable[[int], dict[str, Any]] | None = None,
) -> AsyncIterator[list[Node]]:
    """n nodes on one in-memory network, each joining through the first, all started.

    ``settings`` are :func:`config` overrides shared by every node (``wait_members`` is ``n``
    unless they say otherwise); ``each(i)`` adds node i's own.
    """
    network = network or MemoryNetwork()
    nodes: list[Node] = []
    try:
        for i in range(n):
            cfg = config(
                tmp_path / f"node-{i}",
                listen="mem:0",
                shard_index=i,
                shard_count=n,
                join=(nodes[0].address,) if nodes else (),
                **{"wait_members": n, **(settings or {}), **(each(i) if each else {})},
            )
            transport: Transport = MemoryTransport(network)
            node = await Node.create(cfg, transport=transport)
            nodes.append(node)
            await node.start()
        yield nodes
    finally:
        for node in nodes:
            await node.stop(grace_s=0)


async def tls_metrics_node(tmp_path: Path) -> Node:
    """A started node over mutual TLS (CA in ``tmp_path / "ca"``), its metrics port serving
    HTTPS to the swarm's certificates only, waiting for a second member; a client certificate
    is issued in ``tmp_path / "me"`` (see :func:`metrics_client`)."""
    init_ca(tmp_path / "ca")
    issue_node(tmp_path / "ca", tmp_path / "node", "node")
    issue_node(tmp_path / "ca", tmp_path / "me", "me")
    cfg = config(
        tmp_path / "node", insecure=False, metrics_port=0, metrics_tls=True, wait_members=2
    )
    node = await Node.create(cfg)
    await node.start()
    return node


def metrics_client(tmp_path: Path, cert_dir: Path | None) -> ssl.SSLContext:
    """A client of :func:`tls_metrics_node`: trusts its CA, shows ``cert_dir``'s certificate
    (None: none)."""
    context = ssl.create_default_context(cafile=str(tmp_path / "ca" / CA_CERT_FILE))
    context.check_hostname = False  # node certificates name the swarm, not an address
    if cert_dir is not None:
        context.load_cert_chain(cert_dir / CERT_FILE, cert_dir / KEY_FILE)
    return context


def replica_matches_sender(receiver: Node, sender: Node) -> bool:
    """Whether ``receiver`` holds ``sender``'s public copy as it is now, to the bit."""
    replica = receiver.state.replicas.get(sender.node_id)
    return (
        replica is not None
        and replica.session == sender.state.session
        and replica.seq == sender.state.seq
        and torch.equal(replica.value, sender.state.public)
    )


def refusals_past_joining(node: Node) -> dict[str, int]:
    """What ``node`` refused, less the one refusal a swarm that assembles itself makes by design:
    a joiner's first snapshot may reach a neighbour whose membership has not yet heard of the
    joiner (SWIM spreads a new member within a protocol period or so), which refuses it as
    ``unknown_sender``; the link retries a moment later (gossip/refusals.py, ``Retry.SOON``)."""
    return {r: n for r, n in node.counters.rejected.items() if r != Reason.UNKNOWN_SENDER}


def fixed_identity(secret: int) -> Identity:
    """The same key, and so the same node id, every time (for ids that tests name)."""
    return Identity.from_key(ec.derive_private_key(secret, ec.SECP256R1()))


def signed_record(identity: Identity, address: str, incarnation: int = 1) -> MemberRecord:
    """An alive member record as its node would sign it."""
    record = MemberRecord(identity.node_id, address, incarnation)
    return dataclasses.replace(
        record,
        public_key=public_key_der(identity),
        signature=record_signer(identity)(record.claim()),
    )


class SwimResponder:
    """A member that takes part in the membership protocol and nothing else: a peer at a real
    address for tests that feed a node messages by hand. It answers pings (so the node keeps it
    alive) but never probes, trains or gossips."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.node_id = identity.node_id
        self.transport = GrpcTransport()
        self.swim: Swim | None = None
        self._sends: set[asyncio.Task[str]] = set()

    async def start(self) -> str:
        address = await self.transport.serve(self, "127.0.0.1:0")
        self.swim = Swim(
            self.node_id,
            address,
            1,
            SwimConfig(),
            LoopClock(asyncio.get_running_loop()),
            sign=record_signer(self.identity),
            public_key=public_key_der(self.identity),
        )
        return address

    async def stop(self) -> None:
        sends = list(self._sends)
        for task in sends:
            task.cancel()
        await asyncio.gather(*sends, return_exceptions=True)
        await self.transport.close(0)

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        assert self.swim is not None
        for out in self.swim.receive(message):
            task = asyncio.create_task(self._send(out))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        return self.node_id

    async def _send(self, out: Outgoing) -> str:
        try:
            return await self.transport.call_swim(out.address, out.message, 1.0)
        except (Rejected, Unreachable):  # a lost protocol message, as SWIM expects some to be
            return ""

    def _busy(self) -> NoReturn:
        raise Rejected(Reason.NOT_READY, "this peer only answers the membership protocol")

    async def rpc_hello(self, hello: Hello) -> Hello:
        self._busy()

    async def rpc_push_delta(self, delta: Delta) -> int:
        self._busy()

    async def rpc_push_snapshot(
        self, header: SnapshotHeader, chunks: AsyncIterator[SnapshotChunk]
    ) -> int:
        self._busy()

    async def rpc_status(self) -> NodeStatus:
        self._busy()

    async def rpc_control(self, action: str, caller: ControlCaller) -> tuple[bool, str]:
        self._busy()

    async def rpc_pull_model(
        self, protocol_version: int, requester: str, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        if self.swim is not None:  # always: the refusal comes first, as in the real one
            self._busy()
        yield ModelChunk(0, 0, b"")

    def note_rejected(self, reason: Reason, detail: str) -> None:
        pass

    def is_revoked(self, node_id: str) -> bool:
        return False


T = TypeVar("T")


async def poll(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float) -> T:
    """Ask ``check()`` (a coroutine) until it returns something true. A process has no event
    to wait on; the poll is the event source, and the deadline makes a hang fail by name."""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                got = await check()
                if got:
                    return got
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None
