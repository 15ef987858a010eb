"""A slow neighbour slows only its own link (issue 17): six real nodes with ``--pace link``, one
behind a 1 Mbit/s link half of the time (tests/e2e/slow_neighbour.py). While it is slow, its
neighbours' deltas on their other links keep at least MIN_RATIO of their rate while it is not,
and the slow links themselves carry far fewer (so the shaping bites: with ``--pace node`` each
round waits for the slow link and the fast links fall with it, bench/slow_neighbour.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.slow_neighbour import N, measure

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: Testnet says so otherwise

# A round that waits on every link fell to 0.42 of its rate (issue 17's measurement: 19.9 to 8.3
# rounds a second); with a copy per link the fast links' rate is the CPU's, which a slow node's
# lighter load on a shared machine moves a little either way.
MIN_RATIO = 0.75
MAX_SLOW_SHARE = 0.5  # the slow links carry at most this share of the fast links' deltas


@pytest.mark.timeout(300)
async def test_fast_links_keep_their_rate_beside_a_slow_neighbour(tmp_path: Path) -> None:
    got = await measure("link", tmp_path)
    print(
        f"\ndeltas/s on the fast links, unshaped {[round(r, 2) for r in got.fast_links['fast']]}, "
        f"beside 1 Mbit/s {[round(r, 2) for r in got.fast_links['slow']]} "
        f"({got.ratio():.2f}); on the slow links {[round(r, 2) for r in got.slow_links['slow']]} "
        f"({got.slow_share():.2f} of the fast)"
    )
    assert got.codes == [0] * N, got.codes  # SIGTERM: each left politely and wrote its state
    assert got.slow_share() <= MAX_SLOW_SHARE, f"the slow links carried {got.slow_share():.2f}"
    assert got.ratio() >= MIN_RATIO, f"fast links at {got.ratio():.2f} of their rate"
