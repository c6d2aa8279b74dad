"""The broker: accepts Pulsar-protocol connections and serves the topics it has loaded.

This first version serves every topic itself (a single broker, as in standalone mode): lookups
answer with its own address. Bundle ownership and the load manager come later.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from magnetar.broker.admin import build_app, ensure_default_namespace, namespace_exists
from magnetar.broker.config import BrokerConfig
from magnetar.broker.connection import ServerConnection
from magnetar.broker.deduplication import Deduplication
from magnetar.broker.managed_ledger import ManagedLedger, ManagedLedgerConfig
from magnetar.broker.topic import NamespaceNotFoundError, PersistentTopic
from magnetar.broker.topic_name import TopicName
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.metadata import MetadataStore, open_store

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig, store: MetadataStore | None = None) -> None:
        self.config = config
        self.store = store
        self._owns_store = store is None
        self.ledger_client: LedgerClient | None = None
        self.topics: dict[str, PersistentTopic] = {}
        self._loading: dict[str, asyncio.Task[PersistentTopic]] = {}
        self.connections: set[ServerConnection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._http: web.AppRunner | None = None
        self.port = config.port
        self.http_port = config.http_port

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.config.advertised_address}:{self.port}"

    async def start(self) -> None:
        if self.store is None:
            self.store = await open_store(self.config.metadata_url)
        self.ledger_client = LedgerClient(self.store)
        await ensure_default_namespace(self)
        # HTTP first: once clients can connect to the Pulsar port, the admin API is up too.
        self._http = web.AppRunner(build_app(self), access_log=None)
        await self._http.setup()
        site = web.TCPSite(self._http, self.config.bind_address, self.config.http_port)
        await site.start()
        self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), self.config.bind_address, self.config.port
        )
        self.port = self._server.sockets[0].getsockname()[1]
        log.info(
            "broker serving %s (admin http://%s:%d)",
            self.service_url,
            self.config.advertised_address,
            self.http_port,
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._http is not None:
            await self._http.cleanup()
        for connection in list(self.connections):
            connection.close()
        for topic in list(self.topics.values()):
            try:
                await topic.close()
            except Exception as e:
                log.warning("topic %s did not close cleanly: %s", topic.name, e)
        self.topics.clear()
        if self.ledger_client is not None:
            await self.ledger_client.close()
        if self._owns_store and self.store is not None:
            await self.store.close()
        log.info("broker stopped")

    async def get_topic(self, name: TopicName) -> PersistentTopic:
        """The loaded topic, loading it (and recovering its last ledger) on first use."""
        key = str(name)
        topic = self.topics.get(key)
        if topic is not None:
            return topic
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.get_running_loop().create_task(self._load(name))
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._loading.pop(key, None)

    async def delete_topic(self, name: TopicName, *, force: bool) -> None:
        """Delete a topic's data (ledgers, cursors) and unload it."""
        topic = await self.get_topic(name)
        await topic.delete(force=force)
        self.topics.pop(str(name), None)
        log.info("topic %s deleted", name)

    async def _load(self, name: TopicName) -> PersistentTopic:
        assert self.ledger_client is not None and self.store is not None
        if not await namespace_exists(self, name.namespace_name):
            raise NamespaceNotFoundError(
                f"namespace {name.namespace_name} does not exist (create it with the admin API)"
            )
        c = self.config
        ml_config = ManagedLedgerConfig(
            ensemble_size=c.ensemble_size,
            write_quorum=c.write_quorum,
            ack_quorum=c.ack_quorum,
            max_entries_per_ledger=c.max_entries_per_ledger,
        )
        ml = await ManagedLedger.open(
            name.managed_ledger_name, self.ledger_client, self.store, ml_config
        )
        topic = PersistentTopic(name, ml, c.dispatch_batch)
        if c.deduplication_enabled:
            topic.deduplication = await Deduplication.load(ml)
        self.topics[str(name)] = topic
        log.info("topic %s loaded", name)
        return topic
