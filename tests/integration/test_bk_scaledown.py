"""``magnetar bk scaledown`` as an operator runs it in a bookie pod (``kubectl exec bookie-0 --
magnetar bk scaledown --replicas N``): the StatefulSet's leaving bookies found by their stable
names, the check refusing with its reasons, ``--check`` changing nothing, and an allowed
scale-down putting exactly the leaving bookies on the decommissioning list. On a metadata store
of the tool's own (``local://``) holding registrations and ledgers as a cluster writes them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from magnetar.common.ledger.bookies import BookieRegistration, registration_key
from magnetar.common.ledger.metadata import Fragment, LedgerMetadata, LedgerState, ledger_key
from magnetar.common.ledger.underreplication import DECOMMISSIONING_PATH
from magnetar.common.metadata import open_store

NAMES = [f"bookie-{i}.bookie.magnetar.svc:3181" for i in range(5)]


def seed(url: str, bookies: list[str], ledgers: dict[int, tuple[str, ...]]) -> None:
    async def write() -> None:
        store = await open_store(url)
        try:
            for address in bookies:
                registration = BookieRegistration(address, address, False, 10**9, 10**10)
                await store.put(registration_key(address), registration.to_json())
            for ledger_id, ensemble in ledgers.items():
                metadata = LedgerMetadata(
                    len(ensemble), 2, 2, (Fragment(0, ensemble),), LedgerState.OPEN
                )
                await store.put(ledger_key(ledger_id), metadata.to_bytes())
        finally:
            await store.close()

    asyncio.run(write())


def decommissioning(url: str) -> list[str]:
    async def scan() -> list[str]:
        store = await open_store(url)
        try:
            return sorted(k.rsplit("/", 1)[1] for k in await store.scan(DECOMMISSIONING_PATH + "/"))
        finally:
            await store.close()

    return asyncio.run(scan())


def scaledown(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAGNETAR_")}
    return subprocess.run(
        [sys.executable, "-m", "magnetar", "bk", "scaledown", "--metadata-url", url, *args],
        env={**env, "HOSTNAME": "bookie-0"},  # the pod the operator execs into
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_scaledown_refuses_then_decommissions_the_statefulsets_highest_ordinals(
    tmp_path: Path,
) -> None:
    url = f"local://{tmp_path / 'meta.db'}"
    # Five bookies; ledger 1 spans bookie-2..4 (E=3), ledger 2 bookie-0..2.
    seed(url, NAMES, {1: tuple(NAMES[2:5]), 2: tuple(NAMES[0:3])})

    # 5 -> 2: two would remain, but ledger 1 needs 3 distinct bookies and new ledgers E=3.
    refused = scaledown(url, "--replicas", "2")
    assert refused.returncode == 1, refused
    assert "refused: removing" in refused.stderr
    assert "new ledgers need an ensemble of 3 bookies" in refused.stderr
    assert "ledger 1 (entries from 0 on" in refused.stderr
    assert decommissioning(url) == [], "a refusal changes nothing"

    # 5 -> 4, only checked: allowed, nothing marked.
    checked = scaledown(url, "--replicas", "4", "--check", "--json")
    assert checked.returncode == 0, checked
    verdict = json.loads(checked.stdout)
    assert verdict["allowed"] and verdict["bookies"] == [NAMES[4]]
    assert verdict["ledgers_to_move"] == 1
    assert decommissioning(url) == []

    # 5 -> 4 for real (no replication workers here: marked, not waited for).
    done = scaledown(url, "--replicas", "4", "--no-wait", "--json")
    assert done.returncode == 0, done
    assert decommissioning(url) == [NAMES[4]]

    # Nothing of ordinal 5 or more: nothing to do.
    nothing = scaledown(url, "--replicas", "5")
    assert nothing.returncode == 0 and "nothing to decommission" in nothing.stdout
