"""The gRPC transport: a grpc.aio server for the node's handler, and channels to peers.

Refusals travel as a gRPC status (INVALID_ARGUMENT when the message itself is wrong,
FAILED_PRECONDITION when it does not fit the receiver's state) with the reason in the trailing
metadata key ``murmur-reason``, so the caller gets back the same :class:`Rejected`.

Under mutual TLS every call is judged by who sent it before its message is read: the caller is
the node id its certificate certifies (a node certificate of the swarm's CA: ECDSA P-256, not a
CA, issued by the CA itself), and a caller that is revoked, banned, or holds more than
``calls_per_peer`` calls open is refused at once (so the server takes every method as a stream
of requests, however the client sends it). A caller whose messages do not decode, speak for
another node, or carry member records no honest member sends is banned by that id. Member records
are checked (:class:`node.signing.RecordScreen`) before the node sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import grpc
import grpc.aio
import torch
from google.protobuf.message import DecodeError

from gossip.messages import PROTOCOL_VERSION, Delta, Hello, ModelChunk, SnapshotHeader
from gossip.swim import MemberRecord, SwimMessage
from node import wire
from node.penalties import (
    LogLimiter,
    Penalties,
    PenaltyConfig,
    RateConfig,
    RateLimiter,
    SystemClock,
    held_back,
)
from node.pki import TLS_NAME, CertificateRefused, NodeCertificates, TlsFiles
from node.signing import RecordScreen
from node.status import NodeStatus
from node.transport.base import (
    INVALID_ARGUMENT_REASONS,
    Handler,
    Reason,
    Rejected,
    SnapshotChunk,
    Unreachable,
    iter_chunks,
)
from protos import murmur_pb2_grpc

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
    #: Calls one peer may hold open at once: an honest neighbour holds a delta stream, a
    #: snapshot, a model pull and a few membership calls. With the message limit this bounds
    #: what one peer's half-sent messages can hold of this node's memory.
    calls_per_peer: int = 16
    #: Of those, calls that carry models (deltas, snapshots, pulls), each up to a message of
    #: ``max_message_bytes``: an honest neighbour has a delta stream and a snapshot open, and
    #: briefly the next ones while a link restarts.
    model_calls_per_peer: int = 4
    #: Calls open at once from everyone (gRPC refuses more with RESOURCE_EXHAUSTED).
    max_concurrent_rpcs: int = 1024
    #: HTTP/2 streams per connection.
    streams_per_connection: int = 64
    #: A connection with no call for this long is closed (the peer reconnects when it needs to).
    idle_connection_s: float = 300.0
    #: Membership/hello/status channels kept to other nodes; one is opened for every address
    #: this node answers or probes, so they are bounded, least recently used closed first.
    control_channels: int = 256
    #: A control channel unused this long is closed.
    control_idle_s: float = 120.0
    #: Model channels (deltas, snapshots, pulls): neighbours and recent ones.
    bulk_channels: int = 64
    #: Bans of callers, by certified id, for undecodable messages, messages in another node's
    #: name, and forged member records (under TLS only: without it nothing names a caller).
    penalties: PenaltyConfig = field(default_factory=PenaltyConfig)
    #: A banned or revoked caller's refusal is held back this long (up to ``held_per_peer`` of
    #: them at once), so that its calls come no faster than its open streams allow: a refusal
    #: costs the node a few hundred microseconds of its event loop, a flood of them a core.
    refusal_hold_s: float = 1.0
    held_per_peer: int = 16
    #: Membership messages and hellos per second one certified caller may send (and at once):
    #: an honest member sends another a few a second at most (a probe, an ack, a relayed probe),
    #: and each, with its records, costs the node about a millisecond; refusals past it are held
    #: back as above.
    membership_rate: float = 20.0
    membership_burst: float = 100.0

    def server_options(self) -> list[tuple[str, Any]]:
        return [
            *self.channel_options(),
            ("grpc.max_concurrent_streams", self.streams_per_connection),
            ("grpc.max_connection_idle_ms", int(self.idle_connection_s * 1000)),
        ]

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
    """Judges the caller, decodes, calls the handler, encodes; maps :class:`Rejected` to a
    status. Every method takes its requests as a stream, so that the caller is judged before
    any message of its call is read."""

    def __init__(
        self,
        handler: Handler,
        cfg: GrpcTransportConfig,
        screen: Callable[[], RecordScreen | None],
    ) -> None:
        self.handler = handler
        self.cfg = cfg
        self.certs = NodeCertificates(cfg.tls.ca_pem) if cfg.tls is not None else None
        self._screen = screen
        clock = SystemClock()
        #: Bans by certified id; public so that tests can give it a clock.
        self.penalties = Penalties(cfg.penalties, clock)
        self._open: Counter[str] = Counter()
        self._held: Counter[str] = Counter()
        self._membership_rate = RateLimiter(
            RateConfig(rate=cfg.membership_rate, burst=cfg.membership_burst), clock
        )
        self._log = LogLimiter(clock)

    # -- who calls ----------------------------------------------------------------------------

    def _refusal(self, reason: Reason, detail: str) -> Rejected:
        self.handler.note_rejected(reason, detail)
        return Rejected(reason, detail)

    def _shut_out(self, caller: str, reason: Reason, detail: str) -> Rejected:
        self.handler.note_rejected(reason, detail)
        return _ShutOut(caller, reason, detail)

    def _caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The certified node id of the caller under TLS (refused if its certificate is unfit,
        it is revoked, or banned); without TLS, its connection, since nothing names it."""
        if self.certs is None:
            return str(context.peer())
        pems = list(context.auth_context().get("x509_pem_cert") or [])
        if not pems:
            raise self._refusal(Reason.IDENTITY, "the call came without a certificate")
        try:
            caller = self.certs.node_id(pems[0])
        except CertificateRefused as err:
            raise self._refusal(Reason.CERTIFICATE, f"your certificate is refused: {err}") from None
        if self.handler.is_revoked(caller):
            detail = f"node {caller[:8]} is revoked in this swarm"
            raise self._shut_out(caller, Reason.REVOKED, detail)
        ban_left_s = self.penalties.ban_left_s(caller)
        if ban_left_s > 0:
            detail = f"{caller[:8]} sent too many bad messages; refused for {ban_left_s:.0f} s more"
            raise self._shut_out(caller, Reason.BANNED, detail)
        return caller

    @contextlib.contextmanager
    def _slot(
        self, context: grpc.aio.ServicerContext[Any, Any], model: bool = False
    ) -> Iterator[str]:
        """Hold one of the caller's ``calls_per_peer`` slots (and, for a call that carries a
        model, one of its ``model_calls_per_peer``) for the length of a call."""
        caller = self._caller(context)
        keys = [caller, f"{caller} model"] if model else [caller]
        limits = [self.cfg.calls_per_peer, self.cfg.model_calls_per_peer]
        for key, limit in zip(keys, limits, strict=False):
            if self._open[key] >= limit:
                raise self._refusal(
                    Reason.RATE_LIMITED, f"more than {limit} calls open at once from {caller[:8]}"
                )
        for key in keys:
            self._open[key] += 1
        try:
            yield caller
        finally:
            for key in keys:
                self._open[key] -= 1
                if not self._open[key]:
                    del self._open[key]

    def _penalise(self, caller: str, reason: Reason) -> None:
        """Count a bad message against a certified caller (under TLS only)."""
        if self.certs is None:
            return
        ban_s = self.penalties.note_refusal(caller, reason)
        if ban_s and (held := self._log.allow(caller)) is not None:
            log.warning(
                "%s keeps sending bad messages (last: %s); refusing it for %.0f s%s",
                caller[:8],
                reason,
                ban_s,
                held_back(held),
            )

    def _membership_call(self, caller: str) -> None:
        """Under TLS, a caller's membership messages and hellos keep to ``membership_rate``."""
        if self.certs is not None and not self._membership_rate.allow(caller):
            raise self._shut_out(
                caller,
                Reason.RATE_LIMITED,
                f"{caller[:8]} sends membership messages faster than its rate limit",
            )

    def _check_claim(self, caller: str, claimed: str) -> None:
        """Under TLS a message may only speak for the node whose certificate sent it."""
        if self.certs is not None and claimed != caller:
            err = self._refusal(
                Reason.IDENTITY,
                f"the message speaks for {claimed[:8]}, the certificate is {caller[:8]}",
            )
            self._penalise(caller, err.reason)
            raise err

    # -- messages -----------------------------------------------------------------------------

    async def _first(self, requests: AsyncIterator[Any], what: str) -> Any:
        try:
            return await anext(aiter(requests))
        except StopAsyncIteration:
            return Undecodable(what, 0)

    def _decode(self, decode: Callable[[M], D], raw: M, caller: str) -> D:
        """Decode a message; a malformed one is counted (and held against the caller) before
        it is refused."""
        try:
            if isinstance(raw, Undecodable):
                raise Rejected(Reason.MALFORMED, f"{raw.nbytes} bytes that are not a {raw.what}")
            return decode(raw)
        except Rejected as err:
            self.handler.note_rejected(err.reason, err.detail)
            self._penalise(caller, err.reason)
            raise

    async def _screened(
        self, caller: str, records: Sequence[MemberRecord]
    ) -> tuple[MemberRecord, ...]:
        """The records worth handing on, checked off the event loop within the caller's budget
        (all of them, unchecked, without a screen: the in-memory transport's way)."""
        screen = self._screen()
        if screen is None or not records:
            return tuple(records)
        result = await screen.screen(caller, records, skip=self.handler.is_revoked)
        for _ in range(result.over_budget):
            self.handler.note_rejected(Reason.OVER_BUDGET, f"records from {caller[:8]}")
        if result.blamed:
            self._penalise(caller, Reason.UNADMITTED)
        return result.records

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], err: Rejected) -> None:
        if isinstance(err, _ShutOut) and self._held[err.caller] < self.cfg.held_per_peer:
            self._held[err.caller] += 1
            try:
                await asyncio.sleep(self.cfg.refusal_hold_s)
            finally:
                self._held[err.caller] -= 1
                if not self._held[err.caller]:
                    del self._held[err.caller]
        await context.abort(
            _status_code(err.reason),
            f"{err.reason}: {err.detail}",
            trailing_metadata=((REASON_KEY, str(err.reason)),),
        )

    async def Hello(  # noqa: N802 (gRPC method names)
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.Hello:
        try:
            with self._slot(context) as caller:
                self._membership_call(caller)
                raw = await self._first(requests, "Hello")
                hello = self._decode(wire.hello_from_pb, raw, caller)
                self._check_claim(caller, hello.self_.node_id)
                if not await self._screened(caller, [hello.self_]):
                    raise self._refusal(
                        Reason.RATE_LIMITED, "you sent more member records than this node checks"
                    )
                hello = replace(hello, members=await self._screened(caller, hello.members))
                return wire.hello_to_pb(await self.handler.rpc_hello(hello))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PushDelta(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.DeltaAck:
        try:
            with self._slot(context, model=True) as caller:
                raw = await self._first(requests, "Delta")
                delta = self._decode(wire.delta_from_pb, raw, caller)
                self._check_claim(caller, delta.sender)
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
            with self._slot(context, model=True) as caller:
                async for request in request_iterator:
                    delta = self._decode(wire.delta_from_pb, request, caller)
                    self._check_claim(caller, delta.sender)
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
            with self._slot(context, model=True) as caller:
                try:
                    first = await anext(aiter(request_iterator))
                except StopAsyncIteration:
                    raise self._refusal(Reason.MALFORMED, "empty snapshot stream") from None
                header, chunk0 = self._decode(wire.snapshot_chunk_from_pb, first, caller)
                self._check_claim(caller, header.sender)

                async def chunks() -> AsyncIterator[SnapshotChunk]:
                    yield chunk0
                    async for raw in request_iterator:
                        h, chunk = self._decode(wire.snapshot_chunk_from_pb, raw, caller)
                        if h != header:
                            raise self._refusal(
                                Reason.MALFORMED, "snapshot chunks disagree on a header"
                            )
                        yield chunk

                seq = await self.handler.rpc_push_snapshot(header, chunks())
                return wire.pb.SnapshotAck(replica_seq=seq)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def Status(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.NodeStatus:
        try:
            with self._slot(context):
                return wire.status_to_pb(await self.handler.rpc_status())
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def Swim(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.SwimReply:
        try:
            with self._slot(context) as caller:
                self._membership_call(caller)
                raw = await self._first(requests, "SwimMessage")
                version, message = self._decode(wire.swim_from_pb, raw, caller)
                self._check_claim(caller, message.sender)
                message = replace(message, updates=await self._screened(caller, message.updates))
                return wire.pb.SwimReply(node_id=await self.handler.rpc_swim(version, message))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PullModel(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[wire.pb.ModelChunk]:
        try:
            with self._slot(context, model=True) as caller:
                raw = await self._first(requests, "PullModelRequest")
                request = self._decode(lambda r: r, raw, caller)
                chunks = self.handler.rpc_pull_model(request.protocol_version, request.requester)
                async for chunk in chunks:
                    yield wire.model_chunk_to_pb(chunk)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err


class _ShutOut(Rejected):
    """A refusal of a caller shut out for good or for a while (revoked, banned)."""

    def __init__(self, caller: str, reason: Reason, detail: str) -> None:
        super().__init__(reason, detail)
        self.caller = caller


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

    # Unary requests are taken as streams (the bytes on the wire are the same), so that the
    # servicer runs, and judges the caller, before the request's message is read.
    unary_in = grpc.stream_unary_rpc_method_handler
    handlers = {
        "Hello": handler(unary_in, servicer.Hello, pb.Hello, pb.Hello),
        "PushDelta": handler(unary_in, servicer.PushDelta, pb.Delta, pb.DeltaAck),
        "StreamDeltas": handler(
            grpc.stream_stream_rpc_method_handler, servicer.StreamDeltas, pb.Delta, pb.DeltaAck
        ),
        "PushSnapshot": handler(
            grpc.stream_unary_rpc_method_handler,
            servicer.PushSnapshot,
            pb.SnapshotChunk,
            pb.SnapshotAck,
        ),
        "Status": handler(unary_in, servicer.Status, pb.StatusRequest, pb.NodeStatus),
        "Swim": handler(unary_in, servicer.Swim, pb.SwimMessage, pb.SwimReply),
        "PullModel": handler(
            grpc.stream_stream_rpc_method_handler,
            servicer.PullModel,
            pb.PullModelRequest,
            pb.ModelChunk,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


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
        return Unreachable(f"{address}: {code.name}: {details}")
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


@dataclass
class _Channel:
    channel: grpc.aio.Channel
    stub: murmur_pb2_grpc.MurmurStub
    used: float


class GrpcTransport:
    """gRPC with mutual TLS (``cfg.tls``), or over plain TCP without it."""

    def __init__(self, cfg: GrpcTransportConfig | None = None) -> None:
        self.cfg = cfg or GrpcTransportConfig()
        self._server: grpc.aio.Server | None = None
        self._servicer: _Servicer | None = None
        # Per lane, least recently used first.
        self._channels: dict[str, OrderedDict[str, _Channel]] = {
            "bulk": OrderedDict(),
            "control": OrderedDict(),
        }
        #: Closes of channels replaced or let go (held so that they run to the end).
        self._closing: set[asyncio.Future[None]] = set()
        #: Checks member records before the handler sees them (set by the node; see
        #: :class:`node.signing.RecordScreen`); None hands them on as they came.
        self.screen: RecordScreen | None = None

    @property
    def penalties(self) -> Penalties | None:
        """The bans of callers by certified id, once serving."""
        return self._servicer.penalties if self._servicer is not None else None

    def open_calls(self, caller: str) -> int:
        """Calls open now from ``caller`` (its certified id under TLS)."""
        return self._servicer._open.get(caller, 0) if self._servicer is not None else 0

    def channel_count(self) -> int:
        return sum(len(lane) for lane in self._channels.values())

    async def serve(self, handler: Handler, listen: str) -> str:
        server = grpc.aio.server(
            options=self.cfg.server_options(),
            maximum_concurrent_rpcs=self.cfg.max_concurrent_rpcs,
        )
        tls = self.cfg.tls
        servicer = _Servicer(handler, self.cfg, lambda: self.screen)
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
            raise OSError(f"cannot listen on {listen}: {exc}") from exc
        await server.start()
        self._server = server
        self._servicer = servicer
        if tls is None:
            log.warning(
                "serving on %s:%d over plain TCP (--insecure): no encryption, no authentication "
                "of peers; use it on trusted networks only",
                host,
                port,
            )
        return f"{host}:{port}"

    def _let_go(self, entry: _Channel) -> None:
        self._closing.add(asyncio.ensure_future(entry.channel.close()))
        self._closing = {t for t in self._closing if not t.done()}

    def _stub(self, address: str, lane: str = "bulk") -> murmur_pb2_grpc.MurmurStub:
        """The stub for ``address`` on one of two connections: ``bulk`` carries models (deltas,
        snapshots, pulls), ``control`` the small, deadline-bound calls (membership pings, hellos,
        status). On a slow link a ping on the bulk connection would wait behind megabytes of
        model in its socket buffer and time out: a false suspicion.

        Channels are bounded per lane (least recently used closed first), and control channels
        unused for ``control_idle_s`` are closed: a node answers and probes any address it is
        given, and would otherwise keep a channel to each for good. Bulk channels carry
        long-lived delta streams, so only the bound applies to them."""
        channels = self._channels[lane]
        now = time.monotonic()
        entry = channels.pop(address, None)
        failed = grpc.ChannelConnectivity.TRANSIENT_FAILURE
        if entry is not None and entry.channel.get_state() == failed:
            # The peer was unreachable, and the channel would fail every call at once until its
            # reconnect back-off (up to minutes) ran out, even once the peer is back at the same
            # address, as a restarted device or container is. A new channel tries now.
            self._let_go(entry)
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
            stub = murmur_pb2_grpc.MurmurStub(channel)  # type: ignore[no-untyped-call]
            entry = _Channel(channel, stub, now)
        entry.used = now
        channels[address] = entry  # most recently used last
        limit = self.cfg.control_channels if lane == "control" else self.cfg.bulk_channels
        while len(channels) > limit:
            self._let_go(channels.popitem(last=False)[1])
        if lane == "control":
            while channels:
                oldest = next(iter(channels.values()))
                if now - oldest.used <= self.cfg.control_idle_s:
                    break
                self._let_go(channels.popitem(last=False)[1])
        return entry.stub

    async def call_hello(self, address: str, hello: Hello, timeout_s: float) -> Hello:
        try:
            stub = self._stub(address, "control")
            reply = await stub.Hello(wire.hello_to_pb(hello), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise _map_error(address, err) from None
        answer = wire.hello_from_pb(reply)
        if self.screen is not None:
            # Asked for, so not held to a budget; but checked off the event loop all the same.
            records = (answer.self_, *answer.members)
            await self.screen.screen(address, records, budgeted=False)
        return answer

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
        for lane in self._channels.values():
            while lane:
                await lane.popitem()[1].channel.close()
        await asyncio.gather(*self._closing)
        if self.screen is not None:
            await asyncio.to_thread(self.screen.close)
