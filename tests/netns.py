"""A test network of Linux network namespaces on one bridge, with faults made by iptables.

Needs root. Each host ``i`` is namespace ``<prefix>-n<i>`` with an ``eth0`` (a veth whose other
end, ``<prefix>-v<i>``, is on bridge ``<prefix>-br``) at ``<subnet>.<i + 1>``; the bridge itself
is ``<subnet>.254``, so the test process (in the root namespace) reaches every host. Faults are
iptables rules inside the hosts' own namespaces (nothing on the host's tables, nothing
another user of the machine sees): :meth:`Testnet.split` drops all traffic between groups of
hosts until :meth:`Testnet.heal`. Everything is named with ``prefix`` and removed on exit, also
when building failed halfway, and stale leftovers of an earlier run with the same prefix are
removed first; other prefixes are never touched.

Use it as a context manager (``with Testnet("swim", 6, "10.79.13") as net:``), start each
host's process under ``net.exec_argv(i)`` listening on ``net.address(i)``, and make faults with
``net.split([[0, 1, 2], [3, 4, 5]])`` and ``net.heal()``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Self

__all__ = ["Testnet", "can_build_testnets"]


def sh(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _succeeds(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def can_build_testnets() -> tuple[bool, str]:
    """Whether this process may make namespaces and iptables rules (and why not)."""
    import os
    import shutil

    if os.geteuid() != 0:
        return False, "needs root (network namespaces and iptables)"
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if missing:
        return False, f"needs {' and '.join(missing)}"
    return True, ""


class Testnet:
    """``n`` hosts, each in its own namespace, on one bridge.

    Args:
        prefix: names every namespace, veth and bridge (interface names stay within Linux's
            15 characters for up to 100 hosts with a prefix of up to 10).
        subnet: the first three octets of the hosts' /24; pick one no one else uses here.
    """

    __test__ = False  # a helper, not a test class

    def __init__(self, prefix: str, n: int, subnet: str) -> None:
        if not 1 <= n <= 100 or len(f"{prefix}-br") > 15 or len(f"{prefix}-v{n - 1}") > 15:
            raise ValueError(f"prefix {prefix!r} with {n} hosts makes interface names too long")
        self.prefix, self.n, self.subnet = prefix, n, subnet
        self.bridge = f"{prefix}-br"
        self._split: list[tuple[int, str]] = []  # (host, rule) pairs added by split()

    def namespace(self, i: int) -> str:
        return f"{self.prefix}-n{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def exec_argv(self, i: int) -> list[str]:
        """What to put before a command line to run it on host ``i``."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def __enter__(self) -> Self:
        able, why = can_build_testnets()
        if not able:
            raise RuntimeError(f"a test network {why}")
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
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        # With br_netfilter loaded, the host's FORWARD chain sees bridged traffic too (a Docker
        # engine's policy drops it): let our bridge's own traffic through.
        if self._bridge_filtered():
            sh("iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        for i in range(self.n):
            ns, outside, inside = self.namespace(i), f"{self.prefix}-v{i}", f"{self.prefix}-p{i}"
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
            sh("ip", "link", "set", inside, "netns", ns)
            sh(*self.exec_argv(i), "ip", "link", "set", inside, "name", "eth0")
            sh(*self.exec_argv(i), "ip", "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            sh(*self.exec_argv(i), "ip", "link", "set", "eth0", "up")
            sh(*self.exec_argv(i), "ip", "link", "set", "lo", "up")
            sh("ip", "link", "set", outside, "master", self.bridge, "up")

    # -- faults -------------------------------------------------------------------------------

    def split(self, groups: Sequence[Iterable[int]]) -> None:
        """Drop every packet between hosts of different groups (each host's own INPUT and
        OUTPUT), as a partition does: silently, with no reset or unreachable. The bridge's
        address (the test process) still reaches every host."""
        members = [list(g) for g in groups]
        for g, group in enumerate(members):
            others = [j for k, other in enumerate(members) if k != g for j in other]
            for i in group:
                for j in others:
                    for rule in (f"INPUT -s {self.address(j)}", f"OUTPUT -d {self.address(j)}"):
                        sh(*self.exec_argv(i), "iptables", "-A", *rule.split(), "-j", "DROP")
                        self._split.append((i, rule))

    def heal(self) -> None:
        """Remove every rule :meth:`split` added."""
        while self._split:
            i, rule = self._split.pop()
            sh(*self.exec_argv(i), "iptables", "-D", *rule.split(), "-j", "DROP", check=False)

    # -- cleaning -----------------------------------------------------------------------------

    def clean(self) -> None:
        """Remove this prefix's namespaces (their veths and rules go with them) and bridge."""
        self._split.clear()
        for line in sh("ip", "netns", "list", check=False).splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith(f"{self.prefix}-n") and name[len(self.prefix) + 2 :].isdigit():
                sh("ip", "netns", "del", name, check=False)
        for i in range(self.n):  # a veth left outside when building stopped halfway
            if Path(f"/sys/class/net/{self.prefix}-v{i}").exists():
                sh("ip", "link", "del", f"{self.prefix}-v{i}", check=False)
        if Path(f"/sys/class/net/{self.bridge}").exists():
            if self._bridge_filtered():
                rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
                while _succeeds("iptables", "-D", *rule):
                    pass
            sh("ip", "link", "del", self.bridge, check=False)

    @staticmethod
    def _bridge_filtered() -> bool:
        flag = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        return flag.exists() and flag.read_text().strip() == "1"
