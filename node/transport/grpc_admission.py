"""Who may call the gRPC server, and what its messages must pass before the node sees them; and
how the servicer is added to a server so that this comes first. The servicer that asks
(node/transport/grpc_server.py) decodes, calls the node's handler and encodes.

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from gossip.swim import MemberRecord
from node.runtime import SystemClock
from node.security.penalties import LogLimiter, Penalties, RateConfig, RateLimiter, held_back
from node.security.pki import CertificateRefused, NodeCertificates
from node.security.signing import RecordScreen
from node.transport import wire
from node.transport.base import ControlCaller, Handler, Reason, Rejected
from node.transport.grpc_config import GrpcTransportConfig

if TYPE_CHECKING:
    from protos.murmur_pb2_grpc import MurmurServicer

__all__ = ["Admission", "Undecodable", "add_servicer", "lenient"]

log = logging.getLogger(__name__)

M = TypeVar("M")
D = TypeVar("D")

SERVICE = "murmur.v1.Murmur"


class Admission:
    """Judges each caller of the server by its certified id (revoked, banned, too many calls
    open, membership messages too fast, speaking for another node) and what it sent
    (undecodable, unadmitted member records); owns the bans and the open calls of every
    caller. A refusal is counted with the handler before it is raised."""

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
        #: Calls open now, by caller (and by ``"<caller> model"`` for calls that carry a model).
        self.open_calls: Counter[str] = Counter()
        self._held: Counter[str] = Counter()
        self._membership_rate = RateLimiter(
            RateConfig(rate=cfg.membership_rate, burst=cfg.membership_burst), clock
        )
        self._log = LogLimiter(clock)

    # -- who calls ----------------------------------------------------------------------------

    def refusal(self, reason: Reason, detail: str) -> Rejected:
        self.handler.note_rejected(reason, detail)
        return Rejected(reason, detail)

    def _shut_out(self, caller: str, reason: Reason, detail: str) -> Rejected:
        self.handler.note_rejected(reason, detail)
        return _ShutOut(caller, reason, detail)

    def caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The certified node id of the caller under TLS (refused if its certificate is unfit,
        it is revoked, or banned); without TLS, its connection, since nothing names it."""
        if self.certs is None:
            return str(context.peer())
        pems = list(context.auth_context().get("x509_pem_cert") or [])
        if not pems:
            raise self.refusal(Reason.IDENTITY, "the call came without a certificate")
        try:
            caller = self.certs.node_id(pems[0])
        except CertificateRefused as err:
            raise self.refusal(Reason.CERTIFICATE, f"your certificate is refused: {err}") from None
        if self.handler.is_revoked(caller):
            detail = f"node {caller[:8]} is revoked in this swarm"
            raise self._shut_out(caller, Reason.REVOKED, detail)
        ban_left_s = self.penalties.ban_left_s(caller)
        if ban_left_s > 0:
            detail = f"{caller[:8]} sent too many bad messages; refused for {ban_left_s:.0f} s more"
            raise self._shut_out(caller, Reason.BANNED, detail)
        return caller

    @contextlib.contextmanager
    def slot(
        self, context: grpc.aio.ServicerContext[Any, Any], model: bool = False
    ) -> Iterator[str]:
        """Hold one of the caller's ``calls_per_peer`` slots (and, for a call that carries a
        model, one of its ``model_calls_per_peer``) for the length of a call."""
        caller = self.caller(context)
        keys = [caller, f"{caller} model"] if model else [caller]
        limits = [self.cfg.calls_per_peer, self.cfg.model_calls_per_peer]
        for key, limit in zip(keys, limits, strict=False):
            if self.open_calls[key] >= limit:
                raise self.refusal(
                    Reason.RATE_LIMITED, f"more than {limit} calls open at once from {caller[:8]}"
                )
        for key in keys:
            self.open_calls[key] += 1
        try:
            yield caller
        finally:
            for key in keys:
                self.open_calls[key] -= 1
                if not self.open_calls[key]:
                    del self.open_calls[key]

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

    def membership_call(self, caller: str) -> None:
        """Under TLS, a caller's membership messages and hellos keep to ``membership_rate``."""
        if self.certs is not None and not self._membership_rate.allow(caller):
            raise self._shut_out(
                caller,
                Reason.RATE_LIMITED,
                f"{caller[:8]} sends membership messages faster than its rate limit",
            )

    def check_claim(self, caller: str, claimed: str) -> None:
        """Under TLS a message may only speak for the node whose certificate sent it."""
        if self.certs is not None and claimed != caller:
            err = self.refusal(
                Reason.IDENTITY,
                f"the message speaks for {claimed[:8]}, the certificate is {caller[:8]}",
            )
            self._penalise(caller, err.reason)
            raise err

    def control_caller(
        self, caller: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ControlCaller:
        """Who asks to pause or resume the node: local or not, and under TLS, which node and
        whether its certificate is an admin's."""
        peer = str(context.peer())
        local = peer.startswith(("ipv4:127.", "ipv6:[::1]", "unix:"))
        if self.certs is None:
            return ControlCaller(tls=False, local=local)
        pems = list(context.auth_context().get("x509_pem_cert") or [])
        admin = bool(pems) and self.certs.is_admin(pems[0])
        return ControlCaller(tls=True, node_id=caller, admin=admin, local=local)

    async def hold(self, err: Rejected) -> None:
        """Hold back the refusal of a revoked, banned or flooding caller ``refusal_hold_s``
        (up to ``held_per_peer`` of its refusals at once)."""
        if isinstance(err, _ShutOut) and self._held[err.caller] < self.cfg.held_per_peer:
            self._held[err.caller] += 1
            try:
                await asyncio.sleep(self.cfg.refusal_hold_s)
            finally:
                self._held[err.caller] -= 1
                if not self._held[err.caller]:
                    del self._held[err.caller]

    # -- what it sent -------------------------------------------------------------------------

    def decode(self, decode: Callable[[M], D], raw: M, caller: str) -> D:
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

    async def screened(
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


def add_servicer(servicer: MurmurServicer, server: grpc.aio.Server) -> None:
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
