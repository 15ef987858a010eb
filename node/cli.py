"""The ``murmur`` command: run a node, run a local swarm, ask a node for its status."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from gossip.codecs import CODECS
from gossip.swim import SwimConfig
from gossip.topology import TOPOLOGIES
from node.config import ATTACKS, GossipConfig, NodeConfig, load_config_file
from node.node import JoinError, Node
from node.status import format_status, status_to_json
from node.trainer import TrainerConfig
from node.transport.base import Rejected, Unreachable

__all__ = ["build_node_config", "main", "make_parser"]

log = logging.getLogger("murmur")


TASK_HELP = (
    "digits, logistic, mnist1d, text, module:factory or file.py:factory; "
    "options after a colon: text:size=10m,seq_len=256"
)


def _shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"shard {text!r} is not i/n") from None
    if not sep or not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"shard {text!r}: need 0 <= i < n")
    return i, n


def _add_gossip_flags(p: argparse.ArgumentParser, suppress: bool) -> None:
    d = argparse.SUPPRESS if suppress else None
    p.add_argument("--topology", dest="gossip.topology", choices=TOPOLOGIES, default=d)
    p.add_argument(
        "--degree",
        dest="gossip.degree",
        type=int,
        default=d,
        help="neighbours per node for random-regular",
    )
    p.add_argument(
        "--compress",
        dest="gossip.codec",
        choices=["none", *CODECS],
        default=d,
        help="codec for model deltas (default int8)",
    )
    p.add_argument("--block-size", dest="gossip.block_size", type=int, default=d)
    p.add_argument(
        "--gamma",
        dest="gossip.gamma",
        type=float,
        default=d,
        help="consensus step size (default by codec)",
    )
    p.add_argument(
        "--local-steps",
        dest="gossip.local_steps",
        type=int,
        default=d,
        help="local steps between gossip rounds",
    )
    p.add_argument(
        "--outer-lr",
        dest="gossip.outer_lr",
        type=float,
        default=d,
        help="DiLoCo-style outer Nesterov step on each round's change (e.g. 0.7; default off)",
    )
    p.add_argument(
        "--outer-momentum",
        dest="gossip.outer_momentum",
        type=float,
        default=d,
        help="momentum of the outer step (0.9)",
    )
    p.add_argument(
        "--robust",
        dest="gossip.robust",
        action="store_true",
        default=d,
        help="Byzantine-robust mixing (ClippedGossip) and eviction of anomalous neighbours",
    )
    p.add_argument(
        "--byzantine-fraction",
        dest="gossip.byzantine_fraction",
        type=float,
        default=d,
        help="with --robust: share of neighbour weight assumed Byzantine (default 0.25)",
    )
    # For testing robustness only (under `murmur swarm`, only the last node attacks).
    p.add_argument(
        "--attack", dest="gossip.attack", choices=ATTACKS, default=d, help=argparse.SUPPRESS
    )


def _add_run_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run one node until SIGTERM or SIGINT")
    s = argparse.SUPPRESS  # unset flags fall back to the config file, then to the defaults
    p.add_argument("--config", type=Path, help="TOML file; flags override its values")
    p.add_argument("--listen", default=s, help="host:port to serve on (default 127.0.0.1:7070)")
    p.add_argument("--advertise", default=s, help="host:port others should dial")
    p.add_argument(
        "--join",
        action="append",
        default=s,
        metavar="HOST:PORT",
        help="a node to join through (repeatable)",
    )
    p.add_argument("--state-dir", dest="state_dir", type=Path, default=s)
    p.add_argument("--device", default=s, help="auto, cpu, cuda[:N] or mps")
    p.add_argument("--task", default=s, help=TASK_HELP)
    p.add_argument("--shard", type=_shard, default=s, metavar="I/N")
    p.add_argument(
        "--alpha", type=float, default=s, help="Dirichlet alpha for non-iid shards (default: iid)"
    )
    p.add_argument("--seed", type=int, default=s)
    p.add_argument("--threads", type=int, default=s, help="torch intra-op threads")
    p.add_argument(
        "--wait-members",
        dest="wait_members",
        type=int,
        default=s,
        help="start training once this many members are known",
    )
    p.add_argument("--wait-timeout", dest="wait_timeout_s", type=float, default=s)
    p.add_argument(
        "--checkpoint-interval",
        dest="checkpoint_interval_s",
        type=float,
        default=s,
        help="seconds between checkpoints (default 30)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=s,
        help="plain TCP, no TLS: no encryption, no authentication (trusted networks only)",
    )
    p.add_argument(
        "--tls-dir",
        dest="tls_dir",
        type=Path,
        default=s,
        help="node_key.pem, node_cert.pem and ca_cert.pem (default: the state dir)",
    )
    p.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        default=s,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off)",
    )
    p.add_argument(
        "--metrics-host",
        dest="metrics_host",
        default=s,
        help="address the metrics server binds (default 0.0.0.0)",
    )
    p.add_argument(
        "--swim-period",
        dest="membership.period_s",
        type=float,
        default=s,
        help="membership protocol period in seconds (default 1)",
    )
    p.add_argument(
        "--steps",
        dest="trainer.steps",
        type=int,
        default=s,
        help="local step budget (default: until stopped)",
    )
    p.add_argument("--eval-every", dest="trainer.eval_every", type=int, default=s)
    p.add_argument(
        "--slowdown",
        dest="trainer.slowdown",
        type=float,
        default=s,
        help="make every step X times as long (a straggler, for tests and benchmarks)",
    )
    p.add_argument(
        "--step-time",
        dest="trainer.step_time",
        type=float,
        default=s,
        metavar="SECONDS",
        help="emulate a device whose step takes at least this long (waits out the rest)",
    )
    _add_gossip_flags(p, suppress=True)
    _add_mqtt_flags(p)
    p.set_defaults(func=_cmd_run)


def _add_mqtt_flags(p: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    p.add_argument("--mqtt", default=s, metavar="URL", help="publish status to mqtt://host:port")
    p.add_argument(
        "--mqtt-discovery",
        dest="mqtt_discovery",
        action="store_true",
        default=s,
        help="announce this node on the broker and join the members announced there",
    )
    p.add_argument("--mqtt-prefix", dest="mqtt_prefix", default=s, help="topic prefix (murmur)")
    p.add_argument(
        "--mqtt-interval",
        dest="mqtt_interval_s",
        type=float,
        default=s,
        help="seconds between status messages (2)",
    )
    p.add_argument("--swarm", default=s, help="the swarm's name on the broker (default)")


def _add_monitor_parser(sub: Any) -> None:
    p = sub.add_parser("monitor", help="a live table of a swarm's nodes, from an MQTT broker")
    p.add_argument("--mqtt", required=True, metavar="URL", help="the broker: mqtt://host:port")
    p.add_argument("--swarm", default="default", help="the swarm's name on the broker")
    p.add_argument("--prefix", default="murmur", help="topic prefix")
    p.add_argument("--once", action="store_true", help="print once after --timeout and exit")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds --once listens (3)")
    p.add_argument("--json", action="store_true", help="the statuses as JSON")
    p.set_defaults(func=_cmd_monitor)


def _add_status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="show one node's view of the swarm")
    p.add_argument("address", help="host:port of a node")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument(
        "--tls-dir",
        type=Path,
        help="a certificate from the swarm's CA to ask with (murmur ca issue makes one)",
    )
    p.add_argument("--insecure", action="store_true", help="ask over plain TCP")
    p.set_defaults(func=_cmd_status)


def _add_report_parser(sub: Any) -> None:
    p = sub.add_parser("report", help="plot a run's metrics logs and summarise it in markdown")
    p.add_argument("state_dirs", nargs="+", type=Path, metavar="STATE_DIR")
    p.add_argument(
        "--out", type=Path, help="where run-report.md and plots/ go (the state dirs' parent)"
    )
    p.set_defaults(func=_cmd_report)


def _add_swarm_parser(sub: Any) -> None:
    p = sub.add_parser("swarm", help="run N real nodes on this machine and report")
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--steps", type=int, default=600, help="local steps per node")
    p.add_argument("--duration", type=float, help="stop after this many seconds in any case")
    p.add_argument("--task", default="digits", help=TASK_HELP)
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha (non-iid shards)")
    p.add_argument("--iid", action="store_true", help="iid shards instead of Dirichlet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument(
        "--settle-rounds",
        type=int,
        default=20,
        help="gossip rounds every node does after the last one finishes training",
    )
    p.add_argument("--workdir", type=Path, help="where state dirs and the report go")
    p.add_argument(
        "--no-baseline", action="store_true", help="skip training the single-process reference"
    )
    p.add_argument("--quiet", action="store_true", help="no live progress")
    p.add_argument(
        "--insecure", action="store_true", help="plain TCP between the nodes instead of mTLS"
    )
    _add_gossip_flags(p, suppress=False)
    p.set_defaults(func=_cmd_swarm)


def _add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a swarm of N nodes in one process on a discrete-event clock",
        description="The daemon's gossip core (codecs, replicas, mixing, topology, SWIM, link "
        "policy, trainer step) on a modelled network: latency, bandwidth, loss, stragglers "
        "and churn. Writes sim.jsonl and sim.png to --out. A node steps every --step-time "
        "simulated seconds and gossips at least --local-steps steps apart, when its links "
        "are not busy: the gossip period is about their product, or the links' round trip.",
    )
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--duration", type=float, default=60.0, help="simulated seconds (60)")
    p.add_argument("--task", default="logistic", help=f"{TASK_HELP} (logistic is the cheap one)")
    p.add_argument("--alpha", type=float, default=0.5, help="Dirichlet alpha (non-iid shards)")
    p.add_argument("--iid", action="store_true", help="iid shards instead of Dirichlet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--independent-init",
        action="store_true",
        help="every node starts from a model of its own (to measure consensus from afar)",
    )
    p.add_argument(
        "--step-time", type=float, default=0.02, help="simulated seconds per local step (0.02)"
    )
    p.add_argument("--steps", type=int, help="local step budget per node (default: no limit)")
    p.add_argument("--stragglers", type=float, default=0.0, help="fraction of slow nodes")
    p.add_argument("--straggler-slowdown", type=float, default=5.0, help="how much slower (5)")
    p.add_argument(
        "--speed-spread", type=float, default=0.0, help="sigma of a lognormal step-time factor"
    )
    p.add_argument(
        "--latency",
        type=float,
        nargs=2,
        default=(0.01, 0.05),
        metavar=("MIN", "MAX"),
        help="one-way delay of each link, uniform in [MIN, MAX] seconds (0.01 0.05)",
    )
    p.add_argument("--bandwidth", type=float, default=10.0, help="uplink Mbit/s per node (10)")
    p.add_argument("--loss", type=float, default=0.0, help="loss of deltas and SWIM messages")
    p.add_argument(
        "--churn",
        type=float,
        help="fraction of nodes replaced per simulated minute (half leave, half crash)",
    )
    p.add_argument("--leave-rate", type=float, default=0.0, help="fraction leaving per minute")
    p.add_argument("--crash-rate", type=float, default=0.0, help="fraction crashing per minute")
    p.add_argument("--join-rate", type=float, default=0.0, help="fraction joining per minute")
    p.add_argument("--swim-period", type=float, default=1.0, help="membership period (1 s)")
    p.add_argument(
        "--eval-every", type=float, default=2.0, help="simulated seconds between samples (2)"
    )
    p.add_argument(
        "--consensus-threshold",
        type=float,
        default=1e-2,
        help="relative consensus distance counted as consensus (0.01)",
    )
    p.add_argument("--target-accuracy", type=float, default=0.8)
    p.add_argument("--target-loss", type=float, help="for tasks judged by loss (the task's)")
    p.add_argument("--out", type=Path, default=Path("murmur-sim"), help="output dir")
    p.add_argument("--quiet", action="store_true", help="no progress")
    _add_gossip_flags(p, suppress=False)
    p.set_defaults(func=_cmd_simulate)


def _gossip_config(args: argparse.Namespace) -> GossipConfig:
    """The gossip flags given (``gossip.*`` destinations), over the defaults."""
    given = {
        k.removeprefix("gossip."): v
        for k, v in vars(args).items()
        if k.startswith("gossip.") and v is not None
    }
    return GossipConfig(**given)


def _cmd_simulate(args: argparse.Namespace) -> int:
    import torch

    from node.sim.config import ChurnConfig, NetConfig, SimConfig
    from node.sim.run import run_simulation

    try:
        gossip = _gossip_config(args)
        if gossip.robust or gossip.attack or gossip.outer_lr:
            raise ValueError("--robust, --attack and --outer-lr are not simulated yet")
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
            gossip=gossip,
            membership=SwimConfig(period_s=args.swim_period),
            net=NetConfig(tuple(args.latency), args.bandwidth * 1e6 / 8, args.loss),
            churn=churn,
        )
    except ValueError as err:
        print(f"murmur simulate: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # thousands of tiny models: intra-op threads only contend
    run_simulation(cfg, args.out, None if args.quiet else sys.stdout)
    return 0


def build_node_config(args: argparse.Namespace) -> NodeConfig:
    """Config file values, overridden by the flags that were given."""
    values: dict[str, Any] = load_config_file(args.config) if args.config else {}
    values.update(
        {k: v for k, v in vars(args).items() if k not in ("config", "func", "command", "log_level")}
    )
    if "shard" in values:
        values["shard_index"], values["shard_count"] = values.pop("shard")
    sections: dict[str, dict[str, Any]] = {"trainer": {}, "gossip": {}, "membership": {}}
    top: dict[str, Any] = {}
    for key, value in values.items():
        section, dot, name = key.partition(".")
        if dot:
            sections[section][name] = value
        else:
            top[key] = value
    if "join" in top:
        top["join"] = tuple(top["join"])
    for key in ("state_dir", "tls_dir"):
        if key in top:
            top[key] = Path(top[key])
    known = {f.name for f in fields(NodeConfig)}
    unknown = set(top) - known
    if unknown:
        raise ValueError(f"unknown settings: {', '.join(sorted(unknown))}")
    return NodeConfig(
        **top,
        trainer=TrainerConfig(**sections["trainer"]),
        gossip=GossipConfig(**sections["gossip"]),
        membership=SwimConfig(**sections["membership"]),
    )


async def _serve(cfg: NodeConfig) -> int:
    try:
        node = await Node.create(cfg)
    except (ValueError, OSError) as err:  # no device, task or certificate to be had
        print(f"murmur run: {err}", file=sys.stderr)
        return 2
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await node.start()
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
    stopped = asyncio.create_task(stop.wait())
    failed = asyncio.create_task(node.wait_failed())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    for t in (stopped, failed, announcer):
        t.cancel()
    await node.stop()
    if node.failure is not None:
        log.error("stopped because of an error: %s", node.failure)
        return 1
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = build_node_config(args)
    except (ValueError, TypeError, OSError) as err:
        print(f"murmur run: {err}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(cfg))


def _cmd_status(args: argparse.Namespace) -> int:
    from node.pki import load_tls
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
        except (Unreachable, Rejected) as err:
            print(f"murmur status: {err}", file=sys.stderr)
            return 1
        finally:
            await transport.close(0)
        print(status_to_json(status) if args.json else format_status(status))
        return 0

    return asyncio.run(ask())


def _cmd_swarm(args: argparse.Namespace) -> int:
    from node.swarm import SwarmConfig, run_swarm

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
    from node.report import default_out_dir, write_report

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
    from node.monitor import MonitorConfig, run_monitor
    from node.mqtt_messages import MqttConfig

    try:
        mqtt = MqttConfig(url=args.mqtt, swarm=args.swarm, prefix=args.prefix)
        cfg = MonitorConfig(mqtt, once=args.once, timeout_s=args.timeout, json=args.json)
    except ValueError as err:
        print(f"murmur monitor: {err}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_monitor(cfg))
    except KeyboardInterrupt:
        return 0


def _add_ca_parser(sub: Any) -> None:
    p = sub.add_parser("ca", help="make a swarm CA and issue node certificates for mutual TLS")
    ca = p.add_subparsers(dest="ca_command", required=True)
    init = ca.add_parser("init", help="make a CA: DIR/ca_key.pem (mode 0600) and DIR/ca_cert.pem")
    init.add_argument("dir", type=Path, metavar="DIR")
    init.add_argument("--name", default="murmur swarm", help="the CA's common name")
    init.set_defaults(func=_cmd_ca_init)
    issue = ca.add_parser(
        "issue", help="issue a node certificate (keeps the node key, and id, already in OUT)"
    )
    issue.add_argument("dir", type=Path, metavar="DIR", help="the CA dir")
    issue.add_argument("name", metavar="NAME", help="a label for the node")
    issue.add_argument("--out", type=Path, help="the node's state dir (DIR/NAME)")
    issue.add_argument("--days", type=int, default=365, help="validity in days (365)")
    issue.set_defaults(func=_cmd_ca_issue)
    revoke = ca.add_parser(
        "revoke", help="revoke nodes: a new signed DIR/revoked.json to drop into any node's dir"
    )
    revoke.add_argument("dir", type=Path, metavar="DIR", help="the CA dir")
    revoke.add_argument("node_ids", nargs="+", metavar="NODE_ID")
    revoke.set_defaults(func=_cmd_ca_revoke)


def _cmd_ca_init(args: argparse.Namespace) -> int:
    from node.pki import CA_CERT_FILE, CA_KEY_FILE, init_ca

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
    from node.pki import CA_CERT_FILE, CERT_FILE, KEY_FILE, issue_node

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
    from node.revocation import REVOKED_FILE, revoke

    try:
        revocations = revoke(args.dir, args.node_ids)
    except (ValueError, OSError) as err:
        print(f"murmur ca revoke: {err}", file=sys.stderr)
        return 2
    print(
        f"wrote {args.dir / REVOKED_FILE} (version {revocations.version}, "
        f"{len(revocations.node_ids)} node(s)); copy it into any live node's state dir: "
        "the swarm passes it on"
    )
    return 0


def make_parser() -> argparse.ArgumentParser:
    """The ``murmur`` command line (for :func:`main`, and for checking a command line)."""
    parser = argparse.ArgumentParser(
        prog="murmur", description="Peer-to-peer training by compressed gossip."
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run_parser(sub)
    _add_swarm_parser(sub)
    _add_simulate_parser(sub)
    _add_status_parser(sub)
    _add_report_parser(sub)
    _add_monitor_parser(sub)
    _add_ca_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    del args.log_level
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
