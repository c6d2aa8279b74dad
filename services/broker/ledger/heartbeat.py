"""The broker's health check (``GET /admin/v2/brokers/health``): a message round-tripped through
this broker's own heartbeat topic, as Pulsar's health check sends one through
``persistent://pulsar/<broker>/healthcheck`` and reads it back.

Here the round trip is through the storage path of that topic: its managed ledger (named as the
topic's would be, ``pulsar/<broker>/persistent/healthcheck``) is opened, which fences and
closes the ledger of the last check and creates a new one (metadata store and bookies), a nonce
is added and read back, and the ledgers before it are deleted, so no more than two ledgers are
ever kept. One check at a time: two opens of the managed ledger would fence each other.
"""

from __future__ import annotations

import asyncio
import os

from magnetar.broker.ledger.errors import ManagedLedgerError
from magnetar.broker.ledger.ledger_info import ManagedLedgerConfig
from magnetar.broker.ledger.managed_ledger import ManagedLedger
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.errors import LedgerError
from magnetar.common.ledger.placement import NotEnoughBookiesError
from magnetar.common.metadata import MetadataError, MetadataStore


class HeartbeatFailedError(Exception):
    """The round trip did not complete; the reason says where it stopped."""


def heartbeat_ledger_name(broker_id: str) -> str:
    """The managed ledger of ``persistent://pulsar/<broker_id>/healthcheck``."""
    return f"pulsar/{broker_id}/persistent/healthcheck"


class Heartbeat:
    def __init__(self, broker_id: str, config: ManagedLedgerConfig) -> None:
        self.name = heartbeat_ledger_name(broker_id)
        self._config = config
        self._lock = asyncio.Lock()

    async def round_trip(
        self, ledger_client: LedgerClient, store: MetadataStore, timeout: float
    ) -> None:
        """Write a nonce and read it back within ``timeout`` seconds; HeartbeatFailedError
        otherwise."""
        async with self._lock:
            try:
                async with asyncio.timeout(timeout):
                    await self._round_trip(ledger_client, store)
            except TimeoutError:
                raise HeartbeatFailedError(
                    f"the heartbeat message was not written and read back within {timeout:g} s"
                ) from None
            except (ManagedLedgerError, LedgerError, NotEnoughBookiesError, MetadataError) as e:
                raise HeartbeatFailedError(f"heartbeat {self.name}: {e}") from None

    async def _round_trip(self, ledger_client: LedgerClient, store: MetadataStore) -> None:
        ml = await ManagedLedger.open(self.name, ledger_client, store, self._config)
        try:
            nonce = os.urandom(16)
            position = await ml.add_entry(nonce)
            found = await ml.read_entries(position, 1)
            if [data for _, data in found] != [nonce]:
                raise HeartbeatFailedError(
                    f"heartbeat {self.name}: read back {found!r} at {position}, not the message"
                )
            await ml.trim(position)
        finally:
            await ml.close()
