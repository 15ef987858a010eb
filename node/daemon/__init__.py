"""The node daemon: one node's parts and their assembly (:class:`node.daemon.node.Node`).

The trainer, the gossip worker, membership, the links and the inbound path live here; they
reach the world only through :mod:`node.transport` and are told the time by one runtime.
"""
