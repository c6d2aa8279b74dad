"""The metadata store contract, run against both stores (a real etcd and a local SQLite file).

Every test gets a fresh store: for etcd a unique key prefix and election name on the shared
session-scoped server, for local a file under tmp_path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magnetar.common.metadata import (
    NOT_EXISTS,
    BadVersionError,
    Delete,
    EventType,
    Expect,
    MetadataError,
    MetadataStore,
    NoSuchKeyError,
    Put,
    SessionLostError,
    StoreClosedError,
    Versioned,
    WatchEvent,
    open_store,
)
from tests.support.etcd import EtcdServer
from tests.support.process import pause, resume

T = TypeVar("T")

KINDS = ["etcd", "local"]
REPO_ROOT = Path(__file__).resolve().parents[2]
# Generous bound for anything that should happen "soon"; a hang fails instead of blocking CI.
SOON = 10.0
# Short session TTL for the expiry test (etcd's minimum with default raft timing is ~2 s).
SHORT_TTL = 2


@dataclass(slots=True, frozen=True)
class Backend:
    kind: str
    url: str
    prefix: str  # unique key prefix of this test
    election_name: str  # unique election name of this test

    @property
    def concurrent_sessions(self) -> bool:
        """Can two sessions be open at once? (local: one owning process, one session)."""
        return self.kind == "etcd"

    async def open(self, **options: object) -> MetadataStore:
        return await open_store(self.url, **options)


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    unique = uuid.uuid4().hex[:12]
    if request.param == "etcd":
        url = request.getfixturevalue("etcd_server").url
    else:
        url = f"local://{tmp_path}/meta.db"
    return Backend(request.param, url, f"/test/{unique}", f"test-{unique}")


@pytest.fixture
async def store(backend: Backend) -> AsyncIterator[MetadataStore]:
    opened = await backend.open()
    yield opened
    await opened.close()


@pytest.fixture
async def peer(backend: Backend, store: MetadataStore) -> AsyncIterator[MetadataStore]:
    """A second session for contenders: another etcd session, or the same local store."""
    if not backend.concurrent_sessions:
        yield store
        return
    opened = await backend.open()
    yield opened
    await opened.close()


async def soon(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, SOON)


async def next_event(events: AsyncIterator[WatchEvent]) -> WatchEvent:
    return await soon(anext(events))


# -- get / put / versions / CAS ----------------------------------------------------------


async def test_get_put_and_versions(store: MetadataStore, backend: Backend) -> None:
    key = f"{backend.prefix}/a"
    assert await store.get(key) is None

    v1 = await store.put(key, b"one")
    assert await store.get(key) == Versioned(b"one", v1)
    v2 = await store.put(key, b"\x00two\xff")
    assert v2 > v1 > 0
    assert await store.get(key) == Versioned(b"\x00two\xff", v2)

    # Versions are store-wide revisions: a write to another key also gets a higher one.
    v3 = await store.put(f"{backend.prefix}/b", b"")
    assert v3 > v2
    assert await store.get(f"{backend.prefix}/b") == Versioned(b"", v3)


async def test_cas_conflicts(store: MetadataStore, backend: Backend) -> None:
    key = f"{backend.prefix}/cas"
    with pytest.raises(BadVersionError):
        await store.put(key, b"x", 12345)  # a version on a missing key
    v1 = await store.put(key, b"first", NOT_EXISTS)
    with pytest.raises(BadVersionError):
        await store.put(key, b"again", NOT_EXISTS)
    with pytest.raises(BadVersionError):
        await store.put(key, b"wrong", v1 + 1000)
    assert await store.get(key) == Versioned(b"first", v1)

    v2 = await store.put(key, b"second", v1)
    with pytest.raises(BadVersionError):
        await store.put(key, b"stale", v1)
    assert await store.get(key) == Versioned(b"second", v2)

    with pytest.raises(BadVersionError):
        await store.delete(key, v1)
    assert await store.get(key) == Versioned(b"second", v2)
    await store.delete(key, v2)
    assert await store.get(key) is None

    with pytest.raises(NoSuchKeyError):
        await store.delete(key, v2)
    await store.delete(key)  # unconditional delete of a missing key: no-op


async def test_concurrent_writes_each_get_their_own_answer(
    store: MetadataStore, backend: Backend
) -> None:
    # Many writes in flight at once (the local store commits them in groups): one create of a
    # contested key wins, every other one fails alone; the rest all land, in revision order.
    contested = f"{backend.prefix}/contested"
    root = f"{backend.prefix}/many/"
    async with store.watch(root, prefix=True) as events:
        creates = [store.put(contested, f"{i}".encode(), NOT_EXISTS) for i in range(20)]
        puts = [store.put(f"{root}{i:03}", f"{i}".encode()) for i in range(100)]
        results = await asyncio.gather(*creates, *puts, return_exceptions=True)
        seen = [await next_event(events) for _ in range(100)]
    won = [r for r in results[:20] if not isinstance(r, BaseException)]
    assert len(won) == 1
    assert all(isinstance(r, BadVersionError) for r in results[:20] if r is not won[0])
    versions = results[20:]
    assert all(isinstance(v, int) for v in versions) and len(set(versions)) == 100
    assert [e.version for e in seen] == sorted(e.version for e in seen)
    assert sorted(e.key for e in seen) == [f"{root}{i:03}" for i in range(100)]
    assert (await store.get(contested)).version == won[0]  # type: ignore[union-attr]


# -- multi-key transactions -------------------------------------------------------------


async def test_transaction_applies_every_operation_at_one_revision(
    store: MetadataStore, backend: Backend
) -> None:
    # The bundle split shape: replace A by B and C only if A is unchanged and B, C are new.
    a, b, c = (f"{backend.prefix}/bundles/{n}" for n in "abc")
    va = await store.put(a, b"whole")
    revision = await store.transaction(
        [Expect(a, va), Expect(b, NOT_EXISTS), Expect(c, NOT_EXISTS)],
        [Delete(a), Put(b, b"lower"), Put(c, b"upper")],
    )
    assert revision > va
    assert await store.get(a) is None
    assert await store.get(b) == Versioned(b"lower", revision)
    assert await store.get(c) == Versioned(b"upper", revision)

    # Conditions on keys the operations do not touch, and an update of an existing key.
    later = await store.transaction([Expect(b, revision)], [Put(c, b"upper-2")])
    assert later > revision
    assert await store.get(c) == Versioned(b"upper-2", later)
    assert await store.get(b) == Versioned(b"lower", revision)
    # No conditions: unconditional, still atomic; deleting a missing key is a no-op.
    missing = f"{backend.prefix}/bundles/never"
    last = await store.transaction([], [Delete(b), Delete(missing), Put(a, b"again")])
    assert await store.get(a) == Versioned(b"again", last)
    assert await store.get(b) is None


@pytest.mark.parametrize("failing", ["stale version", "exists", "missing"])
async def test_transaction_applies_nothing_when_one_condition_fails(
    store: MetadataStore, backend: Backend, failing: str
) -> None:
    p = backend.prefix
    a, b, c, untouched = f"{p}/a", f"{p}/b", f"{p}/c", f"{p}/untouched"
    va = await store.put(a, b"a")
    vu = await store.put(untouched, b"u")
    conditions = [Expect(a, va), Expect(b, NOT_EXISTS), Expect(untouched, vu)]
    if failing == "stale version":
        va = await store.put(a, b"a2")  # someone else moved A on
        bad = a
    elif failing == "exists":
        await store.put(b, b"already there")
        bad = b
    else:
        await store.delete(untouched)  # expected at a version, but gone
        bad = untouched
    before = await store.scan(p + "/")

    async with store.watch(p + "/", prefix=True) as events:
        with pytest.raises(BadVersionError) as refused:
            await store.transaction(conditions, [Delete(a), Put(b, b"new"), Put(c, b"new")])
        sentinel = await store.put(f"{p}/sentinel", b"s")
        # The first event after the refused transaction is the sentinel: it changed nothing.
        first = await next_event(events)
    assert (first.key, first.version) == (f"{p}/sentinel", sentinel)
    assert refused.value.key == bad
    assert bad in str(refused.value)
    after = await store.scan(p + "/")
    del after[f"{p}/sentinel"]
    assert after == before
    assert await store.get(a) is not None and (await store.get(a)).version == va  # type: ignore[union-attr]


async def test_transaction_watchers_see_each_change_in_order(
    store: MetadataStore, backend: Backend
) -> None:
    root = f"{backend.prefix}/owned/"
    a, b, c = root + "a", root + "b", root + "c"
    va = await store.put(a, b"a")
    async with store.watch(root, prefix=True) as events, store.watch(c) as c_events:
        revision = await store.transaction(
            [Expect(a, va), Expect(b, NOT_EXISTS)],
            [Delete(a), Put(b, b"b"), Put(c, b"c")],
        )
        got = [await next_event(events) for _ in range(3)]
        only_c = await next_event(c_events)
    assert [(e.type, e.key, e.value, e.version) for e in got] == [
        (EventType.DELETE, a, None, revision),
        (EventType.PUT, b, b"b", revision),
        (EventType.PUT, c, b"c", revision),
    ]
    assert (only_c.type, only_c.key, only_c.version) == (EventType.PUT, c, revision)


async def test_transaction_ephemeral_keys_vanish_with_the_session(backend: Backend) -> None:
    ephemeral, durable = f"{backend.prefix}/owner", f"{backend.prefix}/record"
    owner = await backend.open()
    revision = await owner.transaction(
        [Expect(ephemeral, NOT_EXISTS)],
        [Put(ephemeral, b"broker-1", ephemeral=True), Put(durable, b"d")],
    )
    observer = await backend.open() if backend.concurrent_sessions else owner
    async with observer.watch(ephemeral) as events:
        assert await observer.get(ephemeral) == Versioned(b"broker-1", revision)
        await owner.close()
        event = await next_event(events)
    assert (event.type, event.key) == (EventType.DELETE, ephemeral)
    if not backend.concurrent_sessions:
        observer = await backend.open()
    try:
        assert await observer.get(ephemeral) is None
        assert await observer.get(durable) == Versioned(b"d", revision)
    finally:
        await observer.close()


async def test_concurrent_transactions_on_one_key_exactly_one_wins(
    store: MetadataStore, backend: Backend
) -> None:
    # Ownership transfer shape: many contenders move the same bundle; one wins, whole.
    bundle = f"{backend.prefix}/bundle"
    version = await store.put(bundle, b"old-owner")
    attempts = [
        store.transaction(
            [Expect(bundle, version)],
            [Put(bundle, f"owner-{i}".encode()), Put(f"{backend.prefix}/moved-by-{i}", b"")],
        )
        for i in range(10)
    ]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    won = [i for i, r in enumerate(results) if not isinstance(r, BaseException)]
    assert len(won) == 1, results
    assert all(isinstance(r, BadVersionError) for i, r in enumerate(results) if i != won[0])
    assert await store.get(bundle) == Versioned(f"owner-{won[0]}".encode(), results[won[0]])
    assert await store.children(backend.prefix) == ["bundle", f"moved-by-{won[0]}"]


async def test_malformed_transactions_are_refused(store: MetadataStore, backend: Backend) -> None:
    key = f"{backend.prefix}/k"
    with pytest.raises(ValueError, match="more than once"):
        await store.transaction([], [Put(key, b"1"), Delete(key)])
    with pytest.raises(ValueError, match="positive or NOT_EXISTS"):
        await store.transaction([Expect(key, 0)], [Put(key, b"1")])
    with pytest.raises(ValueError, match="non-empty"):
        await store.transaction([], [Put("", b"1")])
    assert await store.get(key) is None


# -- children and scan -------------------------------------------------------------------


async def test_children_and_scan(store: MetadataStore, backend: Backend) -> None:
    p = backend.prefix
    versions = {key: await store.put(key, key.encode()) for key in [
        f"{p}/a", f"{p}/b/c", f"{p}/b/d", f"{p}/b/d/e", f"{p}/ba"
    ]}  # fmt: skip
    await store.put(f"{p}x", b"sibling, not a child")

    assert await store.children(p) == ["a", "b", "ba"]
    assert await store.children(p + "/") == ["a", "b", "ba"]
    assert await store.children(f"{p}/b") == ["c", "d"]
    assert await store.children(f"{p}/a") == []
    assert await store.children(f"{p}/missing") == []

    expected_b = {
        k: Versioned(k.encode(), v) for k, v in versions.items() if k.startswith(f"{p}/b/")
    }
    assert await store.scan(f"{p}/b/") == expected_b
    # scan is a plain string prefix: /b also matches /ba
    assert set(await store.scan(f"{p}/b")) == {*expected_b, f"{p}/ba"}
    assert set(await store.scan(f"{p}/")) == set(versions)
    assert await store.scan(f"{p}/nothing") == {}


# -- watches -----------------------------------------------------------------------------


async def test_watch_key_sees_put_and_delete_in_order(
    store: MetadataStore, backend: Backend
) -> None:
    key = f"{backend.prefix}/watched"
    async with store.watch(key) as events:
        v1 = await store.put(key, b"1")
        await store.put(f"{key}-other", b"not watched")  # shares the prefix, not the key
        v2 = await store.put(key, b"2")
        await store.delete(key)
        got = [await next_event(events) for _ in range(3)]
    assert [(e.type, e.key, e.value) for e in got] == [
        (EventType.PUT, key, b"1"),
        (EventType.PUT, key, b"2"),
        (EventType.DELETE, key, None),
    ]
    assert got[0].version == v1 and got[1].version == v2 and got[2].version > v2


async def test_watch_prefix_sees_every_key_under_it(store: MetadataStore, backend: Backend) -> None:
    root = f"{backend.prefix}/dir/"
    async with store.watch(root, prefix=True) as events:
        await store.put(root + "a", b"a")
        await store.put(f"{backend.prefix}/outside", b"not watched")
        await store.put(root + "b/c", b"c")
        await store.delete(root + "a")
        got = [await next_event(events) for _ in range(3)]
    assert [(e.type, e.key, e.value) for e in got] == [
        (EventType.PUT, root + "a", b"a"),
        (EventType.PUT, root + "b/c", b"c"),
        (EventType.DELETE, root + "a", None),
    ]
    assert got[0].version < got[1].version < got[2].version


async def test_watch_ends_when_store_closes(backend: Backend) -> None:
    store = await backend.open()
    async with store.watch(f"{backend.prefix}/k") as events:
        pending = asyncio.create_task(anext(events, "ended"))
        await asyncio.sleep(0)
        await store.close()
        assert await soon(pending) == "ended"


async def test_closed_store_refuses_operations(backend: Backend) -> None:
    store = await backend.open()
    await store.close()
    await store.close()  # idempotent
    assert store.session_lost
    with pytest.raises(StoreClosedError):
        await store.get(f"{backend.prefix}/k")
    with pytest.raises(StoreClosedError):
        await store.put(f"{backend.prefix}/k", b"v")


# -- ephemeral keys and sessions ---------------------------------------------------------


async def test_ephemeral_keys_vanish_when_session_closes(backend: Backend) -> None:
    ephemeral, durable = f"{backend.prefix}/ephemeral", f"{backend.prefix}/durable"
    owner = await backend.open()
    await owner.put(ephemeral, b"e", ephemeral=True)
    await owner.put(durable, b"d")
    assert not owner.session_lost

    # Vanishing at close (not only at the next open) must be visible to a watcher: another
    # session's for etcd; for local, in-process watchers are the only ones there are.
    observer = await backend.open() if backend.concurrent_sessions else owner
    async with observer.watch(ephemeral) as events:
        assert (await observer.get(ephemeral)) is not None
        await owner.close()
        event = await next_event(events)
    assert (event.type, event.key) == (EventType.DELETE, ephemeral)

    if not backend.concurrent_sessions:
        observer = await backend.open()
    try:
        assert await observer.get(ephemeral) is None
        assert (await observer.get(durable)) is not None
    finally:
        await observer.close()


class SessionHolder:
    """tests/support/metadata_session.py in its own process, holding one ephemeral key."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, url: str, key: str, ttl: int) -> SessionHolder:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.metadata_session",
            url,
            key,
            str(ttl),
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        holder = cls(process)
        assert await holder.read_line() == "ready"
        return holder

    async def read_line(self) -> str:
        assert self.process.stdout is not None
        line = await soon(self.process.stdout.readline())
        return line.decode().strip()

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.process.pid, sig)

    async def finish(self) -> None:
        """Ask it to exit (close stdin); kill it if it does not."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.signal(signal.SIGCONT)
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), SOON)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def wait_until_gone(store: MetadataStore, key: str, within: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if await store.get(key) is None:
            return True
        await asyncio.sleep(0.1)
    return False


async def test_ephemeral_keys_vanish_when_session_expires(backend: Backend) -> None:
    key = f"{backend.prefix}/held"
    if backend.kind == "local":
        durable = f"{backend.prefix}/durable"
        async with await backend.open() as store:
            await store.put(durable, b"d")
    holder = await SessionHolder.start(backend.url, key, SHORT_TTL)
    try:
        if backend.concurrent_sessions:
            await _expire_by_pausing(backend, holder, key)
        else:
            # The owner crashes without closing; the next owner cleans its ephemeral keys.
            holder.signal(signal.SIGKILL)
            await holder.process.wait()
            async with await backend.open() as store:
                assert await store.get(key) is None
                assert await store.get(durable) is not None
    finally:
        await holder.finish()


async def _expire_by_pausing(backend: Backend, holder: SessionHolder, key: str) -> None:
    async with await backend.open() as observer:
        assert await observer.get(key) is not None
        pause(holder.process.pid)  # no more keepalives: the lease runs out
        assert await wait_until_gone(observer, key, SHORT_TTL + 5), "lease did not expire"
        resume(holder.process.pid)
        # The paused process must notice on its own, not carry on as if nothing happened.
        assert await holder.read_line() == "session lost"
        assert await holder.read_line() == f"put refused: {SessionLostError.__name__}"
        assert await observer.get(key + "-again") is None


async def test_etcd_session_lost_when_etcd_unreachable_for_a_ttl() -> None:
    # A private etcd: pausing the shared one would stall every other test's session.
    with EtcdServer() as server:
        store = await open_store(server.url, session_ttl=SHORT_TTL, request_timeout=1)
        calls: list[str] = []
        lost = asyncio.Event()
        store.add_session_listener(lambda: (calls.append("lost"), lost.set()))
        await store.put("/held", b"x", ephemeral=True)
        server.pause()
        try:
            await asyncio.wait_for(lost.wait(), SHORT_TTL + 5)
            assert store.session_lost and calls == ["lost"]
            with pytest.raises(SessionLostError):
                await store.put("/again", b"x", ephemeral=True)
        finally:
            server.resume()
        await asyncio.sleep(0.5)
        assert calls == ["lost"]  # once, not again when etcd comes back
        late: list[str] = []
        store.add_session_listener(lambda: late.append("lost"))
        await asyncio.sleep(0)
        assert late == ["lost"]  # joined after the loss: still told
        await store.close()


async def test_second_local_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    holder = await SessionHolder.start(f"local://{path}", "/held", SHORT_TTL)
    try:
        with pytest.raises(MetadataError, match=r"meta\.db\.lock is locked by another process"):
            await open_store(f"local://{path}")
    finally:
        await holder.finish()
    async with await open_store(f"local://{path}") as store:  # free again once it exited
        assert await store.get("/held") is None


# -- leader election ---------------------------------------------------------------------


async def test_election_one_wins_and_resign_hands_over(
    backend: Backend, store: MetadataStore, peer: MetadataStore
) -> None:
    first, second = store.election(backend.election_name), peer.election(backend.election_name)
    await soon(first.campaign(b"first"))
    assert first.is_leader
    leader_key = f"/magnetar/elections/{backend.election_name}/leader"
    assert (await store.get(leader_key)) is not None

    waiting = asyncio.create_task(second.campaign(b"second"))
    await asyncio.sleep(0.3)
    assert not waiting.done() and not second.is_leader
    assert await second.leader() == b"first"

    await first.resign()
    await soon(waiting)
    assert second.is_leader and not first.is_leader
    assert await first.leader() == b"second"

    await second.resign()
    await first.resign()  # not the leader: no-op
    assert await first.leader() is None


async def test_election_leader_session_closed_hands_over(backend: Backend) -> None:
    leader_store = await backend.open()
    leader = leader_store.election(backend.election_name)
    await soon(leader.campaign(b"first"))

    if backend.concurrent_sessions:
        async with await backend.open() as other:
            successor = other.election(backend.election_name)
            waiting = asyncio.create_task(successor.campaign(b"second"))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await leader_store.close()
            assert not leader.is_leader
            await soon(waiting)
            assert successor.is_leader and await successor.leader() == b"second"
        return

    # Local: one session per process, so the contender in it ends with it, and the next
    # owner of the file finds the seat vacant.
    contender = leader_store.election(backend.election_name)
    waiting = asyncio.create_task(contender.campaign(b"same process"))
    await asyncio.sleep(0.1)
    await leader_store.close()
    assert not leader.is_leader
    with pytest.raises(StoreClosedError):
        await soon(waiting)
    async with await backend.open() as other:
        successor = other.election(backend.election_name)
        await soon(successor.campaign(b"second"))
        assert successor.is_leader and await successor.leader() == b"second"


async def test_election_observe_sees_every_change(
    backend: Backend, store: MetadataStore, peer: MetadataStore
) -> None:
    observed = store.election(backend.election_name).observe()
    async with contextlib.aclosing(observed):
        assert await soon(anext(observed)) is None
        candidate = peer.election(backend.election_name)
        await soon(candidate.campaign(b"one"))
        assert await soon(anext(observed)) == b"one"
        await candidate.resign()
        assert await soon(anext(observed)) is None
        await soon(store.election(backend.election_name).campaign(b"two"))
        assert await soon(anext(observed)) == b"two"


# -- URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "",
        "etcd",
        "zk://127.0.0.1:2181",
        "http://127.0.0.1:2379",
        "etcd://",
        "etcd://127.0.0.1",
        "etcd://127.0.0.1:notaport",
        "etcd://127.0.0.1:2379,",
        "etcd://127.0.0.1:99999",
        "etcd://::1:2379",
        "local://relative/meta.db",
        "local://",
        "local:///var/lib/magnetar/",
    ],
)
async def test_bad_urls_raise_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="accepted forms are etcd://host:port"):
        await open_store(url)


async def test_unknown_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="session_tll"):
        await open_store(f"local://{tmp_path}/meta.db", session_tll=3)


# -- model-based: random operations against a dict ---------------------------------------

_OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(["put", "delete"]),
        st.sampled_from(["a", "b", "b/c"]),
        st.sampled_from(["unconditional", "not_exists", "current", "wrong"]),
        st.binary(max_size=4),
    ),
    max_size=20,
)
_MISSING_VERSION = 10**12  # a version no key has


@settings(
    max_examples=50,
    deadline=None,
    # One store per example is opened inside the test; the fixture only gives the URL.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(operations=_OPERATIONS)
def test_random_operations_match_a_dict_model(
    backend: Backend, operations: list[tuple[str, str, str, bytes]]
) -> None:
    prefix = f"{backend.prefix}/{uuid.uuid4().hex[:8]}"
    asyncio.run(_check_against_model(backend, prefix, operations))


async def _check_against_model(
    backend: Backend, prefix: str, operations: list[tuple[str, str, str, bytes]]
) -> None:
    model: dict[str, Versioned] = {}
    newest = 0
    async with await backend.open() as store:
        for op, name, mode, value in operations:
            key = f"{prefix}/{name}"
            current = model.get(key)
            expected = _expected_version(mode, current)
            if op == "put":
                refused = (mode == "not_exists" and current is not None) or (
                    mode in ("current", "wrong") and expected != getattr(current, "version", 0)
                )
                if refused:
                    with pytest.raises(BadVersionError):
                        await store.put(key, value, expected)
                else:
                    version = await store.put(key, value, expected)
                    assert version > newest
                    newest = version
                    model[key] = Versioned(value, version)
            else:
                expected = None if mode == "not_exists" else expected
                if expected is not None and current is None:
                    with pytest.raises(NoSuchKeyError):
                        await store.delete(key, expected)
                elif expected is not None and current is not None and expected != current.version:
                    with pytest.raises(BadVersionError):
                        await store.delete(key, expected)
                else:
                    await store.delete(key, expected)
                    model.pop(key, None)
            assert await store.get(key) == model.get(key)
        assert await store.scan(prefix + "/") == model
        top = {k[len(prefix) + 1 :].split("/")[0] for k in model}
        assert await store.children(prefix) == sorted(top)


def _expected_version(mode: str, current: Versioned | None) -> int | None:
    if mode == "unconditional":
        return None
    if mode == "not_exists":
        return NOT_EXISTS
    if current is None:
        return _MISSING_VERSION
    return current.version if mode == "current" else current.version + 1000
