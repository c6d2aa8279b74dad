"""The local metadata store opened read-only beside its owner (``magnetar bk`` on a running
standalone): it reads what the owner writes, refuses writes, and leaves the owner's lock and
ephemeral keys alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from magnetar.common.metadata import open_store
from magnetar.common.metadata.local import (
    LocalMetadataStore,
    MetadataStoreInUseError,
    ReadOnlyStoreError,
)


async def test_a_read_only_open_reads_beside_the_owner(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    owner = await LocalMetadataStore.open(path)
    try:
        await owner.put("/a/1", b"one")
        await owner.put("/a/live", b"x", ephemeral=True)
        with pytest.raises(MetadataStoreInUseError, match="in use"):
            await LocalMetadataStore.open(path)
        reader = await open_store(f"local://{path}", read_only=True)
        try:
            assert isinstance(reader, LocalMetadataStore) and reader.read_only
            found = await reader.get("/a/1")
            assert found is not None and found.value == b"one"
            await owner.put("/a/2", b"two")  # written after the reader opened: seen
            assert sorted(await reader.scan("/a/")) == ["/a/1", "/a/2", "/a/live"]
            assert await reader.children("/a") == ["1", "2", "live"]
            for write in (
                reader.put("/a/3", b"three"),
                reader.delete("/a/1"),
                reader.transaction([], []),
            ):
                with pytest.raises(ReadOnlyStoreError, match="read-only"):
                    await write
        finally:
            await reader.close()
        # The reader's close took nothing of the owner's: its ephemeral key, its lock.
        assert await owner.get("/a/live") is not None
        assert await owner.get("/a/3") is None
        with pytest.raises(MetadataStoreInUseError):
            await LocalMetadataStore.open(path)
    finally:
        await owner.close()


async def test_read_only_needs_an_existing_store_and_is_for_local_ones(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="does not exist"):
        await LocalMetadataStore.open(tmp_path / "none.db", read_only=True)
    assert not (tmp_path / "none.db").exists()
    with pytest.raises(ValueError, match="local store"):
        await open_store("etcd://127.0.0.1:1", read_only=True)
