"""A test network with real NAT: a few public hosts on one "internet" bridge, and homes behind
"home router" namespaces that masquerade (iptables ``MASQUERADE``), forward no port, and drop
every connection that starts outside. Needs root.

Every home uses the same private subnet, as home networks do, so two nodes in different homes
may well have the same address. Hosts:

* public host ``i`` is namespace ``<prefix>-p<i>`` at ``<wan>.<i + 1>``;
* router ``r`` is ``<prefix>-r<r>``, at ``<wan>.<100 + r>`` outside and ``<home>.254`` inside;
* home host ``k`` of router ``r`` is ``<prefix>-h<r><k>`` at ``<home>.<k + 1>``.

The test process (in the root namespace) is on the internet too (``<wan>.254``): it reaches the
public hosts, and, as any outsider, not the homes. Everything is named with ``prefix`` and
removed on exit (also when building failed halfway); other prefixes are never touched.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.netns import Testnet, can_build_testnets, sh

__all__ = ["NatNet"]


class NatNet:
    __test__ = False  # a helper, not a test class

    def __init__(
        self, prefix: str, public: int, homes: int, per_home: int, wan: str, home: str
    ) -> None:
        if len(f"{prefix}-wan") > 15 or len(f"{prefix}-h{homes}{per_home}x") > 15:
            raise ValueError(f"prefix {prefix!r} makes interface names too long")
        self.prefix, self.public, self.homes, self.per_home = prefix, public, homes, per_home
        self.wan, self.home = wan, home
        self.bridge = f"{prefix}-wan"

    # -- names --------------------------------------------------------------------------------

    def public_ns(self, i: int) -> str:
        return f"{self.prefix}-p{i}"

    def public_address(self, i: int) -> str:
        return f"{self.wan}.{i + 1}"

    def router_ns(self, r: int) -> str:
        return f"{self.prefix}-r{r}"

    def home_ns(self, r: int, k: int) -> str:
        return f"{self.prefix}-h{r}{k}"

    def home_address(self, k: int) -> str:
        return f"{self.home}.{k + 1}"

    @staticmethod
    def exec_argv(namespace: str) -> list[str]:
        return ["ip", "netns", "exec", namespace]

    # -- life ---------------------------------------------------------------------------------

    def __enter__(self) -> NatNet:
        able, why = can_build_testnets()
        if not able:
            raise RuntimeError(f"a NAT test network {why}")
        self.clean()
        try:
            self._build()
        except BaseException:
            self.clean()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.clean()

    def _veth(self, ns: str, outside: str, address: str, attach: list[str]) -> None:
        """A veth with its inner end as ``eth0`` of ``ns``; the outer end attached by
        ``attach`` (a command run on it)."""
        inside = f"{outside}i"
        sh("ip", "link", "add", outside, "type", "veth", "peer", "name", inside)
        sh("ip", "link", "set", inside, "netns", ns)
        run = self.exec_argv(ns)
        sh(*run, "ip", "link", "set", inside, "name", "eth0")
        sh(*run, "ip", "addr", "add", address, "dev", "eth0")
        sh(*run, "ip", "link", "set", "eth0", "up")
        sh(*run, "ip", "link", "set", "lo", "up")
        sh(*attach)

    def _build(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.wan}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        if self._bridge_filtered():
            sh("iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT")
        for i in range(self.public):
            ns, outside = self.public_ns(i), f"{self.prefix}-pv{i}"
            sh("ip", "netns", "add", ns)
            attach = ["ip", "link", "set", outside, "master", self.bridge, "up"]
            self._veth(ns, outside, f"{self.public_address(i)}/24", attach)
        for r in range(self.homes):
            router = self.router_ns(r)
            sh("ip", "netns", "add", router)
            outside = f"{self.prefix}-rv{r}"
            attach = ["ip", "link", "set", outside, "master", self.bridge, "up"]
            self._veth(router, outside, f"{self.wan}.{100 + r}/24", attach)
            run = self.exec_argv(router)
            sh(*run, "ip", "link", "add", "home", "type", "bridge")
            sh(*run, "ip", "addr", "add", f"{self.home}.254/24", "dev", "home")
            sh(*run, "ip", "link", "set", "home", "up")
            sh(*run, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            # The home router: out through masquerade; in, only what answers a connection
            # opened from inside; nothing forwarded to any port.
            nat = ["iptables", "-t", "nat", "-A", "POSTROUTING", "-s", f"{self.home}.0/24"]
            sh(*run, *nat, "-o", "eth0", "-j", "MASQUERADE")
            established = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]
            sh(*run, "iptables", "-A", "FORWARD", "-i", "eth0", *established)
            sh(*run, "iptables", "-A", "FORWARD", "-i", "eth0", "-j", "DROP")
            sh(*run, "iptables", "-A", "INPUT", "-i", "eth0", *established)
            sh(*run, "iptables", "-A", "INPUT", "-i", "eth0", "-j", "DROP")
            for k in range(self.per_home):
                host = self.home_ns(r, k)
                sh("ip", "netns", "add", host)
                outside = f"{self.prefix}-h{r}{k}v"
                sh("ip", "link", "add", outside, "type", "veth", "peer", "name", f"{outside}i")
                sh("ip", "link", "set", outside, "netns", router)
                sh(*run, "ip", "link", "set", outside, "master", "home", "up")
                inside = f"{outside}i"
                sh("ip", "link", "set", inside, "netns", host)
                hrun = self.exec_argv(host)
                sh(*hrun, "ip", "link", "set", inside, "name", "eth0")
                sh(*hrun, "ip", "addr", "add", f"{self.home_address(k)}/24", "dev", "eth0")
                sh(*hrun, "ip", "link", "set", "eth0", "up")
                sh(*hrun, "ip", "link", "set", "lo", "up")
                sh(*hrun, "ip", "route", "add", "default", "via", f"{self.home}.254")

    def clean(self) -> None:
        for line in sh("ip", "netns", "list", check=False).splitlines():
            name = line.split()[0] if line.split() else ""
            rest = name[len(self.prefix) + 1 :]
            if name.startswith(f"{self.prefix}-") and rest[:1] in ("p", "r", "h"):
                sh("ip", "netns", "del", name, check=False)
        for link in Path("/sys/class/net").iterdir():
            if link.name.startswith(f"{self.prefix}-") and link.name != self.bridge:
                sh("ip", "link", "del", link.name, check=False)
        if Path(f"/sys/class/net/{self.bridge}").exists():
            if self._bridge_filtered():
                rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
                while (
                    subprocess.run(["iptables", "-D", *rule], capture_output=True).returncode == 0
                ):
                    pass
            sh("ip", "link", "del", self.bridge, check=False)

    _bridge_filtered = staticmethod(Testnet._bridge_filtered)

    # -- checks -------------------------------------------------------------------------------

    def connects(self, namespace: str, address: str, port: int = 9) -> bool:
        """Whether a TCP connection from ``namespace`` to ``address`` gets an answer within a
        second (a refusal is one): what "can dial" means."""
        probe = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(('{address}', {port}), timeout=1)\n"
            "except ConnectionRefusedError:\n"
            "    sys.exit(0)\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        done = subprocess.run([*self.exec_argv(namespace), sys.executable, "-c", probe])
        return done.returncode == 0
