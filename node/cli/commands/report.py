"""``murmur report``: plots of a run's metrics logs and a markdown summary of it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from node.cli.commands.shared import HelpFormatter, fail, lacks_extra

__all__ = ["add_parser", "cmd_report"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur report`` to ``sub``."""
    p = sub.add_parser(
        "report",
        parents=[common],
        formatter_class=HelpFormatter,
        help="plot a run's metrics logs and summarise it in markdown",
    )
    p.add_argument("state_dirs", nargs="+", type=Path, metavar="STATE_DIR")
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where run-report.md and plots/ go (default: the state dirs' parent)",
    )
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    """Write the report; exit 2 if it could not."""
    if lacks_extra("report", "matplotlib", "plots"):
        return 2
    from node.cli.report import default_out_dir, write_report

    missing = [str(d) for d in args.state_dirs if not d.is_dir()]
    if missing:
        return fail("report", f"not a directory: {', '.join(missing)}")
    try:
        path = write_report(args.state_dirs, args.out or default_out_dir(args.state_dirs))
    except (ValueError, OSError) as err:
        return fail("report", err)
    print(f"report: {path}")
    return 0
