"""The gRPC transport: a grpc.aio server for the node's handler, and one channel per peer.

Refusals travel as a gRPC status (INVALID_ARGUMENT when the message itself is wrong,
FAILED_PRECONDITION when it does not fit the receiver's state) with the reason in the trailing
metadata key ``murmur-reason``, so the caller gets back the same :class:`Rejected`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from gossip.messages import PROTOCOL_VERSION, Delta, Hello, ModelChunk, SnapshotHeader
from gossip.swim import SwimMessage
from node import wire
from node.pki import TLS_NAME, TlsFiles, node_id_of_cert
from node.status import NodeStatus
from node.transport.base import (
    INVALID_ARGUMENT_REASONS,
    Handler,
    HandshakeFailed,
    Reason,
    Rejected,
    SnapshotChunk,
    Unreachable,
    iter_chunks,
)
from protos import murmur_pb2_grpc

if TYPE_CHECKING:
    import torch

__all__ = ["GrpcTransport", "GrpcTransportConfig"]

log = logging.getLogger(__name__)

M = TypeVar("M")
D = TypeVar("D")

REASON_KEY = "murmur-reason"
SERVICE = "murmur.v1.Murmur"
#: Codes that mean "could not talk to the peer", not "the peer said no".
_UNREACHABLE_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
    }
)


@dataclass(frozen=True)
class GrpcTransportConfig:
    """Args:
    max_message_bytes: the largest single message sent or accepted; the node sets it from the
        model's size (an fp32 delta plus headroom), so oversized input is refused by gRPC itself.
    """

    max_message_bytes: int = 64 << 20
    #: Mutual TLS material; None serves and dials plain TCP (``--insecure``).
    tls: TlsFiles | None = None

    def channel_options(self) -> list[tuple[str, Any]]:
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", 30_000),
        ]
        if self.tls is not None:
            # Nodes dial addresses no certificate can list in advance: every node certificate
            # names TLS_NAME, and who answers is checked by node id, bound to the certificate.
            options.append(("grpc.ssl_target_name_override", TLS_NAME))
        return options


def _status_code(reason: Reason) -> grpc.StatusCode:
    if reason in INVALID_ARGUMENT_REASONS:
        return grpc.StatusCode.INVALID_ARGUMENT
    if reason in (Reason.SHUTTING_DOWN, Reason.NOT_READY):
        return grpc.StatusCode.UNAVAILABLE
    if reason in (Reason.IDENTITY, Reason.REVOKED):
        return grpc.StatusCode.PERMISSION_DENIED
    if reason is Reason.RATE_LIMITED:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.FAILED_PRECONDITION


class _Servicer(murmur_pb2_grpc.MurmurServicer):
    """Decodes, calls the handler, encodes; maps :class:`Rejected` to a status."""

    def __init__(self, handler: Handler, tls: bool) -> None:
        self.handler = handler
        self.tls = tls

    def _check_sender(
        self, context: grpc.aio.ServicerContext[Any, Any], claimed: str | None
    ) -> None:
        """Under TLS: a revoked node gets nothing, and a message may only speak for the node
        whose certificate sent it (``claimed``; None for calls that claim nobody)."""
        if not self.tls:
            return
        certs = list(context.auth_context().get("x509_pem_cert") or [])
        actual = node_id_of_cert(certs[0]) if certs else ""
        if self.handler.is_revoked(actual):
            err = Rejected(Reason.REVOKED, f"node {actual[:8]} is revoked in this swarm")
            self.handler.note_rejected(err.reason, err.detail)
            raise err
        if claimed is not None and actual != claimed:
            certified = actual[:8] or "absent"
            err = Rejected(
                Reason.IDENTITY,
                f"the message speaks for {claimed[:8]}, the certificate is {certified}",
            )
            self.handler.note_rejected(err.reason, err.detail)
            raise err

    def _decode(self, decode: Callable[[M], D], raw: M) -> D:
        """Decode a message; a malformed one is counted before it is refused."""
        try:
            if isinstance(raw, Undecodable):
                raise Rejected(Reason.MALFORMED, f"{raw.nbytes} bytes that are not a {raw.what}")
            return decode(raw)
        except Rejected as err:
            self.handler.note_rejected(err.reason, err.detail)
            raise

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], err: Rejected) -> None:
        await context.abort(
            _status_code(err.reason),
            f"{err.reason}: {err.detail}",
            trailing_metadata=((REASON_KEY, str(err.reason)),),
        )

    async def Hello(  # noqa: N802 (gRPC method names)
        self, request: wire.pb.Hello, context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.Hello:
        try:
            hello = self._decode(wire.hello_from_pb, request)
            self._check_sender(context, hello.self_.node_id)
            return wire.hello_to_pb(await self.handler.rpc_hello(hello))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PushDelta(  # noqa: N802
        self, request: wire.pb.Delta, context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.DeltaAck:
        try:
            delta = self._decode(wire.delta_from_pb, request)
            self._check_sender(context, delta.sender)
            return wire.pb.DeltaAck(replica_seq=await self.handler.rpc_push_delta(delta))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def StreamDeltas(  # noqa: N802
        self,
        request_iterator: AsyncIterator[wire.pb.Delta],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[wire.pb.DeltaAck]:
        try:
            async for request in request_iterator:
                delta = self._decode(wire.delta_from_pb, request)
                self._check_sender(context, delta.sender)
                yield wire.pb.DeltaAck(replica_seq=await self.handler.rpc_push_delta(delta))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PushSnapshot(  # noqa: N802
        self,
        request_iterator: AsyncIterator[wire.pb.SnapshotChunk],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> wire.pb.SnapshotAck:
        try:
            try:
                first = await anext(aiter(request_iterator))
            except StopAsyncIteration:
                err = Rejected(Reason.MALFORMED, "empty snapshot stream")
                self.handler.note_rejected(err.reason, err.detail)
                raise err from None
            header, chunk0 = self._decode(wire.snapshot_chunk_from_pb, first)
            self._check_sender(context, header.sender)

            async def chunks() -> AsyncIterator[SnapshotChunk]:
                yield chunk0
                async for raw in request_iterator:
                    h, chunk = self._decode(wire.snapshot_chunk_from_pb, raw)
                    if h != header:
                        err = Rejected(Reason.MALFORMED, "snapshot chunks disagree on a header")
                        self.handler.note_rejected(err.reason, err.detail)
                        raise err
                    yield chunk

            seq = await self.handler.rpc_push_snapshot(header, chunks())
            return wire.pb.SnapshotAck(replica_seq=seq)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def Status(  # noqa: N802
        self, request: wire.pb.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.NodeStatus:
        try:
            self._check_sender(context, None)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err
        return wire.status_to_pb(await self.handler.rpc_status())

    async def Swim(  # noqa: N802
        self, request: wire.pb.SwimMessage, context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.SwimReply:
        try:
            version, message = self._decode(wire.swim_from_pb, request)
            self._check_sender(context, message.sender)
            return wire.pb.SwimReply(node_id=await self.handler.rpc_swim(version, message))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PullModel(  # noqa: N802
        self, request: wire.pb.PullModelRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[wire.pb.ModelChunk]:
        try:
            self._check_sender(context, None)
            request = self._decode(lambda r: r, request)
            chunks = self.handler.rpc_pull_model(request.protocol_version, request.requester)
            async for chunk in chunks:
                yield wire.model_chunk_to_pb(chunk)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err


@dataclass(frozen=True)
class Undecodable:
    """What arrived instead of a message when its bytes did not parse."""

    what: str
    nbytes: int


def _lenient(message: type[Any]) -> Callable[[bytes], Any]:
    """A deserializer that hands bytes that do not parse on as :class:`Undecodable`, so the
    servicer refuses them like any malformed message (counted, INVALID_ARGUMENT) instead of
    gRPC failing the call as UNKNOWN before the node ever sees it."""

    def parse(raw: bytes) -> Any:
        try:
            return message.FromString(raw)
        except DecodeError:
            return Undecodable(message.__name__, len(raw))

    return parse


def _add_servicer(servicer: _Servicer, server: grpc.aio.Server) -> None:
    """As the generated ``add_MurmurServicer_to_server``, with lenient deserializers."""
    pb = wire.pb

    def handler(kind: Callable[..., Any], method: Any, request: Any, response: Any) -> Any:
        return kind(
            method,
            request_deserializer=_lenient(request),
            response_serializer=response.SerializeToString,
        )

    handlers = {
        "Hello": handler(grpc.unary_unary_rpc_method_handler, servicer.Hello, pb.Hello, pb.Hello),
        "PushDelta": handler(
            grpc.unary_unary_rpc_method_handler, servicer.PushDelta, pb.Delta, pb.DeltaAck
        ),
        "StreamDeltas": handler(
            grpc.stream_stream_rpc_method_handler, servicer.StreamDeltas, pb.Delta, pb.DeltaAck
        ),
        "PushSnapshot": handler(
            grpc.stream_unary_rpc_method_handler,
            servicer.PushSnapshot,
            pb.SnapshotChunk,
            pb.SnapshotAck,
        ),
        "Status": handler(
            grpc.unary_unary_rpc_method_handler, servicer.Status, pb.StatusRequest, pb.NodeStatus
        ),
        "Swim": handler(
            grpc.unary_unary_rpc_method_handler, servicer.Swim, pb.SwimMessage, pb.SwimReply
        ),
        "PullModel": handler(
            grpc.unary_stream_rpc_method_handler,
            servicer.PullModel,
            pb.PullModelRequest,
            pb.ModelChunk,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


_VERIFY_FAILED = re.compile(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)")


def _handshake_failure(address: str, details: str) -> HandshakeFailed | None:
    """What a failed TLS handshake means, from gRPC's details (which name OpenSSL's error):
    the client learns of a certificate it refuses by name, of one the server refused only by
    the server closing the connection."""
    if "WRONG_VERSION_NUMBER" in details:
        return HandshakeFailed(
            f"{address} speaks plain TCP (it runs --insecure), this node mutual TLS"
        )
    verify = _VERIFY_FAILED.search(details)
    if verify is not None:
        cause = verify.group(1).strip()
        if "issuer" in cause:
            cause = f"its certificate is not from this swarm's CA ({cause})"
        return HandshakeFailed(f"TLS handshake with {address} failed: {cause}")
    if "Failed to create security handshaker" in details:
        return HandshakeFailed(
            f"no TLS handshake with {address} could start: does this node's key fit its "
            "certificate?"
        )
    # Closed while connecting (not mid-call, as a crash would): the server refused the handshake.
    if "Socket closed" in details and "failed to connect" in details:
        return HandshakeFailed(
            f"{address} closed the connection in the handshake: it refused this node's "
            "certificate (from another CA, or expired by its clock), or it runs mutual TLS "
            "and this node plain TCP (--insecure)"
        )
    if "handshake" in details.lower():
        return HandshakeFailed(f"TLS handshake with {address} failed: {details}")
    return None


def _error_of(
    address: str, code: grpc.StatusCode, details: str | None, metadata: Any
) -> Rejected | Unreachable:
    for key, value in metadata or ():
        if key == REASON_KEY:
            try:
                reason = Reason(value)
            except ValueError:
                break
            return Rejected(reason, (details or "").removeprefix(f"{reason}: "))
    if code in _UNREACHABLE_CODES or code == grpc.StatusCode.OK:
        return _handshake_failure(address, details or "") or Unreachable(
            f"{address}: {code.name}: {details}"
        )
    return Rejected(Reason.MALFORMED, f"{address} answered {code.name}: {details}")


def _map_error(address: str, err: grpc.aio.AioRpcError) -> Rejected | Unreachable:
    return _error_of(address, err.code(), err.details(), err.trailing_metadata())


class GrpcDeltaStream:
    """A StreamDeltas call: deltas written, acknowledgements read, in order."""

    def __init__(self, address: str, call: Any) -> None:
        self.address = address
        self._call = call

    async def _failure(self) -> Rejected | Unreachable:
        call = self._call
        return _error_of(
            self.address, await call.code(), await call.details(), await call.trailing_metadata()
        )

    async def send(self, delta: Delta) -> None:
        try:
            await self._call.write(wire.delta_to_pb(delta))
        except (asyncio.InvalidStateError, grpc.aio.AioRpcError):
            raise await self._failure() from None

    async def next_ack(self) -> int:
        try:
            ack = await self._call.read()
        except grpc.aio.AioRpcError as err:
            raise _map_error(self.address, err) from None
        if ack is grpc.aio.EOF:
            raise await self._failure()
        return int(ack.replica_seq)

    def cancel(self) -> None:
        self._call.cancel()


class GrpcTransport:
    """gRPC with mutual TLS (``cfg.tls``), or over plain TCP without it."""

    def __init__(self, cfg: GrpcTransportConfig | None = None) -> None:
        self.cfg = cfg or GrpcTransportConfig()
        self._server: grpc.aio.Server | None = None
        self._channels: dict[str, tuple[grpc.aio.Channel, murmur_pb2_grpc.MurmurStub]] = {}
        #: Closes of channels replaced after a failure (held so that they run to the end).
        self._closing: set[asyncio.Future[None]] = set()

    async def serve(self, handler: Handler, listen: str) -> str:
        server = grpc.aio.server(options=self.cfg.channel_options())
        tls = self.cfg.tls
        servicer = _Servicer(handler, tls is not None)
        _add_servicer(servicer, server)
        host = listen.rsplit(":", 1)[0]
        try:
            if tls is None:
                port = server.add_insecure_port(listen)
            else:
                creds = grpc.ssl_server_credentials(
                    [(tls.key_pem, tls.cert_pem)],
                    root_certificates=tls.ca_pem,
                    require_client_auth=True,
                )
                port = server.add_secure_port(listen, creds)
        except RuntimeError as exc:
            raise OSError(
                f"cannot listen on {listen}: the port is taken, or the address is not this "
                "machine's (GRPC_VERBOSITY=debug shows gRPC's own account)"
            ) from exc
        await server.start()
        self._server = server
        if tls is None:
            log.warning(
                "serving on %s:%d over plain TCP (--insecure): no encryption, no authentication "
                "of peers; use it on trusted networks only",
                host,
                port,
            )
        return f"{host}:{port}"

    def _stub(self, address: str, lane: str = "bulk") -> murmur_pb2_grpc.MurmurStub:
        """The stub for ``address`` on one of two connections: ``bulk`` carries models (deltas,
        snapshots, pulls), ``control`` the small, deadline-bound calls (membership pings, hellos,
        status). On a slow link a ping on the bulk connection would wait behind megabytes of
        model in its socket buffer and time out: a false suspicion."""
        key = f"{lane} {address}"
        entry = self._channels.get(key)
        if entry is not None and entry[0].get_state() == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            # The peer was unreachable, and the channel would fail every call at once until its
            # reconnect back-off (up to minutes) ran out, even once the peer is back at the same
            # address, as a restarted device or container is. A new channel tries now.
            self._closing.add(asyncio.ensure_future(entry[0].close()))
            self._closing = {t for t in self._closing if not t.done()}
            entry = None
        if entry is None:
            # A channel pool of its own, so that the two lanes never share a connection.
            options = [*self.cfg.channel_options(), ("grpc.use_local_subchannel_pool", 1)]
            tls = self.cfg.tls
            if tls is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                creds = grpc.ssl_channel_credentials(tls.ca_pem, tls.key_pem, tls.cert_pem)
                channel = grpc.aio.secure_channel(address, creds, options=options)
            entry = (channel, murmur_pb2_grpc.MurmurStub(channel))  # type: ignore[no-untyped-call]
            self._channels[key] = entry
        return entry[1]

    async def call_hello(self, address: str, hello: Hello, timeout_s: float) -> Hello:
        try:
            stub = self._stub(address, "control")
            reply = await stub.Hello(wire.hello_to_pb(hello), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        return wire.hello_from_pb(reply)

    async def call_push_delta(self, address: str, delta: Delta, timeout_s: float) -> int:
        try:
            ack = await self._stub(address).PushDelta(wire.delta_to_pb(delta), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        return int(ack.replica_seq)

    async def open_delta_stream(self, address: str) -> GrpcDeltaStream:
        return GrpcDeltaStream(address, self._stub(address).StreamDeltas())

    async def call_push_snapshot(
        self, address: str, header: SnapshotHeader, values: torch.Tensor, timeout_s: float
    ) -> int:
        async def requests() -> AsyncIterator[wire.pb.SnapshotChunk]:
            for chunk in iter_chunks(values):
                yield wire.snapshot_chunk_to_pb(header, chunk)

        try:
            ack = await self._stub(address).PushSnapshot(requests(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        return int(ack.replica_seq)

    async def call_status(self, address: str, timeout_s: float) -> NodeStatus:
        try:
            stub = self._stub(address, "control")
            reply = await stub.Status(wire.pb.StatusRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        return wire.status_from_pb(reply)

    async def call_swim(self, address: str, message: SwimMessage, timeout_s: float) -> str:
        request = wire.swim_to_pb(message, PROTOCOL_VERSION)
        try:
            reply = await self._stub(address, "control").Swim(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        return str(reply.node_id)

    async def call_pull_model(
        self, address: str, requester: str, timeout_s: float
    ) -> AsyncIterator[ModelChunk]:
        request = wire.pb.PullModelRequest(protocol_version=PROTOCOL_VERSION, requester=requester)
        call = self._stub(address).PullModel(request, timeout=timeout_s)
        try:
            async for chunk in call:
                yield wire.model_chunk_from_pb(chunk)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        finally:
            call.cancel()

    async def close(self, grace_s: float) -> None:
        # Stop serving first so no new inbound work starts while channels go away.
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        channels, self._channels = self._channels, {}
        for channel, _ in channels.values():
            await channel.close()
        await asyncio.gather(*self._closing)
