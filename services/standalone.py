"""``magnetar standalone``: embedded metadata store, one bookie and one broker in one process,
everything durable under one data directory."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from pathlib import Path

from magnetar.bookie.config import BookieConfig
from magnetar.bookie.local_client import LocalBookieClient
from magnetar.bookie.service import Bookie
from magnetar.broker.broker import Broker
from magnetar.broker.config import BrokerConfig, TopicSettings
from magnetar.common.config import setting
from magnetar.common.metadata import MetadataStore, open_store

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StandaloneConfig(TopicSettings):
    data_dir: str = setting(
        "data/standalone", "directory for the metadata store, journal and ledgers"
    )
    broker_port: int = setting(6650, "Pulsar protocol port")
    http_port: int = setting(8080, "HTTP port of the broker")
    bookie_port: int = setting(3181, "gRPC port of the embedded bookie")
    bookie_http_port: int = setting(8000, "HTTP port of the embedded bookie")
    journal_sync: bool = setting(
        True, "fsync the journal before acknowledging (turn off only for tests)"
    )
    bookie_via_grpc: bool = setting(
        False,
        "reach the embedded bookie over gRPC like a remote one (slower; by default the broker "
        "calls it in process)",
    )

    def validate(self) -> None:
        self.validate_topic_settings()
        self.validate_etcd_tls("local://")  # its metadata is in its data directory


class Standalone:
    def __init__(self, config: StandaloneConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.store: MetadataStore | None = None
        self.bookie: Bookie | None = None
        self.broker: Broker | None = None

    async def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        meta_db = (self.data_dir / "meta.db").resolve()
        self.store = await open_store(f"local://{meta_db}")
        bookie_config = BookieConfig(
            metadata_url="local://",
            bind_address="127.0.0.1",
            advertised_address="127.0.0.1",
            port=self.config.bookie_port,
            http_port=self.config.bookie_http_port,
            journal_dir=str(self.data_dir / "bookie" / "journal"),
            ledger_dir=str(self.data_dir / "bookie" / "ledgers"),
            journal_sync=self.config.journal_sync,
        )
        # The bookie's identity check is what refuses a reset or lost meta.db: the embedded
        # bookie's cookie names a cluster (or it holds data) that an empty store does not know.
        self.bookie = Bookie(bookie_config, self.store, store_name=f"the metadata store {meta_db}")
        await self.bookie.start()
        broker_config = BrokerConfig(
            metadata_url="local://",
            bind_address="0.0.0.0",
            advertised_address="localhost",
            port=self.config.broker_port,
            http_port=self.config.http_port,
            **{f.name: getattr(self.config, f.name) for f in fields(TopicSettings)},
            ensemble_size=1,
            write_quorum=1,
            ack_quorum=1,
        )
        local = {}
        if not self.config.bookie_via_grpc:
            local[self.bookie.address] = LocalBookieClient(
                self.bookie.address, self.bookie.storage, self.bookie.info
            )
        self.broker = Broker(broker_config, self.store, local_bookies=local)
        await self.broker.start()
        log.info(
            "standalone ready: %s (metadata %s, bookie %s)",
            self.broker.service_url,
            self.data_dir / "meta.db",
            self.bookie.address,
        )

    async def stop(self) -> None:
        if self.broker is not None:
            await self.broker.stop()
        if self.bookie is not None:
            await self.bookie.stop()
        if self.store is not None:
            await self.store.close()
