"""Which codec a link should send with (issue 17's ``--compress auto``).

A codec is worth what it brings to consensus per second on the link that carries it. Per round,
a codec c brings ln(10⁴) / R_c, where R_c is the number of rounds CHOCO needs with c for the
consensus distance to fall 10,000-fold (:data:`ROUNDS_TO_CONSENSUS`, measured by
bench/codec_gamma.py with each codec's default γ). A round on the link takes

    t_c = max(compute_s, what a delta of c takes on the link)

(the node's own time between rounds, and the delta's). The choice is the codec with the most
progress per second, 1 / (R_c · t_c). So: fp16 where bytes are cheap (a LAN, where compute or
a fixed cost per delta sets the pace), int8 or int4 on a home uplink, and on the slowest links
whatever is smallest for its rounds.

Two ways to know a delta's time. :func:`round_time_s` models it from a link's rate and round
trip (``max(bytes_c / rate, rtt / window)``), for links that are only modelled
(bench/sim_codec_mix.py). A real link, in the daemon and the simulator alike, measures it
(:class:`LinkCodecs`, from gossip/link_meter.py's times per codec), since every delta also
pays a fixed cost that no model of bytes sees.

A link's measurements move all the time, so the choice moves only when another codec is
``hysteresis`` times better than the current one: a codec change is safe (each delta carries its
codec, and replicas stay bit-identical across one: tests/gossip/test_auto_codec.py), but a link
that flips every round learns nothing about either codec's pace.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gossip.codecs import AUTO_CODECS, get_codec
from gossip.link_meter import LinkMeter

__all__ = [
    "AUTO_CODECS",
    "ROUNDS_TO_CONSENSUS",
    "LinkCodecs",
    "LinkMeasure",
    "choose_codec",
    "round_time_s",
]

#: Rounds until the consensus distance fell 10,000-fold: 16 nodes on the exponential graph, a
#: 4,096-value Gaussian start, each codec at its default γ (bench/codec_gamma.py, RESULTS.md).
ROUNDS_TO_CONSENSUS = {"fp16": 5, "int8": 7, "int4": 12, "sign": 345}


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
) -> str:
    """The codec with the most consensus progress per second on ``link``; ``current`` stays
    unless another is ``hysteresis`` times better."""
    if hysteresis < 1:
        raise ValueError(f"hysteresis is {hysteresis}: expected at least 1")
    names = list(candidates)
    unknown = [c for c in names if c not in ROUNDS_TO_CONSENSUS]
    if not names or unknown:
        raise ValueError(f"no measured pace for {unknown or 'an empty list'}")

    def seconds(codec: str) -> float:  # to the 10,000-fold fall: R_c · t_c
        return ROUNDS_TO_CONSENSUS[codec] * round_time_s(codec, numel, link)

    best = min(names, key=lambda c: (seconds(c), names.index(c)))
    if current in names and seconds(current) <= hysteresis * seconds(best):
        return current
    return best


class LinkCodecs:
    """The codec of each link under ``auto``, from what each codec's deltas took on it.

    A codec's score on a link is R_c · max(compute_s, t_c): the rounds it needs times a round's
    time, where t_c is what its deltas took on this link lately (:meth:`LinkMeter.delta_s`).
    A codec not measured there lately is predicted: with one codec measured, in proportion to
    its bytes, which is right where bytes set the pace and pessimistic for a larger codec where
    a fixed cost per delta does (a fast link, a busy machine); with two or more, from the line
    of time against bytes through them, which sees that fixed cost. So a smaller codec is
    tried whenever the prediction says so, and while the current codec is the only one
    measured, the next larger is also *probed* every ``probe_s``: the probe's deltas measure
    it, and the next update keeps whichever scored better. Measurements count for
    ``memory_s`` after a codec's last delta, so that a link that changed (shaped, unshaped)
    is judged by what it is now: the price is a few deltas of exploration every ``memory_s``.
    The choice moves only when another codec scores ``hysteresis`` times better; a link not
    yet measured sends with ``initial``.

    Args:
        numel: the model's values (the codecs' bytes follow from it).
        memory_s: how long a codec's measurement counts after its last delta.
        probe_s: how often a link tries the next larger codec while only its current codec
            is measured.
    """

    def __init__(
        self,
        numel: int,
        initial: str = "int8",
        candidates: Iterable[str] = AUTO_CODECS,
        hysteresis: float = 1.25,
        memory_s: float = 10.0,
        probe_s: float = 5.0,
    ) -> None:
        self.candidates = tuple(candidates)
        if initial not in self.candidates:
            raise ValueError(f"the initial codec {initial!r} is not among {self.candidates}")
        unknown = [c for c in self.candidates if c not in ROUNDS_TO_CONSENSUS]
        if unknown or hysteresis < 1 or memory_s <= 0 or probe_s <= 0:
            raise ValueError(
                f"no measured pace for {unknown}"
                if unknown
                else "need hysteresis >= 1 and "
                f"positive memory_s and probe_s, got {hysteresis}, {memory_s}, {probe_s}"
            )
        self.initial = initial
        self.hysteresis = hysteresis
        self.memory_s = memory_s
        self.probe_s = probe_s
        self.nbytes = {c: get_codec(c).encoded_nbytes(numel) for c in self.candidates}
        #: The candidates, fewest bytes first.
        self.by_size = sorted(self.candidates, key=lambda c: self.nbytes[c])
        self.chosen: dict[str, str] = {}
        self._probed_at: dict[str, float] = {}

    def update(
        self, meters: Mapping[str, LinkMeter], compute_s: float, now: float
    ) -> dict[str, str]:
        """Each link's codec now, for the links in ``meters`` (the others are forgotten)."""
        chosen = {}
        for peer, meter in meters.items():
            chosen[peer] = self._choose(peer, meter, compute_s, now)
        self.chosen = chosen
        self._probed_at = {p: t for p, t in self._probed_at.items() if p in chosen}
        return dict(chosen)

    def _choose(self, peer: str, meter: LinkMeter, compute_s: float, now: float) -> str:
        current = self.chosen.get(peer, self.initial)
        measured = {
            c: t for c in self.candidates if (t := meter.delta_s(c, now, self.memory_s)) is not None
        }
        if current not in measured:
            return current  # its deltas are still being measured
        fixed, per_byte = self._fit(measured)

        def score(c: str) -> float:
            took = measured.get(c, fixed + per_byte * self.nbytes[c])
            return ROUNDS_TO_CONSENSUS[c] * max(compute_s, took)

        best = min(self.candidates, key=lambda c: (score(c), self.candidates.index(c)))
        if score(current) > self.hysteresis * score(best):
            return best
        larger = self.by_size.index(current) + 1
        if len(measured) < 2 and larger < len(self.by_size):
            since = now - self._probed_at.setdefault(peer, now)
            if since >= self.probe_s:
                self._probed_at[peer] = now
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
