"""An insider: one device holding a valid certificate of the swarm's CA, attacking the swarm
with a server and a client of its own, built from protos/murmur.proto (it speaks the wire
protocol directly; none of murmur's node code runs in it).

It joins like a member, then on command:

* ``flood``: membership messages full of identities it made itself (thousands of keys, each
  record signed by its own key; with no certificate, with the insider's certificate pasted
  on, with a broken signature), or of its own record at ever newer incarnations (each a valid
  record that costs a signature check);
* ``forge``: replays of the oldest records it saw, and departures it cannot sign: DEAD records
  built from each member's own signed "alive" record;
* ``poison``: snapshots of 1e38 everywhere, pushed to every node;
* and always: every model pull is answered with 1e38 everywhere.

Run as ``python -m tests.e2e.insider TLS_DIR JOIN_ADDRESS``: it prints one JSON line when it
is ready (``{"event": "ready", "node_id", "address"}``), then takes one JSON command per line on
stdin (``{"do": "flood", "seconds": 5, "kind": "forged"}``, ``{"do": "forge", "seconds": 5}``,
``{"do": "poison"}``, ``{"do": "stats"}``) and answers each with a JSON line when it is done.
The bench (bench/insider_flood.py) drives the same class in-process.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import struct
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from protos import murmur_pb2 as pb
from protos import murmur_pb2_grpc as pb_grpc

PROTOCOL_VERSION = 3  # as gossip/messages.py says, written out as an outsider would
TLS_NAME = "murmur"
CHUNK_VALUES = 1 << 18
POISON = 1e38
#: Records per membership message: the most a node takes in one (node/transport/wire.py).
PER_MESSAGE = 32
_ECDSA = ec.ECDSA(hashes.SHA256())
Context = grpc.aio.ServicerContext[Any, Any]


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _der_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _node_id(key: ec.EllipticCurvePrivateKey) -> str:
    digest = hashes.Hash(hashes.SHA256())
    digest.update(_der_key(key))
    return digest.finalize().hex()[:32]


def _claim(m: pb.Member) -> bytes:
    what = "left" if m.status == pb.LEFT else "alive"
    return f"murmur-member|{m.node_id}|{m.address}|{m.incarnation}|{what}".encode()


def _signed(key: ec.EllipticCurvePrivateKey, address: str, incarnation: int) -> pb.Member:
    m = pb.Member(
        node_id=_node_id(key), address=address, incarnation=incarnation, public_key=_der_key(key)
    )
    m.signature = key.sign(_claim(m), _ECDSA)
    return m


def digits_fingerprint() -> pb.TaskFingerprint:
    """The built-in digits task's fingerprint (an MLP 64-64-10), with int8 gossip."""
    shapes = [("0.weight", [64, 64]), ("0.bias", [64]), ("2.weight", [10, 64]), ("2.bias", [10])]
    return pb.TaskFingerprint(
        params=[pb.ParamSpec(name=n, shape=s, dtype="float32") for n, s in shapes],
        codec="int8",
        block_size=256,
    )


class Insider(pb_grpc.MurmurServicer):
    """The attacker's node. ``tls_dir`` holds its key and certificate from the swarm's CA."""

    def __init__(self, tls_dir: Path, fingerprint: pb.TaskFingerprint | None = None) -> None:
        key = serialization.load_pem_private_key(_read(tls_dir / "node_key.pem"), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self.key: ec.EllipticCurvePrivateKey = key
        self.key_pem = _read(tls_dir / "node_key.pem")
        self.cert_pem = _read(tls_dir / "node_cert.pem")
        self.ca_pem = _read(tls_dir / "ca_cert.pem")
        cert = x509.load_pem_x509_certificate(self.cert_pem)
        self.cert_der = cert.public_bytes(serialization.Encoding.DER)
        self.node_id = _node_id(self.key)
        self.fingerprint = fingerprint or digits_fingerprint()
        self.numel = sum(math.prod(p.shape) for p in self.fingerprint.params)
        self.address = ""
        self.incarnation = time.time_ns() // 1_000_000
        self.latest: dict[str, pb.Member] = {}  # the newest record of each member seen
        self.oldest: dict[str, pb.Member] = {}  # the first, for replays
        self.counts: Counter[str] = Counter()
        self._server: grpc.aio.Server | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._sybils: list[ec.EllipticCurvePrivateKey] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- records ------------------------------------------------------------------------------

    def own(self, incarnation: int | None = None) -> pb.Member:
        m = _signed(self.key, self.address, incarnation or self.incarnation)
        m.certificate = self.cert_der
        return m

    def _learn(self, members: Any) -> None:
        for m in members:
            if m.node_id == self.node_id:
                continue
            if m.node_id not in self.oldest:
                self.oldest[m.node_id] = m
            known = self.latest.get(m.node_id)
            if known is None or (m.incarnation >= known.incarnation and m.status == pb.ALIVE):
                self.latest[m.node_id] = m

    def sybils(self, n: int) -> list[ec.EllipticCurvePrivateKey]:
        while len(self._sybils) < n:
            self._sybils.append(ec.generate_private_key(ec.SECP256R1()))
        return self._sybils[:n]

    # -- serving ------------------------------------------------------------------------------

    async def serve(self, host: str = "127.0.0.1") -> str:
        server = grpc.aio.server()
        pb_grpc.add_MurmurServicer_to_server(self, server)  # type: ignore[no-untyped-call]
        creds = grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True
        )
        port = server.add_secure_port(f"{host}:0", creds)
        await server.start()
        self._server = server
        self.address = f"{host}:{port}"
        return self.address

    async def Hello(self, request: pb.Hello, context: Context) -> pb.Hello:  # noqa: N802
        self._learn([request.self])
        self.counts["hellos_answered"] += 1
        return pb.Hello(
            protocol_version=PROTOCOL_VERSION,
            self=self.own(),
            fingerprint=request.fingerprint,  # whatever the joiner trains, so do we
            members=list(self.latest.values()),
        )

    async def Swim(self, request: pb.SwimMessage, context: Context) -> pb.SwimReply:  # noqa: N802
        self._learn(request.updates)
        if request.kind == pb.PING:  # ack, so that the swarm keeps us
            ack = pb.SwimMessage(
                protocol_version=PROTOCOL_VERSION,
                kind=pb.ACK,
                sender=self.node_id,
                sender_address=self.address,
                seq=request.seq,
                target=self.node_id,
                updates=[self.own()],
            )
            self._spawn(self._call_swim(request.sender_address, ack))
        return pb.SwimReply(node_id=self.node_id)

    async def PullModel(  # noqa: N802
        self, request: pb.PullModelRequest, context: Context
    ) -> AsyncIterator[pb.ModelChunk]:
        self.counts["poisoned_pulls_served"] += 1
        data = POISON_CHUNK if self.numel >= CHUNK_VALUES else _poison_bytes(self.numel)
        for offset in range(0, self.numel, CHUNK_VALUES):
            n = min(CHUNK_VALUES, self.numel - offset)
            yield pb.ModelChunk(numel=self.numel, offset=offset, data=data[: 4 * n], step=10**6)

    async def PushSnapshot(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.SnapshotChunk], context: Context
    ) -> pb.SnapshotAck:
        seq = 0
        async for chunk in request_iterator:
            seq = chunk.seq
        return pb.SnapshotAck(replica_seq=seq)

    async def StreamDeltas(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.Delta], context: Context
    ) -> AsyncIterator[pb.DeltaAck]:
        async for delta in request_iterator:
            yield pb.DeltaAck(replica_seq=delta.seq)

    async def PushDelta(self, request: pb.Delta, context: Context) -> pb.DeltaAck:  # noqa: N802
        return pb.DeltaAck(replica_seq=request.seq)

    async def Status(  # noqa: N802
        self, request: pb.StatusRequest, context: Context
    ) -> pb.NodeStatus:
        return pb.NodeStatus(node_id=self.node_id, address=self.address)

    # -- calling ------------------------------------------------------------------------------

    def stub(self, address: str) -> pb_grpc.MurmurStub:
        channel = self._channels.get(address)
        if channel is None:
            creds = grpc.ssl_channel_credentials(self.ca_pem, self.key_pem, self.cert_pem)
            options = [("grpc.ssl_target_name_override", TLS_NAME)]
            channel = grpc.aio.secure_channel(address, creds, options=options)
            self._channels[address] = channel
        return pb_grpc.MurmurStub(channel)  # type: ignore[no-untyped-call]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _note(self, what: str, err: grpc.aio.AioRpcError | None) -> None:
        if err is None:
            self.counts[f"{what} ok"] += 1
            return
        reasons = [str(v) for k, v in err.trailing_metadata() or () if k == "murmur-reason"]
        self.counts[f"{what} {reasons[0] if reasons else err.code().name}"] += 1

    async def _call_swim(self, address: str, message: pb.SwimMessage, what: str = "") -> None:
        try:
            await self.stub(address).Swim(message, timeout=5.0)
            err = None
        except grpc.aio.AioRpcError as e:
            err = e
        if what:
            self._note(what, err)

    async def join(self, address: str) -> None:
        hello = pb.Hello(
            protocol_version=PROTOCOL_VERSION, self=self.own(), fingerprint=self.fingerprint
        )
        reply = await self.stub(address).Hello(hello, timeout=15.0)
        self._learn([reply.self, *reply.members])

    def _ping(self, updates: list[pb.Member], seq: int = 1) -> pb.SwimMessage:
        return pb.SwimMessage(
            protocol_version=PROTOCOL_VERSION,
            kind=pb.PING,
            sender=self.node_id,
            sender_address=self.address,
            seq=seq,
            updates=[self.own(), *updates],
        )

    def _forged_batch(self, start: int, n: int) -> list[pb.Member]:
        """Records of identities it made (no certificate; its own pasted on; a broken
        signature), ``n`` of them from the ``start``-th, each signed by its own key."""
        out = []
        keys = self.sybils(start + n)[start:]
        for i, key in enumerate(keys):
            m = _signed(key, f"127.0.0.{1 + (start + i) % 250}:{7000 + (start + i) % 1000}", 1)
            if i % 3 == 1:
                m.certificate = self.cert_der
            elif i % 3 == 2:
                m.signature = m.signature[:-1] + bytes([m.signature[-1] ^ 1])
            out.append(m)
        return out

    async def flood(self, targets: list[str], seconds: float, kind: str = "forged") -> int:
        """Send membership messages of ``PER_MESSAGE - 1`` records each to every target, as
        fast as they answer, for ``seconds``; returns the records sent."""
        deadline = time.monotonic() + seconds
        pool = 4096
        if kind == "forged":
            per = PER_MESSAGE - 1
            batches = [self._forged_batch(i, per) for i in range(0, pool, per)]
        sent = 0

        async def one(address: str) -> None:
            nonlocal sent
            i = 0
            while time.monotonic() < deadline:
                if kind == "forged":
                    updates = batches[i % len(batches)]
                else:  # "valid": its own records at ever newer incarnations
                    self.incarnation += PER_MESSAGE
                    updates = [self.own(self.incarnation - k) for k in range(1, PER_MESSAGE)]
                i += 1
                await self._call_swim(address, self._ping(updates, i), f"flood-{kind}")
                sent += len(updates)

        await asyncio.gather(*(one(a) for a in targets for _ in range(4)))
        self.counts[f"records sent ({kind})"] += sent
        return sent

    async def forge(self, targets: list[str], seconds: float, period_s: float = 0.25) -> None:
        """Every ``period_s``: each member's newest record turned DEAD (its "alive" signature
        is all a dead record carries), and each member's oldest record, replayed."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            dead = []
            for m in self.latest.values():
                forged = pb.Member()
                forged.CopyFrom(m)
                forged.status = pb.DEAD
                dead.append(forged)
            replays = list(self.oldest.values())
            updates = (dead + replays)[: PER_MESSAGE - 1]
            await asyncio.gather(
                *(self._call_swim(a, self._ping(updates), "forge") for a in targets)
            )
            await asyncio.sleep(period_s)

    async def poison(self, targets: list[str]) -> None:
        """A snapshot of 1e38 everywhere, pushed to every target in our own name."""

        async def one(address: str) -> None:
            session = int.from_bytes(os.urandom(7), "big")

            async def chunks() -> AsyncIterator[pb.SnapshotChunk]:
                for offset in range(0, self.numel, CHUNK_VALUES):
                    n = min(CHUNK_VALUES, self.numel - offset)
                    yield pb.SnapshotChunk(
                        protocol_version=PROTOCOL_VERSION,
                        sender=self.node_id,
                        session=session,
                        seq=1,
                        numel=self.numel,
                        offset=offset,
                        data=_poison_bytes(n),
                        degree=4,
                    )

            try:
                await self.stub(address).PushSnapshot(chunks(), timeout=10.0)
                self._note("poison", None)
            except grpc.aio.AioRpcError as err:
                self._note("poison", err)

        await asyncio.gather(*(one(a) for a in targets))

    def members(self) -> list[str]:
        return [m.address for m in self.latest.values()]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
        if self._server is not None:
            await self._server.stop(0)


def _poison_bytes(n: int) -> bytes:
    return struct.pack("<f", POISON) * n


POISON_CHUNK = _poison_bytes(CHUNK_VALUES)


async def _main(tls_dir: Path, join: str) -> None:
    insider = Insider(tls_dir)
    await insider.serve()
    await insider.join(join)
    print(json.dumps({"event": "ready", "node_id": insider.node_id, "address": insider.address}))
    sys.stdout.flush()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := await reader.readline():
            command = json.loads(line)
            targets = command.get("targets") or insider.members()
            what = command["do"]
            if what == "flood":
                await insider.flood(targets, command["seconds"], command.get("kind", "forged"))
            elif what == "forge":
                await insider.forge(targets, command["seconds"])
            elif what == "poison":
                await insider.poison(targets)
            print(json.dumps({"done": what, "counts": dict(insider.counts)}))
            sys.stdout.flush()
    finally:
        await insider.close()


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1]), sys.argv[2]))
