"""``--compress auto`` under a bound on sending (``--max-upload-rate``, ``--byte-budget``): a
link is no faster than the bound lets the node send, so the codecs are scored by the bytes it
lets through, and a larger codec that would lose even at that pace is not probed."""

from __future__ import annotations

import pytest

from gossip.budget import BudgetConfig
from gossip.codecs import AUTO_CODECS, get_codec
from gossip.link_codecs import LinkCodecs
from gossip.link_meter import SAMPLES, LinkMeter
from gossip.upload_cap import BUDGET_CHARGE, UploadCap, bound_rate

WIDE = 1_126_410  # the 1.1M-parameter MLP of the slow-link benches
#: A 20 Mbit/s uplink: a delta's time is its bytes at 2.5 MB/s.
UPLINK = {c: get_codec(c).encoded_nbytes(WIDE) / 2.5e6 for c in AUTO_CODECS}


def carried(codec: str, took: float, now: float = 0.0) -> tuple[LinkMeter, float]:
    """A meter that timed SAMPLES deltas of ``codec``, each ``took`` seconds; and the time after."""
    meter = LinkMeter()
    for _ in range(SAMPLES):
        meter.sent(now, codec)
        now += took
        meter.answered(now)
    return meter, now


def test_a_fast_link_under_a_tight_cap_stays_on_sign_and_is_not_probed() -> None:
    """Five links of 20 Mbit/s, the node capped to 0.42 MB/s: uncapped, the link's pace would
    have a codec of four times sign's bytes probed at once; capped, a round of int4 to five
    links takes 4 times sign's share of the cap, and int4 needs 0.93 of sign's rounds."""
    meters = {}
    now = 0.0
    for peer in "abcde":
        meters[peer], now = carried("sign", UPLINK["sign"], now)
    free = LinkCodecs(WIDE, memory_s=60.0)
    assert free.update_all(meters, 0.02, now) == "int4"  # the probe of the next larger
    capped = LinkCodecs(WIDE, memory_s=60.0, model_rate=bound_rate(420_000, None))
    assert capped.update_all(meters, 0.02, now) == "sign"
    assert not capped.probing
    assert capped.update(meters, 0.02, now + 30.0) == dict.fromkeys("abcde", "sign")
    assert not capped.probing


def test_a_cap_the_link_is_far_below_binds_nothing() -> None:
    """A bound above what the link carries changes no choice: the link is the pace."""
    meter, now = carried("sign", UPLINK["sign"])
    loose = LinkCodecs(WIDE, memory_s=60.0, model_rate=bound_rate(1e9, None))
    free = LinkCodecs(WIDE, memory_s=60.0)
    assert loose.update({"a": meter}, 0.02, now) == free.update({"a": meter}, 0.02, now)


def test_the_bound_is_the_models_share_of_the_cap_or_the_budget_whichever_is_lower() -> None:
    assert bound_rate(None, None) is None
    assert bound_rate(420_000, None) == pytest.approx(UploadCap(420_000, 0.0).model_rate)
    day = BudgetConfig(500_000_000, 86_400.0)
    per_s = 500_000_000 / 86_400.0 / BUDGET_CHARGE  # about 4.5 kB/s of models
    assert bound_rate(None, day) == pytest.approx(per_s)
    assert bound_rate(420_000, day) == pytest.approx(per_s)
    with pytest.raises(ValueError, match="model_rate"):
        LinkCodecs(WIDE, model_rate=0.0)
