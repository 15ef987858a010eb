"""What the ``murmur`` commands share: the help formatter, the options every command takes, the
gossip flags of ``run``, ``swarm`` and ``simulate``, and the one way a command says it failed."""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from node import settings
from node.settings import ATTACKS, BRIDGE_CODEC_NAMES, CODEC_NAMES, TOPOLOGY_NAMES
from node.telemetry.logs import LOG_FORMATS, LOG_LEVELS

if TYPE_CHECKING:  # the commands import what they need, so that --help need not load torch
    from node.config import GossipConfig

__all__ = [
    "TASK_HELP",
    "HelpFormatter",
    "add_gossip_flags",
    "add_regions_flag",
    "common_options",
    "fail",
    "flag_help",
    "gossip_config",
    "lacks_extra",
    "sigterm_interrupts",
]

TASK_HELP = (
    "digits, logistic, mnist1d, text, module:factory or file.py:factory; "
    "options after a colon: text:size=10m,seq_len=256"
)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
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


#: --gamma's default as its help says it: node/config_gossip.py's DEFAULT_GAMMA (that module
#: imports the gossip core, which the light commands must not; a test keeps the two alike).
GAMMA_DEFAULTS_HELP = "by codec: 1.0 fp32/fp16, 0.8 int8, 0.5 int4, 0.3 sign"


def flag_help(key: str, text: str | None = None, default: str | None = None) -> str:
    """A run flag's help: the schema's description of ``key`` and its default, one way for all."""
    shown = default if default is not None else _default_text(settings.default_of(key))
    return f"{text or settings.description_of(key)} (default: {shown})"


def common_options(top: bool) -> argparse.ArgumentParser:
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


def add_gossip_flags(p: argparse.ArgumentParser, suppress: bool) -> None:
    """The gossip settings as flags (``gossip.*`` destinations); ``suppress`` leaves unset ones
    out of the namespace, so that ``murmur run`` falls back to its file and environment."""
    # Values stay strings here: the settings schema parses and checks them (node/settings.py).
    d = argparse.SUPPRESS if suppress else None
    p.add_argument(
        "--topology",
        dest="gossip.topology",
        choices=TOPOLOGY_NAMES,
        default=d,
        help=flag_help("gossip.topology"),
    )
    p.add_argument(
        "--degree", dest="gossip.degree", metavar="K", default=d, help=flag_help("gossip.degree")
    )
    p.add_argument(
        "--fanout", dest="gossip.fanout", metavar="S", default=d, help=flag_help("gossip.fanout")
    )
    p.add_argument(
        "--bridge-compress",
        dest="gossip.bridge_codec",
        choices=BRIDGE_CODEC_NAMES,
        default=d,
        help=flag_help("gossip.bridge_codec"),
    )
    p.add_argument(
        "--bridge-period",
        dest="gossip.bridge_period",
        metavar="P",
        default=d,
        help=flag_help("gossip.bridge_period"),
    )
    p.add_argument(
        "--compress",
        dest="gossip.codec",
        choices=CODEC_NAMES,
        default=d,
        help=flag_help("gossip.codec", "codec of the model deltas (none is fp32)"),
    )
    p.add_argument(
        "--block-size",
        dest="gossip.block_size",
        metavar="B",
        default=d,
        help=flag_help("gossip.block_size", "values per quantization scale, a multiple of 8"),
    )
    p.add_argument(
        "--compress-fraction",
        dest="gossip.compress_fraction",
        metavar="F",
        default=d,
        help=flag_help("gossip.compress_fraction"),
    )
    p.add_argument(
        "--gamma",
        dest="gossip.gamma",
        metavar="G",
        default=d,
        help=flag_help(
            "gossip.gamma",
            "consensus step size, in (0, 1]",
            GAMMA_DEFAULTS_HELP,
        ),
    )
    p.add_argument(
        "--local-steps",
        dest="gossip.local_steps",
        metavar="H",
        default=d,
        help=flag_help("gossip.local_steps"),
    )
    p.add_argument(
        "--max-local-steps",
        dest="gossip.max_local_steps",
        metavar="H",
        default=d,
        help=flag_help("gossip.max_local_steps"),
    )
    p.add_argument(
        "--no-trigger",
        dest="gossip.trigger",
        action="store_false",
        default=d,
        help=flag_help(
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
        help=flag_help("gossip.trigger_threshold"),
    )
    p.add_argument(
        "--heartbeat",
        dest="gossip.heartbeat_s",
        metavar="S",
        default=d,
        help=flag_help("gossip.heartbeat_s"),
    )
    p.add_argument(
        "--max-upload-rate",
        dest="gossip.max_upload_rate",
        metavar="RATE",
        default=d,
        help=flag_help("gossip.max_upload_rate"),
    )
    p.add_argument(
        "--byte-budget",
        dest="gossip.byte_budget",
        metavar="BYTES/PERIOD",
        default=d,
        help=flag_help("gossip.byte_budget"),
    )
    p.add_argument(
        "--pace",
        dest="gossip.pace",
        choices=("node", "link"),
        default=d,
        help=flag_help("gossip.pace"),
    )
    p.add_argument(
        "--outer-lr",
        dest="gossip.outer_lr",
        metavar="LR",
        default=d,
        help=flag_help(
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
        help=flag_help("gossip.outer_momentum"),
    )
    p.add_argument(
        "--robust",
        dest="gossip.robust",
        action="store_true",
        default=d,
        help=flag_help(
            "gossip.robust",
            "Byzantine-robust mixing (ClippedGossip) and eviction of anomalous neighbours",
        ),
    )
    p.add_argument(
        "--byzantine-fraction",
        dest="gossip.byzantine_fraction",
        metavar="F",
        default=d,
        help=flag_help("gossip.byzantine_fraction"),
    )
    # For testing robustness only (under `murmur swarm`, only the last node attacks).
    p.add_argument(
        "--attack", dest="gossip.attack", choices=ATTACKS, default=d, help=argparse.SUPPRESS
    )


def add_regions_flag(p: argparse.ArgumentParser) -> None:
    """``--regions N``: the nodes split into N regions (``r0`` ..), contiguous blocks by index."""
    p.add_argument(
        "--regions",
        type=int,
        default=0,
        metavar="N",
        help="split the nodes into N regions (r0, r1, ..., contiguous by index), each node's "
        "--region; with --topology regional most edges stay inside one (default: none)",
    )


def gossip_config(args: argparse.Namespace) -> GossipConfig:
    """The gossip flags given (``gossip.*`` destinations), checked by the settings schema.

    Raises:
        SettingsError: a value was refused (node/settings.py says how); a ValueError.
    """
    from node.config import gossip_config as checked

    given = {
        k.removeprefix("gossip."): v
        for k, v in vars(args).items()
        if k.startswith("gossip.") and v is not None
    }
    return checked(given)


def fail(command: str, message: object, code: int = 2) -> int:
    """Say on stderr why ``murmur COMMAND`` stops, and give its exit code (2: it could not start,
    1: it failed while working)."""
    print(f"murmur {command}: {message}", file=sys.stderr)
    return code


def lacks_extra(command: str, module: str, extra: str, purpose: str | None = None) -> bool:
    """True, having said which ``pip install`` fixes it, when ``module`` is not installed."""
    from node.extras import MissingExtra, require

    try:
        require(module, extra, purpose or f"murmur {command}")
    except MissingExtra as err:
        fail(command, err)
        return True
    return False


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def sigterm_interrupts() -> None:
    """From now on SIGTERM raises KeyboardInterrupt, as SIGINT does: a clean stop, exit 0."""
    signal.signal(signal.SIGTERM, _interrupt)
