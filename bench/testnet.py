"""The slow-link benches' network: a network namespace per node on one bridge, every link shaped.

Host ``i`` gets namespace ``<name>-n<i>`` with an ``eth0`` at ``<subnet>.<i+1>`` on a bridge in
the root namespace; ``scripts/shape-link`` shapes both directions of its link (the node's uplink
inside the namespace: rate, delay and loss; its downlink on the bridge side: the rate). Where
the kernel has netem, netem applies all three; where it has not, tbf keeps the rate and the
delay and loss go in user space (tests/impair.py's NFQUEUE workers, on what each host receives;
iptables and the dev extra's fnfqueue). ``Testnet.applied`` says which. Everything made is named
``<name>-*`` and removed on exit, on failure too, and before building (left over from a run that
was killed): the network itself is tests/netns.py's, which this adds the shaping to. Used by
bench/slow_links.py and bench/text_links.py; needs root and iptables.
"""

from __future__ import annotations

from pathlib import Path

from tests import netns
from tests.impair import Impairment
from tests.netns import sh

__all__ = ["Testnet", "sh"]

PREFIX = "mmb"
SUBNET = "10.77.0"
SHAPE = str(Path(__file__).resolve().parent.parent / "scripts" / "shape-link")


class Testnet(netns.Testnet):
    """``n`` namespaces on one bridge (tests/netns.py's network, named ``name``-*), each link
    shaped once it is built."""

    def __init__(
        self, n: int, rate: str, delay: str, loss: str, name: str = PREFIX, subnet: str = SUBNET
    ) -> None:
        super().__init__(name, n, subnet)
        self.rate, self.delay, self.loss = rate, delay, loss
        #: How the links were shaped (scripts/shape-link's words, or the user-space delay's).
        self.applied = ""
        #: Delay and loss in user space (tests/impair.py's NFQUEUE workers, on each host's
        #: receive side) where the kernel has no netem; None where netem applied them, or none
        #: were asked.
        self.impairment: Impairment | None = None

    def sent_bytes(self, i: int) -> int:
        """What node ``i`` put on the wire: its link's bytes as they arrive at the bridge."""
        return int(Path(f"/sys/class/net/{self.prefix}-v{i}/statistics/rx_bytes").read_text())

    def _build(self) -> None:
        super()._build()
        up = ["--rate", self.rate, "--delay", self.delay, "--loss", self.loss]
        shaping = []
        for i in range(self.n):
            shaping.append(sh(*self.exec_argv(i), SHAPE, "eth0", *up))
            sh(SHAPE, f"{self.prefix}-v{i}", "--rate", self.rate)  # the downlink: the rate only
        self.applied = shaping[0]
        delay_s, loss = _seconds(self.delay), _fraction(self.loss)
        if self.applied.startswith("applied tbf") and (delay_s > 0 or loss > 0):
            # No netem: tbf holds the rate, and the delay and loss go in user space, before
            # any process opens a connection (tests/impair.py turns segmentation offload off).
            self.impairment = Impairment(self, "nfqueue").__enter__()
            self.impairment.set(loss, delay_s)
            self.applied = (
                f"applied tbf: rate {self.rate}; in user space (no netem): delay {self.delay}"
                f" and loss {self.loss or 0} on what each host receives"
            )

    def clean(self) -> None:
        if self.impairment is not None:
            self.impairment.close()
            self.impairment = None
        super().clean()


def _seconds(delay: str) -> float:
    """``20ms``, ``500us`` or ``0.5s`` in seconds (``0`` or empty: none)."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if delay.endswith(unit):
            return float(delay[: -len(unit)]) * scale
    if delay in ("", "0"):
        return 0.0
    raise ValueError(f"a delay needs its unit (20ms, 0.5s), got {delay!r}")


def _fraction(loss: str) -> float:
    """``1%`` or ``0.01`` as a fraction."""
    if not loss:
        return 0.0
    return float(loss[:-1]) / 100 if loss.endswith("%") else float(loss)
