"""The codec a link chooses from its rate and round trip (gossip/codec_choice.py)."""

from __future__ import annotations

import pytest

from gossip.codec_choice import ROUNDS_TO_CONSENSUS, LinkMeasure, choose_codec, round_time_s

MLP = 1_100_000  # the slow-link bench's model


def test_cheap_bytes_take_a_codec_near_the_fewest_rounds_and_dear_ones_the_smallest() -> None:
    lan = LinkMeasure(rate=125e6, rtt_s=0.001, compute_s=0.05)
    home = LinkMeasure(rate=2.5e6, rtt_s=0.02, compute_s=0.05)
    cellular = LinkMeasure(rate=125e3, rtt_s=0.08, compute_s=0.05)
    # compute sets every codec's pace: fp16's 10% fewer rounds are not worth twice the bytes
    assert choose_codec(MLP, lan) == "int8"
    assert choose_codec(MLP, lan, frugal=1.0) == "fp16"  # bytes free: the fewest rounds
    # bytes set the pace: sign's 1.5x rounds cost a seventh of int8's bytes each
    assert choose_codec(MLP, home) == "sign"
    assert choose_codec(MLP, cellular) == "sign"
    assert choose_codec(MLP, home, candidates=["fp16", "int8", "int4"]) == "int4"
    # a tiny model: every codec fits a round's compute
    assert choose_codec(1_000, cellular) == "int8"
    # pure gossip from far apart, where sign needs 86 times fp16's rounds, never takes it
    for link, codec in [(home, "int4"), (cellular, "int4"), (lan, "fp16")]:
        assert choose_codec(MLP, link, rounds=ROUNDS_TO_CONSENSUS, frugal=1.0) == codec


def test_the_choice_follows_the_link_with_hysteresis() -> None:
    fast = LinkMeasure(rate=125e6, rtt_s=0.001, compute_s=0.05)
    # int4 is 1.4x int8's rounds at the same pace: within a hysteresis of 1.5 it stays, beyond
    # 1.25 it goes, to int8 (within 15% of fp16, on half its bytes)
    assert choose_codec(MLP, fast, current="int4", hysteresis=1.5) == "int4"
    assert choose_codec(MLP, fast, current="int4", hysteresis=1.25) == "int8"
    # a codec of fewer bytes within 15% of the best is taken at once
    assert choose_codec(MLP, fast, current="fp16") == "int8"
    slow = LinkMeasure(rate=125e3, rtt_s=0.08, compute_s=0.05)
    assert choose_codec(MLP, slow, current="fp16") == "sign"  # the link changed: so does it


def test_a_round_takes_the_longest_of_compute_wire_and_round_trip() -> None:
    link = LinkMeasure(rate=1e6, rtt_s=1.0, compute_s=0.1, window=2)
    assert round_time_s("int8", 1000, link) == 0.5  # the round trip over the window
    assert round_time_s("int8", 10_000_000, link) > 10.0  # the wire


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="measurement"):
        LinkMeasure(rate=0.0, rtt_s=0.1)
    with pytest.raises(ValueError, match="no measured pace"):
        choose_codec(MLP, LinkMeasure(1e6, 0.1), candidates=["topk"])
    with pytest.raises(ValueError, match="hysteresis"):
        choose_codec(MLP, LinkMeasure(1e6, 0.1), hysteresis=0.5)
    with pytest.raises(ValueError, match="frugal"):
        choose_codec(MLP, LinkMeasure(1e6, 0.1), frugal=1.5, hysteresis=1.25)
