"""``murmur run``: one node, until SIGTERM or SIGINT; its settings from the defaults, a TOML
file, ``MURMUR_*`` variables and the flags, checked by the schema in node/settings.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.cli.commands.serve import serve
from node.cli.commands.shared import (
    HelpFormatter,
    add_gossip_flags,
    fail,
    flag_help,
    sigterm_interrupts,
)
from node.settings_sources import SettingsError, load_settings

if TYPE_CHECKING:  # torch: only once the settings passed
    from node.config import NodeConfig

__all__ = ["RUN_EXAMPLES", "add_parser", "build_node_config", "cmd_run", "run_flag_labels"]

log = logging.getLogger("murmur")

RUN_EXAMPLES = """examples:
  murmur run --insecure --state-dir /tmp/a --listen 127.0.0.1:7070 --shard 0/2 --steps 300
  murmur run --insecure --state-dir /tmp/b --listen 127.0.0.1:7071 --shard 1/2 --steps 300 \\
      --join 127.0.0.1:7070
  MURMUR_STEPS=300 murmur run --insecure --state-dir /tmp/c --listen 127.0.0.1:7072 \\
      --join 127.0.0.1:7070

Settings come from the defaults, then --config FILE (TOML: the keys are the settings'
names, or the flags' names, with [trainer], [gossip] and [membership] tables), then
MURMUR_* environment variables (MURMUR_WAIT_MEMBERS, MURMUR_GOSSIP__CODEC, MURMUR_STEPS,
...), then the flags. A value of the wrong type or out of range, or an unknown key, is
refused before the node starts."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Add ``murmur run``: every node setting as a flag, unset ones left to the file and env."""
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run one node until SIGTERM or SIGINT",
        description="Run one node: serve, join, train, gossip, until SIGTERM or SIGINT;\n"
        "then leave politely, write the final checkpoint and exit 0.",
        epilog=RUN_EXAMPLES,
        formatter_class=HelpFormatter,
    )
    s = argparse.SUPPRESS  # unset flags fall back to the environment, the file, the defaults
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a TOML file of settings; the environment and the flags override it (default: none)",
    )
    p.add_argument("--listen", metavar="HOST:PORT", default=s, help=flag_help("listen"))
    p.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        default=s,
        help=flag_help("advertise", default="the bound address"),
    )
    p.add_argument(
        "--join",
        action="append",
        default=s,
        metavar="HOST:PORT",
        help=flag_help("join", "a node to join through; repeatable"),
    )
    p.add_argument(
        "--state-dir", dest="state_dir", metavar="DIR", default=s, help=flag_help("state_dir")
    )
    p.add_argument(
        "--device",
        metavar="auto|cpu|cuda[:N]|mps",
        default=s,
        help=flag_help("device", "where to train"),
    )
    p.add_argument(
        "--task",
        metavar="NAME|MODULE:FACTORY|FILE.py:FACTORY",
        default=s,
        help=flag_help(
            "task", "what to train: a built-in task (digits, logistic) or a factory of your own"
        ),
    )
    p.add_argument(
        "--shard",
        default=s,
        metavar="I/N",
        help=flag_help("shard", "this node's part of the data, shard I of N", "0/1"),
    )
    p.add_argument(
        "--alpha", metavar="A", default=s, help=flag_help("alpha", default="none: iid shards")
    )
    p.add_argument("--seed", metavar="S", default=s, help=flag_help("seed"))
    p.add_argument(
        "--threads",
        metavar="N",
        default=s,
        help=flag_help("threads", "torch intra-op threads", "torch's"),
    )
    p.add_argument(
        "--wait-members",
        dest="wait_members",
        metavar="N",
        default=s,
        help=flag_help("wait_members"),
    )
    p.add_argument(
        "--wait-timeout",
        dest="wait_timeout_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("wait_timeout_s"),
    )
    p.add_argument(
        "--snapshot-grace",
        dest="snapshot_grace_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("snapshot_grace_s"),
    )
    p.add_argument(
        "--checkpoint-interval",
        dest="checkpoint_interval_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("checkpoint_interval_s"),
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=s,
        help=flag_help(
            "insecure",
            "plain TCP, no TLS: no encryption, no authentication (trusted networks only)",
        ),
    )
    p.add_argument(
        "--tls-dir",
        dest="tls_dir",
        metavar="DIR",
        default=s,
        help=flag_help(
            "tls_dir", "where node_key.pem, node_cert.pem and ca_cert.pem are", "the state dir"
        ),
    )
    p.add_argument(
        "--metrics-port",
        dest="metrics_port",
        metavar="PORT",
        default=s,
        help=flag_help(
            "metrics_port",
            "serve Prometheus metrics at http://HOST:PORT/metrics; 0 picks a free port",
            "off",
        ),
    )
    p.add_argument(
        "--metrics-host",
        dest="metrics_host",
        metavar="HOST",
        default=s,
        help=flag_help(
            "metrics_host", default="the --listen host; loopback for a wildcard such as 0.0.0.0"
        ),
    )
    p.add_argument(
        "--metrics-tls",
        dest="metrics_tls",
        action="store_true",
        default=s,
        help=flag_help("metrics_tls"),
    )
    p.add_argument(
        "--swim-period",
        dest="membership.period_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("membership.period_s"),
    )
    p.add_argument(
        "--steps",
        dest="trainer.steps",
        metavar="N",
        default=s,
        help=flag_help("trainer.steps", default="none: train until stopped"),
    )
    p.add_argument(
        "--eval-every",
        dest="trainer.eval_every",
        metavar="N",
        default=s,
        help=flag_help("trainer.eval_every"),
    )
    p.add_argument(
        "--idle-eval-interval",
        dest="trainer.idle_eval_interval_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("trainer.idle_eval_interval_s"),
    )
    p.add_argument(
        "--summary-interval",
        dest="summary_interval_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("summary_interval_s"),
    )
    p.add_argument(
        "--slowdown",
        dest="trainer.slowdown",
        metavar="X",
        default=s,
        help=flag_help("trainer.slowdown"),
    )
    p.add_argument(
        "--step-time",
        dest="trainer.step_time",
        metavar="SECONDS",
        default=s,
        help=flag_help("trainer.step_time"),
    )
    add_gossip_flags(p, suppress=True)
    p.add_argument(
        "--region",
        dest="gossip.region",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=flag_help("gossip.region", default="none"),
    )
    _add_mqtt_flags(p)
    _add_power_flags(p)
    p.set_defaults(func=cmd_run, flag_labels=run_flag_labels(p))


def _add_power_flags(p: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    p.add_argument(
        "--pause-on-battery-below",
        dest="power.pause_on_battery_below",
        metavar="PCT",
        default=s,
        help=flag_help("power.pause_on_battery_below"),
    )
    p.add_argument(
        "--pause-above-temp",
        dest="power.pause_above_temp",
        metavar="C",
        default=s,
        help=flag_help("power.pause_above_temp"),
    )
    p.add_argument(
        "--only-on-ac",
        dest="power.only_on_ac",
        action="store_true",
        default=s,
        help=flag_help("power.only_on_ac"),
    )
    p.add_argument(
        "--active-hours",
        dest="power.active_hours",
        metavar="HH:MM-HH:MM",
        default=s,
        help=flag_help("power.active_hours"),
    )
    p.add_argument(
        "--sysfs-root",
        dest="power.sysfs_root",
        metavar="DIR",
        default=s,
        help=flag_help("power.sysfs_root"),
    )
    p.add_argument(
        "--power-poll-interval",
        dest="power.poll_interval_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("power.poll_interval_s"),
    )


def _add_mqtt_flags(p: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    p.add_argument(
        "--mqtt",
        default=s,
        metavar="URL",
        help=flag_help("mqtt", "publish status to mqtt://host:port"),
    )
    p.add_argument(
        "--mqtt-discovery",
        dest="mqtt_discovery",
        action="store_true",
        default=s,
        help=flag_help(
            "mqtt_discovery",
            "announce this node on the broker and join the members announced there",
        ),
    )
    p.add_argument(
        "--mqtt-prefix",
        dest="mqtt_prefix",
        metavar="PREFIX",
        default=s,
        help=flag_help("mqtt_prefix"),
    )
    p.add_argument(
        "--mqtt-interval",
        dest="mqtt_interval_s",
        metavar="SECONDS",
        default=s,
        help=flag_help("mqtt_interval_s"),
    )
    p.add_argument("--swarm", metavar="NAME", default=s, help=flag_help("swarm"))


#: Namespace entries that are not settings.
_NOT_SETTINGS = frozenset({"config", "func", "command", "log_level", "log_format", "flag_labels"})


def run_flag_labels(parser: argparse.ArgumentParser) -> dict[str, str]:
    """How each run setting is spelled on the command line (``trainer.steps`` -> ``--steps``)."""
    return {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings}


def build_node_config(
    args: argparse.Namespace, environ: dict[str, str] | None = None
) -> NodeConfig:
    """Defaults, then the config file, then ``MURMUR_*`` variables, then the flags given.

    Raises:
        SettingsError: a value was refused (node/settings.py says how).
    """
    flags = {k: v for k, v in vars(args).items() if k not in _NOT_SETTINGS}
    labels: dict[str, str] = getattr(args, "flag_labels", {})
    loaded = load_settings(args.config, environ, flags, labels)
    from node.config import node_config  # torch: only once the settings passed

    return node_config(loaded)


def cmd_run(args: argparse.Namespace) -> int:
    """Run one node; exit 0 after a clean stop, 1 if it failed, 2 if it could not start."""
    # Until the event loop takes the signals over (first thing in serve), SIGTERM interrupts
    # as SIGINT does: nothing has started that needs stopping.
    sigterm_interrupts()
    try:
        try:
            cfg = build_node_config(args)
        except SettingsError as err:
            return fail("run", err)
        return asyncio.run(serve(cfg))
    except KeyboardInterrupt:
        log.info("stopped before the node started")
        return 0
