"""The simulation as its nodes and links see it: what node/sim/node.py and node/sim/link.py may
ask of node/sim/swarm.py (which owns the nodes), so that neither imports it."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Protocol

import torch

from gossip.clock import ManualClock
from gossip.codecs import Codec
from gossip.events import EventQueue, Network
from gossip.messages import Delta, SnapshotHeader
from gossip.swim import SwimMessage
from node.sim.config import SimConfig

__all__ = ["Receiver", "Resuming", "World"]


class Receiver(Protocol):
    """A simulated node as a link delivers to it (node/sim/node.py ``SimNode``)."""

    @property
    def address(self) -> str: ...

    def rpc_push_delta(self, delta: Delta, stream: tuple[str, int], nbytes: int) -> int:
        """The delta applied through the inbound path; raises ``Rejected``."""
        ...

    def rpc_push_snapshot(self, header: SnapshotHeader, values: torch.Tensor, nbytes: int) -> int:
        """The snapshot applied through the inbound path; raises ``Rejected``."""
        ...


class Resuming(Protocol):
    """A node that comes back from a long pause: it takes a pulled model, then rejoins."""

    @property
    def address(self) -> str: ...

    def adopt(self, values: torch.Tensor, session: int) -> None: ...

    def come_back(self) -> None: ...


class World(Protocol):
    """The simulation (node/sim/swarm.py ``Simulation``): its time, network and configuration."""

    @property
    def cfg(self) -> SimConfig: ...

    @property
    def clock(self) -> ManualClock: ...

    @property
    def events(self) -> EventQueue: ...

    @property
    def network(self) -> Network: ...

    @property
    def rng(self) -> random.Random: ...

    @property
    def codec(self) -> Codec: ...

    def live_node(self, address: str) -> Receiver | None:
        """The node at ``address`` if it is up."""
        ...

    def swim_delivery(self, address: str, message: SwimMessage) -> Callable[[], None]:
        """What delivers ``message`` to ``address`` when it arrives."""
        ...

    def holds_session(self, address: str, member: str) -> bool:
        """Whether the node at ``address`` (behind NAT) holds a session to ``member``."""
        ...

    def pull_after_pause(self, node: Resuming) -> None:
        """``node`` resumes after a long pause: pull the model from a member that is not
        paused, then call its ``come_back``."""
        ...

    def relay_swim(
        self, src: str, dst: str, relays: tuple[str, ...], nbytes: int, message: SwimMessage
    ) -> None:
        """Send a membership message for a node behind NAT through one of its relays."""
        ...
