"""The client side's channels to peers (node/transport/grpc.py dials through them): one per
address on each of three lanes, plain TCP or mutual TLS as the transport is set up, bounded per
lane, and replaced when they are stuck in gRPC's reconnect back-off.

A node answers and probes any address it is given, and would otherwise keep a channel to each
for good: so each lane keeps at most so many (least recently used closed first), and control
channels unused for ``control_idle_s`` are closed. Bulk and session channels carry long-lived
streams, so only the bound applies to them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import grpc
import grpc.aio

from gossip.clock import Clock
from node.transport.grpc_config import GrpcTransportConfig
from protos import murmur_pb2_grpc

__all__ = ["ChannelPool", "Lane"]

#: ``bulk`` carries models (deltas, snapshots, pulls), ``control`` the small, deadline-bound
#: calls (membership pings, hellos, status), ``session`` the dial-out sessions, each on a
#: connection of its own.
Lane = Literal["bulk", "control", "session"]


@dataclass
class _Channel:
    channel: grpc.aio.Channel
    stub: murmur_pb2_grpc.MurmurStub
    used: float


class ChannelPool:
    """Channels to peers by lane and address; ``clock`` times their idleness."""

    def __init__(self, cfg: GrpcTransportConfig, clock: Clock) -> None:
        self.cfg = cfg
        self._clock = clock
        # Per lane, least recently used first.
        self._lanes: dict[Lane, OrderedDict[str, _Channel]] = {
            "bulk": OrderedDict(),
            "control": OrderedDict(),
            "session": OrderedDict(),
        }
        #: Closes of channels replaced or let go (held so that they run to the end).
        self._closing: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def _let_go(self, entry: _Channel) -> None:
        self._closing.add(asyncio.ensure_future(entry.channel.close()))
        self._closing = {t for t in self._closing if not t.done()}

    def stub(self, address: str, lane: Lane) -> Any:
        """The stub for ``address`` on ``lane`` (see :data:`Lane`), dialled if there is none."""
        channels = self._lanes[lane]
        now = self._clock.now()
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
        if lane == "session":
            limit = self.cfg.bulk_channels
        while len(channels) > limit:
            self._let_go(channels.popitem(last=False)[1])
        if lane == "control":
            while channels:
                oldest = next(iter(channels.values()))
                if now - oldest.used <= self.cfg.control_idle_s:
                    break
                self._let_go(channels.popitem(last=False)[1])
        return entry.stub

    async def close(self) -> None:
        """Close every channel, and wait for those let go before to close."""
        for lane in self._lanes.values():
            while lane:
                await lane.popitem()[1].channel.close()
        await asyncio.gather(*self._closing)
