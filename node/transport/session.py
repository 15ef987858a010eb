"""Dial-out sessions: how a node that nobody can dial (behind NAT, a firewall) takes full part.

The node behind NAT opens one long-lived ``Session`` call to a member that others can dial. Its
own calls to that member go out as any call does; the member's calls to it travel down the
session as frames (``SessionFrame``: one call's frames share an id), so that one connection,
opened by the node behind NAT, carries everything between the two, both ways.

* At the member (:class:`SessionTable`, :class:`TunnelStub`): a call to the address of a node
  that holds a session to it is written down that session instead of dialled. The stub has the
  generated stub's methods and raises ``grpc.aio.AioRpcError`` as a real call does, so the
  transport above maps its refusals the same way.
* At the node behind NAT (``serve_session``, node/transport/session_serve.py): each call that
  comes down the session is run by the same :class:`~node.transport.grpc_server.Servicer` as a
  call over a socket, with a context that names the caller by the certificate the member proved
  at the opening (it signs the node's nonce), so every call is judged as any other.
* A member that holds no session to such a node reaches it through one of its relays (the members
  its record names): ``Forward`` carries one membership call, signed and numbered by the member
  that made it, so the relay can neither forge, alter nor replay it (node/transport/forwarding.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from node.security.signing import signature_holds
from node.transport import wire

__all__ = [
    "METHODS",
    "SessionTable",
    "TunnelPeer",
    "TunnelStub",
    "closed_error",
    "end_frame",
    "session_claim",
    "sign",
    "signed_by",
]

log = logging.getLogger(__name__)

_ECDSA = ec.ECDSA(hashes.SHA256())
REASON_KEY = "murmur-reason"  # as node/transport/grpc_server.py's

pb = wire.pb

#: Method -> (request type, response type, whether the response is a stream).
METHODS: dict[str, tuple[type[Any], type[Any], bool]] = {
    "Hello": (pb.Hello, pb.Hello, False),
    "PushDelta": (pb.Delta, pb.DeltaAck, False),
    "StreamDeltas": (pb.Delta, pb.DeltaAck, True),
    "PushSnapshot": (pb.SnapshotChunk, pb.SnapshotAck, False),
    "Status": (pb.StatusRequest, pb.NodeStatus, False),
    "Swim": (pb.SwimMessage, pb.SwimReply, False),
    "PullModel": (pb.PullModelRequest, pb.ModelChunk, True),
}


def session_claim(nonce: bytes) -> bytes:
    """What the member signs at a session's opening: the node's fresh nonce."""
    return b"murmur-session|" + nonce


def sign(key_pem: bytes, data: bytes) -> bytes:
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key.sign(data, _ECDSA)


def signed_by(cert_pem: bytes, data: bytes, signature: bytes) -> bool:
    """Whether ``signature`` over ``data`` holds for the key of ``cert_pem``."""
    try:
        key = x509.load_pem_x509_certificate(cert_pem).public_key()
    except ValueError:
        return False
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return signature_holds(der, data, signature)


def _rpc_error(code: int, details: str, reason: str) -> grpc.aio.AioRpcError:
    status = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    trailing = grpc.aio.Metadata((REASON_KEY, reason)) if reason else grpc.aio.Metadata()
    return grpc.aio.AioRpcError(status, grpc.aio.Metadata(), trailing, details)


def closed_error(address: str) -> grpc.aio.AioRpcError:
    return _rpc_error(
        grpc.StatusCode.UNAVAILABLE.value[0], f"the session with {address} closed", ""
    )


def end_frame(
    call: int, code: grpc.StatusCode, details: str = "", reason: str = ""
) -> wire.pb.SessionFrame:
    return pb.SessionFrame(call=call, end=True, code=code.value[0], details=details, reason=reason)


# -- at the member: calls down a session ----------------------------------------------------


class _Call:
    """One call's frames from the node behind NAT: its messages, then its end."""

    def __init__(self) -> None:
        self.frames: asyncio.Queue[Any] = asyncio.Queue()


class TunnelPeer:
    """The member's end of one session: calls written as frames, answers read back by id."""

    def __init__(self, address: str, node_id: str, cert: bytes = b"") -> None:
        self.address = address
        self.node_id = node_id
        #: The certificate the node that holds the session showed (empty without TLS).
        self.cert = cert
        self.out: asyncio.Queue[Any] = asyncio.Queue()
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        self.closed = False

    def start(self) -> tuple[int, _Call]:
        if self.closed:
            raise closed_error(self.address)
        call_id = next(self._ids)
        call = self._calls[call_id] = _Call()
        return call_id, call

    def send(self, frame: Any) -> None:
        if self.closed:
            raise closed_error(self.address)
        self.out.put_nowait(frame)

    def finish(self, call_id: int) -> None:
        self._calls.pop(call_id, None)

    def deliver(self, frame: Any) -> None:
        """A frame from the node: to the call it belongs to (a late one is dropped)."""
        call = self._calls.get(frame.call)
        if call is not None:
            call.frames.put_nowait(frame)

    def close(self) -> None:
        """The session ended: every open call ends unavailable."""
        self.closed = True
        for call in self._calls.values():
            call.frames.put_nowait(None)
        self._calls.clear()
        self.out.put_nowait(None)

    async def unary(
        self,
        method: str,
        request: Any,
        timeout_s: float | None,
    ) -> wire.pb.SessionFrame:
        """One request, one answer: the answer's frame (or the error it ended with).
        ``request``: a message, or a forwarded call's frame as its maker made it."""
        call_id, call = self.start()
        try:
            if isinstance(request, pb.SessionFrame):
                frame = pb.SessionFrame()
                frame.CopyFrom(request)
                frame.call, frame.has_message, frame.end = call_id, True, True
            else:
                frame = pb.SessionFrame(
                    call=call_id,
                    method=method,
                    message=request.SerializeToString(),
                    has_message=True,
                    end=True,
                )
            self.send(frame)
            try:
                answer = await asyncio.wait_for(_next(call, self.address), timeout_s)
            except TimeoutError:
                self._cancel(call_id)
                raise _rpc_error(
                    grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "Deadline Exceeded", ""
                ) from None
            if answer.has_message:
                return answer  # type: ignore[no-any-return]
            raise _rpc_error(answer.code, answer.details, answer.reason)
        finally:
            self.finish(call_id)

    def _cancel(self, call_id: int) -> None:
        if not self.closed:
            self.out.put_nowait(end_frame(call_id, grpc.StatusCode.CANCELLED))


async def _next(call: _Call, address: str) -> Any:
    frame = await call.frames.get()
    if frame is None:
        raise closed_error(address)
    return frame


class _StreamCall:
    """A stream-stream call down a session (StreamDeltas), as the generated stub's."""

    def __init__(self, peer: TunnelPeer, method: str, response: type[Any]) -> None:
        self._peer = peer
        self._method = method
        self._response = response
        self._id, self._call = peer.start()
        self._first = True
        self._status: tuple[int, str, str] | None = None

    async def write(self, message: Any) -> None:
        if self._status is not None:
            raise asyncio.InvalidStateError("the call is over")
        frame = pb.SessionFrame(
            call=self._id, message=message.SerializeToString(), has_message=True
        )
        if self._first:
            frame.method, self._first = self._method, False
        self._peer.send(frame)

    async def read(self) -> Any:
        if self._status is not None:
            return grpc.aio.EOF
        try:
            frame = await _next(self._call, self._peer.address)
        except grpc.aio.AioRpcError as err:
            self._status = (err.code().value[0], err.details() or "", "")
            raise
        if frame.has_message:
            if frame.end:  # a one-message answer: the call is over, and it went well
                self._status = (grpc.StatusCode.OK.value[0], "", "")
                self._peer.finish(self._id)
            return self._response.FromString(frame.message)
        self._status = (frame.code, frame.details, frame.reason)
        self._peer.finish(self._id)
        if frame.code != grpc.StatusCode.OK.value[0]:
            raise _rpc_error(*self._status)
        return grpc.aio.EOF

    def cancel(self) -> None:
        if self._status is None:
            self._status = (grpc.StatusCode.CANCELLED.value[0], "cancelled", "")
            self._peer._cancel(self._id)
            self._peer.finish(self._id)

    async def code(self) -> grpc.StatusCode:
        return _rpc_error(*(self._status or (2, "", ""))).code()

    async def details(self) -> str:
        return (self._status or (2, "", ""))[1]

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        reason = (self._status or (2, "", ""))[2]
        return grpc.aio.Metadata((REASON_KEY, reason)) if reason else grpc.aio.Metadata()


class TunnelStub:
    """The generated stub's methods, for a node reached down its session."""

    def __init__(self, peer: TunnelPeer) -> None:
        self._peer = peer

    def _unary(self, method: str) -> Callable[..., Any]:
        response = METHODS[method][1]

        async def call(request: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
            frame = await self._peer.unary(method, request, timeout)
            return response.FromString(frame.message)

        return call

    def __getattr__(self, method: str) -> Any:
        if method in ("Hello", "PushDelta", "Status", "Swim"):
            return self._unary(method)
        raise AttributeError(method)

    def StreamDeltas(self) -> _StreamCall:  # noqa: N802 (the generated stub's names)
        return _StreamCall(self._peer, "StreamDeltas", pb.DeltaAck)

    async def PushSnapshot(  # noqa: N802
        self,
        requests: AsyncIterator[Any],
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        call = _StreamCall(self._peer, "PushSnapshot", pb.SnapshotAck)

        async def run() -> Any:
            async for chunk in requests:
                await call.write(chunk)
            self._peer.send(pb.SessionFrame(call=call._id, end=True))
            ack = await call.read()
            if ack is grpc.aio.EOF:
                raise _rpc_error(grpc.StatusCode.INTERNAL.value[0], "no snapshot ack", "")
            await call.read()  # the end, with its status
            return ack

        try:
            return await asyncio.wait_for(run(), timeout)
        except TimeoutError:
            call.cancel()
            raise _rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "Deadline Exceeded", ""
            ) from None
        except BaseException:
            call.cancel()
            raise

    def PullModel(self, request: Any, timeout: float | None = None) -> _PullCall:  # noqa: N802
        return _PullCall(self._peer, request)


class _PullCall:
    def __init__(self, peer: TunnelPeer, request: Any) -> None:
        self._call = _StreamCall(peer, "PullModel", pb.ModelChunk)
        self._request = request
        self._peer = peer

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Any]:
        await self._call.write(self._request)
        self._peer.send(pb.SessionFrame(call=self._call._id, end=True))
        while (chunk := await self._call.read()) is not grpc.aio.EOF:
            yield chunk

    def cancel(self) -> None:
        self._call.cancel()


class SessionTable:
    """The sessions this member holds, by the address of the node that opened each."""

    def __init__(self) -> None:
        self._peers: dict[str, TunnelPeer] = {}
        #: Bytes of forwarded calls (for other members) this member passed on, both ways.
        self.forwarded_bytes = 0

    def open(self, address: str, node_id: str, cert: bytes = b"") -> TunnelPeer | None:
        """A new session from ``node_id`` (its certificate ``cert``) at ``address``; None when
        another node holds one for that address (a second one from the same node replaces the
        first)."""
        held = self._peers.get(address)
        if held is not None and not held.closed:
            if held.node_id != node_id:
                return None
            held.close()
        peer = self._peers[address] = TunnelPeer(address, node_id, cert)
        return peer

    def closed(self, peer: TunnelPeer) -> None:
        peer.close()
        if self._peers.get(peer.address) is peer:
            del self._peers[peer.address]

    def get(self, address: str) -> TunnelPeer | None:
        peer = self._peers.get(address)
        return peer if peer is not None and not peer.closed else None

    def held_by(self, address: str, node_id: str) -> bool:
        """Whether ``node_id`` holds the session for ``address`` (without TLS nothing names a
        caller, so whoever holds it)."""
        peer = self.get(address)
        return peer is not None and peer.node_id in (node_id, "")

    def __len__(self) -> int:
        return sum(not p.closed for p in self._peers.values())

    def close_all(self) -> None:
        for peer in list(self._peers.values()):
            peer.close()
        self._peers.clear()
