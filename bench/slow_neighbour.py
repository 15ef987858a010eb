"""One slow neighbour among six real nodes, under both paces (issue 17)::

    .venv/bin/python -m bench.slow_neighbour [--rate 1mbit] [--codec fp32] [--window 12]

Needs root (namespaces and tc). Each pace gets its own swarm (tests/e2e/slow_neighbour.py): the
last node's link alternates unshaped and shaped at ``--rate``, twice, and the table gives the
deltas a second on its neighbours' other links (fast) and on their links to it (slow) in each
phase, and the fast links' rate beside the slow node over their rate without it.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tests.e2e.slow_neighbour import measure


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default="1mbit")
    parser.add_argument("--codec", default="fp32")
    parser.add_argument("--window", type=float, default=12.0)
    args = parser.parse_args()
    table = Table(title=f"one node of six behind {args.rate}, {args.codec} deltas")
    for col in ("pace", "fast links, unshaped", "fast links, beside it", "ratio", "slow links"):
        table.add_column(col, justify="right")
    for pace in ("node", "link"):
        with tempfile.TemporaryDirectory() as tmp:
            got = await measure(
                pace, Path(tmp), rate=args.rate, codec=args.codec, window_s=args.window
            )
        table.add_row(
            pace,
            f"{mean(got.fast_links['fast']):.2f}/s",
            f"{mean(got.fast_links['slow']):.2f}/s",
            f"{got.ratio():.2f}",
            f"{mean(got.slow_links['slow']):.2f}/s",
        )
    Console().print(table)


if __name__ == "__main__":
    asyncio.run(main())
