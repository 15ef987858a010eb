"""``murmur simulate``: a swarm of N simulated nodes in one process, on a discrete-event clock.

Each simulated node runs the daemon's core (codecs, replicas, mixing, topology, SWIM membership,
the link outbox and round pacing, the trainer's step) over a modelled network instead of gRPC.
"""

from node.sim.config import ChurnConfig, NetConfig, SimConfig
from node.sim.swarm import Simulation

__all__ = ["ChurnConfig", "NetConfig", "SimConfig", "Simulation"]
