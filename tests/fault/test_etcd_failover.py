"""etcd member failures under a live metadata session (a real three-member etcd cluster).

The store is opened on all three members (``etcd://h:p1,h:p2,h:p3``). The member it talks to is
killed (SIGKILL) or paused (SIGSTOP) while a writer creates keys and a watch follows them; then that member comes
back and the next one the store moved to is killed. Throughout: the session (lease) and its
ephemeral key survive, new writes succeed, the watch delivers every write exactly once in order,
and no write that returned success is lost. A write whose answer was lost in the crash may
raise OutcomeUnknownError (never a false success); whether it landed is checked, not assumed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from magnetar.common.metadata import (
    NOT_EXISTS,
    EventType,
    MetadataStore,
    OutcomeUnknownError,
    Versioned,
    WatchEvent,
    open_store,
)
from magnetar.common.metadata.etcd import EtcdMetadataStore
from tests.support.etcd import EtcdCluster

# Short enough that a session that missed its keepalives would visibly expire during the test.
SESSION_TTL = 4
REQUEST_TIMEOUT = 2.0
SOON = 20.0
DATA = "/failover/data/"
EPHEMERAL = "/failover/owner"


@pytest.fixture
def cluster() -> AsyncIterator[EtcdCluster]:
    with EtcdCluster(3) as started:
        yield started


class Writer:
    """Creates DATA keys one after another; remembers which ones returned success."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.acked: dict[str, Versioned] = {}
        self.unknown: set[str] = set()
        self.count = 0
        self.progress = asyncio.Event()

    async def run(self) -> None:
        while True:
            key, value = f"{DATA}{self.count:06}", f"value-{self.count}".encode()
            self.count += 1
            try:
                version = await self.store.put(key, value, NOT_EXISTS)
            except OutcomeUnknownError:
                self.unknown.add(key)
                continue
            self.acked[key] = Versioned(value, version)
            self.progress.set()
            await asyncio.sleep(0.01)

    async def wait_for_writes(self, n: int) -> None:
        """Wait until ``n`` more writes succeeded."""
        target = len(self.acked) + n
        async with asyncio.timeout(SOON):
            while len(self.acked) < target:
                self.progress.clear()
                await self.progress.wait()


class Follower:
    """Watches DATA on the store under test and keeps every event."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.seen: list[WatchEvent] = []
        self.ready = asyncio.Event()
        self.arrived = asyncio.Event()

    async def run(self) -> None:
        async with self.store.watch(DATA, prefix=True) as events:
            self.ready.set()
            async for event in events:
                self.seen.append(event)
                self.arrived.set()

    async def wait_for_keys(self, keys: set[str]) -> None:
        async with asyncio.timeout(SOON):
            while not keys <= {e.key for e in self.seen}:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.mark.parametrize("failure", ["kill", "pause"])
async def test_session_writes_and_watches_survive_member_failures(
    cluster: EtcdCluster, failure: str
) -> None:
    # kill: SIGKILL, connections reset at once. pause: SIGSTOP, the member holds connections
    # open and answers nothing, so only timeouts reveal it.
    store = await open_store(cluster.url, session_ttl=SESSION_TTL, request_timeout=REQUEST_TIMEOUT)
    assert isinstance(store, EtcdMetadataStore)
    assert len(store.endpoints) == 3
    owner_version = await store.put(EPHEMERAL, b"me", ephemeral=True)
    writer = Writer(store)
    follower = Follower(store)
    async with asyncio.TaskGroup() as tasks:
        following = tasks.create_task(follower.run())
        await asyncio.wait_for(follower.ready.wait(), SOON)
        writing = tasks.create_task(writer.run())
        try:
            await writer.wait_for_writes(20)
            killed: list[int] = []
            for round_ in range(2):
                victim = cluster.member_on(store.endpoint.port)
                if failure == "kill":
                    victim.kill()
                else:
                    cluster.move_leader_off(victim)  # see move_leader_off: etcd's own bug
                    victim.pause()
                killed.append(victim.client_port)
                await writer.wait_for_writes(20)  # new writes succeed on another member
                assert store.endpoint.port != victim.client_port
                # Longer than the TTL: only keepalives that reached the cluster through the
                # other members can have kept the session.
                await asyncio.sleep(SESSION_TTL + 1)
                assert not store.session_lost
                await _assert_owner_key_alive(cluster, victim.client_port, owner_version, round_)
                # Back; the next round fails the member the store moved to.
                if failure == "kill":
                    victim.start()
                else:
                    victim.resume()
                    victim.wait_healthy()
            assert killed[0] != killed[1]
            await writer.wait_for_writes(20)
        finally:
            writing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writing
        await follower.wait_for_keys(set(writer.acked))
        following.cancel()

    # No write that returned success is lost, and each kept the version it was given.
    stored = await store.scan(DATA)
    for key, versioned in writer.acked.items():
        assert stored.get(key) == versioned, f"acknowledged write {key} lost or changed"
    assert set(stored) <= set(writer.acked) | writer.unknown
    # The watch delivered every write once, in revision order, across both failovers.
    puts = [e for e in follower.seen if e.type is EventType.PUT]
    assert [e.version for e in puts] == sorted({e.version for e in puts})
    assert {e.key: Versioned(e.value or b"", e.version) for e in puts} == stored
    assert await store.get(EPHEMERAL) == Versioned(b"me", owner_version)
    await store.close()
    async with await open_store(cluster.url) as after:
        assert await after.get(EPHEMERAL) is None  # closing ended the session


async def test_open_skips_a_dead_member_and_a_lone_member_url_still_works(
    cluster: EtcdCluster,
) -> None:
    first, second, _ = cluster.members
    first.kill()
    async with await open_store(cluster.url, request_timeout=REQUEST_TIMEOUT) as store:
        assert isinstance(store, EtcdMetadataStore)
        assert store.endpoint.port != first.client_port
        await store.put("/failover/open", b"x")
    # A URL naming only a dead member is refused with the member named, not a hang.
    with pytest.raises(Exception, match=str(first.client_port)):
        await open_store(first.url, request_timeout=REQUEST_TIMEOUT)
    async with await open_store(second.url) as store:
        assert (await store.get("/failover/open")) is not None


async def _assert_owner_key_alive(
    cluster: EtcdCluster, dead_port: int, version: int, round_: int
) -> None:
    """Read the session's ephemeral key through a member that is up (a separate client)."""
    alive = next(m for m in cluster.members if m.client_port != dead_port)
    async with await open_store(alive.url) as observer:
        assert await observer.get(EPHEMERAL) == Versioned(b"me", version), (
            f"round {round_}: the session's ephemeral key vanished: the lease expired"
        )


async def test_lost_write_answer_is_reported_and_unsent_writes_are_resent(
    cluster: EtcdCluster,
) -> None:
    # Every member healthy first: a store that opens while one still catches up may be moving
    # to another member, and the member paused below would then not be the one the write goes to.
    for member in cluster.members:
        member.wait_healthy()
    async with await open_store(cluster.url, session_ttl=SESSION_TTL, request_timeout=1) as store:
        assert isinstance(store, EtcdMetadataStore)
        await store.put("/writes/a", b"a")
        # Paused: the connection stays open, the request is sent and never answered. Resending
        # a compare-and-set could make it fail against its own first attempt: report instead.
        paused = cluster.member_on(store.endpoint.port)
        # Holding the event loop: the store cannot move to another member meanwhile.
        cluster.move_leader_off(paused)
        paused.pause()  # returns once every thread of it has stopped
        try:
            with pytest.raises(OutcomeUnknownError, match="may or may not have been applied"):
                await store.put("/writes/b", b"b", NOT_EXISTS)
            assert store.endpoint.port != paused.client_port  # moved on for the read-back
            assert (await store.get("/writes/a")) is not None
        finally:
            paused.resume()
        paused.wait_healthy()
        # Killed: the next request finds the connection refused, so it was never sent and is
        # resent on another member; the caller just sees success.
        killed = cluster.member_on(store.endpoint.port)
        killed.kill()
        # Let gRPC see the reset, as any later request would (a loaded machine may take longer
        # than the usual few milliseconds: wait until the channel is no longer ready).
        channel = store._client.channel
        state = channel.get_state()
        async with asyncio.timeout(SOON):
            while state == grpc.ChannelConnectivity.READY:
                await channel.wait_for_state_change(state)
                state = channel.get_state()
        version = await store.put("/writes/c", b"c", NOT_EXISTS)
        assert store.endpoint.port != killed.client_port
        assert await store.get("/writes/c") == Versioned(b"c", version)
