"""Saying hello: how a node joins a swarm through a member's address, and how a member takes a
joiner.

A joiner says hello (its protocol version, task fingerprint, signed member record and what it
knows of the swarm) to the first address that answers; the member checks that nobody else
answers at the joiner's address, by calling it back, then merges it into its view and answers
with its own view. A joiner that nobody can call back (NAT, a firewall) goes by an address that
never resolves and opens a dial-out session to the member, through which it is taken
(node/daemon/dialout.py).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import replace

from gossip.messages import PROTOCOL_VERSION, Hello, TaskFingerprint
from gossip.refusals import REFUSALS
from gossip.swim import Swim
from node.config import GossipConfig
from node.daemon.dialout import DialOut, unreachable_address
from node.daemon.membership import Membership
from node.runtime import Runtime
from node.security.penalties import LogLimiter, held_back
from node.transport.base import HandshakeFailed, Reason, Rejected, Transport, Unreachable

__all__ = ["Introductions", "JoinError"]

log = logging.getLogger(__name__)

#: Refusals that mean "not now" rather than "never": retry the join (gossip/refusals.py).
_RETRYABLE = frozenset(r for r, c in REFUSALS.items() if c.retryable)


class JoinError(RuntimeError):
    """The node could not join the swarm (refused, or nobody answered in time)."""


class Introductions:
    """One node's side of the hello exchange, both ways.

    Args:
        hello: this node's hello as it stands (its record, its view, its revocation list).
        adopt_revocations: takes a revocation list a peer sent (its blob, the peer).
    """

    def __init__(
        self,
        node_id: str,
        fingerprint: TaskFingerprint,
        transport: Transport,
        swim: Swim,
        membership: Membership,
        dialout: DialOut,
        cfg: GossipConfig,
        runtime: Runtime,
        hello: Callable[[], Hello],
        adopt_revocations: Callable[[bytes, str], bool],
    ) -> None:
        self.node_id = node_id
        self.fingerprint = fingerprint
        self.transport = transport
        self.swim = swim
        self.membership = membership
        self.dialout = dialout
        self.cfg = cfg
        self.runtime = runtime
        self.hello = hello
        self.adopt_revocations = adopt_revocations
        self._callback_log = LogLimiter(runtime.clock)
        #: Members that refused our call-back, to whom we said hello again through a session.
        self._hello_through_session: set[str] = set()

    async def introduce(self, address: str) -> Hello:
        """Say hello to ``address`` and learn its members. Raises Rejected or Unreachable."""
        reply = await self.transport.call_hello(address, self.hello(), self.cfg.call_timeout_s)
        if reply.protocol_version != PROTOCOL_VERSION:
            raise Rejected(Reason.PROTOCOL_VERSION, f"{address} speaks {reply.protocol_version}")
        differences = self.fingerprint.differences(reply.fingerprint)
        if differences:
            raise Rejected(Reason.FINGERPRINT, "; ".join(differences))
        self.adopt_revocations(reply.revocations, address)
        self.membership.merge([reply.self_, *reply.members])
        await self.membership.settle()
        return reply

    async def welcome(self, hello: Hello) -> Hello:
        """A joiner said hello (its version and task already checked): make sure it can be
        reached where it says, then take it and what it knows into the view.

        Raises:
            Rejected: nobody answers at the joiner's address, or another node does; the view is
                unchanged.
        """
        joiner = hello.self_
        self.adopt_revocations(hello.revocations, joiner.node_id)
        if self.swim.verify is not None and not self.swim.verify(joiner):
            raise Rejected(
                Reason.IDENTITY, "your member record is not signed by the key of its node id"
            )
        if self.transport.holds_session(joiner.address, joiner.node_id):
            # It cannot be dialled (so it opened a session to us first): the session, opened
            # under its certificate, is the one way to reach it, and proves the address its own.
            log.info("joiner %s is reached through its session to us", joiner.node_id[:8])
            self.membership.merge([joiner, *hello.members], relayer=joiner.node_id)
            await self.membership.settle()
            return replace(self.hello(), unreachable=True)
        try:
            # Half the joiner's deadline for its hello, so that our answer still reaches it.
            callback_s = self.cfg.call_timeout_s / 2
            answered = await self.membership.check_address(joiner.address, callback_s)
        except (Unreachable, Rejected) as err:
            answered = ""
            why = str(err)
        else:
            why = f"node {answered[:8]} answers there"
        if answered != joiner.node_id:
            # One answer whatever went wrong: the call-back's own error (refused, reset, timed
            # out, someone else answers) would make this node a port scanner for any member.
            if (held := self._callback_log.allow(joiner.node_id)) is not None:
                log.info(
                    "joiner %s not at %s: %s%s",
                    joiner.node_id[:8],
                    joiner.address,
                    why,
                    held_back(held),
                )
            raise Rejected(
                Reason.BAD_ADDRESS,
                f"nobody answers as {joiner.node_id[:8]} at your address {joiner.address}; "
                "set --advertise to an address others can dial",
            )
        self.membership.merge([joiner, *hello.members], relayer=joiner.node_id)
        await self.membership.settle()
        return self.hello()

    async def join(self, addresses: Iterable[str], timeout_s: float | None) -> str:
        """Introduce ourselves through the first of ``addresses`` that takes us, retrying silent
        ones until ``timeout_s`` (None: for ever); one is enough, since its answer lists everyone.

        Returns the address that took us.

        Raises:
            JoinError: an address refused us (the task differs, say), or none answered.
        """
        clock = self.runtime.clock
        deadline = math.inf if timeout_s is None else clock.now() + timeout_s

        async def through(address: str) -> str:
            delay = 0.1
            while True:
                try:
                    await self.introduce(address)
                    return address
                except Rejected as err:
                    if err.reason is Reason.BAD_ADDRESS and await self._behind_nat(address):
                        continue  # say hello again, through the session
                    if err.reason not in _RETRYABLE:
                        raise JoinError(f"{address} refused us: {err}") from err
                    if clock.now() > deadline:
                        raise JoinError(f"{address} is not taking members: {err}") from err
                except HandshakeFailed as err:
                    raise JoinError(f"{address} refused us: {err}") from err
                except Unreachable as err:
                    if clock.now() > deadline:
                        raise JoinError(f"{address} did not answer: {err}") from err
                log.debug("waiting for %s to answer", address)  # the node counts down
                await self.runtime.sleep(delay)
                delay = min(2 * delay, 2.0)

        pending = {asyncio.create_task(through(a)) for a in dict.fromkeys(addresses)}
        errors: list[BaseException] = []
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    err = task.exception()
                    if err is None:
                        return task.result()
                    if isinstance(err.__cause__, Rejected | HandshakeFailed):
                        raise err  # a refusal is an answer: this swarm will not have us
                    errors.append(err)
            raise errors[0]
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _behind_nat(self, address: str) -> bool:
        """The member at ``address`` could not call us back: nobody can dial this node. Go by
        an address of our own that never resolves (once) and open a session to the member,
        through which it takes us. Returns whether to say hello again: the session is up, and
        this is the first time this member refused us (a refusal through the session is
        final)."""
        if address in self._hello_through_session:
            return False
        self._hello_through_session.add(address)
        if not self.dialout.active:
            listen = self.swim.address
            self.dialout.active = True
            self.swim.address = unreachable_address(self.node_id, listen)
            log.warning(
                "%s cannot call this node back at %s: nobody can dial it (NAT, a firewall); "
                "taking part through dial-out sessions, as %s",
                address,
                listen,
                self.swim.address,
            )
        if await self.dialout.open(address, self.cfg.call_timeout_s):
            return True
        log.warning("no dial-out session to %s either", address)
        return False
