"""What a failed gRPC call means to its caller: :class:`Rejected` when the peer said no, with
the reason it sent in the trailing metadata key ``murmur-reason`` (see
node/transport/grpc_server.py), else :class:`Unreachable`, or :class:`HandshakeFailed` when a
TLS handshake failed, named by its likely cause. The client side (node/transport/grpc.py) maps
every error of its calls through here.
"""

from __future__ import annotations

import re
from typing import Any

import grpc
import grpc.aio

from node.transport.base import HandshakeFailed, Reason, Rejected, Unreachable
from node.transport.grpc_server import REASON_KEY

__all__ = ["error_of", "map_error"]

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


def error_of(
    address: str, code: grpc.StatusCode, details: str | None, metadata: Any
) -> Rejected | Unreachable:
    """The error of a call to ``address`` that ended with ``code``, ``details`` and trailing
    ``metadata``."""
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


def map_error(address: str, err: grpc.aio.AioRpcError) -> Rejected | Unreachable:
    """The error of a call to ``address`` that raised ``err``."""
    return error_of(address, err.code(), err.details(), err.trailing_metadata())
