"""The node's assembly: its randomness comes from the runtime it is given, and its service sees
only the narrow port (node/daemon/service.py ServicePort)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from gossip.outbox import OutboxConfig
from node.config import GossipConfig
from node.daemon import service
from node.daemon.node import Node
from node.runtime import Runtime
from node.sim import SimConfig, Simulation
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config


async def _session(tmp_path: Path, name: str, seed: int) -> int:
    cfg = config(tmp_path / name, listen="mem:0")
    node = await Node.create(
        cfg, transport=MemoryTransport(MemoryNetwork()), runtime=Runtime.on_loop(seed=seed)
    )
    return node.state.session


async def test_one_seed_fixes_the_nodes_random_choices(tmp_path: Path) -> None:
    """Session ids come from the runtime's RNG, not the global one: one seed, one session."""
    first = await _session(tmp_path, "a", seed=7)
    again = await _session(tmp_path, "b", seed=7)
    other = await _session(tmp_path, "c", seed=8)
    assert first == again
    assert first != other


async def test_the_service_talks_to_its_port_only(tmp_path: Path) -> None:
    """What the service is given is the port and the inbound path, not the node."""
    cfg = config(tmp_path / "a", listen="mem:0")
    node = await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))
    assert not isinstance(node.service.port, Node)
    assert node.service.port.node_id == node.node_id
    tree = ast.parse(inspect.getsource(service))
    attributes = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "node" not in attributes  # no self.node.<anything> left


async def test_the_links_window_in_time_reaches_the_links_of_both_runtimes(tmp_path: Path) -> None:
    """``gossip.link_window_s`` (gossip/outbox.py ``window_s``) is what each runtime's links
    are built with, not the outbox's default."""
    cfg = config(tmp_path / "a", listen="mem:0", **{"gossip.link_window_s": 0.25})
    node = await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))
    sim = Simulation(SimConfig(nodes=2, gossip=GossipConfig(link_window_s=0.25)))
    built = [node.peers.link_cfg.outbox.window_s]
    built += [n.link_cfg.outbox.window_s for n in sim.nodes.values()]
    assert built == [0.25, 0.25, 0.25]
    assert OutboxConfig().window_s != 0.25
