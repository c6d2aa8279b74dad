"""Integrity of a bookie at its edges, with real bookie processes: a server socket never shares
an address in use; an entry over the size limit fails alone; a corrupt replica is read around."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from magnetar.common.ledger.bookie_client import BookieClient
from magnetar.common.ledger.entry import encode_entry, verify_entry
from tests.support.bookie import BookieFactory, bookie_factory_fixture


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[BookieFactory]:
    yield from bookie_factory_fixture(tmp_path)


async def _add_and_read(address: str, ledger_id: int, entry_id: int) -> bytes:
    payload = f"ledger {ledger_id} entry {entry_id}".encode()
    async with BookieClient(address, timeout=10) as client:
        await client.add(ledger_id, entry_id, encode_entry(ledger_id, entry_id, -1, 1, payload))
        entry = await client.read(ledger_id, entry_id)
    header = verify_entry(entry)
    assert (header.ledger_id, header.entry_id) == (ledger_id, entry_id)
    return entry[-len(payload) :]


# -- server sockets ------------------------------------------------------------------------


@pytest.mark.parametrize("shared", ["port", "http_port"])
def test_second_bookie_on_a_port_in_use_refuses_to_start(
    bookies: BookieFactory, shared: str
) -> None:
    first = bookies.start(journal_sync=False)
    assert asyncio.run(_add_and_read(first.address, 7, 0)) == b"ledger 7 entry 0"

    second = bookies.create(journal_sync=False)
    setattr(second, shared, getattr(first, shared))
    # Run it to its end: waiting for /ready would ask the first bookie when the HTTP port is
    # the shared one.
    try:
        refused = subprocess.run(second.command(), capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"a second bookie on the {shared} of a running one did not exit")
    message = refused.stdout + refused.stderr
    assert refused.returncode != 0, message
    bound = f"127.0.0.1:{getattr(first, shared)}"
    assert f"cannot listen on {bound} ({shared}): address already in use" in message, message
    assert "Traceback" not in message, message

    # The first bookie is untouched: still ready, still storing and serving its entries.
    assert first.running
    assert first.http("GET", "/ready")[0] == 200
    assert asyncio.run(_add_and_read(first.address, 7, 1)) == b"ledger 7 entry 1"
    assert "cannot listen" not in first.log_text()
