"""``murmur monitor``: a live table of a swarm's nodes, from the statuses they publish to an
MQTT broker (``murmur run --mqtt``)."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from node.cli.commands.shared import HelpFormatter, fail, sigterm_interrupts

__all__ = ["MONITOR_EXAMPLES", "add_parser", "cmd_monitor"]

MONITOR_EXAMPLES = """examples:
  murmur monitor --mqtt mqtt://127.0.0.1:1883 --swarm lab
  murmur monitor --mqtt mqtt://127.0.0.1:1883 --swarm lab --once --json"""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur monitor`` to ``sub``."""
    p = sub.add_parser(
        "monitor",
        parents=[common],
        help="a live table of a swarm's nodes, from an MQTT broker",
        epilog=MONITOR_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--mqtt", required=True, metavar="URL", help="the broker: mqtt://host:port")
    p.add_argument(
        "--swarm", metavar="NAME", default="default", help="the swarm's name (default: default)"
    )
    p.add_argument(
        "--mqtt-prefix",
        metavar="PREFIX",
        default="murmur",
        help="the MQTT topics' prefix, as the nodes' --mqtt-prefix (default: murmur)",
    )
    p.add_argument(
        "--once", action="store_true", help="print once after --timeout and exit (default: off)"
    )
    p.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=float,
        default=3.0,
        help="how long --once listens (default: 3.0)",
    )
    p.add_argument("--json", action="store_true", help="the statuses as JSON (default: off)")
    p.add_argument(
        "--hide-departed",
        action="store_true",
        help="leave out nodes gone offline, or stale ones silent for 10 minutes (default: off)",
    )
    p.add_argument(
        "--width",
        metavar="COLUMNS",
        type=int,
        help="table width in columns (default: the terminal's, else 80)",
    )
    p.set_defaults(func=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    """Watch the broker until stopped (or once); exit 2 on a refused flag."""
    from node.cli.monitor import MonitorConfig, run_monitor
    from node.telemetry.mqtt_messages import MqttConfig

    try:
        mqtt = MqttConfig(url=args.mqtt, swarm=args.swarm, prefix=args.mqtt_prefix)
        cfg = MonitorConfig(
            mqtt,
            once=args.once,
            timeout_s=args.timeout,
            json=args.json,
            hide_departed=args.hide_departed,
            width=args.width,
        )
    except ValueError as err:
        return fail("monitor", err)
    sigterm_interrupts()  # stopped like Ctrl-C: a clean exit 0
    try:
        return asyncio.run(run_monitor(cfg))
    except KeyboardInterrupt:
        return 0
