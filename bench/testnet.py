"""The slow-link benches' network: a network namespace per node on one bridge, every link shaped.

Host ``i`` gets namespace ``<name>-n<i>`` with an ``eth0`` at ``<subnet>.<i+1>`` on a bridge in
the root namespace; ``scripts/shape-link`` shapes both directions of its link (the node's uplink
inside the namespace: rate, delay and loss; its downlink on the bridge side: the rate). Where
the kernel has netem, netem applies all three; where it has not, tbf keeps the rate and the
delay and loss go in user space (tests/impair.py's NFQUEUE workers, on what each host receives;
iptables and the dev extra's fnfqueue). ``Testnet.applied`` says which. Everything made is named
``<name>-*`` and removed on exit, on failure too, and before building (left over from a run that
was killed). Used by bench/slow_links.py and bench/text_links.py; needs root.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.impair import Impairment

__all__ = ["Testnet", "sh"]

PREFIX = "mmb"
SUBNET = "10.77.0"
SHAPE = str(Path(__file__).resolve().parent.parent / "scripts" / "shape-link")


def sh(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def succeeds(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


@dataclass
class Testnet:
    """``n`` namespaces on one bridge, each link shaped."""

    n: int
    rate: str
    delay: str
    loss: str
    applied: str = ""
    #: Names of everything made start with this (another bench may use its own at once).
    name: str = PREFIX
    subnet: str = SUBNET
    #: Delay and loss in user space (tests/impair.py's NFQUEUE workers, on each host's receive
    #: side) where the kernel has no netem; None where netem applied them, or none were asked.
    impairment: Impairment | None = field(default=None, repr=False)

    def namespace(self, i: int) -> str:
        return f"{self.name}-n{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def exec_argv(self, i: int) -> list[str]:
        """What to put before a command line to run it on host ``i``."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def sent_bytes(self, i: int) -> int:
        """What node ``i`` put on the wire: its link's bytes as they arrive at the bridge."""
        return int(Path(f"/sys/class/net/{self.name}-v{i}/statistics/rx_bytes").read_text())

    def __enter__(self) -> Testnet:
        self.clean()
        try:
            self._build()
        except BaseException:
            self.clean()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.clean()

    def _build(self) -> None:
        bridge = f"{self.name}-br"
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        # A Docker engine on this host drops forwarded bridge traffic unless told otherwise.
        if _bridge_filtered():
            sh("iptables", "-I", "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT")
        shaping = []
        for i in range(self.n):
            ns, outside, inside = self.namespace(i), f"{self.name}-v{i}", f"{self.name}-p{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh(*self.exec_argv(i), "ip", "link", "set", inside, "name", "eth0")
            sh(*self.exec_argv(i), "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            sh(*self.exec_argv(i), "ip", "link", "set", "eth0", "up")
            sh(*self.exec_argv(i), "ip", "link", "set", "lo", "up")
            sh("ip", "link", "set", outside, "master", bridge, "up")
            up = ["--rate", self.rate, "--delay", self.delay, "--loss", self.loss]
            shaping.append(sh(*self.exec_argv(i), SHAPE, "eth0", *up))
            sh(SHAPE, outside, "--rate", self.rate)  # the downlink: the rate only
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
        for ns in sh("ip", "netns", "list", check=False).splitlines():
            name = ns.split()[0] if ns.split() else ""
            if name.startswith(f"{self.name}-n"):
                sh("ip", "netns", "del", name, check=False)  # takes its veth pair along
        bridge = f"{self.name}-br"
        if Path(f"/sys/class/net/{bridge}").exists():
            if _bridge_filtered():
                rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
                while succeeds("iptables", "-D", *rule):
                    pass
            sh("ip", "link", "del", bridge, check=False)


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


def _bridge_filtered() -> bool:
    flag = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    return succeeds("which", "iptables") and flag.exists() and flag.read_text().strip() == "1"
