"""The gRPC server side: every call judged by its certified caller, then decoded and handed
to the node's handler; refusals mapped to gRPC statuses (see node/transport/grpc.py).

Who may call, and what its messages must pass before the node sees them (the certified caller,
bans, open calls, rate, claims, member records), is node/transport/grpc_admission.py, with how
the servicer is added to a server (every method taken as a stream, its requests parsed
leniently) so that the caller is judged first; this module holds the servicer that asks it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio

from gossip.messages import DIGEST_BYTES
from node.security.penalties import Penalties
from node.security.pki import NodeCertificates
from node.security.signing import RecordScreen
from node.transport import wire
from node.transport.base import (
    CONTROL_ACTIONS,
    INVALID_ARGUMENT_REASONS,
    Handler,
    Reason,
    Rejected,
    SnapshotChunk,
)
from node.transport.forwarding import FORWARDED_METHODS, ForwardChecks
from node.transport.grpc_admission import Admission, Undecodable, add_servicer, lenient
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

REASON_KEY = "murmur-reason"


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
    """Has the caller judged (:class:`~node.transport.grpc_admission.Admission`), decodes,
    calls the handler, encodes; maps :class:`Rejected` to a status. Every method takes its
    requests as a stream, so that the caller is judged before any message of its call is read."""

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
        #: Who may call and what its messages must pass; owns the bans and open calls.
        self.admission = Admission(handler, cfg, screen)
        #: What this member checks of the calls it passes on as a relay.
        self.relay_checks = ForwardChecks(cfg.tls, self.certs)

    @property
    def certs(self) -> NodeCertificates | None:
        """The swarm's CA's judge of node certificates; None without TLS."""
        return self.admission.certs

    @property
    def penalties(self) -> Penalties:
        """Bans by certified id."""
        return self.admission.penalties

    async def _first(self, requests: AsyncIterator[Any], what: str) -> Any:
        try:
            return await anext(aiter(requests))
        except StopAsyncIteration:
            return Undecodable(what, 0)

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], err: Rejected) -> None:
        await self.admission.hold(err)
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
            with self.admission.slot(context) as caller:
                self.admission.membership_call(caller)
                raw = await self._first(requests, "Hello")
                hello = self.admission.decode(wire.hello_from_pb, raw, caller)
                self.admission.check_claim(caller, hello.self_.node_id)
                if not await self.admission.screened(caller, [hello.self_]):
                    raise self.admission.refusal(
                        Reason.RATE_LIMITED, "you sent more member records than this node checks"
                    )
                hello = replace(hello, members=await self.admission.screened(caller, hello.members))
                return wire.hello_to_pb(await self.handler.rpc_hello(hello))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PushDelta(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.DeltaAck:
        try:
            with self.admission.slot(context, model=True) as caller:
                raw = await self._first(requests, "Delta")
                delta = self.admission.decode(wire.delta_from_pb, raw, caller)
                self.admission.check_claim(caller, delta.sender)
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
            with self.admission.slot(context, model=True) as caller:
                async for request in request_iterator:
                    delta = self.admission.decode(wire.delta_from_pb, request, caller)
                    self.admission.check_claim(caller, delta.sender)
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
            with self.admission.slot(context, model=True) as caller:
                try:
                    first = await anext(aiter(request_iterator))
                except StopAsyncIteration:
                    raise self.admission.refusal(
                        Reason.MALFORMED, "empty snapshot stream"
                    ) from None
                header, chunk0 = self.admission.decode(wire.snapshot_chunk_from_pb, first, caller)
                self.admission.check_claim(caller, header.sender)

                async def chunks() -> AsyncIterator[SnapshotChunk]:
                    yield chunk0
                    async for raw in request_iterator:
                        h, chunk = self.admission.decode(wire.snapshot_chunk_from_pb, raw, caller)
                        if h != header:
                            raise self.admission.refusal(
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
            with self.admission.slot(context):
                return wire.status_to_pb(await self.handler.rpc_status())
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def Swim(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.SwimReply:
        try:
            with self.admission.slot(context) as caller:
                self.admission.membership_call(caller)
                raw = await self._first(requests, "SwimMessage")
                version, message = self.admission.decode(wire.swim_from_pb, raw, caller)
                self.admission.check_claim(caller, message.sender)
                message = replace(
                    message, updates=await self.admission.screened(caller, message.updates)
                )
                return wire.pb.SwimReply(node_id=await self.handler.rpc_swim(version, message))
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def Control(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> wire.pb.ControlReply:
        try:
            with self.admission.slot(context) as caller:
                raw = await self._first(requests, "ControlRequest")
                if isinstance(raw, Undecodable) or raw.action >= len(CONTROL_ACTIONS):
                    raise self.admission.refusal(Reason.MALFORMED, "not a ControlRequest")
                paused, reason = await self.handler.rpc_control(
                    CONTROL_ACTIONS[raw.action], self.admission.control_caller(caller, context)
                )
                return wire.pb.ControlReply(paused=paused, reason=reason)
        except Rejected as err:
            await self._refuse(context, err)
            raise AssertionError("abort returned") from err

    async def PullModel(  # noqa: N802
        self, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[wire.pb.ModelChunk]:
        try:
            with self.admission.slot(context, model=True) as caller:
                raw = await self._first(requests, "PullModelRequest")
                request = self.admission.decode(lambda r: r, raw, caller)
                if request.have and len(request.have) != DIGEST_BYTES:
                    raise self.admission.refusal(
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
            caller = self.admission.caller(context)
            self.admission.membership_call(caller)
            opening = await context.read()
            if opening is grpc.aio.EOF or isinstance(opening, Undecodable):
                raise self.admission.refusal(Reason.MALFORMED, "a session opens with its address")
            address = self.admission.decode(
                lambda f: wire.address(f.address, "session address"), opening, caller
            )
            # Without TLS the caller is its connection, which names no node.
            if self.certs is not None:
                cert = bytes(next(iter(context.auth_context()["x509_pem_cert"])))
                peer = self.sessions.open(address, caller, cert)
            else:
                peer = self.sessions.open(address, "")
            if peer is None:
                raise self.admission.refusal(
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
            with self.admission.slot(context) as caller:
                self.admission.membership_call(caller)
                raw = await self._first(requests, "ForwardRequest")
                request = self.admission.decode(lambda r: r, raw, caller)
                if request.call.method not in FORWARDED_METHODS:
                    raise self.admission.refusal(
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
                    raise self.admission.refusal(*verdict.refusal)
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
