"""Bundle ownership (and bundle documents, registry, load-manager election) on both stores.

etcd: each broker is a session of its own on the shared real etcd (and, for lease expiry, a
separate process paused past its TTL). local: one process is one session, so contenders share
the store, as brokers in one standalone process would.

Run as ``python -m tests.integration.test_ownership URL NAMESPACE BUNDLE TTL``, this module is
the paused holder: it acquires the bundle, prints "acquired", and when its session is lost
prints "lost" and "owns False" (what ``owns()`` says then).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from magnetar.broker.cluster import bundles
from magnetar.broker.cluster.bundles import BundleRange, default_ranges
from magnetar.broker.cluster.load_manager import LoadManager
from magnetar.broker.cluster.ownership import OwnershipStore, ownership_key
from magnetar.broker.cluster.registry import BrokerRegistry, BundleStats, LoadReport
from magnetar.broker.config import BrokerConfig
from magnetar.common.cluster.broker_info import BrokerInfo
from magnetar.common.metadata import BadVersionError, MetadataError, MetadataStore, open_store
from tests.support.polling import wait_until_async
from tests.support.process import pause, resume

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
SOON = 10.0
SHORT_TTL = 2
BUNDLE = default_ranges(4)[1]


def broker(n: int) -> BrokerInfo:
    return BrokerInfo(f"127.0.0.{n}:8080", f"pulsar://127.0.0.{n}:6650", f"http://127.0.0.{n}:8080")


@dataclass(slots=True, frozen=True)
class Backend:
    kind: str
    url: str
    namespace: str  # unique tenant/namespace of this test

    @property
    def concurrent_sessions(self) -> bool:
        return self.kind == "etcd"

    async def open(self, **options: object) -> MetadataStore:
        return await open_store(self.url, **options)


def make_backend(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Backend:
    unique = uuid.uuid4().hex[:12]
    if kind == "etcd":
        url = request.getfixturevalue("etcd_server").url
    else:
        url = f"local://{tmp_path}/meta.db"
    return Backend(kind, url, f"t-{unique}/ns")


@pytest.fixture(params=["etcd", "local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request, tmp_path, request.param)


@pytest.fixture
def etcd_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Only etcd: tests that need two live sessions at once (the local store has one per
    process)."""
    return make_backend(request, tmp_path, "etcd")


@pytest.fixture
def local_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request, tmp_path, "local")


@dataclass(slots=True)
class Brokers:
    stores: list[MetadataStore]
    a: OwnershipStore
    b: OwnershipStore


@pytest.fixture
async def brokers(backend: Backend) -> AsyncIterator[Brokers]:
    first = await backend.open()
    second = await backend.open() if backend.concurrent_sessions else first
    a, b = OwnershipStore(first, broker(1)), OwnershipStore(second, broker(2))
    await a.start()
    await b.start()
    yield Brokers([first, second], a, b)
    for ownership in (a, b):
        await ownership.close()
    for store in {id(s): s for s in (first, second)}.values():
        await store.close()


async def eventually(check: Callable[[], Awaitable[bool]], within: float = SOON) -> bool:
    return await wait_until_async(check, within)


def owner_is(
    ownership: OwnershipStore, namespace: str, expected: BrokerInfo | None
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await ownership.owner(namespace, BUNDLE) == expected

    return check


# -- ownership ----------------------------------------------------------------------------


async def test_racing_claims_exactly_one_wins(brokers: Brokers, backend: Backend) -> None:
    ns = backend.namespace
    results = await asyncio.gather(
        brokers.a.try_acquire(ns, BUNDLE), brokers.b.try_acquire(ns, BUNDLE)
    )
    assert results[0] == results[1]
    winner_info = results[0]
    assert winner_info in (broker(1), broker(2))
    winner, loser = (brokers.a, brokers.b) if winner_info == broker(1) else (brokers.b, brokers.a)
    assert winner.owns(ns, BUNDLE) and not loser.owns(ns, BUNDLE)
    assert winner.owned() == {(ns, BUNDLE)} and loser.owned() == set()
    assert await eventually(owner_is(loser, ns, winner_info))
    assert await eventually(owner_is(winner, ns, winner_info))
    # Claiming again changes nothing.
    assert await loser.try_acquire(ns, BUNDLE) == winner_info
    assert await winner.try_acquire(ns, BUNDLE) == winner_info


async def test_release_lets_the_other_acquire(brokers: Brokers, backend: Backend) -> None:
    ns = backend.namespace
    assert await brokers.a.try_acquire(ns, BUNDLE) == broker(1)
    await brokers.b.release(ns, BUNDLE)  # not b's: nothing happens
    assert await brokers.b.try_acquire(ns, BUNDLE) == broker(1)
    await brokers.a.release(ns, BUNDLE)
    assert not brokers.a.owns(ns, BUNDLE)
    assert await eventually(owner_is(brokers.b, ns, None))
    assert await brokers.b.try_acquire(ns, BUNDLE) == broker(2)
    assert brokers.b.owns(ns, BUNDLE)
    assert await eventually(owner_is(brokers.a, ns, broker(2)))


async def test_cache_follows_the_watch_without_reads(
    brokers: Brokers, backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = backend.namespace
    observer_store = await backend.open() if backend.concurrent_sessions else brokers.stores[0]
    observer = OwnershipStore(observer_store, broker(3))
    await observer.start()
    try:

        async def no_reads(key: str) -> None:
            raise AssertionError(f"owner() read {key} from the store")

        monkeypatch.setattr(observer_store, "get", no_reads)
        assert await observer.owner(ns, BUNDLE) is None
        await brokers.a.try_acquire(ns, BUNDLE)
        assert await eventually(owner_is(observer, ns, broker(1)))
        assert observer.owners() == {(ns, BUNDLE): broker(1)}
        await brokers.a.release(ns, BUNDLE)
        assert await eventually(owner_is(observer, ns, None))
        await brokers.b.try_acquire(ns, BUNDLE)
        assert await eventually(owner_is(observer, ns, broker(2)))
    finally:
        monkeypatch.undo()
        await observer.close()
        if observer_store is not brokers.stores[0]:
            await observer_store.close()


async def test_a_key_deleted_behind_our_back_stops_serving(
    brokers: Brokers, backend: Backend
) -> None:
    ns = backend.namespace
    lost: list[tuple[str, BundleRange]] = []
    brokers.a.add_bundle_lost_listener(lambda n, b: lost.append((n, b)))
    await brokers.a.try_acquire(ns, BUNDLE)
    await brokers.stores[1].delete(ownership_key(ns, BUNDLE))

    async def gone() -> bool:
        return not brokers.a.owns(ns, BUNDLE)

    assert await eventually(gone)
    assert lost == [(ns, BUNDLE)]
    assert await brokers.b.try_acquire(ns, BUNDLE) == broker(2)


async def test_closing_a_session_frees_its_bundles_and_fires_lost(backend: Backend) -> None:
    ns = backend.namespace
    store = await backend.open()
    a = OwnershipStore(store, broker(1))
    await a.start()
    lost = asyncio.Event()
    a.add_lost_listener(lost.set)
    other = await backend.open() if backend.concurrent_sessions else None
    try:
        await a.try_acquire(ns, BUNDLE)
        await store.close()  # the session ends without a.close(): as if the store died
        await asyncio.wait_for(lost.wait(), SOON)
        assert not a.owns(ns, BUNDLE) and a.owned() == set()
        late = asyncio.Event()
        a.add_lost_listener(late.set)
        await asyncio.wait_for(late.wait(), SOON)
        if other is None:
            # local: the session was the process's store; a reopened store has no such key.
            other = await backend.open()
        b = OwnershipStore(other, broker(2))
        await b.start()
        assert await eventually(owner_is(b, ns, None))
        assert await b.try_acquire(ns, BUNDLE) == broker(2)
        await b.close()
    finally:
        await a.close()
        if other is not None:
            await other.close()


async def test_close_releases_what_is_held(brokers: Brokers, backend: Backend) -> None:
    ns = backend.namespace
    await brokers.a.try_acquire(ns, BUNDLE)
    await brokers.a.close()
    assert not brokers.a.owns(ns, BUNDLE)
    assert await eventually(owner_is(brokers.b, ns, None))


async def test_a_previous_session_of_the_same_broker_is_taken_over(
    etcd_backend: Backend,
) -> None:
    # etcd only: a restarted process's local store drops the old session's keys itself.
    backend = etcd_backend
    ns = backend.namespace
    old_store, new_store = await backend.open(), await backend.open()
    try:
        old, new = OwnershipStore(old_store, broker(1)), OwnershipStore(new_store, broker(1))
        await old.try_acquire(ns, BUNDLE)
        assert await new.try_acquire(ns, BUNDLE) == broker(1)
        assert new.owns(ns, BUNDLE)
        await old_store.close()  # the old lease ends; the key is bound to the new one
        assert await new.owner(ns, BUNDLE) == broker(1)
        assert (await new_store.get(ownership_key(ns, BUNDLE))) is not None
    finally:
        await old_store.close()
        await new_store.close()


async def test_owner_splits_and_keeps_both_halves(brokers: Brokers, backend: Backend) -> None:
    ns = backend.namespace
    ranges = await bundles.load_or_create(brokers.stores[0], ns, 4)
    lost: list[tuple[str, BundleRange]] = []
    brokers.a.add_bundle_lost_listener(lambda n, b: lost.append((n, b)))
    await brokers.a.try_acquire(ns, BUNDLE)
    with pytest.raises(BadVersionError):  # not b's to split
        await brokers.b.split(ns, BUNDLE, bundles.split(BUNDLE))
    low, high = bundles.split(BUNDLE)
    updated = await brokers.a.split(ns, BUNDLE, (low, high))
    assert updated == [ranges[0], low, high, *ranges[2:]]
    assert brokers.a.owned() == {(ns, low), (ns, high)}
    assert await bundles.load_or_create(brokers.stores[1], ns, 4) == updated
    assert await eventually(owner_is(brokers.b, ns, None))
    for half in (low, high):
        assert await brokers.b.try_acquire(ns, half) == broker(1)
    await asyncio.sleep(0.2)  # let the watch deliver the split's events
    assert lost == [] and brokers.a.owns(ns, low) and brokers.a.owns(ns, high)


# -- lease expiry of a paused owner (etcd only) --------------------------------------------


async def test_paused_owner_past_its_ttl_loses_the_bundle(etcd_server: object) -> None:
    url = etcd_server.url  # type: ignore[attr-defined]
    ns = f"t-{uuid.uuid4().hex[:12]}/ns"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.test_ownership",
        url,
        ns,
        str(BUNDLE),
        str(SHORT_TTL),
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdin is not None

    async def line() -> str:
        return (await asyncio.wait_for(process.stdout.readline(), SOON)).decode().strip()

    store = await open_store(url)
    b = OwnershipStore(store, broker(2))
    await b.start()
    try:
        assert await line() == "acquired"
        assert await eventually(owner_is(b, ns, broker(1)))
        pause(process.pid)
        assert await eventually(owner_is(b, ns, None), SHORT_TTL + 8), "lease did not expire"
        assert await b.try_acquire(ns, BUNDLE) == broker(2)
        resume(process.pid)
        assert await line() == "lost"
        assert await line() == "owns False"
        assert await b.owner(ns, BUNDLE) == broker(2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            resume(process.pid)
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), SOON)
        except TimeoutError:
            process.kill()
            await process.wait()
        await b.close()
        await store.close()


async def _hold(url: str, namespace: str, bundle: str, ttl: int) -> None:
    store = await open_store(url, session_ttl=ttl)
    ownership = OwnershipStore(store, broker(1))
    lost = asyncio.Event()
    ownership.add_lost_listener(lost.set)
    await ownership.start()
    assert await ownership.try_acquire(namespace, BundleRange.parse(bundle)) == broker(1)
    print("acquired", flush=True)
    stdin_closed = asyncio.create_task(asyncio.to_thread(sys.stdin.read))
    session_lost = asyncio.create_task(lost.wait())
    await asyncio.wait({stdin_closed, session_lost}, return_when=asyncio.FIRST_COMPLETED)
    if lost.is_set():
        print("lost", flush=True)
        print(f"owns {ownership.owns(namespace, BundleRange.parse(bundle))}", flush=True)
        await stdin_closed
    await ownership.close(release=False)
    await store.close()


# -- bundle documents on two sessions ------------------------------------------------------


async def test_concurrent_bundle_creators_on_two_sessions_converge(backend: Backend) -> None:
    first = await backend.open()
    second = await backend.open() if backend.concurrent_sessions else first
    try:
        results = await asyncio.gather(
            *(bundles.load_or_create(s, backend.namespace, n) for s, n in ((first, 4), (second, 8)))
        )
        assert results[0] == results[1]
    finally:
        await first.close()
        if second is not first:
            await second.close()


# -- registry -------------------------------------------------------------------------------


async def test_registry_lists_live_brokers_and_drops_closed_ones(etcd_backend: Backend) -> None:
    backend = etcd_backend  # two live sessions at once: etcd only
    first, second = await backend.open(), await backend.open()
    try:
        one, two = BrokerRegistry(first, broker(1)), BrokerRegistry(second, broker(2))
        await one.start()
        await one.register(LoadReport(topics=1))
        await two.register(LoadReport(topics=2))

        async def both() -> bool:
            active = await one.active()
            return {b: r.topics for b, (_, r) in active.items()} == {
                broker(1).broker_id: 1,
                broker(2).broker_id: 2,
            }

        assert await eventually(both)
        await two.update(LoadReport(topics=5, msg_rate_in=3.0))

        async def updated() -> bool:
            return (await one.active())[broker(2).broker_id][1].topics == 5

        assert await eventually(updated)
        await second.close()  # its lease ends: it is no longer active

        async def dropped() -> bool:
            return set(await one.active()) == {broker(1).broker_id}

        assert await eventually(dropped)
        # Another broker claiming our id with other addresses is refused.
        impostor_store = await backend.open()
        impostor = BrokerRegistry(
            impostor_store, BrokerInfo(broker(1).broker_id, "pulsar://elsewhere:1", "http://x:1")
        )
        with pytest.raises(MetadataError, match="already registered"):
            await impostor.register(LoadReport())
        await impostor_store.close()
        await one.close()
    finally:
        await first.close()
        await second.close()


async def test_registry_on_the_local_store(local_backend: Backend) -> None:
    backend = local_backend
    store = await backend.open()
    try:
        registry = BrokerRegistry(store, broker(1))
        await registry.register(LoadReport(topics=3))
        assert (await registry.active())[broker(1).broker_id] == (broker(1), LoadReport(topics=3))
        await registry.unregister()
        assert await registry.active() == {}
    finally:
        await store.close()


# -- load manager --------------------------------------------------------------------------


@dataclass(slots=True)
class Node:
    store: MetadataStore
    registry: BrokerRegistry
    ownership: OwnershipStore
    manager: LoadManager
    unloaded: list[tuple[str, str, BundleRange]]

    async def close(self) -> None:
        await self.manager.close()
        await self.ownership.close()
        await self.registry.close()
        await self.store.close()


async def node(url: str, n: int, config: BrokerConfig) -> Node:
    store = await open_store(url)
    info = broker(n)
    registry = BrokerRegistry(store, info)
    ownership = OwnershipStore(store, info)
    unloaded: list[tuple[str, str, BundleRange]] = []

    async def unload(owner: BrokerInfo, namespace: str, bundle: BundleRange) -> None:
        unloaded.append((owner.broker_id, namespace, bundle))

    await registry.start()
    await ownership.start()
    await registry.register(LoadReport())
    manager = LoadManager(store, registry, ownership, config, unload)
    return Node(store, registry, ownership, manager, unloaded)


async def test_one_leader_and_a_fast_handover(etcd_server: object) -> None:
    url = etcd_server.url  # type: ignore[attr-defined]
    config = BrokerConfig(load_balancer_shedding_interval_seconds=3600)
    nodes = [await node(url, 1, config), await node(url, 2, config)]
    try:
        for n in nodes:
            n.manager.start()

        async def one_leader() -> bool:
            return sum(n.manager.is_leader for n in nodes) == 1

        assert await eventually(one_leader)
        leader = next(n for n in nodes if n.manager.is_leader)
        follower = next(n for n in nodes if not n.manager.is_leader)
        assert await follower.manager.leader_info() == leader.ownership.me
        await asyncio.sleep(0.5)
        assert await one_leader()  # still exactly one

        await leader.close()
        nodes.remove(leader)

        async def took_over() -> bool:
            return follower.manager.is_leader

        assert await eventually(took_over, 5.0)
        assert await follower.manager.leader_info() == follower.ownership.me
    finally:
        for n in nodes:
            await n.close()


async def test_leader_places_spreads_and_sheds(etcd_server: object) -> None:
    url = etcd_server.url  # type: ignore[attr-defined]
    config = BrokerConfig(load_balancer_shedding_grace_period_seconds=60)
    nodes = [await node(url, i, config) for i in (1, 2)]
    namespace = f"t-{uuid.uuid4().hex[:12]}/ns"
    try:
        leader = nodes[0].manager
        nodes[0].manager.start()

        async def leading() -> bool:
            return leader.is_leader

        assert await eventually(leading)
        # Eight bundles placed in a burst spread four and four; the chosen broker claims.
        by_id = {n.ownership.me.broker_id: n for n in nodes}
        ranges = await bundles.load_or_create(nodes[0].store, namespace, 8)
        for bundle in ranges:
            chosen = await leader.select(namespace, bundle)
            assert await by_id[chosen.broker_id].ownership.try_acquire(namespace, bundle) == chosen
        counts = [len(n.ownership.owned()) for n in nodes]
        assert counts == [4, 4]
        assert await leader.select(namespace, ranges[0]) == await nodes[0].ownership.owner(
            namespace, ranges[0]
        )

        # A third, empty broker joins: an idle cluster balances bundle counts toward it.
        nodes.append(await node(url, 3, config))

        async def sees_three() -> bool:
            return len(await nodes[0].registry.active()) == 3

        assert await eventually(sees_three)
        _, shed = await leader.run_once()
        assert sorted(s.from_broker for s in shed) == [broker(1).broker_id, broker(2).broker_id]
        unloaded = nodes[0].unloaded
        assert [(b, ns, r) for b, ns, r in unloaded] == [
            (s.from_broker, s.namespace, s.bundle) for s in shed
        ]
        # Within the grace period the same bundles are not moved again.
        _, again = await leader.run_once()
        assert not {(s.namespace, s.bundle) for s in again} & {
            (s.namespace, s.bundle) for s in shed
        }

        # A hot bundle with many topics is split (the leader unloads it, then splits the
        # document on the condition that nobody owns it).
        hot = ranges[1]
        owner = next(n for n in nodes if n.ownership.owns(namespace, hot))
        await owner.registry.update(
            LoadReport(bundle_stats=(BundleStats(namespace, hot, 10.0, 5000),))
        )
        await owner.ownership.release(namespace, hot)  # as the unload would

        async def reported() -> bool:
            active = await nodes[0].registry.active()
            return bool(active[owner.ownership.me.broker_id][1].bundle_stats)

        assert await eventually(reported)
        await owner.ownership.try_acquire(namespace, hot)

        async def visible() -> bool:
            return (namespace, hot) in nodes[0].ownership.owners()

        assert await eventually(visible)
        real_unload = leader._unload

        async def unload_and_release(o: BrokerInfo, ns: str, b: BundleRange) -> None:
            await real_unload(o, ns, b)
            await owner.ownership.release(ns, b)

        leader._unload = unload_and_release
        split_done, _ = await leader.run_once()
        assert split_done == [(namespace, hot)]
        assert len(await bundles.load_or_create(nodes[0].store, namespace, 8)) == 9
    finally:
        for n in nodes:
            await n.close()


if __name__ == "__main__":
    asyncio.run(_hold(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
