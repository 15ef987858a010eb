"""Deadlines of whole-model transfers grow with the model, so slow links can carry them."""

from __future__ import annotations

from node.daemon.links import MIN_LINK_BYTES_PER_S, transfer_timeout_s


def test_a_model_transfer_is_given_time_for_the_slowest_link() -> None:
    one_million_floats = 4_000_000
    timeout = transfer_timeout_s(10.0, one_million_floats)
    # At 1 Mbit/s the bytes alone take 32 s; the call's own deadline comes on top.
    assert timeout == 10.0 + 32.0
    assert one_million_floats / MIN_LINK_BYTES_PER_S < timeout
    assert transfer_timeout_s(10.0, 0) == 10.0
