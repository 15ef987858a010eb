"""How a gRPC transport is set up: shared by its client side (node/transport/grpc.py) and its
server side (node/transport/grpc_server.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from node.security.penalties import PenaltyConfig
from node.security.pki import TLS_NAME, TlsFiles

__all__ = ["GrpcTransportConfig"]


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
    #: How long a relay waits for the answer of a membership call it passed down a session.
    forward_timeout_s: float = 2.0

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
