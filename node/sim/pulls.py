"""Model pulls in a simulated swarm: a joiner's, and a node's back from a long pause.

A pull is a request (``REPLY_BYTES``) to the source, then the whole model back over the
modelled network, never lost, at the pace of the source's upload cap if it has one: what the
daemon's pull does (node/daemon/transfer.py), as one transfer. The swarm (node/sim/swarm.py)
says who pulls from whom; this module moves the model and counts the bytes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

import torch

from gossip.digest import model_digest
from gossip.events import EventQueue, Network
from node.sim.link import REPLY_BYTES
from node.sim.node import SimNode
from node.sim.world import Resuming
from node.transport import wire_sizes

__all__ = ["Pulls"]


class Pulls:
    """Args:
    events, network: the simulation's event queue and modelled network.
    rng: the simulation's own random draws (shared, so that a seed replays the same swarm).
    nodes: the swarm's nodes by address (the swarm keeps it; a pull reads who is there).
    """

    def __init__(
        self,
        events: EventQueue,
        network: Network,
        rng: random.Random,
        nodes: Mapping[str, SimNode],
    ) -> None:
        self.events = events
        self.network = network
        self.rng = rng
        self.nodes = nodes
        #: Bytes of every model pulled so far (requests left out).
        self.nbytes = 0

    def after_pause(self, node: Resuming) -> None:
        """``node`` pulls the model of a member that is not paused, then comes back."""
        sources = self._sources()
        sim_node = self.nodes.get(node.address)
        if not sources or sim_node is None:
            node.come_back()
            return
        self.pull(sim_node, self.rng.choice(sources), then=node.come_back)

    def _sources(self) -> list[SimNode]:
        """Nodes a model may be pulled from: training, and not paused."""
        return [n for n in self.nodes.values() if n.training and not n.paused]

    def pull(self, node: SimNode, source: SimNode, then: Callable[[], None] | None = None) -> None:
        """``node`` pulls ``source``'s model (another's, should ``source`` go meanwhile), then
        links and trains, as a joiner (or, with ``then``, does that instead)."""

        def at_source() -> None:
            if not node.alive:
                return
            if not source.alive:
                self.pull(node, self.rng.choice(self._sources() or [node]), then)
                return
            values = source.flat.flat.clone()
            node.pulled_from = source.node_id
            nbytes = wire_sizes.model_nbytes(values.numel(), source.step)
            held = model_digest(values) == model_digest(node.flat.flat)
            if held:  # the joiner named it: one chunk says it is the same (gossip/digest.py)
                nbytes = wire_sizes.same_model_nbytes(values.numel(), source.step)
            self.nbytes += nbytes

            def send() -> None:
                self.network.send(
                    source.address, node.address, nbytes, lambda: pulled(values, held), lossy=False
                )

            cap = source.upload_cap
            if cap is None:
                send()
                return
            # Served in chunks at the cap's pace, as the daemon's port serves it: it is all
            # there once the last chunk may go.
            now = self.events.now()
            self.events.at(
                cap.reserve(nbytes, now) + max(0.0, nbytes - cap.capacity) / cap.model_rate, send
            )

        def pulled(values: torch.Tensor, held: bool) -> None:
            if not node.alive:
                return
            node.adopt(values, self.rng.getrandbits(62), held)
            if then is not None:
                then()
                return
            node.start_links()  # and trains once its edges are up both ways, as the daemon
            node.after_swim()

        self.network.send(node.address, source.address, REPLY_BYTES, at_source, lossy=False)
