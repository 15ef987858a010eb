"""What a simulated swarm is: one frozen dataclass per component, as for the daemon."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gossip.swim import SwimConfig
from node.config import GossipConfig

__all__ = ["ChurnConfig", "NetConfig", "PartitionConfig", "SimConfig"]


@dataclass(frozen=True)
class PartitionConfig:
    """The network split into ``groups`` groups of nodes from ``at_s`` for ``for_s`` simulated
    seconds: the initial nodes by index into equal, contiguous groups (node ids are hashes, so
    each group is spread over the ring), joiners round robin. Between groups, deltas and
    membership messages are lost; calls (snapshots, pulls) wait until the partition ends."""

    at_s: float
    for_s: float
    groups: int = 2

    def __post_init__(self) -> None:
        if self.at_s < 0 or self.for_s <= 0 or self.groups < 2:
            raise ValueError("a partition needs at >= 0, a positive duration and 2+ groups")

    @classmethod
    def parse(cls, text: str) -> PartitionConfig:
        """``AT:FOR`` or ``AT:FOR:GROUPS`` (seconds, seconds, a count), as the CLI takes it."""
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            return cls(float(parts[0]), float(parts[1]), int(parts[2]) if parts[2:] else 2)
        except ValueError:
            raise ValueError(
                f"--partition {text!r}: expected AT:FOR[:GROUPS] (seconds, seconds, 2 or more "
                "groups), e.g. 30:30"
            ) from None


@dataclass(frozen=True)
class NetConfig:
    """The modelled network.

    Args:
        latency_s: (min, max): each link's one-way delay is fixed, uniform in this range.
        bandwidth_bps: every node's uplink in bytes per second (inf: unlimited).
        loss: probability that a delta or a membership message is lost. Snapshots, model
            pulls and acknowledgements are not: the transport retries calls until they land.
        partition: a split of the network for a while, if any.
        behind_nat: the share of the nodes that nobody can dial (node/sim/nat.py): they name
            relays, and the topology gives them only neighbours others can dial.
        regions: the nodes split into this many regions (gossip/topology.py
            ``block_region``), each node's ``--region``; 0: none.
        cross_region_slowdown: a message between two regions takes this many times the delay
            and this many times the uplink time of one inside a region.
    """

    latency_s: tuple[float, float] = (0.01, 0.05)
    bandwidth_bps: float = 1.25e6  # 10 Mbit/s
    loss: float = 0.0
    partition: PartitionConfig | None = None
    behind_nat: float = 0.0
    regions: int = 0
    cross_region_slowdown: float = 10.0

    def __post_init__(self) -> None:
        lo, hi = self.latency_s
        if not 0 <= lo <= hi:
            raise ValueError("latency needs 0 <= min <= max")
        if self.bandwidth_bps <= 0 or not 0 <= self.loss < 1:
            raise ValueError("bandwidth must be positive and loss in [0, 1)")
        if not 0 <= self.behind_nat < 1:
            raise ValueError("behind_nat is a share of the nodes, in [0, 1)")
        if self.regions < 0 or self.cross_region_slowdown < 1:
            raise ValueError("regions is a count (0: none); cross_region_slowdown at least 1")


@dataclass(frozen=True)
class ChurnConfig:
    """Nodes leaving (announced), crashing (silent) and joining (through a random live member,
    pulling the model as a joiner does), each a Poisson process; rates are fractions of the
    swarm's initial size per simulated minute. A joiner takes the shard of a node that went,
    as a replaced device would, or a random one when none did."""

    leave_per_min: float = 0.0
    crash_per_min: float = 0.0
    join_per_min: float = 0.0

    def __post_init__(self) -> None:
        if min(self.leave_per_min, self.crash_per_min, self.join_per_min) < 0:
            raise ValueError("churn rates must not be negative")

    @classmethod
    def replacing(cls, per_min: float) -> ChurnConfig:
        """``per_min`` of the nodes replaced per minute: half leave, half crash, as many join."""
        return cls(per_min / 2, per_min / 2, per_min)


@dataclass(frozen=True)
class SimConfig:
    """Args:
    nodes: the swarm's size at the start (everyone knows everyone, as after a settled join).
    task: a built-in task or ``module:factory``; ``logistic`` is the cheap one.
    alpha: Dirichlet concentration of the non-iid shards; None for iid.
    seed: the swarm's seed (initial model, data split, the simulation's randomness).
    independent_init: each node starts from a model of its own (seeded by its index) instead
        of the swarm's common one, so consensus starts far and its time can be measured.
    step_time_s: simulated seconds of one local step on a node of speed 1.
    stragglers: the fraction of nodes that are ``straggler_slowdown`` times slower.
    speed_spread: every node's step time is also multiplied by exp(N(0, spread²)).
    steps: local step budget per node (None: train until the end); afterwards a node gossips
        every ``gossip.idle_round_interval_s``, as the daemon does.
    duration_s: simulated seconds to run.
    eval_every_s: simulated seconds between two samples of the swarm's figures; evaluating
        every node's model is the expensive part.
    consensus_threshold: the relative consensus distance (over the first sample's) counted
        as reached; target_accuracy: the accuracy counted as reached (tasks judged by accuracy);
        target_loss: the eval loss counted as reached (tasks judged by their loss; None: the
        task's own target).
    wait_timeout_s: a node starts training once every edge is up both ways, or after this long
        (the daemon's ``wait_timeout_s``).
    attackers: testing robustness: this share of the initial nodes (rounded, at least one when
        positive) publishes ``gossip.attack`` instead of its model; samples count only the
        honest nodes.
    paused_fraction: the share of the nodes paused at any moment, on average (devices on
        battery, hot, off AC or outside their hours): each node alternates between running and
        paused, each for an exponential time, paused for ``pause_mean_s`` on average. A paused
        node is paused as the daemon's is (node/daemon/node.py): out of the topology, a member
        still, and after a pause of ``PULL_AFTER_PAUSE_S`` or more it pulls the model before it
        comes back. Samples count the nodes that are not paused.
    pause_mean_s: the mean length of one pause.
    budgeted_fraction: the share of the nodes that ``gossip.byte_budget`` applies to (devices
        on metered links, drawn apart from the rest of the randomness); 1: every node.
    """

    nodes: int = 64
    task: str = "logistic"
    alpha: float | None = 0.5
    seed: int = 0
    independent_init: bool = False
    step_time_s: float = 0.02
    stragglers: float = 0.0
    straggler_slowdown: float = 5.0
    speed_spread: float = 0.0
    steps: int | None = None
    duration_s: float = 60.0
    eval_every_s: float = 2.0
    consensus_threshold: float = 1e-2
    target_accuracy: float = 0.8
    target_loss: float | None = None
    wait_timeout_s: float = 60.0  # the daemon's default
    attackers: float = 0.0
    paused_fraction: float = 0.0
    pause_mean_s: float = 60.0
    budgeted_fraction: float = 1.0
    gossip: GossipConfig = field(default_factory=GossipConfig)
    membership: SwimConfig = field(default_factory=SwimConfig)
    net: NetConfig = field(default_factory=NetConfig)
    churn: ChurnConfig = field(default_factory=ChurnConfig)

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("a swarm needs at least one node")
        if self.step_time_s <= 0 or self.duration_s <= 0 or self.eval_every_s <= 0:
            raise ValueError("step time, duration and eval interval must be positive")
        if not 0 <= self.stragglers <= 1 or self.straggler_slowdown < 1:
            raise ValueError("stragglers is a fraction; their slowdown is at least 1")
        if self.speed_spread < 0 or not math.isfinite(self.speed_spread):
            raise ValueError("speed_spread must be a finite non-negative number")
        if self.wait_timeout_s <= 0:
            raise ValueError("wait_timeout_s must be positive")
        if self.steps == 0 and self.gossip.idle_round_interval_s is None:
            raise ValueError("gossip alone (steps 0) needs idle rounds: set idle_round_interval_s")
        if not 0 <= self.budgeted_fraction <= 1:
            raise ValueError("budgeted_fraction is a share of the nodes, in [0, 1]")
        if self.budgeted_fraction < 1 and self.gossip.byte_budget is None:
            raise ValueError("budgeted_fraction says who has the byte budget: give one too")
        if not 0 <= self.paused_fraction < 1 or self.pause_mean_s <= 0:
            raise ValueError("paused_fraction is a share in [0, 1); pause_mean_s is positive")
        if not 0 <= self.attackers < 1:
            raise ValueError("attackers is a share of the nodes, in [0, 1)")
        if (self.attackers > 0) != (self.gossip.attack is not None):
            raise ValueError(
                "attackers (a share of the nodes) and gossip.attack (what they publish) go "
                "together: give both or neither"
            )

    @property
    def attacker_count(self) -> int:
        """How many of the initial nodes attack."""
        return max(1, round(self.attackers * self.nodes)) if self.attackers > 0 else 0
