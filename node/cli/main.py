"""The ``murmur`` command: run a node, run a local swarm, ask a node for its status."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node import settings
from node.settings import ATTACKS, CODEC_NAMES, TOPOLOGY_NAMES
from node.settings_sources import SettingsError, load_settings
from node.telemetry.logs import LOG_FORMATS, LOG_LEVELS, quiet_grpc, setup_logging

if TYPE_CHECKING:  # the commands import what they need, so that --help need not load torch
    from node.config import GossipConfig, NodeConfig

__all__ = ["build_node_config", "main", "make_parser"]

log = logging.getLogger("murmur")

EXAMPLES = """examples:
  murmur ca init ~/swarm-ca
  murmur ca issue ~/swarm-ca a --out ~/murmur-a
  murmur run --state-dir ~/murmur-a --listen 0.0.0.0:7070
  murmur status 127.0.0.1:7070 --tls-dir ~/murmur-a

Every command has its own --help (murmur run --help)."""

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

MONITOR_EXAMPLES = """examples:
  murmur monitor --mqtt mqtt://127.0.0.1:1883 --swarm lab
  murmur monitor --mqtt mqtt://127.0.0.1:1883 --swarm lab --once --json"""

#: The examples of every --help, each a sequence of commands run by tests/test_docs.py.
HELP_EXAMPLES = {"murmur": EXAMPLES, "murmur run": RUN_EXAMPLES, "murmur monitor": MONITOR_EXAMPLES}


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default, written one way: ``(default: X)``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "(default" in text
            or not action.option_strings
            or action.default is argparse.SUPPRESS
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return text
        return f"{text} (default: {_default_text(action.default)})"


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "none"
    return str(value)


def _h(key: str, text: str | None = None, default: str | None = None) -> str:
    """A run flag's help: the schema's description of ``key`` and its default, one way for all."""
    shown = default if default is not None else _default_text(settings.default_of(key))
    return f"{text or settings.description_of(key)} (default: {shown})"


TASK_HELP = (
    "digits, logistic, mnist1d, text, module:factory or file.py:factory; "
    "options after a colon: text:size=10m,seq_len=256"
)


def _add_gossip_flags(p: argparse.ArgumentParser, suppress: bool) -> None:
    # Values stay strings here: the settings schema parses and checks them (node/settings.py).
    d = argparse.SUPPRESS if suppress else None
    p.add_argument(
        "--topology",
        dest="gossip.topology",
        choices=TOPOLOGY_NAMES,
        default=d,
        help=_h("gossip.topology"),
    )
    p.add_argument(
        "--degree", dest="gossip.degree", metavar="K", default=d, help=_h("gossip.degree")
    )
    p.add_argument(
        "--compress",
        dest="gossip.codec",
        choices=CODEC_NAMES,
        default=d,
        help=_h("gossip.codec", "codec of the model deltas (none is fp32)"),
    )
    p.add_argument(
        "--block-size",
        dest="gossip.block_size",
        metavar="B",
        default=d,
        help=_h("gossip.block_size", "values per quantization scale, a multiple of 8"),
    )
    p.add_argument(
        "--compress-fraction",
        dest="gossip.compress_fraction",
        metavar="F",
        default=d,
        help=_h("gossip.compress_fraction"),
    )
    p.add_argument(
        "--gamma",
        dest="gossip.gamma",
        metavar="G",
        default=d,
        help=_h(
            "gossip.gamma",
            "consensus step size, in (0, 1]",
            "by codec: 1.0 fp32/fp16, 0.8 int8, 0.5 int4, 0.1 sign",
        ),
    )
    p.add_argument(
        "--local-steps",
        dest="gossip.local_steps",
        metavar="H",
        default=d,
        help=_h("gossip.local_steps"),
    )
    p.add_argument(
        "--no-trigger",
        dest="gossip.trigger",
        action="store_false",
        default=d,
        help=_h(
            "gossip.trigger",
            "turn the event-triggered rule off: gossip every round the links allow, even idle",
            "the rule is on",
        ),
    )
    p.add_argument(
        "--trigger-threshold",
        dest="gossip.trigger_threshold",
        metavar="F",
        default=d,
        help=_h("gossip.trigger_threshold"),
    )
    p.add_argument(
        "--heartbeat",
        dest="gossip.heartbeat_s",
        metavar="S",
        default=d,
        help=_h("gossip.heartbeat_s"),
    )
    p.add_argument(
        "--outer-lr",
        dest="gossip.outer_lr",
        metavar="LR",
        default=d,
        help=_h(
            "gossip.outer_lr",
            "DiLoCo-style outer Nesterov step on each round's change "
            "of the model, with this learning rate (e.g. 0.7)",
            "off",
        ),
    )
    p.add_argument(
        "--outer-momentum",
        dest="gossip.outer_momentum",
        metavar="M",
        default=d,
        help=_h("gossip.outer_momentum"),
    )
    p.add_argument(
        "--robust",
        dest="gossip.robust",
        action="store_true",
        default=d,
        help=_h(
            "gossip.robust",
            "Byzantine-robust mixing (ClippedGossip) and eviction of anomalous neighbours",
        ),
    )
    p.add_argument(
        "--byzantine-fraction",
        dest="gossip.byzantine_fraction",
        metavar="F",
        default=d,
        help=_h("gossip.byzantine_fraction"),
    )
    # For testing robustness only (under `murmur swarm`, only the last node attacks).
    p.add_argument(
        "--attack", dest="gossip.attack", choices=ATTACKS, default=d, help=argparse.SUPPRESS
    )


def _add_run_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run one node until SIGTERM or SIGINT",
        description="Run one node: serve, join, train, gossip, until SIGTERM or SIGINT;\n"
        "then leave politely, write the final checkpoint and exit 0.",
        epilog=RUN_EXAMPLES,
        formatter_class=_Formatter,
    )
    s = argparse.SUPPRESS  # unset flags fall back to the environment, the file, the defaults
    p.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a TOML file of settings; the environment and the flags override it (default: none)",
    )
    p.add_argument("--listen", metavar="HOST:PORT", default=s, help=_h("listen"))
    p.add_argument(
        "--advertise",
        metavar="HOST:PORT",
        default=s,
        help=_h("advertise", default="the bound address"),
    )
    p.add_argument(
        "--join",
        action="append",
        default=s,
        metavar="HOST:PORT",
        help=_h("join", "a node to join through; repeatable"),
    )
    p.add_argument("--state-dir", dest="state_dir", metavar="DIR", default=s, help=_h("state_dir"))
    p.add_argument(
        "--device", metavar="auto|cpu|cuda[:N]|mps", default=s, help=_h("device", "where to train")
    )
    p.add_argument(
        "--task",
        metavar="NAME|MODULE:FACTORY|FILE.py:FACTORY",
        default=s,
        help=_h(
            "task", "what to train: a built-in task (digits, logistic) or a factory of your own"
        ),
    )
    p.add_argument(
        "--shard",
        default=s,
        metavar="I/N",
        help=_h("shard", "this node's part of the data, shard I of N", "0/1"),
    )
    p.add_argument("--alpha", metavar="A", default=s, help=_h("alpha", default="none: iid shards"))
    p.add_argument("--seed", metavar="S", default=s, help=_h("seed"))
    p.add_argument(
        "--threads", metavar="N", default=s, help=_h("threads", "torch intra-op threads", "torch's")
    )
    p.add_argument(
        "--wait-members", dest="wait_members", metavar="N", default=s, help=_h("wait_members")
    )
    p.add_argument(
        "--wait-timeout",
        dest="wait_timeout_s",
        metavar="SECONDS",
        default=s,
        help=_h("wait_timeout_s"),
    )
    p.add_argument(
        "--snapshot-grace",
        dest="snapshot_grace_s",
        metavar="SECONDS",
        default=s,
        help=_h("snapshot_grace_s"),
    )
    p.add_argument(
        "--checkpoint-interval",
        dest="checkpoint_interval_s",
        metavar="SECONDS",
        default=s,
        help=_h("checkpoint_interval_s"),
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=s,
        help=_h(
            "insecure",
            "plain TCP, no TLS: no encryption, no authentication (trusted networks only)",
        ),
    )
    p.add_argument(
        "--tls-dir",
        dest="tls_dir",
        metavar="DIR",
        default=s,
        help=_h(
            "tls_dir", "where node_key.pem, node_cert.pem and ca_cert.pem are", "the state dir"
        ),
    )
    p.add_argument(
        "--metrics-port",
        dest="metrics_port",
        metavar="PORT",
        default=s,
        help=_h(
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
        help=_h(
            "metrics_host", default="the --listen host; loopback for a wildcard such as 0.0.0.0"
        ),
    )
    p.add_argument(
        "--metrics-tls",
        dest="metrics_tls",
        action="store_true",
        default=s,
        help=_h("metrics_tls"),
    )
    p.add_argument(
        "--swim-period",
        dest="membership.period_s",
        metavar="SECONDS",
        default=s,
        help=_h("membership.period_s"),
    )
    p.add_argument(
        "--steps",
        dest="trainer.steps",
        metavar="N",
        default=s,
        help=_h("trainer.steps", default="none: train until stopped"),
    )
    p.add_argument(
        "--eval-every",
        dest="trainer.eval_every",
        metavar="N",
        default=s,
        help=_h("trainer.eval_every"),
    )
    p.add_argument(
        "--idle-eval-interval",
        dest="trainer.idle_eval_interval_s",
        metavar="SECONDS",
        default=s,
        help=_h("trainer.idle_eval_interval_s"),
    )
    p.add_argument(
        "--summary-interval",
        dest="summary_interval_s",
        metavar="SECONDS",
        default=s,
        help=_h("summary_interval_s"),
    )
    p.add_argument(
        "--slowdown",
        dest="trainer.slowdown",
        metavar="X",
        default=s,
        help=_h("trainer.slowdown"),
    )
    p.add_argument(
        "--step-time",
        dest="trainer.step_time",
        metavar="SECONDS",
        default=s,
        help=_h("trainer.step_time"),
    )
    _add_gossip_flags(p, suppress=True)
    _add_mqtt_flags(p)
    p.set_defaults(func=_cmd_run, flag_labels=run_flag_labels(p))


def _add_mqtt_flags(p: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    p.add_argument(
        "--mqtt", default=s, metavar="URL", help=_h("mqtt", "publish status to mqtt://host:port")
    )
    p.add_argument(
        "--mqtt-discovery",
        dest="mqtt_discovery",
        action="store_true",
        default=s,
        help=_h(
            "mqtt_discovery",
            "announce this node on the broker and join the members announced there",
        ),
    )
    p.add_argument(
        "--mqtt-prefix", dest="mqtt_prefix", metavar="PREFIX", default=s, help=_h("mqtt_prefix")
    )
    p.add_argument(
        "--mqtt-interval",
        dest="mqtt_interval_s",
        metavar="SECONDS",
        default=s,
        help=_h("mqtt_interval_s"),
    )
    p.add_argument("--swarm", metavar="NAME", default=s, help=_h("swarm"))


def _add_monitor_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "monitor",
        parents=[common],
        help="a live table of a swarm's nodes, from an MQTT broker",
        epilog=MONITOR_EXAMPLES,
        formatter_class=_Formatter,
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
    p.set_defaults(func=_cmd_monitor)


def _add_status_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "status",
        parents=[common],
        formatter_class=_Formatter,
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
    p.set_defaults(func=_cmd_status)


def _add_report_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "report",
        parents=[common],
        formatter_class=_Formatter,
        help="plot a run's metrics logs and summarise it in markdown",
    )
    p.add_argument("state_dirs", nargs="+", type=Path, metavar="STATE_DIR")
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where run-report.md and plots/ go (default: the state dirs' parent)",
    )
    p.set_defaults(func=_cmd_report)


def _add_swarm_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "swarm",
        parents=[common],
        formatter_class=_Formatter,
        help="run N real nodes on this machine and report",
    )
    p.add_argument("--nodes", type=int, default=8, metavar="N", help="node processes to run")
    p.add_argument("--steps", type=int, default=600, metavar="N", help="local steps per node")
    p.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long in any case"
    )
    p.add_argument("--task", default="digits", metavar="TASK", help=TASK_HELP)
    p.add_argument(
        "--alpha", type=float, default=0.5, metavar="A", help="Dirichlet alpha (non-iid shards)"
    )
    p.add_argument("--iid", action="store_true", help="iid shards instead of Dirichlet")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the swarm's seed")
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="every node's device")
    p.add_argument(
        "--eval-every", type=int, default=100, metavar="N", help="evaluate every N steps"
    )
    p.add_argument(
        "--settle-rounds",
        type=int,
        metavar="N",
        default=20,
        help="gossip rounds every node does after the last one finishes training (a node "
        "that falls quiet first, with the event-triggered rule, counts as settled)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="where state dirs and the report go (default: murmur-runs/TIME)",
    )
    p.add_argument(
        "--no-baseline", action="store_true", help="skip training the single-process reference"
    )
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.add_argument(
        "--insecure", action="store_true", help="plain TCP between the nodes instead of mTLS"
    )
    _add_gossip_flags(p, suppress=False)
    p.set_defaults(func=_cmd_swarm)


def _add_simulate_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "simulate",
        parents=[common],
        formatter_class=_Formatter,
        help="simulate a swarm of N nodes in one process on a discrete-event clock",
        description="The daemon's gossip core (codecs, replicas, mixing, topology, SWIM, link "
        "policy, trainer step) on a modelled network: latency, bandwidth, loss, stragglers "
        "and churn. Writes sim.jsonl and sim.png to --out. A node steps every --step-time "
        "simulated seconds and gossips at least --local-steps steps apart, when its links "
        "are not busy: the gossip period is about their product, or the links' round trip.",
    )
    p.add_argument("--nodes", type=int, default=64, metavar="N", help="simulated nodes")
    p.add_argument(
        "--duration", type=float, default=60.0, metavar="SECONDS", help="simulated seconds"
    )
    p.add_argument(
        "--task",
        default="logistic",
        metavar="TASK",
        help=f"{TASK_HELP} (logistic is the cheap one)",
    )
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha (non-iid shards)")
    p.add_argument("--iid", action="store_true", help="iid shards instead of Dirichlet")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the swarm's seed")
    p.add_argument(
        "--independent-init",
        action="store_true",
        help="every node starts from a model of its own (to measure consensus from afar)",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="simulated seconds per local step",
    )
    p.add_argument(
        "--steps", type=int, metavar="N", help="local step budget per node (default: no limit)"
    )
    p.add_argument(
        "--stragglers", type=float, default=0.0, metavar="F", help="fraction of slow nodes"
    )
    p.add_argument(
        "--straggler-slowdown", type=float, default=5.0, metavar="X", help="how much slower"
    )
    p.add_argument(
        "--speed-spread",
        type=float,
        default=0.0,
        metavar="SIGMA",
        help="sigma of a lognormal step-time factor",
    )
    p.add_argument(
        "--latency",
        type=float,
        nargs=2,
        default=(0.01, 0.05),
        metavar=("MIN", "MAX"),
        help="one-way delay of each link, uniform in [MIN, MAX] seconds",
    )
    p.add_argument(
        "--bandwidth", type=float, default=10.0, metavar="MBIT", help="uplink Mbit/s per node"
    )
    p.add_argument(
        "--loss", type=float, default=0.0, metavar="P", help="loss of deltas and SWIM messages"
    )
    p.add_argument(
        "--partition",
        metavar="AT:FOR[:GROUPS]",
        help="split the network into GROUPS (2) groups at AT simulated seconds for FOR seconds",
    )
    p.add_argument(
        "--churn",
        type=float,
        metavar="F",
        help="fraction of nodes replaced per simulated minute (half leave, half crash)",
    )
    p.add_argument(
        "--leave-rate", type=float, default=0.0, metavar="F", help="fraction leaving per minute"
    )
    p.add_argument(
        "--crash-rate", type=float, default=0.0, metavar="F", help="fraction crashing per minute"
    )
    p.add_argument(
        "--join-rate", type=float, default=0.0, metavar="F", help="fraction joining per minute"
    )
    p.add_argument(
        "--swim-period",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="membership period in seconds",
    )
    p.add_argument(
        "--eval-every",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="simulated seconds between samples",
    )
    p.add_argument(
        "--consensus-threshold",
        type=float,
        metavar="D",
        default=1e-2,
        help="relative consensus distance counted as consensus",
    )
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=0.8,
        metavar="ACC",
        help="accuracy counted as reached",
    )
    p.add_argument(
        "--target-loss",
        type=float,
        metavar="LOSS",
        help="eval loss counted as reached, for tasks judged by loss (default: the task's)",
    )
    p.add_argument(
        "--attackers",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="testing robustness: share of the nodes that publish --attack (scale, flip, "
        "random, huge, spike) instead of their model (samples count the honest nodes only)",
    )
    p.add_argument("--out", type=Path, default=Path("murmur-sim"), metavar="DIR", help="output dir")
    p.add_argument("--quiet", action="store_true", help="no progress")
    _add_gossip_flags(p, suppress=False)
    p.set_defaults(func=_cmd_simulate)


def _gossip_config(args: argparse.Namespace) -> GossipConfig:
    """The gossip flags given (``gossip.*`` destinations), checked by the settings schema."""
    from node.config import gossip_config

    given = {
        k.removeprefix("gossip."): v
        for k, v in vars(args).items()
        if k.startswith("gossip.") and v is not None
    }
    return gossip_config(given)


def _cmd_simulate(args: argparse.Namespace) -> int:
    from node.extras import MissingExtra, require

    try:
        require("matplotlib", "plots", "murmur simulate")
    except MissingExtra as err:
        print(f"murmur simulate: {err}", file=sys.stderr)
        return 2
    import torch

    from gossip.swim import SwimConfig
    from node.sim.config import ChurnConfig, NetConfig, PartitionConfig, SimConfig
    from node.sim.run import run_simulation

    try:
        gossip = _gossip_config(args)
        churn = (
            ChurnConfig.replacing(args.churn)
            if args.churn is not None
            else ChurnConfig(args.leave_rate, args.crash_rate, args.join_rate)
        )
        cfg = SimConfig(
            nodes=args.nodes,
            task=args.task,
            alpha=None if args.iid else args.alpha,
            seed=args.seed,
            independent_init=args.independent_init,
            step_time_s=args.step_time,
            stragglers=args.stragglers,
            straggler_slowdown=args.straggler_slowdown,
            speed_spread=args.speed_spread,
            steps=args.steps,
            duration_s=args.duration,
            eval_every_s=args.eval_every,
            consensus_threshold=args.consensus_threshold,
            target_accuracy=args.target_accuracy,
            target_loss=args.target_loss,
            attackers=args.attackers,
            gossip=gossip,
            membership=SwimConfig(period_s=args.swim_period),
            net=NetConfig(
                tuple(args.latency),
                args.bandwidth * 1e6 / 8,
                args.loss,
                PartitionConfig.parse(args.partition) if args.partition else None,
            ),
            churn=churn,
        )
    except ValueError as err:
        print(f"murmur simulate: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # thousands of tiny models: intra-op threads only contend
    run_simulation(cfg, args.out, None if args.quiet else sys.stdout)
    return 0


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


async def _serve(cfg: NodeConfig) -> int:
    """Run the node until a signal; a signal at any moment (loading, joining, waiting for
    members, pulling the model, training, writing a checkpoint) stops it within moments.

    Exit codes: 0 after a clean stop, 1 when the node failed while running, 2 when it could not
    start (no device, task or certificate; refused by the swarm; nobody answered).
    """
    from node.daemon.node import JoinError, Node

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.warning("%s again: already stopping", sig.name)
        else:
            log.info("%s: stopping", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    stopped = asyncio.create_task(stop.wait())

    async def until_stopped(work: asyncio.Task[Any]) -> bool:
        """Wait for ``work`` or a signal; on a signal cancel ``work``. True if it finished."""
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return True
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False

    creating = asyncio.create_task(Node.create(cfg))
    try:
        if not await until_stopped(creating):
            return 0
        node = creating.result()
    except (ValueError, OSError) as err:  # no device, task or certificate to be had
        print(f"murmur run: {err}", file=sys.stderr)
        return 2
    starting = asyncio.create_task(node.start())
    try:
        if not await until_stopped(starting):
            await node.stop()
            return 0
        starting.result()
    except (JoinError, OSError) as err:
        log.error("%s", err)
        await node.stop()
        return 2
    # One machine-readable line on stdout says the node is up (murmur swarm reads it).
    ready: dict[str, str | int] = {
        "event": "ready",
        "node_id": node.node_id,
        "address": node.address,
    }
    if node.metrics_server is not None:
        ready["metrics_port"] = node.metrics_server.port
    print(json.dumps(ready), flush=True)

    async def announce_trained() -> None:
        await node.training_finished.wait()
        if node.trainer.error is not None:  # it failed (diverged, say): nothing was trained
            return
        ev = node.trainer.last_eval
        print(
            json.dumps(
                {
                    "event": "trained",
                    "step": node.trainer.step,
                    "accuracy": ev.accuracy if ev else None,
                }
            ),
            flush=True,
        )

    announcer = asyncio.create_task(announce_trained())
    failed = asyncio.create_task(node.wait_failed())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    for t in (stopped, failed, announcer):
        t.cancel()
    await node.stop()
    if node.failure is not None:
        log.error("stopped because of an error: %s", node.failure)
        return 1
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _cmd_run(args: argparse.Namespace) -> int:
    # Until the event loop takes the signals over (first thing in _serve), SIGTERM interrupts
    # as SIGINT does: nothing has started that needs stopping.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        try:
            cfg = build_node_config(args)
        except SettingsError as err:
            print(f"murmur run: {err}", file=sys.stderr)
            return 2
        return asyncio.run(_serve(cfg))
    except KeyboardInterrupt:
        log.info("stopped before the node started")
        return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from node.security.pki import load_tls
    from node.telemetry.status import format_status, status_to_json
    from node.transport.base import HandshakeFailed, Rejected, Unreachable
    from node.transport.grpc import GrpcTransport, GrpcTransportConfig

    if args.insecure == (args.tls_dir is not None):
        print(
            "murmur status: give --tls-dir DIR (a certificate of the swarm) or --insecure",
            file=sys.stderr,
        )
        return 2
    try:
        tls = None if args.insecure else load_tls(args.tls_dir)
    except (ValueError, OSError) as err:
        print(f"murmur status: {err}", file=sys.stderr)
        return 2

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
            print(f"murmur status: {said}", file=sys.stderr)
            return 1
        except (Unreachable, Rejected) as err:
            print(f"murmur status: {err}", file=sys.stderr)
            return 1
        finally:
            await transport.close(0)
        print(status_to_json(status) if args.json else format_status(status))
        return 0

    return asyncio.run(ask())


def _cmd_swarm(args: argparse.Namespace) -> int:
    from node.extras import MissingExtra, require

    try:
        require("matplotlib", "plots", "murmur swarm (its report)")
    except MissingExtra as err:
        print(f"murmur swarm: {err}", file=sys.stderr)
        return 2
    from node.cli.swarm import SwarmConfig, run_swarm

    try:
        gossip = _gossip_config(args)
        cfg = SwarmConfig(
            nodes=args.nodes,
            steps=args.steps,
            duration_s=args.duration,
            task=args.task,
            alpha=None if args.iid else args.alpha,
            seed=args.seed,
            device=args.device,
            eval_every=args.eval_every,
            settle_rounds=args.settle_rounds,
            workdir=args.workdir,
            baseline=not args.no_baseline,
            insecure=args.insecure,
            progress=not args.quiet,
            gossip=gossip,
        )
    except ValueError as err:
        print(f"murmur swarm: {err}", file=sys.stderr)
        return 2
    return asyncio.run(run_swarm(cfg))


def _cmd_report(args: argparse.Namespace) -> int:
    from node.extras import MissingExtra, require

    try:
        require("matplotlib", "plots", "murmur report")
    except MissingExtra as err:
        print(f"murmur report: {err}", file=sys.stderr)
        return 2
    from node.cli.report import default_out_dir, write_report

    missing = [str(d) for d in args.state_dirs if not d.is_dir()]
    if missing:
        print(f"murmur report: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        path = write_report(args.state_dirs, args.out or default_out_dir(args.state_dirs))
    except (ValueError, OSError) as err:
        print(f"murmur report: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def _cmd_monitor(args: argparse.Namespace) -> int:
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
        print(f"murmur monitor: {err}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: a clean exit 0
    try:
        return asyncio.run(run_monitor(cfg))
    except KeyboardInterrupt:
        return 0


def _add_ca_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "ca",
        parents=[common],
        formatter_class=_Formatter,
        help="make a swarm CA and issue node certificates for mutual TLS",
    )
    ca = p.add_subparsers(dest="ca_command", required=True)
    init = ca.add_parser(
        "init",
        parents=[common],
        formatter_class=_Formatter,
        help="make a CA: DIR/ca_key.pem (mode 0600) and DIR/ca_cert.pem",
    )
    init.add_argument("dir", type=Path, metavar="DIR")
    init.add_argument("--name", default="murmur swarm", metavar="NAME", help="the CA's common name")
    init.set_defaults(func=_cmd_ca_init)
    issue = ca.add_parser(
        "issue",
        parents=[common],
        formatter_class=_Formatter,
        help="issue a node certificate (keeps the node key, and id, already in OUT)",
    )
    issue.add_argument("dir", type=Path, metavar="DIR", help="the CA dir")
    issue.add_argument("name", metavar="NAME", help="a label for the node")
    issue.add_argument(
        "--out", type=Path, metavar="OUT", help="the node's state dir (default: DIR/NAME)"
    )
    issue.add_argument("--days", type=int, default=365, metavar="N", help="validity in days")
    issue.set_defaults(func=_cmd_ca_issue)
    revoke = ca.add_parser(
        "revoke",
        parents=[common],
        formatter_class=_Formatter,
        help="revoke nodes: a new signed DIR/revoked.json to drop into any node's dir",
    )
    revoke.add_argument("dir", type=Path, metavar="DIR", help="the CA dir")
    revoke.add_argument(
        "node_ids",
        nargs="+",
        metavar="NODE_ID",
        help="a node id, or the first characters (at least 4) of one this CA issued",
    )
    revoke.set_defaults(func=_cmd_ca_revoke)


def _cmd_ca_init(args: argparse.Namespace) -> int:
    from node.security.pki import CA_CERT_FILE, CA_KEY_FILE, init_ca

    try:
        init_ca(args.dir, name=args.name)
    except (ValueError, OSError) as err:
        print(f"murmur ca init: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.dir / CA_KEY_FILE} (mode 0600, keep it secret) and {args.dir / CA_CERT_FILE}"
    )
    return 0


def _cmd_ca_issue(args: argparse.Namespace) -> int:
    from node.security.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE, issue_node

    if args.out is None and (args.name in ("", ".", "..") or "/" in args.name):
        print(f"murmur ca issue: {args.name!r} cannot name a dir; give --out", file=sys.stderr)
        return 2
    out: Path = args.out if args.out is not None else args.dir / args.name
    had_key = (out / KEY_FILE).exists()
    try:
        node_id = issue_node(args.dir, out, args.name, days=args.days)
    except (ValueError, OSError) as err:
        print(f"murmur ca issue: {err}", file=sys.stderr)
        return 2
    key = f"{out / KEY_FILE} ({'kept' if had_key else 'new'}, mode 0600)"
    print(f"wrote {out / CERT_FILE} and {out / CA_CERT_FILE}; key {key}")
    print(f"node id {node_id}")
    return 0


def _cmd_ca_revoke(args: argparse.Namespace) -> int:
    from node.security.pki import issued_nodes, resolve_node_id
    from node.security.revocation import REVOKED_FILE, revoke

    try:
        ids = [resolve_node_id(args.dir, i) for i in args.node_ids]
        revocations = revoke(args.dir, ids)
        issued = issued_nodes(args.dir)
    except (ValueError, OSError) as err:
        print(f"murmur ca revoke: {err}", file=sys.stderr)
        return 2
    for node_id in ids:
        name = issued.get(node_id, {}).get("name")
        print(f"revoked {node_id}" + (f" ({name})" if name else " (not issued by this CA)"))
    print(
        f"wrote {args.dir / REVOKED_FILE} (version {revocations.version}, "
        f"{len(revocations.node_ids)} node(s)); copy it into any live node's state dir: "
        "the swarm passes it on"
    )
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("murmur")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _common_options(top: bool) -> argparse.ArgumentParser:
    """Options every command takes, before or after the command's name."""
    p = argparse.ArgumentParser(add_help=False)
    d = argparse.SUPPRESS  # set after the command, they must not reset what came before it
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO" if top else d,
        help="how much to log (default: INFO)",
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text" if top else d,
        help="text, or one JSON object per line for log shippers (default: text)",
    )
    return p


def make_parser() -> argparse.ArgumentParser:
    """The ``murmur`` command line (for :func:`main`, and for checking a command line)."""
    parser = argparse.ArgumentParser(
        prog="murmur",
        description="Peer-to-peer training by compressed gossip.",
        epilog=EXAMPLES,
        formatter_class=_Formatter,
        parents=[_common_options(top=True)],
    )
    parser.add_argument("--version", action="version", version=f"murmur {_version()}")
    common = _common_options(top=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run_parser(sub, common)
    _add_swarm_parser(sub, common)
    _add_simulate_parser(sub, common)
    _add_status_parser(sub, common)
    _add_report_parser(sub, common)
    _add_monitor_parser(sub, common)
    _add_ca_parser(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    quiet_grpc()  # before anything imports grpc
    args = make_parser().parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
