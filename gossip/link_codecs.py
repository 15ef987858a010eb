"""Each link's codec under ``--compress auto``, from what the link measures of itself.

gossip/codec_choice.py says how a codec is scored (the rounds it needs times a round's time)
and picked (the fewest bytes within ``frugal`` of the best); :class:`LinkCodecs` keeps, for each
link of a node, what its deltas took by codec (gossip/link_meter.py), predicts the codecs it has
not measured, probes the next larger one, and picks.

A node whose sending is bounded (``--max-upload-rate``, or a byte budget spread over its
period) cannot send faster than that bound, whatever its links measure: a round of codec c to
L links takes at least L · bytes_c / rate of it. :class:`LinkCodecs` takes that as the floor
of each codec's time (``model_rate``), so under a cap that binds the codecs are scored by the
bytes the cap lets through, as on a link of that rate; and while a bound is set, no larger
codec is probed that could not win even at its floor, since a probe's deltas would spend the
budget on a codec that loses (without a bound, probes go on as before). Without the floor, 8
simulated nodes capped to 0.42 MB/s probed int4 on their fast links and made half of sign's
rounds (bench/RESULTS.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gossip.codec_choice import (
    FRUGAL,
    ROUNDS_TO_CONSENSUS,
    ROUNDS_WHILE_TRAINING,
    Phase,
    pick,
)
from gossip.codecs import AUTO_CODECS, get_codec
from gossip.link_meter import LinkMeter

__all__ = ["DRIFT", "MAX_PROBE_GAP", "LinkCodecs"]

#: A probe that lost doubles the wait before the next, up to this many ``probe_s``: on a slow
#: link each probe's deltas are the larger codec's, and the answer seldom changes.
MAX_PROBE_GAP = 8

#: What a link taught (its line of time against bytes) holds while the codec it sends with
#: takes within this factor of what the line says, either way; past it the link has changed
#: and is probed again.
DRIFT = 2.0


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
        model_rate: bytes of model message a second that the node may send on all its links
            together (its cap's or budget's share for models: gossip/upload_cap.py's
            ``bound_rate``); None: no bound.
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
        model_rate: float | None = None,
    ) -> None:
        self.candidates = tuple(candidates)
        if initial not in self.candidates:
            raise ValueError(f"the initial codec {initial!r} is not among {self.candidates}")
        unknown = [c for c in self.candidates if c not in rounds or c not in settle_rounds]
        if model_rate is not None and not model_rate > 0:
            raise ValueError(f"model_rate must be positive bytes a second, got {model_rate}")
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
        self.model_rate = model_rate
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
                    peer, current, *times, compute_s, now, phase == "settling", len(meters)
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
                len(meters),
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
        links: int,
    ) -> str:
        rounds = self.settle_rounds if settling else self.rounds
        compute_s = 0.0 if settling else compute_s  # no steps between rounds any more
        floor = self._floor(links)
        scores = {c: rounds[c] * max(compute_s, times[c], floor[c]) for c in self.candidates}
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
            if self.model_rate is not None and all(
                rounds[c] * max(compute_s, floor[c]) * self.frugal >= scores[current]
                for c in self.by_size[larger:]
            ):
                return current  # none could win even at its floor: a probe would only spend
            last = self._probed_at.get(key)
            if last is None or now - last >= self._probe_gap.get(key, self.probe_s):
                self._probed_at[key] = now
                self._probing[key] = self.by_size[larger]
                return self.by_size[larger]
        return current

    def _floor(self, links: int) -> dict[str, float]:
        """The least time a round of each codec to ``links`` links takes under the node's bound
        on sending (all zero without one)."""
        if self.model_rate is None:
            return dict.fromkeys(self.candidates, 0.0)
        return {c: links * self.nbytes[c] / self.model_rate for c in self.candidates}

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
