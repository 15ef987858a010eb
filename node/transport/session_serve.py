"""The end of a dial-out session at the node behind NAT (node/transport/session.py has the
frames and the member's end): the calls the member sends down the session, each run by the
node's own servicer under the certificate the member proved at the opening."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio

from node.transport.forwarding import PROBE, ForwardChecks
from node.transport.grpc_server import status_code
from node.transport.session import (
    METHODS,
    REASON_KEY,
    closed_error,
    end_frame,
    pb,
    session_claim,
    signed_by,
)

__all__ = ["SessionContext", "serve_session"]

log = logging.getLogger(__name__)


class SessionContext:
    """What the servicer reads of a call's context, for a call that came down a session: the
    caller's certificate (proved at the opening, or by the forwarded call's signature)."""

    def __init__(self, peer: str, cert_pem: bytes | None) -> None:
        self._peer = peer
        self._cert = cert_pem
        self.finished = False

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self._cert]} if self._cert else {}

    def done(self) -> bool:
        return self.finished

    async def abort(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        reason = next((v for k, v in trailing_metadata if k == REASON_KEY), "")
        raise _Aborted(code, details, str(reason))


class _Aborted(grpc.aio.AbortError):
    """How a servicer's abort ends a call that came down a session."""

    def __init__(self, code: grpc.StatusCode, details: str, reason: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.reason = reason


@dataclass
class _Incoming:
    requests: asyncio.Queue[Any]
    task: asyncio.Task[None] | None = None


async def serve_session(
    call: Any,
    servicer: Any,
    address: str,
    *,
    certs: Any | None,
    member: str,
    lenient: Callable[[type[Any]], Callable[[bytes], Any]],
    checks: ForwardChecks,
    on_up: Callable[[str], None] | None = None,
    on_fault: Callable[[str, str], None] | None = None,
) -> None:
    """Run one session that this node opened (``call``: the ``Session`` call) until it ends:
    prove who the member is, then run every call it sends with ``servicer``. ``lenient``
    makes a request parser that hands undecodable bytes on to the servicer, as the server's.
    Calls the member passes on for others (and this node's probes of it) are judged by
    ``checks``; ``on_fault`` hears of each that the member altered or replayed.

    Raises:
        grpc.aio.AioRpcError: the session ended (the member went away, or refused it).
        PermissionError: the member did not prove the certificate it showed.
    """
    nonce = os.urandom(16)
    await call.write(pb.SessionFrame(address=address, nonce=nonce))
    opening = await call.read()
    if opening is grpc.aio.EOF:
        raise closed_error(member)
    cert: bytes | None = None
    peer_name = f"session:{member}"
    if certs is not None:
        cert = bytes(opening.certificate)
        if not signed_by(cert, session_claim(nonce), bytes(opening.signature)):
            raise PermissionError(f"{member} did not prove the certificate it showed")
        certs.node_id(cert)  # refused unless a node certificate of this swarm's CA
    if on_up is not None:
        on_up(member)
    out: asyncio.Queue[Any] = asyncio.Queue()
    incoming: dict[int, _Incoming] = {}

    async def writer() -> None:
        while True:
            frame = await out.get()
            await call.write(frame)

    def forwarded(call_id: int, first: Any) -> tuple[bool, bytes | None]:
        """Judge a call the member passes on: (whether it runs, the maker's certificate)."""
        verdict = checks.check(first, address, via=member)
        if verdict.refusal is None:
            return True, verdict.maker
        reason, detail = verdict.refusal
        servicer.handler.note_rejected(reason, detail)
        if verdict.relay_at_fault and on_fault is not None:
            on_fault(member, detail)
        out.put_nowait(end_frame(call_id, status_code(reason), f"{reason}: {detail}", reason.value))
        return False, None

    def reply_with(call_id: int, first: Any, message: bytes) -> None:
        frame = pb.SessionFrame(call=call_id, message=message, has_message=True, end=True)
        if first.via:
            checks.sign_answer(address, member, first, frame)
        out.put_nowait(frame)

    async def run(call_id: int, method: str, first: Any, inbox: _Incoming) -> None:
        caller_cert = cert
        if first.via or method == PROBE:
            runs, caller_cert = forwarded(call_id, first)
            if not runs:
                return
            if method == PROBE:  # this node's own, through the member: it came back
                reply_with(call_id, first, bytes(first.message))
                return
        request_type, _, streaming = METHODS[method]
        parse = lenient(request_type)
        context = SessionContext(peer_name, caller_cert)

        async def requests() -> AsyncIterator[Any]:
            frame = first
            while frame is not None:
                if frame.has_message:
                    yield parse(bytes(frame.message))
                if frame.end:
                    return
                frame = await inbox.requests.get()

        try:
            handler = getattr(servicer, method)
            if streaming:
                async for answer in handler(requests(), context):
                    out.put_nowait(
                        pb.SessionFrame(
                            call=call_id, message=answer.SerializeToString(), has_message=True
                        )
                    )
                out.put_nowait(end_frame(call_id, grpc.StatusCode.OK))
            else:
                reply = await handler(requests(), context)
                reply_with(call_id, first, reply.SerializeToString())
        except _Aborted as err:
            out.put_nowait(end_frame(call_id, err.code, err.details, err.reason))
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # one call failed; the session goes on
            log.exception("a call down the session from %s failed", member)
            out.put_nowait(end_frame(call_id, grpc.StatusCode.INTERNAL, repr(exc)))
        finally:
            context.finished = True
            incoming.pop(call_id, None)

    writing = asyncio.ensure_future(writer())
    try:
        while True:
            frame = await call.read()
            if frame is grpc.aio.EOF:
                raise closed_error(member)
            known = incoming.get(frame.call)
            if known is not None:
                if frame.end and not frame.has_message and frame.code:
                    if known.task is not None:  # cancelled by the member
                        known.task.cancel()
                else:
                    known.requests.put_nowait(frame)
                continue
            if frame.method not in METHODS and frame.method != PROBE:
                if frame.method:
                    out.put_nowait(
                        end_frame(
                            frame.call, grpc.StatusCode.UNIMPLEMENTED, f"no method {frame.method}"
                        )
                    )
                continue
            inbox = _Incoming(asyncio.Queue())
            incoming[frame.call] = inbox
            inbox.task = asyncio.ensure_future(run(frame.call, frame.method, frame, inbox))
    finally:
        writing.cancel()
        for inbox in list(incoming.values()):
            if inbox.task is not None:
                inbox.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await writing
