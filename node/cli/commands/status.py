"""``murmur status``: one node's view of the swarm, asked over gRPC (mutual TLS, or plain TCP
with ``--insecure``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.commands.shared import HelpFormatter, fail

if TYPE_CHECKING:
    from node.security.pki import TlsFiles

__all__ = ["add_asking_flags", "add_parser", "asking_tls", "cmd_status", "handshake_said"]


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
    add_asking_flags(p, "a certificate from the swarm's CA to ask with (murmur ca issue makes one)")
    p.set_defaults(func=cmd_status)


def add_asking_flags(p: argparse.ArgumentParser, tls_help: str) -> None:
    """How a command that asks one node asks: ``--timeout``, ``--tls-dir`` or ``--insecure``."""
    p.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long to wait for an answer",
    )
    p.add_argument("--tls-dir", type=Path, metavar="DIR", help=tls_help)
    p.add_argument("--insecure", action="store_true", help="ask over plain TCP")


def asking_tls(args: argparse.Namespace, command: str) -> tuple[TlsFiles | None, int | None]:
    """The TLS files to ask with (None under ``--insecure``), or the exit code of a command
    that cannot ask (2, said on stderr)."""
    from node.security.pki import load_tls

    if args.insecure == (args.tls_dir is not None):
        return None, fail(command, "give --tls-dir DIR (a certificate of the swarm) or --insecure")
    try:
        return (None if args.insecure else load_tls(args.tls_dir)), None
    except (ValueError, OSError) as err:
        return None, fail(command, err)


def handshake_said(args: argparse.Namespace, err: Exception) -> str:
    """What to say of a failed handshake: under ``--insecure``, that the node runs TLS."""
    if args.insecure:
        return (
            f"{args.address} closed the connection: it runs mutual TLS, so ask it with "
            "--tls-dir DIR (a certificate from the swarm's CA) instead of --insecure"
        )
    return str(err)


def cmd_status(args: argparse.Namespace) -> int:
    """Print a node's status; exit 1 if it did not answer, 2 without a way to ask."""
    from node.telemetry.status import format_status, status_to_json
    from node.transport.base import HandshakeFailed, Rejected, Unreachable
    from node.transport.grpc import GrpcTransport, GrpcTransportConfig

    tls, refused = asking_tls(args, "status")
    if refused is not None:
        return refused

    async def ask() -> int:
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        try:
            status = await transport.call_status(args.address, args.timeout)
        except HandshakeFailed as err:
            return fail("status", handshake_said(args, err), 1)
        except (Unreachable, Rejected) as err:
            return fail("status", err, 1)
        finally:
            await transport.close(0)
        print(status_to_json(status) if args.json else format_status(status))
        return 0

    return asyncio.run(ask())
