"""Pull a model from a node and report the memory it took: ``python -m tests.node.pull_probe
ADDRESS NUMEL`` prints one JSON line. Runs in a process of its own so that its peak resident
memory belongs to the transfer alone."""

from __future__ import annotations

import asyncio
import json
import resource
import sys

import torch

from node.daemon.transfer import receive_model
from node.transport.grpc import GrpcTransport, GrpcTransportConfig


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    """The process's high-water mark of resident memory (VmHWM). Not ``ru_maxrss``, which
    Linux carries over from the parent across fork and exec, so it would count the sender."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


async def main(address: str, numel: int) -> None:
    transport = GrpcTransport(GrpcTransportConfig(max_message_bytes=4 << 20))
    await transport.call_status(address, 30.0)  # the channel is up before the baseline
    baseline = rss_bytes()
    values, step = await receive_model(
        transport.call_pull_model(address, "probe", 120.0), numel, address
    )
    # Read the peak before anything else here allocates (the checksum below does).
    peak = peak_rss_bytes()
    result = {
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "numel": values.numel(),
        "sum": float(values.double().sum()),
        "step": step,
    }
    print(json.dumps(result), flush=True)
    await transport.close(0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
