"""Which codec a link should send with (issue 17's ``--compress auto``).

A codec is worth what it brings per second on the link that carries it. Per round a codec c
brings 1 / R_c, where R_c is the rounds it needs for a job relative to the others; a round on
the link takes

    t_c = max(compute_s, what a delta of c takes on the link)

(the node's own time between rounds, and the delta's), so the codec's score, the seconds the
job takes, is R_c · t_c. Two tables of R_c:

* :data:`ROUNDS_WHILE_TRAINING`, what ``auto`` uses: a training swarm starts from one model (a
  joiner pulls it) and has only to keep up with its own steps, and each round's error waits in
  x - x̂ for the next. With a round after every step, int8 and int4 reach the target in 1 to
  1.4 times fp16's rounds and sign (at its γ of 0.3) in 1.1 to 1.5 times
  (bench/codec_tracking.py).
* :data:`ROUNDS_TO_CONSENSUS`: pure gossip from far apart (each node its own Gaussian vector),
  rounds to agree 10,000-fold, where sign needs 86 times fp16's rounds (bench/codec_gamma.py);
  bench/sim_codec_mix.py models that case. ``auto`` uses it once a node's training is over and
  until its rounds fall to heartbeats (*settling*): nothing then refills x - x̂ but gossip, the
  job is to close what disagreement training left, and a round of sign closes little of it.
  Measured with four in-memory nodes after 300 steps of training: on sign they were still
  1e-5 apart after 20 s and 380 rounds a node, where on int8 they agreed to 2e-7 within 1 s,
  in 7 rounds between the four (bench/sim_settle.py has the simulator's). A heartbeat carries
  next to nothing, so while a node's rounds are only heartbeats (*quiet*: after training, or
  while a byte budget holds the rest) every link sends with the smallest codec, whatever it
  measured: heartbeats are too sparse to measure a link by.

Bytes are a cost too: the user pays for them, and on a shared uplink every other flow does.
So the choice is not simply the best score: it is the codec of fewest bytes among those within
``frugal`` (15%) of the best. On a LAN, where compute sets every codec's pace, that is int8,
not fp16 (half the bytes for a tenth more rounds); on a home uplink int4 or sign; on a cellular
link sign.

Two ways to know a delta's time. :func:`round_time_s` models it from a link's rate and round
trip (``max(bytes_c / rate, rtt / window)``), for links that are only modelled
(bench/sim_codec_mix.py). A real link, in the daemon and the simulator alike, measures it
(gossip/link_codecs.py, from gossip/link_meter.py's times per codec), since every delta also
pays a fixed cost that no model of bytes sees.

A link's measurements move all the time, so the choice moves to a larger codec only when the
current one scores ``hysteresis`` times worse than the best; it moves to a smaller one as soon as
that one is within ``frugal`` of the best. A codec change is safe (each delta carries its codec,
and replicas stay bit-identical across one: tests/gossip/test_auto_codec.py), but a link that
flips every round learns nothing about either codec's pace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gossip.codecs import AUTO_CODECS, get_codec

__all__ = [
    "AUTO_CODECS",
    "FRUGAL",
    "ROUNDS_TO_CONSENSUS",
    "ROUNDS_WHILE_TRAINING",
    "LinkMeasure",
    "Phase",
    "choose_codec",
    "phase_of",
    "pick",
    "round_time_s",
]

#: Rounds until the consensus distance fell 10,000-fold: 16 nodes on the exponential graph, a
#: 4,096-value Gaussian start, each codec at its default γ (bench/codec_gamma.py, RESULTS.md).
ROUNDS_TO_CONSENSUS: Mapping[str, float] = {"fp16": 5, "int8": 7, "int4": 12, "sign": 430}

#: Rounds to the target while training, relative to fp16's, a round after every local step:
#: the worst node's time to the target, the larger of two swarms (16 nodes of the digits MLP,
#: 4 of the 1.1M-parameter MLP; bench/codec_tracking.py, RESULTS.md).
ROUNDS_WHILE_TRAINING: Mapping[str, float] = {"fp16": 1.0, "int8": 1.1, "int4": 1.4, "sign": 1.5}

#: What a node's rounds are for (:func:`phase_of`): keeping up with its training, closing the
#: disagreement training left (*settling*), or only heartbeats (*quiet*).
Phase = Literal["training", "settling", "quiet"]


def phase_of(trained: bool, quiet: bool) -> Phase:
    """A node's phase: ``quiet`` while its rounds are only heartbeats (its trigger's last round
    was one), else ``settling`` once its training is over (``trained``), else ``training``."""
    return "quiet" if quiet else "settling" if trained else "training"


#: A codec of fewer bytes is taken when its score is within this factor of the best.
FRUGAL = 1.15


def pick(
    scores: Mapping[str, float],
    nbytes: Mapping[str, int],
    current: str | None,
    hysteresis: float,
    frugal: float = FRUGAL,
) -> str:
    """The codec of fewest bytes whose score is within ``frugal`` of the best; but a
    ``current`` codec of fewer bytes still stays until it scores ``hysteresis`` times the
    best."""
    best = min(scores.values())
    target = min((c for c in scores if scores[c] <= frugal * best), key=lambda c: nbytes[c])
    if current is None or current not in scores or nbytes[target] <= nbytes[current]:
        return target
    return current if scores[current] <= hysteresis * best else target


@dataclass(frozen=True)
class LinkMeasure:
    """What a link is, for the model of :func:`round_time_s` (bench/sim_codec_mix.py's links).

    Args:
        rate: bytes a second it carries.
        rtt_s: its round trip.
        compute_s: the node's own time between rounds (its local steps).
        window: deltas it keeps in flight.
    """

    rate: float
    rtt_s: float
    compute_s: float = 0.0
    window: int = 2

    def __post_init__(self) -> None:
        if not self.rate > 0 or self.rtt_s < 0 or self.compute_s < 0 or self.window < 1:
            raise ValueError(f"not a link's measurement: {self}")


def round_time_s(codec: str, numel: int, link: LinkMeasure) -> float:
    """t_c: how long one round of ``codec`` for a model of ``numel`` values takes on ``link``."""
    wire = get_codec(codec).encoded_nbytes(numel) / link.rate
    return max(link.compute_s, wire, link.rtt_s / link.window)


def choose_codec(
    numel: int,
    link: LinkMeasure,
    current: str | None = None,
    candidates: Iterable[str] = AUTO_CODECS,
    hysteresis: float = 1.25,
    rounds: Mapping[str, float] = ROUNDS_WHILE_TRAINING,
    frugal: float = FRUGAL,
) -> str:
    """The codec for ``link`` by :func:`pick`, each scored R_c · t_c from ``rounds``."""
    if hysteresis < frugal or frugal < 1:
        raise ValueError(f"need 1 <= frugal <= hysteresis, got {frugal} and {hysteresis}")
    names = list(candidates)
    unknown = [c for c in names if c not in rounds]
    if not names or unknown:
        raise ValueError(f"no measured pace for {unknown or 'an empty list'}")
    scores = {c: rounds[c] * round_time_s(c, numel, link) for c in names}
    nbytes = {c: get_codec(c).encoded_nbytes(numel) for c in names}
    return pick(scores, nbytes, current, hysteresis, frugal)
