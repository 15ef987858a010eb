"""The gRPC transport: a grpc.aio server for the node's handler, and the calls to peers.

Refusals travel as a gRPC status (INVALID_ARGUMENT when the message itself is wrong,
FAILED_PRECONDITION when it does not fit the receiver's state) with the reason in the trailing
metadata key ``murmur-reason``, so the caller gets back the same :class:`Rejected`. The server
side, which judges every caller before it reads its message, is node/transport/grpc_server.py.

This module holds the transport and its calls: to a peer's address, down a session it holds to
this node, or through the relays of a member nobody can dial. The channels the calls go on
(lanes, bounds, TLS credentials) are node/transport/grpc_channels.py; how a failed call reads as
:class:`Rejected` or :class:`Unreachable` is node/transport/grpc_errors.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from gossip.clock import Clock
from gossip.messages import PROTOCOL_VERSION, Delta, Hello, ModelChunk, SnapshotHeader
from gossip.relays import relay_order
from gossip.swim import SwimMessage
from node.runtime import SystemClock
from node.security.penalties import Penalties
from node.security.pki import CertificateRefused, node_id_of_cert
from node.security.signing import RecordScreen
from node.telemetry.status import NodeStatus
from node.transport import wire
from node.transport.base import (
    CONTROL_ACTIONS,
    UNDIALLABLE_DOMAIN,
    Handler,
    Rejected,
    Route,
    Unreachable,
    snapshot_chunks,
)
from node.transport.forwarding import PROBE, ForwardChecks, Forwarder
from node.transport.grpc_channels import ChannelPool, Lane
from node.transport.grpc_config import GrpcTransportConfig
from node.transport.grpc_errors import error_of, map_error
from node.transport.grpc_server import REASON_KEY, Servicer, add_servicer, lenient
from node.transport.session import SessionTable, TunnelStub
from node.transport.session_serve import serve_session

if TYPE_CHECKING:
    import torch

__all__ = ["GrpcTransport", "GrpcTransportConfig"]

log = logging.getLogger(__name__)


class GrpcDeltaStream:
    """A StreamDeltas call: deltas written, acknowledgements read, in order."""

    def __init__(self, address: str, call: Any) -> None:
        self.address = address
        self._call = call

    async def _failure(self) -> Rejected | Unreachable:
        call = self._call
        return error_of(
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
            raise map_error(self.address, err) from None
        if ack is grpc.aio.EOF:
            raise await self._failure()
        return int(ack.replica_seq)

    def cancel(self) -> None:
        self._call.cancel()


class GrpcTransport:
    """gRPC with mutual TLS (``cfg.tls``), or over plain TCP without it. ``clock`` times the
    expiry of idle channels (the monotonic clock unless a test gives one)."""

    def __init__(self, cfg: GrpcTransportConfig | None = None, clock: Clock | None = None) -> None:
        self.cfg = cfg or GrpcTransportConfig()
        self._clock: Clock = clock or SystemClock()
        self._server: grpc.aio.Server | None = None
        self._servicer: Servicer | None = None
        self._node_checks: ForwardChecks | None = None
        self._channels = ChannelPool(self.cfg, self._clock)
        #: Checks member records before the handler sees them (set by the node; see
        #: :class:`node.security.signing.RecordScreen`); None hands them on as they came.
        self.screen: RecordScreen | None = None
        #: Dial-out sessions that nodes others cannot dial hold to this one: calls to their
        #: addresses go down them (node/transport/session.py).
        self.sessions = SessionTable()
        #: Addresses of members that nobody can dial -> the relays their records name (set by
        #: the node from its view): membership calls to them go through a relay.
        self.routes: dict[str, Route] = {}
        #: Signs and numbers the calls this node has relays pass on (node/transport/forwarding.py).
        self.forwarder = Forwarder(self.cfg.tls)
        #: The relay that last passed a call on for each such address: tried first next time.
        self._last_relay: dict[str, str] = {}
        self._relay_salt = os.urandom(16)  # this node's own order of every node's relays

    @property
    def penalties(self) -> Penalties | None:
        """The bans of callers by certified id, once serving."""
        return self._servicer.penalties if self._servicer is not None else None

    def open_calls(self, caller: str) -> int:
        """Calls open now from ``caller`` (its certified id under TLS)."""
        if self._servicer is None:
            return 0
        return self._servicer.admission.open_calls.get(caller, 0)

    def channel_count(self) -> int:
        return len(self._channels)

    async def serve(self, handler: Handler, listen: str) -> str:
        server = grpc.aio.server(
            options=self.cfg.server_options(),
            maximum_concurrent_rpcs=self.cfg.max_concurrent_rpcs,
        )
        tls = self.cfg.tls
        servicer = Servicer(handler, self.cfg, lambda: self.screen, self.sessions)
        add_servicer(servicer, server)
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
        self._servicer = servicer
        #: What this node checks of the calls its relays pass down its sessions.
        self._node_checks = ForwardChecks(self.cfg.tls, servicer.certs)
        if tls is None:
            log.warning(
                "serving on %s:%d over plain TCP (--insecure): no encryption, no authentication "
                "of peers; use it on trusted networks only",
                host,
                port,
            )
        return f"{host}:{port}"

    def _stub(self, address: str, lane: Lane = "bulk") -> Any:
        """The stub for ``address`` on one of two connections: ``bulk`` carries models (deltas,
        snapshots, pulls), ``control`` the small, deadline-bound calls (membership pings, hellos,
        status). On a slow link a ping on the bulk connection would wait behind megabytes of
        model in its socket buffer and time out: a false suspicion.

        A peer that holds a session to this node is reached down it; any other on a channel of
        the lane, which are bounded and expire (node/transport/grpc_channels.py)."""
        peer = self.sessions.get(address)
        if peer is not None:  # it opened a session to us: the one way to reach it
            return TunnelStub(peer)
        if address.rpartition(":")[0].endswith(UNDIALLABLE_DOMAIN):
            # A node nobody can dial, without a session to us: a dial would only wait for its
            # deadline on a name that never resolves.
            raise Unreachable(f"{address} cannot be dialled: it holds no session to this node")
        return self._channels.stub(address, lane)

    async def call_hello(self, address: str, hello: Hello, timeout_s: float) -> Hello:
        try:
            stub = self._stub(address, "control")
            reply = await stub.Hello(wire.hello_to_pb(hello), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
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
            raise map_error(address, err) from None
        return int(ack.replica_seq)

    async def open_delta_stream(self, address: str) -> GrpcDeltaStream:
        return GrpcDeltaStream(address, self._stub(address).StreamDeltas())

    async def call_push_snapshot(
        self, address: str, header: SnapshotHeader, values: torch.Tensor, timeout_s: float
    ) -> int:
        async def requests() -> AsyncIterator[wire.pb.SnapshotChunk]:
            for chunk in snapshot_chunks(header, values):
                yield wire.snapshot_chunk_to_pb(header, chunk)

        try:
            ack = await self._stub(address).PushSnapshot(requests(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
        return int(ack.replica_seq)

    async def call_status(self, address: str, timeout_s: float) -> NodeStatus:
        try:
            stub = self._stub(address, "control")
            reply = await stub.Status(wire.pb.StatusRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
        return wire.status_from_pb(reply)

    async def call_control(self, address: str, action: str, timeout_s: float) -> tuple[bool, str]:
        """Pause, resume or query the node at ``address`` (``murmur ctl``): whether it is
        paused now, and why."""
        if action not in CONTROL_ACTIONS:
            raise ValueError(f"{action!r} is not one of {', '.join(CONTROL_ACTIONS)}")
        request = wire.pb.ControlRequest(action=action.upper())  # the enum's names
        try:
            reply = await self._stub(address, "control").Control(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
        return bool(reply.paused), str(reply.reason)

    async def call_swim(self, address: str, message: SwimMessage, timeout_s: float) -> str:
        request = wire.swim_to_pb(message, PROTOCOL_VERSION)
        route = self.routes.get(address)
        if route is not None and route.relays and self.sessions.get(address) is None:
            return await self._forward_swim(address, route, request, timeout_s)
        try:
            reply = await self._stub(address, "control").Swim(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
        return str(reply.node_id)

    async def _forward_swim(
        self, address: str, route: Route, request: Any, timeout_s: float
    ) -> str:
        """A membership call for a member nobody can dial, through the first of its relays
        that passes it on and brings back the member's own answer (the one that did last time
        first, then in this node's own order: ``relay_order``); each try signed and numbered
        afresh, so that no relay can alter or replay it."""
        message = request.SerializeToString()
        last = self._last_relay.get(address)
        order = relay_order(route.relays, address, last, self._relay_salt)
        failure: Rejected | Unreachable = Unreachable(f"{address}: no relay answered")
        for relay in order:
            try:
                answer = await self._forwarded(relay, address, "Swim", message, timeout_s)
            except (Rejected, Unreachable) as err:
                failure = err
                continue
            reply = wire.pb.SwimReply.FromString(answer.message)
            if self._certified(bytes(answer.origin_certificate), reply.node_id) != route.node_id:
                failure = Unreachable(f"{relay}: the answer for {address} is not its node's")
                continue
            self._last_relay[address] = relay
            return str(reply.node_id)
        raise failure

    def _certified(self, cert: bytes, claimed: str) -> str | None:
        """The id of the node whose certificate ``cert`` signed an answer (a node certificate
        of this swarm); None when it is none. Without TLS nothing is signed: ``claimed``."""
        if self.cfg.tls is None:
            return claimed
        try:
            if self._servicer is not None and self._servicer.certs is not None:
                return self._servicer.certs.node_id(cert)
            return node_id_of_cert(cert)
        except (CertificateRefused, ValueError):
            return None

    async def probe_relay(self, relay: str, own_address: str, timeout_s: float) -> None:
        """A probe from this node to itself through ``relay``, which holds its session: it must
        come back within ``timeout_s``, as sent, and signed by this node.

        Raises:
            Unreachable: it did not come back in time, or came back other than it went.
            Rejected: the relay refused it.
        """
        nonce = os.urandom(16)
        answer = await self._forwarded(relay, own_address, PROBE, nonce, timeout_s)
        if bytes(answer.message) != nonce:  # and it is signed by this node (_forwarded)
            raise Unreachable(f"{relay}: the probe came back other than it went")

    async def _forwarded(
        self, relay: str, to: str, method: str, message: bytes, timeout_s: float
    ) -> Any:
        """One forwarded call through ``relay``: its answer, checked to be the one signed for
        it by the node it was for (the caller checks whose signature it is)."""
        frame = self.forwarder.frame(to, relay, method, message)
        forward = wire.pb.ForwardRequest(to=to, call=frame)
        try:
            answer = await self._stub(relay, "control").Forward(forward, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise map_error(relay, err) from None
        if not answer.has_message:
            metadata = ((REASON_KEY, answer.reason),) if answer.reason else ()
            code = next((c for c in grpc.StatusCode if c.value[0] == answer.code), None)
            raise error_of(to, code or grpc.StatusCode.UNKNOWN, answer.details, metadata)
        if self.forwarder.answer_signer(to, relay, frame, answer) is None:
            raise Unreachable(f"{relay}: the answer from {to} is not signed for this call")
        return answer

    def holds_session(self, address: str, node_id: str) -> bool:
        return self.sessions.held_by(address, node_id)

    def set_routes(self, routes: Mapping[str, Route]) -> None:
        self.routes = dict(routes)
        self._last_relay = {
            a: r for a, r in self._last_relay.items() if a in routes and r in routes[a].relays
        }

    def session_figures(self) -> tuple[int, int]:
        return len(self.sessions), self.sessions.forwarded_bytes

    async def hold_session(
        self,
        address: str,
        own_address: str,
        on_up: Callable[[str], None] | None = None,
        on_fault: Callable[[str, str], None] | None = None,
    ) -> None:
        """Open a dial-out session to the member at ``address`` and serve the calls it sends
        down it, until it ends. ``own_address`` is the address others know this node by;
        ``on_fault`` hears of each call the member passed on altered or replayed.

        Raises:
            Unreachable: the session could not open, or it ended.
            Rejected: the member refused it.
        """
        if self._servicer is None or self._node_checks is None:
            raise RuntimeError("serve() first: the session's calls are served as any other")
        call = self._stub(address, "session").Session()
        try:
            await serve_session(
                call,
                self._servicer,
                own_address,
                certs=self._servicer.certs,
                member=address,
                lenient=lenient,
                checks=self._node_checks,
                on_up=on_up,
                on_fault=on_fault,
            )
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
        except PermissionError as err:
            raise Unreachable(str(err)) from None
        finally:
            call.cancel()

    async def call_pull_model(
        self, address: str, requester: str, timeout_s: float, have: bytes = b""
    ) -> AsyncIterator[ModelChunk]:
        request = wire.pb.PullModelRequest(
            protocol_version=PROTOCOL_VERSION, requester=requester, have=have
        )
        call = self._stub(address).PullModel(request, timeout=timeout_s)
        try:
            async for chunk in call:
                yield wire.model_chunk_from_pb(chunk)
        except grpc.aio.AioRpcError as err:
            raise map_error(address, err) from None
        finally:
            call.cancel()

    async def close(self, grace_s: float) -> None:
        # Stop serving first so no new inbound work starts while channels go away.
        self.sessions.close_all()
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        await self._channels.close()
        if self.screen is not None:
            await asyncio.to_thread(self.screen.close)
