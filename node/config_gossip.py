"""Configuration of a node's gossip: :class:`GossipConfig`, the consensus step size γ by codec
(:data:`DEFAULT_GAMMA`, :data:`SPARSE_GAMMA_PER_SHARE`), and :func:`gossip_config`, which builds
one from gossip flags. :mod:`node.config` re-exports these names.

Users' settings (file, environment, flags) are checked by the schema in :mod:`node.settings`
first; the checks here guard the dataclass that code builds directly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gossip.budget import BudgetConfig
from gossip.codecs import AUTO_CODECS, CODECS, DEFAULT_FRACTION, AutoCodec, Codec, get_codec
from gossip.robust import ATTACKS  # test-only attacks (GossipConfig.attack)
from gossip.schedules import SCHEDULES, ScheduleConfig
from gossip.swim_messages import check_region
from gossip.topology import TOPOLOGIES
from gossip.trigger import TriggerConfig
from node.daemon.pacing import MIN_UPLOAD_RATE
from node.settings import FLAG_KEYS
from node.settings_sources import load_settings

__all__ = [
    "DEFAULT_GAMMA",
    "PACES",
    "SPARSE_GAMMA_PER_SHARE",
    "GossipConfig",
    "gossip_config",
]

_FLAG_OF = {key.removeprefix("gossip."): flag for flag, key in FLAG_KEYS.items()}

#: The sparse codecs' γ as a multiple of the share k / B of each block they send: the best γ
#: grows in proportion to it, and random-k's, whose error waits B / k rounds on average to be
#: sent, is a quarter of top-k's (bench/codec_gamma.py, bench/RESULTS.md).
SPARSE_GAMMA_PER_SHARE = {"topk": 1.5, "randk": 0.375, "dct-topk": 1.5}

#: Consensus step size by codec: harsher compression needs a smaller γ (Koloskova et al. 2019).
#: The sparse codecs' entries are for the default fraction and block size (1.17% sent).
#: Sign's 0.3 is tuned for training from one starting model, murmur's case: behind 20 Mbit/s
#: links its worst node reached the target 3 times sooner than at 0.1 (the best γ for pure gossip
#: from independent starts, which 0.3 averages in 1.25-1.3 times the rounds; bench/RESULTS.md).
DEFAULT_GAMMA = {
    "fp32": 1.0,
    "fp16": 1.0,
    "int8": 0.8,
    "int4": 0.5,
    "sign": 0.3,
    **{name: m * round(DEFAULT_FRACTION * 256) / 256 for name, m in SPARSE_GAMMA_PER_SHARE.items()},
}


#: How a node paces its links (GossipConfig ``pace``).
PACES = ("node", "link")


@dataclass(frozen=True)
class GossipConfig:
    """Args:
    topology: auto (exponential up to 64 members, expander above: gossip/topology.py
        ``resolved``), ring, exponential, expander, random-regular or regional, over the known
        node ids; or a time-varying schedule over the exponential graph's links
        (gossip/schedules.py): one-peer-exponential (each round to the links at ±2^k, k
        cycling) or epidemic (each round to ``fanout`` links drawn afresh); both need ``pace``
        link.
    fanout: with epidemic, the links each round goes to.
    bridge_codec: the codec of the links between regions (fp16, int8, int4 or sign), the
        others keeping ``codec``; every delta then names its codec, as under ``auto`` (whose
        codec set the swarm then shares). With ``codec`` auto, the links inside regions send
        int8. None: one codec. Needs ``pace`` link.
    bridge_period: a link between regions carries a delta in at most one of every this many
        of the node's rounds (1: every round). Needs ``pace`` link when above 1.
    degree: neighbours per node for random-regular; bridges between each two regions for
        regional.
    region: this node's region, in its signed member record (regional keeps most edges inside
        a region and ``degree`` across between each two); empty: none.
    codec: fp32 (alias none), fp16, int8, int4, sign, topk, randk or dct-topk; or ``auto``:
        the default: among fp16, int8, int4 and sign, the codec of fewest bytes within 15% of
        the most progress per second at the links' measured pace (gossip/codec_choice.py),
        one per link with ``pace`` link, else one per round scored by the slowest link; each
        pair of codecs mixes at the smaller default γ of the two.
    block_size: values per quantization scale (per top-k selection, for the sparse codecs).
    compress_fraction: share of each block the sparse codecs send (topk, randk, dct-topk).
    gamma: consensus step size; None picks :data:`DEFAULT_GAMMA` for the codec (for a sparse
        codec, :data:`SPARSE_GAMMA_PER_SHARE` times the share of each block it sends).
    local_steps: local training steps between gossip rounds (H): the least; more when the
        links are still busy with the last round.
    max_local_steps: the most local steps between two rounds: a trainer that gets there
        waits until its links take the next round. None: no bound (a fast device on a slow
        link takes as many steps as its links leave it time for).
    idle_round_interval_s: how often to consider a round once local training is over; None:
        no rounds then (a node that only serves its model).
    trigger: make a round only when it is worth its bytes (gossip/trigger.py): the unsent
        change or the neighbours' news exceeds ``trigger_threshold`` of the model's recent
        movement, or ``heartbeat_s`` passed; False: every round the pacing allows (as before).
    trigger_threshold: that fraction.
    heartbeat_s: the slowest a node gossips with the trigger (at most 0.4 of
        ``silence_limit_s``).
    link_queue: deltas queued per neighbour; past that the link resyncs with a snapshot.
    link_window_s: seconds of a link's measured pace that may wait in line on it before it
        holds up rounds (gossip/outbox.py; ``window_s``).
    silence_limit_s: a neighbour silent this long leaves the mix until it speaks again.
    call_timeout_s: deadline of each call to a peer.
    seed: seeds random-regular graphs (every node must use the same).
    robust: Byzantine-robust mixing: ClippedGossip (gossip/robust.py) and eviction of
        neighbours whose deltas look anomalous.
    byzantine_fraction: with ``robust``, the share of a node's neighbour weight assumed
        Byzantine; at least that much of the farthest neighbours' pull is clipped.
    attack: for testing robustness only: this node publishes harmful but valid deltas
        (``scale``: 10·x, ``flip``: -x, ``random``: x plus unit Gaussian noise) and does not mix.
    outer_lr: DiLoCo-style outer Nesterov step on each round's change of the model, with this
        learning rate (gossip/outer.py); None: off.
    outer_momentum: its Nesterov momentum.
    max_upload_rate: bytes per second the node sends at most, on all its links together and
        with protocol overhead (node/daemon/pacing.py); None: no cap.
    byte_budget: (bytes, seconds): what the node may send per period, spread over it, and
        heartbeats only once spent (gossip/budget.py); None: no budget. Needs the trigger.
    pace: ``node``: one public copy, one delta per round for every link, and a round waits
        until no healthy link still carries the last; ``link``: a public copy per link
        (gossip/replicas.py ``per_link``), so each link carries rounds at its own pace and a
        slow neighbour slows only its own link, for a copy of the model per link in memory.
        Plain mixing only (not with ``robust``).
    """

    topology: str = "auto"
    degree: int = 4
    fanout: int = ScheduleConfig.fanout
    bridge_codec: str | None = None
    bridge_period: int = 1
    region: str = ""
    codec: str = "auto"
    block_size: int = 256
    compress_fraction: float = DEFAULT_FRACTION  # CHOCO-SGD's top-1%; an index fits a byte
    gamma: float | None = None
    local_steps: int = 1
    max_local_steps: int | None = None
    idle_round_interval_s: float | None = 0.1
    trigger: bool = True
    trigger_threshold: float = TriggerConfig.threshold
    heartbeat_s: float = TriggerConfig.heartbeat_s
    link_queue: int = 16
    link_window_s: float = 0.5
    silence_limit_s: float = 30.0
    call_timeout_s: float = 10.0
    seed: int = 0
    robust: bool = False
    byzantine_fraction: float = 0.25
    attack: str | None = None
    outer_lr: float | None = None
    outer_momentum: float = 0.9
    max_upload_rate: float | None = None
    byte_budget: tuple[int, float] | None = None
    pace: str = "node"

    def __post_init__(self) -> None:
        if self.pace not in PACES:
            raise ValueError(f"unknown pace {self.pace!r}; known: {', '.join(PACES)}")
        if self.pace == "link" and (self.robust or self.attack is not None):
            raise ValueError(
                "--pace link mixes with plain CHOCO only: robust mixing scores one public "
                "copy per node; leave --robust off or use --pace node"
            )
        if self.idle_round_interval_s is not None and self.idle_round_interval_s <= 0:
            raise ValueError("idle_round_interval_s must be positive (None: no idle rounds)")
        if self.outer_lr is not None and self.outer_lr <= 0:
            raise ValueError(f"outer_lr must be positive, got {self.outer_lr}")
        if not 0 <= self.outer_momentum < 1:
            raise ValueError(f"outer_momentum must be in [0, 1), got {self.outer_momentum}")
        codec = "fp32" if self.codec == "none" else self.codec
        if codec not in CODECS and codec != AutoCodec.name:
            known = ", ".join([*CODECS, AutoCodec.name])
            raise ValueError(f"unknown codec {self.codec!r}; known: none, {known}")
        object.__setattr__(self, "codec", codec)
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"unknown topology {self.topology!r}; known: {', '.join(TOPOLOGIES)}")
        if self.topology in SCHEDULES and self.pace != "link":
            raise ValueError(
                f"--topology {self.topology} sends each round to some links only, which needs "
                "a copy of the model per link: add --pace link"
            )
        if self.fanout < 1:
            raise ValueError(f"fanout must be at least 1, got {self.fanout}")
        if self.bridge_period < 1:
            raise ValueError(f"bridge_period must be at least 1, got {self.bridge_period}")
        if (self.bridge_codec is not None or self.bridge_period > 1) and self.pace != "link":
            raise ValueError(
                "a codec or a period of their own for the links between regions needs a copy "
                "of the model per link: add --pace link"
            )
        if self.bridge_codec is not None and codec == AutoCodec.name:
            # A bridge codec fixes the links between regions; auto, the default, then leaves
            # the links inside regions on int8, as they were before auto was the default.
            object.__setattr__(self, "codec", "int8")
        if self.bridge_codec is not None and not (
            self.bridge_codec in AUTO_CODECS and self.codec in AUTO_CODECS
        ):
            raise ValueError(
                f"--bridge-compress {self.bridge_codec} with --compress {self.codec}: both "
                f"must be one of {', '.join(AUTO_CODECS)} (the codecs a delta may name)"
            )
        check_region(self.region)
        if self.gamma is not None and not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if self.local_steps < 1:
            raise ValueError("local_steps must be at least 1")
        if self.max_local_steps is not None and self.max_local_steps < self.local_steps:
            raise ValueError(
                f"max_local_steps ({self.max_local_steps}) must be at least local_steps "
                f"({self.local_steps})"
            )
        if self.block_size <= 0 or self.block_size % 8:
            raise ValueError("block_size must be a positive multiple of 8")
        if codec in CODECS:
            CODECS[codec].make(self.block_size, self.compress_fraction)  # raises on what it refuses
        if not 0 <= self.byzantine_fraction < 1:
            raise ValueError("byzantine_fraction must be in [0, 1)")
        if self.attack is not None and self.attack not in ATTACKS:
            raise ValueError(f"unknown attack {self.attack!r}; known: {', '.join(ATTACKS)}")
        TriggerConfig(self.trigger_threshold, self.heartbeat_s)  # raises on values it refuses
        if self.max_upload_rate is not None and self.max_upload_rate < MIN_UPLOAD_RATE:
            raise ValueError(
                f"max_upload_rate must be at least {MIN_UPLOAD_RATE} bytes/s (membership alone "
                f"needs a few kB/s), got {self.max_upload_rate:g}"
            )
        if self.byte_budget is not None:
            self.budget_config  # raises on values it refuses  # noqa: B018
            if not self.trigger:
                raise ValueError(
                    "a byte budget needs the trigger (once spent, the node makes only its "
                    "heartbeat rounds): leave --no-trigger off"
                )

    @property
    def budget_config(self) -> BudgetConfig | None:
        """The byte budget's settings; None without a budget."""
        if self.byte_budget is None:
            return None
        nbytes, period_s = self.byte_budget
        return BudgetConfig(int(nbytes), float(period_s))

    @property
    def schedule_config(self) -> ScheduleConfig | None:
        """The time-varying schedule over the links for the Mixer; None for a static graph."""
        if self.topology not in SCHEDULES:
            return None
        return ScheduleConfig(self.topology, self.fanout, self.seed)

    @property
    def trigger_config(self) -> TriggerConfig | None:
        """The event-triggered rule's settings for the Mixer; None with the trigger off."""
        if not self.trigger:
            return None
        return TriggerConfig(self.trigger_threshold, self.heartbeat_s)

    @property
    def link_gamma(self) -> dict[str, float] | None:
        """With ``auto`` or a bridge codec and no γ given, the γ of each codec a link may
        send with; None otherwise (one γ, :attr:`step_size`, for every link)."""
        if self.gamma is not None:
            return None
        if self.codec == AutoCodec.name:
            return {c: DEFAULT_GAMMA[c] for c in AUTO_CODECS}
        if self.bridge_codec is not None:
            return {c: DEFAULT_GAMMA[c] for c in (self.codec, self.bridge_codec)}
        return None

    def swarm_codec(self) -> Codec:
        """The codec the swarm shares (its name is in the task fingerprint): ``codec``, or
        with a bridge codec auto's set, starting every link on ``codec``."""
        if self.bridge_codec is not None:
            return AutoCodec(self.block_size, initial=self.codec)
        return get_codec(self.codec, self.block_size, self.compress_fraction)

    @property
    def step_size(self) -> float:
        """γ: as given, or the codec's default (for a sparse codec, in proportion to its share)."""
        if self.gamma is not None:
            return self.gamma
        if self.codec == AutoCodec.name or self.bridge_codec is not None:
            return 1.0  # each link's γ is its codecs' (link_gamma)
        if self.codec in SPARSE_GAMMA_PER_SHARE:
            k = round(self.compress_fraction * self.block_size)
            return min(1.0, SPARSE_GAMMA_PER_SHARE[self.codec] * k / self.block_size)
        return DEFAULT_GAMMA[self.codec]


def gossip_config(given: dict[str, Any]) -> GossipConfig:
    """A :class:`GossipConfig` from gossip flags (strings, by field name), checked by the
    schema that ``murmur run`` uses (for ``murmur swarm`` and ``murmur simulate``).

    Raises:
        SettingsError: a value was refused.
    """
    labels = {k: "--" + _FLAG_OF.get(k, k.replace("_", "-")) for k in given}
    settings = load_settings(
        environ={}, flags={f"gossip.{k}": v for k, v in given.items()}, flag_labels=labels
    )
    return GossipConfig(**settings.gossip.model_dump())
