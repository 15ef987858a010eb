"""The simulator's codec that decodes each payload once (node/sim/decodes.py) is the swarm's
codec in every setting: a sparse codec's share and auto's first codec survive the wrapping
(before, both fell back to their defaults, so ``murmur simulate --compress-fraction`` was lost)."""

from __future__ import annotations

import torch

from gossip.codecs import AutoCodec, get_codec
from node.sim.decodes import sharing_decodes


def test_the_wrapped_codec_keeps_its_settings_and_decodes_alike() -> None:
    x = torch.randn(1024, generator=torch.Generator().manual_seed(0))
    for codec in (
        get_codec("topk", 128, 0.05),
        get_codec("dct-topk", 256, 0.02),
        AutoCodec(64, initial="int4"),
        get_codec("int8", 32),
    ):
        shared = sharing_decodes(codec)
        assert shared.name == codec.name
        assert shared.block_size == codec.block_size
        assert shared.fraction == codec.fraction
        assert shared.encoded_nbytes(x.numel()) == codec.encoded_nbytes(x.numel())
        enc = codec.compress(x, torch.Generator().manual_seed(1)).encoded
        assert torch.equal(shared.decode(enc), codec.decode(enc))
        assert torch.equal(shared.decode(enc), shared.decode(enc))  # from its cache, a copy
    auto = sharing_decodes(AutoCodec(64, initial="int4"))
    assert isinstance(auto, AutoCodec)
    assert auto.initial.name == "int4"
