"""A refusal to a call that has already ended (the caller left, the server is stopping) is a
cancellation, which gRPC logs quietly, not a servicer error with a traceback; a refusal to a
live call aborts it as always. Found by the soak test: at the final SIGTERM a node refused a
delta with ``shutting_down`` after the stream had closed, and gRPC logged ExecuteBatchError."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import grpc.aio
import pytest
from grpc._cython import cygrpc  # type: ignore[attr-defined]  # its ExecuteBatchError

from node.transport.base import Handler, Reason, Rejected
from node.transport.grpc import GrpcTransportConfig
from node.transport.grpc_server import Servicer


class Call:
    """The two parts of a servicer context that a refusal uses, for a call in a given state."""

    def __init__(self, done: bool, abort_raises: BaseException) -> None:
        self._done, self._raises = done, abort_raises
        self.aborts = 0

    def done(self) -> bool:
        return self._done

    async def abort(self, *args: Any, **kwargs: Any) -> None:
        self.aborts += 1
        raise self._raises


def servicer() -> Servicer:
    return Servicer(cast(Handler, object()), GrpcTransportConfig(), lambda: None)


@pytest.mark.parametrize(
    ("done", "abort_raises", "expected", "aborts"),
    [
        (False, grpc.aio.AbortError(), grpc.aio.AbortError, 1),  # live: aborted as always
        (True, grpc.aio.AbortError(), asyncio.CancelledError, 0),  # over: nothing to send
        (False, cygrpc.ExecuteBatchError("send status"), asyncio.CancelledError, 1),  # ended now
    ],
    ids=["live", "ended", "ended-during-abort"],
)
async def test_a_refusal_aborts_a_live_call_and_cancels_an_ended_one(
    done: bool, abort_raises: BaseException, expected: type[BaseException], aborts: int
) -> None:
    call = Call(done, abort_raises)
    context = cast(grpc.aio.ServicerContext[Any, Any], call)
    with pytest.raises(expected):
        await servicer()._refuse(context, Rejected(Reason.SHUTTING_DOWN, "stopping"))
    assert call.aborts == aborts
