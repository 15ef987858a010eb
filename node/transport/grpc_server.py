"""The gRPC server side: every call judged by its certified caller, then decoded and handed
to the node's handler; refusals mapped to gRPC statuses (see node/transport/grpc.py).

Under mutual TLS every call is judged by who sent it before its message is read: the caller is
the node id its certificate certifies (a node certificate of the swarm's CA: ECDSA P-256, not a
CA, issued by the CA itself), and a caller that is revoked, banned, or holds more than
``calls_per_peer`` calls open is refused at once (so the server takes every method as a stream
of requests, however the client sends it). A caller whose messages do not decode, speak for
another node, or carry member records no honest member sends is banned by that id. Member records
are checked (:class:`node.security.signing.RecordScreen`) before the node sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from gossip.messages import DIGEST_BYTES
from gossip.swim import MemberRecord
from node.runtime import SystemClock
from node.security.penalties import LogLimiter, Penalties, RateConfig, RateLimiter, held_back
from node.security.pki import CertificateRefused, NodeCertificates
from node.security.signing import RecordScreen
from node.transport import wire
from node.transport.base import (
    CONTROL_ACTIONS,
    INVALID_ARGUMENT_REASONS,
    ControlCaller,
    Handler,
    Reason,
    Rejected,
    SnapshotChunk,
)
from node.transport.forwarding import FORWARDED_METHODS, ForwardChecks
from node.transport.grpc_config import GrpcTransportConfig
from node.transport.session import (
    SessionTable,
    end_frame,
    session_claim,
    sign,
)
from protos import murmur_pb2_grpc

__all__ = ["REASON_KEY", "Servicer", "Undecodable", "add_servicer", "lenient", "status_code"]

log = logging.getLogger(__name__)

M = TypeVar("M")
D = TypeVar("D")

REASON_KEY = "murmur-reason"
SERVICE = "murmur.v1.Murmur"


def status_code(reason: Reason) -> grpc.StatusCode:
    if reason in INVALID_ARGUMENT_REASONS:
        return grpc.StatusCode.INVALID_ARGUMENT
    if reason in (Reason.SHUTTING_DOWN, Reason.NOT_READY):
        return grpc.StatusCode.UNAVAILABLE
    if reason in (Reason.IDENTITY, Reason.REVOKED, Reason.CERTIFICATE):
        return grpc.StatusCode.PERMISSION_DENIED
    if reason is Reason.RATE_LIMITED:
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.FAILED_PRECONDITION


class Servicer(murmur_pb2_grpc.MurmurServicer):
    """Judges the caller, decodes, calls the handler, encodes; maps :class:`Rejected` to a
    status. Every method takes its requests as a stream, so that the caller is judged before
    any message of its call is read."""

    def __init__(
        self,
        handler: Handler,
        cfg: GrpcTransportConfig,
        screen: Callable[[], RecordScreen | None],
        sessions: SessionTable | None = None,
    ) -> None:
        self.handler = handler
        #: Dial-out sessions held from nodes that others cannot dial (node/transport/session.py).
        self.sessions = sessions if sessions is not None else SessionTable()
        self.cfg = cfg
        self.certs = NodeCertificates(cfg.tls.ca_pem) if cfg.tls is not None else None
        #: What this member checks of the calls it passes on as a relay.
        self.relay_checks = ForwardChecks(cfg.tls, self.certs)
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
        if context.done():
            # The call is over (the caller left, or the server is stopping): there is no one to
            # tell, and gRPC would log a failed status send as a servicer error.
            raise asyncio.CancelledError
        try:
            await context.abort(
                status_code(err.reason),
                f"{err.reason}: {err.detail}",
                trailing_metadata=((REASON_KEY, str(err.reason)),),
            )
        except grpc.aio.AbortError:
            raise  # how abort ends the call
        except Exception as failed:
            # It ended between the check and the abort (gRPC's private ExecuteBatchError: the
            # status could not be sent). A cancellation is what it is, and gRPC logs it quietly.
            raise asyncio.CancelledError from failed

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

    async def Control(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.ControlReply:
        try:
            with self._slot(context) as caller:
                raw = await self._first(requests, "ControlRequest")
                if isinstance(raw, Undecodable) or raw.action >= len(CONTROL_ACTIONS):
                    raise self._refusal(Reason.MALFORMED, "not a ControlRequest")
                paused, reason = await self.handler.rpc_control(
                    CONTROL_ACTIONS[raw.action], self._control_caller(caller, context)
                )
                return wire.pb.ControlReply(paused=paused, reason=reason)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    def _control_caller(
        self, caller: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ControlCaller:
        peer = str(context.peer())
        local = peer.startswith(("ipv4:127.", "ipv6:[::1]", "unix:"))
        if self.certs is None:
            return ControlCaller(tls=False, local=local)
        pems = list(context.auth_context().get("x509_pem_cert") or [])
        admin = bool(pems) and self.certs.is_admin(pems[0])
        return ControlCaller(tls=True, node_id=caller, admin=admin, local=local)

    async def PullModel(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[wire.pb.ModelChunk]:
        try:
            with self._slot(context, model=True) as caller:
                raw = await self._first(requests, "PullModelRequest")
                request = self._decode(lambda r: r, raw, caller)
                if request.have and len(request.have) != DIGEST_BYTES:
                    raise self._refusal(
                        Reason.MALFORMED, "a pull's model digest is not a SHA-256 digest"
                    )
                chunks = self.handler.rpc_pull_model(
                    request.protocol_version, request.requester, request.have
                )
                async for chunk in chunks:
                    yield wire.model_chunk_to_pb(chunk)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def Session(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """A node that others cannot dial opened a session: prove who we are, then carry our
        calls to it (written by the transport, see TunnelStub) until either side ends it."""
        try:
            caller = self._caller(context)
            self._membership_call(caller)
            opening = await context.read()
            if opening is grpc.aio.EOF or isinstance(opening, Undecodable):
                raise self._refusal(Reason.MALFORMED, "a session opens with its address")
            address = self._decode(
                lambda f: wire.address(f.address, "session address"), opening, caller
            )
            # Without TLS the caller is its connection, which names no node.
            if self.certs is not None:
                cert = bytes(next(iter(context.auth_context()["x509_pem_cert"])))
                peer = self.sessions.open(address, caller, cert)
            else:
                peer = self.sessions.open(address, "")
            if peer is None:
                raise self._refusal(
                    Reason.BAD_ADDRESS, f"another node holds a session for {address}"
                )
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err
        tls = self.cfg.tls
        answer = wire.pb.SessionFrame()
        if tls is not None:
            answer.certificate = tls.cert_pem
            answer.signature = sign(tls.key_pem, session_claim(bytes(opening.nonce)))
        await context.write(answer)
        log.info("session from %s at %s is up", caller[:8], address)

        async def read() -> None:
            while (frame := await context.read()) is not grpc.aio.EOF:
                if isinstance(frame, Undecodable):
                    break
                peer.deliver(frame)

        reading = asyncio.ensure_future(read())
        writing: asyncio.Task[Any] | None = None
        try:
            while True:
                writing = asyncio.ensure_future(peer.out.get())
                done, _ = await asyncio.wait({reading, writing}, return_when="FIRST_COMPLETED")
                if reading in done:
                    break
                frame = writing.result()
                if frame is None:
                    break
                await context.write(frame)
        finally:
            self.sessions.closed(peer)
            for task in (reading, writing):
                if task is not None:
                    task.cancel()
            log.info("session from %s at %s closed", caller[:8], address)

    async def Forward(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.SessionFrame:
        """A membership call (or a probe) for a node that holds a session to us, checked and
        passed down it as it came (node/transport/forwarding.py: the node checks it again);
        its answer, signed by the node, comes back as it is."""
        try:
            with self._slot(context) as caller:
                self._membership_call(caller)
                raw = await self._first(requests, "ForwardRequest")
                request = self._decode(lambda r: r, raw, caller)
                if request.call.method not in FORWARDED_METHODS:
                    raise self._refusal(
                        Reason.MALFORMED, f"{request.call.method!r} is not passed on"
                    )
                peer = self.sessions.get(request.to)
                if peer is None:
                    return end_frame(
                        0, grpc.StatusCode.UNAVAILABLE, f"no session from {request.to} here"
                    )
                verdict = self.relay_checks.check(
                    request.call, request.to, holder=(peer.node_id, peer.cert)
                )
                if verdict.refusal is not None:
                    raise self._refusal(*verdict.refusal)
                try:
                    answer = await peer.unary(
                        request.call.method, request.call, self.cfg.forward_timeout_s
                    )
                except grpc.aio.AioRpcError as err:
                    reason = dict(err.trailing_metadata() or ()).get(REASON_KEY, "")
                    return end_frame(0, err.code(), err.details() or "", str(reason))
                finally:
                    self.sessions.forwarded_bytes += request.ByteSize()
                self.sessions.forwarded_bytes += answer.ByteSize()
                return answer
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


def lenient(message: type[Any]) -> Callable[[bytes], Any]:
    """A deserializer that hands bytes that do not parse on as :class:`Undecodable`, so the
    servicer refuses them like any malformed message (counted, INVALID_ARGUMENT) instead of
    gRPC failing the call as UNKNOWN before the node ever sees it."""

    def parse(raw: bytes) -> Any:
        try:
            return message.FromString(raw)
        except DecodeError:
            return Undecodable(message.__name__, len(raw))

    return parse


def add_servicer(servicer: Servicer, server: grpc.aio.Server) -> None:
    """As the generated ``add_MurmurServicer_to_server``, with lenient deserializers."""
    pb = wire.pb

    def handler(kind: Callable[..., Any], method: Any, request: Any, response: Any) -> Any:
        return kind(
            method,
            request_deserializer=lenient(request),
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
        "Session": handler(
            grpc.stream_stream_rpc_method_handler,
            servicer.Session,
            pb.SessionFrame,
            pb.SessionFrame,
        ),
        "Forward": handler(unary_in, servicer.Forward, pb.ForwardRequest, pb.SessionFrame),
        "Control": handler(unary_in, servicer.Control, pb.ControlRequest, pb.ControlReply),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
