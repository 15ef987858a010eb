"""The ``murmur`` command: the top-level parser, one subcommand per module of
:mod:`node.cli.commands`, and the dispatch to the chosen command's ``cmd_*`` function."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from node.cli.commands import ca, ctl, monitor, report, run, simulate, status, swarm
from node.cli.commands.shared import HelpFormatter, common_options
from node.telemetry.logs import quiet_grpc, setup_logging

__all__ = ["HELP_EXAMPLES", "main", "make_parser"]

EXAMPLES = """examples:
  murmur ca init ~/swarm-ca
  murmur ca issue ~/swarm-ca a --out ~/murmur-a
  murmur run --state-dir ~/murmur-a --listen 0.0.0.0:7070
  murmur status 127.0.0.1:7070 --tls-dir ~/murmur-a

Every command has its own --help (murmur run --help)."""

#: The examples of every --help, each a sequence of commands run by tests/test_docs.py.
HELP_EXAMPLES = {
    "murmur": EXAMPLES,
    "murmur run": run.RUN_EXAMPLES,
    "murmur monitor": monitor.MONITOR_EXAMPLES,
}

#: What adds each subcommand, in the order ``murmur --help`` lists them.
COMMANDS = (
    run.add_parser,
    swarm.add_parser,
    simulate.add_parser,
    status.add_parser,
    ctl.add_parser,
    report.add_parser,
    monitor.add_parser,
    ca.add_parser,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("murmur")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def make_parser() -> argparse.ArgumentParser:
    """The ``murmur`` command line (for :func:`main`, and for checking a command line)."""
    parser = argparse.ArgumentParser(
        prog="murmur",
        description="Peer-to-peer training by compressed gossip.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
        parents=[common_options(top=True)],
    )
    parser.add_argument("--version", action="version", version=f"murmur {_version()}")
    common = common_options(top=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_parser in COMMANDS:
        add_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``murmur ARGV`` (the process's arguments if None) and give its exit code."""
    quiet_grpc()  # before anything imports grpc
    args = make_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
