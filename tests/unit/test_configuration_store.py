"""Tenants, namespaces and partitioned topics move from a cluster's local metadata store to the
configuration store when an operator adds one (``records.move_to_configuration_store``), on two
real SQLite stores: what the configuration store has wins, the local copies go, running it again
moves nothing, and one store under two URLs is left as it is. ``initialize-cluster-metadata``
writes ``public/default`` to the configuration store; no broker code reads such a record through
a local store handle."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from magnetar.broker.namespace.clusters import cluster_key
from magnetar.broker.namespace.records import (
    NAMESPACES_PATH,
    PARTITIONED_PATH,
    TENANTS_PATH,
    TOPIC_POLICIES_PATH,
    move_to_configuration_store,
)
from magnetar.common.metadata import MetadataStore, open_store


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[MetadataStore, MetadataStore]]:
    local = await open_store(f"local://{tmp_path}/local/meta.db")
    configuration = await open_store(f"local://{tmp_path}/configuration/meta.db")
    yield local, configuration
    await local.close()
    await configuration.close()


async def test_local_records_move_and_the_configuration_store_wins(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    local, configuration = stores
    await local.put(f"{TENANTS_PATH}/acme", json.dumps({"allowedClusters": ["east"]}).encode())
    await local.put(f"{NAMESPACES_PATH}/acme/orders", b'{"message_ttl_in_seconds": 60}')
    await local.put(f"{NAMESPACES_PATH}/public/default", b"{}")
    await local.put(f"{PARTITIONED_PATH}/acme/orders/persistent/t", b'{"partitions": 3}')
    topic_policy = f"{TOPIC_POLICIES_PATH}/acme/orders/persistent/t"
    await local.put(topic_policy, b'{"message_ttl_in_seconds": 5}')
    # Another cluster made public/default first, with a policy: its record stays.
    await configuration.put(f"{NAMESPACES_PATH}/public/default", b'{"deduplication": true}')

    moved = await move_to_configuration_store(local, configuration)

    assert moved == {TENANTS_PATH: 1, NAMESPACES_PATH: 1, PARTITIONED_PATH: 1}
    on_configuration = {k: v.value for k, v in (await configuration.scan("/magnetar/")).items()}
    assert on_configuration == {
        f"{TENANTS_PATH}/acme": b'{"allowedClusters": ["east"]}',
        f"{NAMESPACES_PATH}/acme/orders": b'{"message_ttl_in_seconds": 60}',
        f"{NAMESPACES_PATH}/public/default": b'{"deduplication": true}',
        f"{PARTITIONED_PATH}/acme/orders/persistent/t": b'{"partitions": 3}',
    }
    # The local copies are gone (nothing can bring a deleted namespace back from them);
    # topic-level policies are the cluster's own and stay local.
    assert list(await local.scan("/magnetar/")) == [topic_policy]
    assert await move_to_configuration_store(local, configuration) == dict.fromkeys(moved, 0)


async def test_one_store_under_two_names_is_left_alone(tmp_path: Path) -> None:
    store = await open_store(f"local://{tmp_path}/meta.db")
    try:
        await store.put(f"{NAMESPACES_PATH}/acme/orders", b"{}")
        moved = await move_to_configuration_store(store, store)
        assert moved == {TENANTS_PATH: 0, NAMESPACES_PATH: 0, PARTITIONED_PATH: 0}
        assert list(await store.scan("/magnetar/")) == [f"{NAMESPACES_PATH}/acme/orders"]
    finally:
        await store.close()


ROOT = Path(__file__).resolve().parents[2] / "services"
#: A record of the configuration store read or written through a local store handle.
_LOCAL_HANDLE = r"(broker|conn\.broker|self|self\._host)\.(store|_store)\b"
_MISPLACED = [
    re.compile(rf"(read_partitioned|partitioned_topics|namespace_document)\(\s*{_LOCAL_HANDLE}"),
    re.compile(
        rf"{_LOCAL_HANDLE}\.(get|put|delete|children|scan)\(\s*"
        r"(f\"\{(TENANTS_PATH|NAMESPACES_PATH|PARTITIONED_PATH)\}|partitioned_key\(|"
        r"(TENANTS_PATH|NAMESPACES_PATH|PARTITIONED_PATH)\b)"
    ),
]
#: Files whose ``self.store`` is the configuration store.
_CONFIGURATION_HOLDERS = {"broker/namespace/authorization.py"}


def test_configuration_records_are_never_read_from_the_local_store() -> None:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in _CONFIGURATION_HOLDERS:
            continue
        text = path.read_text()
        for pattern in _MISPLACED:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{relative}:{line}: {match.group(0)}")
    assert found == [], "use broker.configuration_store for these records:\n" + "\n".join(found)


def test_initialize_cluster_metadata_writes_the_configuration_store(tmp_path: Path) -> None:
    local, shared = tmp_path / "local" / "meta.db", tmp_path / "shared" / "meta.db"
    local.parent.mkdir()
    shared.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "initialize-cluster-metadata",
         "--metadata-url", f"local://{local}", "--configuration-metadata-store",
         f"local://{shared}", "--cluster", "east"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr

    async def namespaces(path: Path) -> list[str]:
        store = await open_store(f"local://{path}")
        try:
            return list(await store.scan(f"{NAMESPACES_PATH}/"))
        finally:
            await store.close()

    assert asyncio.run(namespaces(shared)) == [f"{NAMESPACES_PATH}/public/default"]
    assert asyncio.run(namespaces(local)) == []

    # Pulsar's flags register the cluster there too (once: a second run leaves it).
    def initialize(*urls: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "magnetar.cli", "initialize-cluster-metadata",
             "--metadata-url", f"local://{local}", "--configuration-metadata-store",
             f"local://{shared}", "--cluster", "east", *urls],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    done = initialize(
        "--web-service-url", "http://east:8080", "--broker-service-url", "pulsar://east:6650"
    )
    assert done.returncode == 0 and "cluster east registered" in done.stdout, done

    async def cluster(path: Path) -> dict[str, str] | None:
        store = await open_store(f"local://{path}")
        try:
            found = await store.get(cluster_key("east"))
            return None if found is None else json.loads(found.value)
        finally:
            await store.close()

    east = {"serviceUrl": "http://east:8080", "brokerServiceUrl": "pulsar://east:6650"}
    assert asyncio.run(cluster(shared)) == east
    assert asyncio.run(cluster(local)) is None
    done = initialize("--web-service-url", "http://other:8080")
    assert done.returncode == 0 and "registered already" in done.stdout, done
    assert asyncio.run(cluster(shared)) == east
