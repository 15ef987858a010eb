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
(:class:`LinkCodecs`, from gossip/link_meter.py's times per codec), since every delta also
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
from gossip.link_meter import LinkMeter

__all__ = [
    "AUTO_CODECS",
    "DRIFT",
    "FRUGAL",
    "ROUNDS_TO_CONSENSUS",
    "ROUNDS_WHILE_TRAINING",
    "LinkCodecs",
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

#: A probe that lost doubles the wait before the next, up to this many ``probe_s``: on a slow
#: link each probe's deltas are the larger codec's, and the answer seldom changes.
MAX_PROBE_GAP = 8

#: What a link taught (its line of time against bytes) holds while the codec it sends with
#: takes within this factor of what the line says, either way; past it the link has changed
#: and is probed again.
DRIFT = 2.0


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


class LinkCodecs:
    """The codec of each link under ``auto``, from what each codec's deltas took on it; or,
    for a node whose rounds go to every link at once (``--pace node``), one codec for all.

    A codec's score on a link is R_c · max(compute_s, t_c): the rounds it needs times a round's
    time, where t_c is what its deltas took on this link lately (:meth:`LinkMeter.delta_s`).
    A codec not measured there lately is predicted: with one codec measured, in proportion to
    its bytes, which is right where bytes set the pace and pessimistic for a larger codec where
    a fixed cost per delta does (a fast link, a busy machine); with two or more, from the line
    of time against bytes through them, which sees that fixed cost. So a smaller codec is
    tried whenever the prediction says so, and while the current codec is the only one
    measured, the next larger is also *probed*: the probe's deltas measure it, and the next
    update keeps whichever scored better. Links start on sign (``initial``), the smallest: a
    slow link is right from its first delta, and a fast one measures sign and its probe within
    a few of its quick rounds. Measurements count for ``memory_s`` after a codec's last delta,
    so that a link that changed (shaped, unshaped) is judged by what it is now. The line they
    drew is kept past that: while the codec a link sends with takes within :data:`DRIFT` of
    what the line says, the link is the one that was measured, and the line, scaled to the
    current codec's time, predicts the others without another probe. A probe's deltas are the
    larger codec's, which on a slow link is what the choice was made to avoid; so a link is
    probed when it has no line yet or has left it, at once, and then every ``probe_s``, twice
    as long after each probe that lost (up to :data:`MAX_PROBE_GAP` times).
    The pick is :func:`pick`'s; a link not yet measured sends with ``initial``. One codec for
    all links (:meth:`update_all`) scores each codec by its slowest link, since such a round
    is done when every link has carried it.

    Args:
        numel: the model's values (the codecs' bytes follow from it).
        rounds: R_c by codec while the node trains (default :data:`ROUNDS_WHILE_TRAINING`).
        settle_rounds: R_c by codec while the node settles (default :data:`ROUNDS_TO_CONSENSUS`).
        memory_s: how long a codec's measurement counts after its last delta.
        probe_s: how often a link tries the next larger codec while only its current codec
            is measured.
    """

    #: The key of the one codec of :meth:`update_all`.
    ALL = ""

    def __init__(
        self,
        numel: int,
        initial: str = "sign",
        candidates: Iterable[str] = AUTO_CODECS,
        hysteresis: float = 1.25,
        memory_s: float = 10.0,
        probe_s: float = 5.0,
        rounds: Mapping[str, float] = ROUNDS_WHILE_TRAINING,
        frugal: float = FRUGAL,
        settle_rounds: Mapping[str, float] = ROUNDS_TO_CONSENSUS,
    ) -> None:
        self.candidates = tuple(candidates)
        if initial not in self.candidates:
            raise ValueError(f"the initial codec {initial!r} is not among {self.candidates}")
        unknown = [c for c in self.candidates if c not in rounds or c not in settle_rounds]
        if unknown or not 1 <= frugal <= hysteresis or memory_s <= 0 or probe_s <= 0:
            raise ValueError(
                f"no measured pace for {unknown}"
                if unknown
                else "need 1 <= frugal <= hysteresis and positive memory_s and probe_s, got "
                f"{frugal}, {hysteresis}, {memory_s}, {probe_s}"
            )
        self.initial = initial
        self.hysteresis = hysteresis
        self.frugal = frugal
        self.rounds = dict(rounds)
        self.settle_rounds = dict(settle_rounds)
        self.memory_s = memory_s
        self.probe_s = probe_s
        self.nbytes = {c: get_codec(c).encoded_nbytes(numel) for c in self.candidates}
        #: The candidates, fewest bytes first.
        self.by_size = sorted(self.candidates, key=lambda c: self.nbytes[c])
        self.chosen: dict[str, str] = {}
        self._probed_at: dict[str, float] = {}
        self._probing: dict[str, str] = {}  # the codec a link is probing
        self._probe_gap: dict[str, float] = {}  # seconds between its probes, now
        self._lines: dict[str, tuple[float, float]] = {}  # what each link's codecs taught

    @property
    def probing(self) -> Mapping[str, str]:
        """The links whose codec now is a probe (of the next larger codec), by link: what
        they would send with otherwise is the next smaller."""
        return dict(self._probing)

    def update(
        self,
        meters: Mapping[str, LinkMeter],
        compute_s: float,
        now: float,
        phase: Phase = "training",
    ) -> dict[str, str]:
        """Each link's codec now, for the links in ``meters`` (the others are forgotten), in the
        node's ``phase`` (:func:`phase_of`): while settling, codecs are scored by
        ``settle_rounds`` with no steps between rounds; while quiet, every link takes the
        smallest codec, no probe pending."""
        chosen = {}
        for peer, meter in meters.items():
            current = self.chosen.get(peer, self.initial)
            if phase == "quiet":
                chosen[peer] = self._quiet(peer)
            elif (times := self._times(peer, meter, current, now)) is None:
                chosen[peer] = current
            else:
                chosen[peer] = self._decide(
                    peer, current, *times, compute_s, now, phase == "settling"
                )
        self.chosen = chosen
        self._forget(chosen.keys())
        return dict(chosen)

    def update_all(
        self,
        meters: Mapping[str, LinkMeter],
        compute_s: float,
        now: float,
        phase: Phase = "training",
    ) -> str:
        """The one codec of every link now: each codec's time is its slowest link's (the links
        that have not measured the current codec yet are left out). ``phase`` as for
        :meth:`update`."""
        current = self.chosen.get(self.ALL, self.initial)
        if phase == "quiet":
            current = self._quiet(self.ALL)
        elif known := [
            t for p, m in meters.items() if (t := self._times(p, m, current, now)) is not None
        ]:
            worst = {c: max(times[c] for times, _ in known) for c in self.candidates}
            current = self._decide(
                self.ALL,
                current,
                worst,
                min(n for _, n in known),
                compute_s,
                now,
                phase == "settling",
            )
        self.chosen = {self.ALL: current}
        self._lines = {p: line for p, line in self._lines.items() if p in meters}
        return current

    def _quiet(self, key: str) -> str:
        """The smallest codec, no probe pending (what was learned of the link is kept)."""
        self._probing.pop(key, None)
        return self.by_size[0]

    def _forget(self, links: Iterable[str]) -> None:
        """Keep nothing of the links not among ``links`` (they closed)."""
        kept = set(links)
        for state in (self._probed_at, self._probing, self._probe_gap, self._lines):
            for gone in state.keys() - kept:
                del state[gone]

    def _times(
        self, peer: str, meter: LinkMeter, current: str, now: float
    ) -> tuple[dict[str, float], int] | None:
        """Each codec's delta time on the link, measured or predicted, and how many codecs
        the prediction rests on (a kept line counts as two); None while the current codec's
        deltas are still being measured."""
        measured = {
            c: t for c in self.candidates if (t := meter.delta_s(c, now, self.memory_s)) is not None
        }
        if current not in measured:
            return None
        known = len(measured)
        if known >= 2:
            fixed, per_byte = self._lines[peer] = self._fit(measured)
        else:
            fixed, per_byte = self._held(peer, current, measured[current])
            known += peer in self._lines
        times = {c: measured.get(c, fixed + per_byte * self.nbytes[c]) for c in self.candidates}
        return times, known

    def _held(self, peer: str, codec: str, took: float) -> tuple[float, float]:
        """With only ``codec`` measured, its ``took`` seconds a delta: the link's kept line
        scaled to that time, while it is within :data:`DRIFT` of the line; otherwise (the
        link changed, the line is dropped) all of it in the codec's bytes."""
        line = self._lines.get(peer)
        if line is not None:
            said = line[0] + line[1] * self.nbytes[codec]
            if said > 0 and 1 / DRIFT <= took / said <= DRIFT:
                return line[0] * took / said, line[1] * took / said
            del self._lines[peer]
        return self._fit({codec: took})

    def _decide(
        self,
        key: str,
        current: str,
        times: Mapping[str, float],
        measured: int,
        compute_s: float,
        now: float,
        settling: bool,
    ) -> str:
        rounds = self.settle_rounds if settling else self.rounds
        compute_s = 0.0 if settling else compute_s  # no steps between rounds any more
        scores = {c: rounds[c] * max(compute_s, times[c]) for c in self.candidates}
        chosen = pick(scores, self.nbytes, current, self.hysteresis, self.frugal)
        if self._probing.get(key) == current:  # the probe is measured: it lost, or it won
            del self._probing[key]
            lost = self.nbytes[chosen] < self.nbytes[current]
            gap = self._probe_gap.get(key, self.probe_s)
            self._probe_gap[key] = (
                min(2 * gap, MAX_PROBE_GAP * self.probe_s) if lost else self.probe_s
            )
        if chosen != current:
            return chosen
        larger = self.by_size.index(current) + 1
        if measured < 2 and larger < len(self.by_size):
            last = self._probed_at.get(key)
            if last is None or now - last >= self._probe_gap.get(key, self.probe_s):
                self._probed_at[key] = now
                self._probing[key] = self.by_size[larger]
                return self.by_size[larger]
        return current

    def _fit(self, measured: Mapping[str, float]) -> tuple[float, float]:
        """A delta's time as ``fixed + per_byte * bytes``: a least-squares line through the
        codecs measured (neither part negative), or with one measured, all in its bytes."""
        xs = [float(self.nbytes[c]) for c in measured]
        ts = list(measured.values())
        mx, mt = sum(xs) / len(xs), sum(ts) / len(ts)
        var = sum((x - mx) ** 2 for x in xs)
        if var > 0:
            per_byte = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / var
            fixed = mt - per_byte * mx
            if per_byte < 0:
                return mt, 0.0
            if fixed >= 0:
                return fixed, per_byte
        return 0.0, sum(t * x for x, t in zip(xs, ts, strict=True)) / sum(x * x for x in xs)
