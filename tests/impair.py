"""Loss and delay on every link of a :class:`~tests.netns.Testnet`, with or without netem.

Every packet that crosses a link is lost with probability ``loss`` and otherwise arrives
``delay_s`` later, in each direction, so a round trip between two hosts takes ``2 * delay_s``
more and loses ``1 - (1 - loss)**2`` of its exchanges. Two ways, the first that works in the
hosts' own namespaces:

* ``netem`` on what each host sends (``tc qdisc add dev eth0 root netem delay <d> loss <p>``),
  what users' kernels have;
* ``nfqueue``, for a kernel without netem, on what each host receives: loss by
  ``iptables -m statistic --mode random`` (a DROP rule), delay by a user-space worker per host
  (this module run as a program in the host's namespace) that takes each packet from an
  ``NFQUEUE`` rule, holds it ``delay_s`` and lets it go. It holds packets first in, first out
  with one delay, so it reorders nothing. The receiving side, because a packet dropped or held
  in its sender's own output path is not a lost or delayed one to TCP: the sender learns of a
  drop at once (``EPERM``) and retries, and a held packet counts against its TCP Small Queues
  limit (about two packets), which would cap every connection far below the link.

The rules are in each host's ``mangle`` PREROUTING, before ``filter`` where
:meth:`Testnet.split` drops (a packet let go from a queue skips only the rest of its own
table). Packets between the test process (the bridge's address) and a host are impaired one
way: netem delays and loses the host's answers, nfqueue the test process's requests.
Segmentation offload is turned off on every host's ``eth0`` (``gso_max_segs 1``), so each lost
packet is one packet on the wire, not a 64 KB burst: impair the links before the processes open
their connections, which take the setting when they connect.

    with Testnet("lossy", 6, "10.79.41") as net, Impairment(net) as links:
        links.set(loss=0.1, delay_s=0.04)  # "netem" or "nfqueue": links.method
        ...
        links.clear()
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any, Protocol

from tests.netns import sh


class Hosts(Protocol):
    """What impairing a network needs of it: its hosts (each with an ``eth0``), and how to
    run a command on one (tests.netns.Testnet, and bench/testnet.py's)."""

    n: int

    def exec_argv(self, i: int) -> list[str]: ...


__all__ = ["Impairment", "netem_available"]

REPO = Path(__file__).resolve().parent.parent
CHAIN = "MURMUR_IMPAIR"  # in each host's own mangle table, so no one else's
#: How long a delay worker may take to bind its queue (it imports a library and binds).
WORKER_START_S = 30.0


def netem_available(net: Hosts, host: int = 0) -> bool:
    """Whether the kernel takes a netem qdisc, found by trying one on ``host``'s loopback."""
    argv = [*net.exec_argv(host), "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay"]
    if subprocess.run([*argv, "1ms"], capture_output=True, check=False).returncode != 0:
        return False
    sh(*net.exec_argv(host), "tc", "qdisc", "del", "dev", "lo", "root", check=False)
    return True


class Impairment:
    """Loss and delay on every host's ``eth0`` of ``net``, changed by :meth:`set`.

    Args:
        net: a built test network.
        method: ``"auto"`` (netem where the kernel has it, else nfqueue), ``"netem"`` or
            ``"nfqueue"`` (to test the fallback on a kernel with netem).
    """

    def __init__(self, net: Hosts, method: str = "auto") -> None:
        if method not in ("auto", "netem", "nfqueue"):
            raise ValueError(f"method {method!r}: expected auto, netem or nfqueue")
        self.net = net
        self._want = method
        self.method = ""  # the one in use, once entered
        self.loss, self.delay_s = 0.0, 0.0
        self._workers: dict[int, DelayWorker] = {}  # host: its delay worker (nfqueue)
        self._queue = 0  # the queue number the workers now serve
        self._netem_on = False

    def __enter__(self) -> Impairment:
        self.method = self._want
        if self.method == "auto":
            self.method = "netem" if netem_available(self.net) else "nfqueue"
        try:
            for i in range(self.net.n):
                sh(*self.net.exec_argv(i), "ip", "link", "set", "eth0", "gso_max_segs", "1")
                if self.method == "nfqueue":
                    self._iptables(i, "-N", CHAIN)
                    self._iptables(i, "-A", "PREROUTING", "-i", "eth0", "-j", CHAIN)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _iptables(self, host: int, *args: str, check: bool = True) -> None:
        sh(*self.net.exec_argv(host), "iptables", "-w", "-t", "mangle", *args, check=check)

    def set(self, loss: float, delay_s: float) -> None:
        """Every packet a host sends is lost with probability ``loss`` and otherwise leaves
        ``delay_s`` later; ``set(0, 0)`` is a clean network again."""
        if not 0 <= loss < 1 or delay_s < 0:
            raise ValueError(
                f"loss {loss} and delay {delay_s} s: expected 0 <= loss < 1, delay >= 0"
            )
        if self.method == "netem":
            self._set_netem(loss, delay_s)
        elif self.method == "nfqueue":
            self._set_nfqueue(loss, delay_s)
        else:
            raise RuntimeError("enter the Impairment (with ...) before setting it")
        self.loss, self.delay_s = loss, delay_s

    def clear(self) -> None:
        self.set(0.0, 0.0)

    def _set_netem(self, loss: float, delay_s: float) -> None:
        verb = "change" if self._netem_on else "add"
        for i in range(self.net.n):
            qdisc = ["tc", "qdisc", verb, "dev", "eth0", "root", "netem"]
            sh(
                *self.net.exec_argv(i),
                *qdisc,
                "delay",
                f"{delay_s * 1e6:.0f}us",
                "loss",
                f"{loss * 100:g}%",
            )
        self._netem_on = True

    def _set_nfqueue(self, loss: float, delay_s: float) -> None:
        old = dict(self._workers)
        if delay_s != self.delay_s:
            # New workers on the other queue number first, so that no packet meets a queue
            # that no one serves (the kernel drops those); the old ones let go of what they hold.
            self._queue ^= 1
            self._workers = {}
            if delay_s > 0:
                self._workers = {
                    i: DelayWorker(self.net, i, self._queue, delay_s) for i in range(self.net.n)
                }
                for worker in self._workers.values():
                    worker.wait_ready()
        for i in range(self.net.n):
            self._iptables(i, "-F", CHAIN)
            if loss > 0:
                rule = ["-m", "statistic", "--mode", "random", "--probability", f"{loss:.6f}"]
                self._iptables(i, "-A", CHAIN, *rule, "-j", "DROP")
            if i in self._workers:
                self._iptables(i, "-A", CHAIN, "-j", "NFQUEUE", "--queue-num", str(self._queue))
        if delay_s != self.delay_s:
            for worker in old.values():
                worker.stop()

    def check(self) -> None:
        """Raise if a delay worker has died (its host's link would drop everything)."""
        for i, worker in self._workers.items():
            if worker.proc.poll() is not None:
                raise RuntimeError(f"the delay worker of host {i} exited: {worker.stderr()}")

    def close(self) -> None:
        """Take every impairment away (the namespaces themselves stay)."""
        for i in range(self.net.n):
            if self._netem_on:
                sh(*self.net.exec_argv(i), "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            if self.method == "nfqueue":
                self._iptables(i, "-D", "PREROUTING", "-i", "eth0", "-j", CHAIN, check=False)
                self._iptables(i, "-F", CHAIN, check=False)
                self._iptables(i, "-X", CHAIN, check=False)
        self._netem_on = False
        for worker in self._workers.values():
            worker.stop()
        self._workers = {}
        self.loss, self.delay_s = 0.0, 0.0


class DelayWorker:
    """This module as a program in host ``i``'s namespace, serving NFQUEUE ``queue``."""

    def __init__(self, net: Hosts, host: int, queue: int, delay_s: float) -> None:
        argv = [
            sys.executable,
            "-m",
            "tests.impair",
            "--queue",
            str(queue),
            "--delay-s",
            str(delay_s),
        ]
        self.proc = subprocess.Popen(
            [*net.exec_argv(host), *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,  # where ``tests`` is a package, whatever the caller's directory
        )

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""

    def wait_ready(self) -> None:
        """Wait for its "ready" line (the queue is bound); raise with its error if it fails."""
        assert self.proc.stdout is not None
        done = threading.Event()
        line: list[str] = []

        def read() -> None:
            assert self.proc.stdout is not None
            line.append(self.proc.stdout.readline())
            done.set()

        threading.Thread(target=read, daemon=True).start()
        if not done.wait(WORKER_START_S) or line[0].strip() != "ready":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the delay worker did not start: {self.stderr().strip()}")

    def stop(self) -> None:
        """Close its input: it lets go of the packets it holds, each at its time, and exits."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(WORKER_START_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


# -- the delay worker ---------------------------------------------------------------------------


class Delayer:
    """Holds each packet ``delay_s`` from its arrival, then accepts it, first in first out.

    One delay for all and one releasing thread: packets leave in the order they came (no flow is
    reordered), each ``delay_s`` after it came, give or take the scheduler's wake-up."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._held: deque[tuple[float, Any]] = deque()  # (due, packet), due in arrival order
        self._cond = threading.Condition()
        self._closing = False
        self.released = 0
        self._thread = threading.Thread(target=self._release, name="release", daemon=True)
        self._thread.start()

    def hold(self, packet: Any) -> None:
        with self._cond:
            self._held.append((time.monotonic() + self.delay_s, packet))
            if len(self._held) == 1:
                self._cond.notify()

    def close(self) -> None:
        """Let go of everything held, each at its time, then return."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join()

    def _release(self) -> None:
        while True:
            with self._cond:
                while not self._held and not self._closing:
                    self._cond.wait()
                if not self._held:
                    return
                due, packet = self._held[0]
                wait_s = due - time.monotonic()
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    continue
                self._held.popleft()
            packet.accept()
            self.released += 1


def _serve(queue: int, delay_s: float, ready: IO[str]) -> None:
    import fnfqueue  # the dev extra: a harness need, never a node's

    conn = fnfqueue.Connection(packet_size=4096)  # headers only: a verdict needs no payload
    q = conn.bind(queue)
    q.set_mode(0, fnfqueue.COPY_META)
    q.set_maxlen(65536)  # a 6-node swarm holds a few hundred at 40 ms; the kernel drops past it
    delayer = Delayer(delay_s)

    def until_eof() -> None:
        # The harness closes our input once no rule sends packets here any more: let go of
        # what is held, each at its time, then close (the kernel drops what a closed queue holds).
        sys.stdin.read()
        delayer.close()
        conn.close()  # ends the loop below

    threading.Thread(target=until_eof, daemon=True).start()
    print("ready", file=ready, flush=True)
    for packet in conn:
        delayer.hold(packet)


def main() -> None:
    parser = argparse.ArgumentParser(description="Delay every packet of an NFQUEUE queue.")
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-s", type=float, required=True)
    args = parser.parse_args()
    _serve(args.queue, args.delay_s, sys.stdout)


if __name__ == "__main__":
    main()
