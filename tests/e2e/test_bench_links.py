"""The slow-link benches' network (bench/testnet.py) puts the delay it is asked for on every
link, whether the kernel has netem or not (then in user space): a TCP handshake between two of
its hosts takes at least the two one-way delays."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import testnet

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs

DELAY_S = 0.010
SERVER = """
import socket
s = socket.socket()
s.bind(("0.0.0.0", 47999))
s.listen(16)
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""
CLIENT = """
import json, socket, time
rtts = []
for _ in range(5):
    s = socket.socket()
    began = time.perf_counter()
    s.connect(({address!r}, 47999))
    rtts.append(time.perf_counter() - began)
    s.close()
print(json.dumps(rtts))
"""


def test_a_handshake_between_two_hosts_takes_both_one_way_delays() -> None:
    with testnet.Testnet(
        2, "20mbit", f"{DELAY_S * 1e3:g}ms", "0", name="bln", subnet="10.79.62"
    ) as net:
        argv = [*net.exec_argv(1), sys.executable, "-c", SERVER]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as server:
            try:
                assert server.stdout is not None
                assert server.stdout.readline().strip() == "listening"
                client = CLIENT.format(address=net.address(1))
                rtts = json.loads(testnet.sh(*net.exec_argv(0), sys.executable, "-c", client))
            finally:
                server.kill()
        applied = net.applied
    print(f"\nlinks: {applied}; handshakes {[round(r * 1e3, 1) for r in rtts]} ms")
    assert "10ms" in applied, applied
    assert min(rtts) >= 2 * DELAY_S, rtts  # unshaped, a handshake on a veth takes 0.1 ms
