"""Which codec a link should send with, from its measured rate and round trip (issue 17).

A codec is worth what it brings to consensus per second on the link that carries it. Per round,
a codec c brings ln(10⁴) / R_c, where R_c is the number of rounds CHOCO needs with c for the
consensus distance to fall 10,000-fold (:data:`ROUNDS_TO_CONSENSUS`, measured by
bench/codec_gamma.py with each codec's default γ). A round on the link takes

    t_c = max(compute_s, bytes_c / rate, rtt / window)

(the node's own time between rounds, the delta's time on the wire, and the round trip shared by
the ``window`` deltas a link keeps in flight). The choice is the codec with the most progress per
second, 1 / (R_c · t_c). So: fp16 where bytes are cheap (a LAN, where compute sets the pace),
int8 or int4 on a home uplink, and on the slowest links whatever is smallest for its rounds.

A link's measurements move all the time, so the choice moves only when another codec is
``hysteresis`` times better than the current one: a codec change is safe (each delta carries its
codec, and replicas stay bit-identical across one: tests/gossip/test_pairwise.py), but a link
that flips every round learns nothing about either codec's pace.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gossip.codecs import get_codec

__all__ = ["AUTO_CODECS", "ROUNDS_TO_CONSENSUS", "LinkMeasure", "choose_codec", "round_time_s"]

#: Rounds until the consensus distance fell 10,000-fold: 16 nodes on the exponential graph, a
#: 4,096-value Gaussian start, each codec at its default γ (bench/codec_gamma.py, RESULTS.md).
ROUNDS_TO_CONSENSUS = {"fp16": 5, "int8": 7, "int4": 12, "sign": 345}

#: What ``--compress auto`` chooses among (fp32 brings nothing over fp16 at twice its bytes).
AUTO_CODECS = ("fp16", "int8", "int4", "sign")


@dataclass(frozen=True)
class LinkMeasure:
    """What a link measured of itself.

    Args:
        rate: bytes a second it carried (its recent delivery rate).
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
