"""The codec a link chooses from its rate and round trip (gossip/codec_choice.py)."""

from __future__ import annotations

import pytest

from gossip.codec_choice import LinkMeasure, choose_codec, round_time_s

MLP = 1_100_000  # the slow-link bench's model


def test_cheap_bytes_take_the_codec_of_fewest_rounds_and_dear_ones_the_smallest_fit() -> None:
    lan = LinkMeasure(rate=125e6, rtt_s=0.001, compute_s=0.05)
    home = LinkMeasure(rate=2.5e6, rtt_s=0.02, compute_s=0.05)
    cellular = LinkMeasure(rate=125e3, rtt_s=0.08, compute_s=0.05)
    assert choose_codec(MLP, lan) == "fp16"  # compute sets the pace: fewest rounds wins
    assert choose_codec(MLP, home) == "int4"
    assert choose_codec(MLP, cellular) == "int4"
    # a tiny model: every codec fits a round's compute, so fewest rounds wins everywhere
    assert choose_codec(1_000, cellular) == "fp16"
    # sign only pays where its rounds are nearly free: offered nothing else, it is taken
    assert choose_codec(MLP, cellular, candidates=["sign"]) == "sign"


def test_the_choice_follows_the_link_with_hysteresis() -> None:
    fast = LinkMeasure(rate=125e6, rtt_s=0.001, compute_s=0.05)
    # int8 is 1.4x fp16's time here: within a hysteresis of 1.5 it stays, beyond 1.25 it goes
    assert choose_codec(MLP, fast, current="int8", hysteresis=1.5) == "int8"
    assert choose_codec(MLP, fast, current="int8", hysteresis=1.25) == "fp16"
    slow = LinkMeasure(rate=125e3, rtt_s=0.08, compute_s=0.05)
    assert choose_codec(MLP, slow, current="fp16") == "int4"  # the link changed: so does it


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
