"""The link impairment of tests/impair.py does what it says: a UDP echo between two hosts of a
Testnet takes ``2 * delay`` longer, loses about ``1 - (1 - p)**2`` of its round trips (each
way loses p), and comes back in order; the fallback (nfqueue) always, netem too where the kernel
has it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from tests.impair import Impairment, netem_available
from tests.netns import Testnet

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs

PREFIX, SUBNET = "lossy", "10.79.40"
DELAY_S = 0.04
LOSS = 0.1
PACKETS = 2000  # the loss rate's standard error is about 0.009 with these

ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
while True:
    data, peer = s.recvfrom(64)
    s.sendto(data, peer)
"""

PROBE = """
import json, socket, sys, threading, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
sent, order, rtts = {}, [], []
def receive():
    while True:
        try:
            data = s.recv(64)
        except TimeoutError:
            return
        seq = int(data)
        order.append(seq)
        rtts.append(time.monotonic() - sent[seq])
t = threading.Thread(target=receive)
for seq in range(n):
    sent[seq] = time.monotonic()
    s.sendto(str(seq).encode(), (host, port))
    if seq == 0:
        t.start()
    time.sleep(0.002)
t.join()
print(json.dumps({"order": order, "rtts": rtts}))
"""


def echo_round_trips(net: Testnet, n: int) -> tuple[list[int], list[float]]:
    """Host 0 sends ``n`` numbered datagrams to an echo on host 1: the numbers that came back,
    in the order they came, and their round-trip times."""
    echo = subprocess.Popen(
        [*net.exec_argv(1), sys.executable, "-c", ECHO, net.address(1)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert echo.stdout is not None
        port = echo.stdout.readline().strip()
        argv = [*net.exec_argv(0), sys.executable, "-c", PROBE, net.address(1), port, str(n)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        echo.kill()
        echo.wait()
        assert echo.stdout is not None
        echo.stdout.close()
    got = json.loads(done.stdout)
    return got["order"], got["rtts"]


@pytest.mark.timeout(180)
def test_impaired_links_delay_both_ways_lose_about_p_each_way_and_keep_order() -> None:
    with Testnet(PREFIX, 2, SUBNET) as net:
        methods = ["netem", "nfqueue"] if netem_available(net) else ["nfqueue"]
        for method in methods:
            with Impairment(net, method) as links:
                assert links.method == method
                order, rtts = echo_round_trips(net, 200)
                assert len(order) == 200  # a clean link loses nothing
                clean_s = statistics.median(rtts)

                links.set(0.0, DELAY_S)
                order, rtts = echo_round_trips(net, 200)
                assert len(order) == 200
                added_s = statistics.median(rtts) - clean_s
                # Both directions wait DELAY_S; a scheduler's wake-up adds a little, never less.
                assert 2 * DELAY_S * 0.95 < added_s < 2 * DELAY_S + 0.02, (method, added_s)
                assert order == sorted(order), method  # one delay for all: nothing overtakes

                links.set(LOSS, DELAY_S)
                order, rtts = echo_round_trips(net, PACKETS)
                lost = 1 - len(order) / PACKETS
                expected = 1 - (1 - LOSS) ** 2
                assert abs(lost - expected) < 0.04, (method, lost, expected)
                assert order == sorted(order), method
                assert statistics.median(rtts) - clean_s > 2 * DELAY_S * 0.95
                links.check()

                print(
                    f"\n{method}: round trip {clean_s * 1e3:.2f} ms clean, +{added_s * 1e3:.1f} ms "
                    f"with {DELAY_S * 1e3:g} ms each way; {lost:.3f} of round trips lost at "
                    f"{LOSS:g} each way (expected {expected:.3f})"
                )
                links.clear()
                order, rtts = echo_round_trips(net, 200)
                assert len(order) == 200  # clean again: the rules and the workers are gone
                assert statistics.median(rtts) < clean_s + DELAY_S / 2
        rules = subprocess.run(
            [*net.exec_argv(0), "iptables", "-t", "mangle", "-S"], capture_output=True, text=True
        ).stdout
        assert "MURMUR_IMPAIR" not in rules
