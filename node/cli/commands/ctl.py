"""``murmur ctl pause|resume ADDR``: pause a node by hand, or end a pause by hand, over gRPC.

Only the node's own certificate (its ``--tls-dir``, on its own machine) or an admin
certificate of the swarm's CA (``murmur ca issue --admin``) may ask; a node without TLS takes
the call from its own machine only. SIGUSR1 and SIGUSR2 to the node's process do the same.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from node.cli.commands.shared import HelpFormatter, fail
from node.cli.commands.status import add_asking_flags, asking_tls, handshake_said

__all__ = ["add_parser", "cmd_ctl"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur ctl`` to ``sub``."""
    p = sub.add_parser(
        "ctl",
        parents=[common],
        formatter_class=HelpFormatter,
        help="pause or resume a node by hand",
        description=__doc__,
    )
    p.add_argument(
        "action",
        choices=("pause", "resume", "query"),
        help="pause: train and gossip nothing, stay a member; resume: end a pause by hand "
        "(a pause its device's policy holds stays); query: say whether it is paused",
    )
    p.add_argument("address", help="host:port of the node")
    add_asking_flags(
        p, "the node's own TLS dir, or an admin's certificate (murmur ca issue --admin)"
    )
    p.set_defaults(func=cmd_ctl)


def cmd_ctl(args: argparse.Namespace) -> int:
    """Ask; print whether the node is paused now, and why. Exit 1 if it did not answer or
    refused, 2 without a way to ask."""
    from node.transport.base import HandshakeFailed, Rejected, Unreachable
    from node.transport.grpc import GrpcTransport, GrpcTransportConfig

    tls, refused = asking_tls(args, "ctl")
    if refused is not None:
        return refused

    async def ask() -> int:
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        try:
            paused, reason = await transport.call_control(args.address, args.action, args.timeout)
        except HandshakeFailed as err:
            return fail("ctl", handshake_said(args, err), 1)
        except (Unreachable, Rejected) as err:
            return fail("ctl", err, 1)
        finally:
            await transport.close(0)
        if not paused:
            print(f"{args.address} runs (not paused)")
        elif args.action == "resume":
            print(f"{args.address} is still paused: {reason}")
        else:
            print(f"{args.address} is paused: {reason}")
        return 0

    return asyncio.run(ask())
