"""``murmur status``: one node's view of the swarm, asked over gRPC (mutual TLS, or plain TCP
with ``--insecure``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from node.cli.commands.shared import HelpFormatter, fail

__all__ = ["add_parser", "cmd_status"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur status`` to ``sub``."""
    p = sub.add_parser(
        "status",
        parents=[common],
        formatter_class=HelpFormatter,
        help="show one node's view of the swarm",
    )
    p.add_argument("address", help="host:port of a node")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for an answer",
    )
    p.add_argument(
        "--tls-dir",
        type=Path,
        metavar="DIR",
        help="a certificate from the swarm's CA to ask with (murmur ca issue makes one)",
    )
    p.add_argument("--insecure", action="store_true", help="ask over plain TCP")
    p.set_defaults(func=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    """Print a node's status; exit 1 if it did not answer, 2 without a way to ask."""
    from node.security.pki import load_tls
    from node.telemetry.status import format_status, status_to_json
    from node.transport.base import HandshakeFailed, Rejected, Unreachable
    from node.transport.grpc import GrpcTransport, GrpcTransportConfig

    if args.insecure == (args.tls_dir is not None):
        return fail("status", "give --tls-dir DIR (a certificate of the swarm) or --insecure")
    try:
        tls = None if args.insecure else load_tls(args.tls_dir)
    except (ValueError, OSError) as err:
        return fail("status", err)

    async def ask() -> int:
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        try:
            status = await transport.call_status(args.address, args.timeout)
        except HandshakeFailed as err:
            said = str(err)
            if args.insecure:
                said = (
                    f"{args.address} closed the connection: it runs mutual TLS, so ask it with "
                    "--tls-dir DIR (a certificate from the swarm's CA) instead of --insecure"
                )
            return fail("status", said, 1)
        except (Unreachable, Rejected) as err:
            return fail("status", err, 1)
        finally:
            await transport.close(0)
        print(status_to_json(status) if args.json else format_status(status))
        return 0

    return asyncio.run(ask())
