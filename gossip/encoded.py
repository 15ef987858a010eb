"""What a compressed vector is on the wire, apart from the codecs that make it: so that code
that only carries or inspects messages (``murmur status``, the wire module) need not load torch."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Encoded"]


@dataclass(frozen=True)
class Encoded:
    """A compressed flat vector as it travels: the codec's name, its geometry and its bytes."""

    codec: str
    numel: int
    block_size: int
    scales: bytes
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.scales) + len(self.data)
