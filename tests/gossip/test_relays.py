"""gossip/relays.py: the relays a node names, and the order in which others try them."""

from __future__ import annotations

from collections import Counter

from gossip.relays import RELAYS, choose_relays, relay_order

NODE = "abcd.unreachable.invalid:7070"


def test_a_node_keeps_the_relays_it_named_while_they_hold_its_session() -> None:
    assert choose_relays(["b:1", "c:1"], {"a:1", "b:1", "c:1"}) == ("b:1", "c:1")
    assert choose_relays(["b:1", "c:1"], {"a:1", "c:1", "d:1"}) == ("a:1", "c:1")
    assert choose_relays([], {"z:1"}) == ("z:1",)
    assert choose_relays(["b:1"], set()) == ()
    assert len(choose_relays([], {f"m{k}:1" for k in range(10)})) == RELAYS


def test_members_spread_their_calls_over_a_nodes_relays() -> None:
    relays = ["r1:7070", "r2:7070"]
    first = Counter(relay_order(relays, NODE, None, bytes([k]))[0] for k in range(200))
    # Each member has an order of its own: neither relay carries every member's calls.
    assert set(first) == set(relays)
    assert min(first.values()) >= 60  # of 200; the hash splits them about evenly


def test_a_member_keeps_to_the_relay_that_passed_its_last_call_on() -> None:
    relays = ["r1:7070", "r2:7070", "r3:7070"]
    for k in range(20):
        salt = bytes([k])
        for last in relays:
            order = relay_order(relays, NODE, last, salt)
            assert order[0] == last
            assert sorted(order) == sorted(relays)
        # Unknown or no last relay: the member's own order, the same every time.
        assert relay_order(relays, NODE, "gone:1", salt) == relay_order(relays, NODE, None, salt)


def test_a_relay_coming_or_going_leaves_the_order_of_the_others() -> None:
    for k in range(50):
        salt = bytes([k])
        two = relay_order(["r1:7070", "r2:7070"], NODE, None, salt)
        three = relay_order(["r1:7070", "r2:7070", "r3:7070"], NODE, None, salt)
        assert [r for r in three if r != "r3:7070"] == two
