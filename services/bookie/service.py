"""A running bookie: storage, the gRPC bookie protocol, HTTP, registration and the loops that
keep it healthy (checkpoint, garbage collection, disk check)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from aiohttp import web

from magnetar.bookie import disk_checker
from magnetar.bookie.auditor import Auditor, AuditorSettings
from magnetar.bookie.config import BookieConfig
from magnetar.bookie.cookie import BookieIdentityError, verify_identity
from magnetar.bookie.gc import GarbageCollector
from magnetar.bookie.ledger_storage import LedgerStorage
from magnetar.bookie.metrics import BookieMetrics
from magnetar.bookie.replication import ReplicationSettings, ReplicationWorker
from magnetar.bookie.server import BookieService, grpc_server_options
from magnetar.common.config import ConfigError
from magnetar.common.ledger.bookies import BookieRegistration, registration_key
from magnetar.common.ledger.client import LedgerClient
from magnetar.common.ledger.identity import Cookie
from magnetar.common.ledger.metadata import LEDGER_ID_COUNTER
from magnetar.common.ledger.underreplication import decommissioning_key, read_settings
from magnetar.common.metadata import MetadataError, MetadataStore, open_store
from magnetar.common.metrics import CONTENT_TYPE, render
from magnetar.common.net import AddressInUseError, listen_error
from magnetar.common.proto import bookie_pb2 as pb
from magnetar.common.proto import bookie_pb2_grpc

log = logging.getLogger(__name__)


def bind_grpc_port(
    server: grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Bind the bookie protocol's port (TLS with ``credentials``); the bound port, or
    AddressInUseError naming it.

    ``add_insecure_port`` reports a failed bind by returning 0 in some gRPC versions and by
    raising RuntimeError in others (``add_secure_port`` alike)."""
    try:
        if credentials is None:
            bound = server.add_insecure_port(f"{host}:{port}")
        else:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
    except RuntimeError:
        raise AddressInUseError(listen_error("port", host, port, "bind failed")) from None
    if bound == 0:
        raise AddressInUseError(listen_error("port", host, port, "bind failed"))
    return bound


def grpc_server_credentials(config: BookieConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of the bookie protocol from the bookie's tls_* settings (None: TLS off).

    A client certificate is asked for only under tls_client_authentication, and then required:
    gRPC verifies a certificate whenever it asks for one, so asking without requiring would
    refuse a client showing a certificate it was not meant to show."""
    if not config.tls_enabled:
        return None
    chain = _read_setting_file(config.tls_certificate_path, "tls_certificate_path")
    key = _read_setting_file(config.tls_key_store, "tls_key_store")
    if b"CERTIFICATE-----" not in chain:
        raise ConfigError(
            f"tls_certificate_path: {config.tls_certificate_path} holds no PEM certificate"
        )
    if b"PRIVATE KEY-----" not in key or b"ENCRYPTED" in key:
        raise ConfigError(
            f"tls_key_store: {config.tls_key_store} holds no unencrypted PEM private key"
        )
    if not config.tls_client_authentication:
        return grpc.ssl_server_credentials([(key, chain)])
    roots = _read_setting_file(config.tls_trust_store, "tls_trust_store")
    if b"CERTIFICATE-----" not in roots:
        raise ConfigError(f"tls_trust_store: {config.tls_trust_store} holds no PEM certificate")
    return grpc.ssl_server_credentials(
        [(key, chain)], root_certificates=roots, require_client_auth=True
    )


def _read_setting_file(path: str, setting: str) -> bytes:
    # A few KB of PEM, read once at start.
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"{setting}: cannot read {path}: {e.strerror}") from None


class Bookie:
    """One bookie. ``store`` may be shared (standalone mode); otherwise the bookie opens its own
    from ``config.metadata_url`` and reopens it if the session is lost. ``store_name`` names the
    store in identity refusals (default: the metadata URL)."""

    def __init__(
        self,
        config: BookieConfig,
        store: MetadataStore | None = None,
        *,
        store_name: str | None = None,
    ) -> None:
        self.config = config
        self.store_name = store_name or f"the metadata store {config.metadata_url}"
        self.cookie: Cookie | None = None
        self.address = config.resolved_address()
        self.metrics = BookieMetrics()
        self.storage = LedgerStorage(config, self.metrics)
        self._store = store
        self._owns_store = store is None
        self._grpc: grpc.aio.Server | None = None
        self._http: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._usage = disk_checker.DiskUsage(0.0, 0, 0)
        self._registered = False
        self._stopping = False
        self._reregister = asyncio.Event()
        self._draining = False  # being decommissioned: read-only until it is removed
        self._recovery_store: MetadataStore | None = None
        self._recovery_client: LedgerClient | None = None
        self.gc: GarbageCollector | None = None
        self.port = config.port
        self.http_port = config.http_port

    @property
    def http_address(self) -> str:
        return f"{self.address.rsplit(':', 1)[0]}:{self.http_port}"

    async def start(self) -> None:
        self._grpc = grpc.aio.server(options=grpc_server_options())
        bookie_pb2_grpc.add_BookieServicer_to_server(
            BookieService(self.storage, self.info), self._grpc
        )
        bound = bind_grpc_port(
            self._grpc,
            self.config.bind_address,
            self.config.port,
            grpc_server_credentials(self.config),
        )
        if self.config.port == 0:
            self.port = bound
            self.address = f"{self.address.rsplit(':', 1)[0]}:{bound}"
        if self._store is None:
            self._store = await open_store(
                self.config.metadata_url,
                session_ttl=self.config.session_ttl_s,
                tls=self.config.etcd_tls(),
            )
        # The identity first: nothing is opened or created in directories of another bookie,
        # nor served against a metadata store that does not know them.
        self.cookie = await verify_identity(
            self._store,
            self.address,
            Path(self.config.journal_dir),
            Path(self.config.ledger_dir),
            store_name=self.store_name,
        )
        self.storage.wiped_below = self.cookie.wiped_below
        self.gc = GarbageCollector(
            self.storage,
            lambda: self._store,
            self.metrics,
            address=self.address,
            instance_id=self.cookie.instance_id,
            min_idle_s=self.config.gc_orphan_min_idle_s,
        )
        await self.storage.start()
        await self._refuse_a_store_behind_the_data()
        self._check_disk()
        await self._grpc.start()
        await self._start_http()
        self._store.add_session_listener(self._reregister.set)
        await self._register()
        self._tasks = [
            asyncio.create_task(
                self._every(self.config.checkpoint_interval_s, self.storage.checkpoint),
                name="checkpoint",
            ),
            asyncio.create_task(
                self._every(self.config.disk_check_interval_s, self._disk_check_round),
                name="disk-check",
            ),
            asyncio.create_task(self._keep_registered(), name="registration"),
        ]
        if self.config.gc_interval_s > 0:
            self._tasks.append(
                asyncio.create_task(self._every(self.config.gc_interval_s, self.gc.run), name="gc")
            )
        await self._start_autorecovery()
        log.info(
            "bookie %s serving%s (http %s)",
            self.address,
            " over TLS" if self.config.tls_enabled else "",
            self.http_address,
        )

    async def _refuse_a_store_behind_the_data(self) -> None:
        """Every ledger id was handed out by the store's counter before any bookie held it, so a
        counter below a ledger this bookie holds means the store went back to an older state
        (restored from an old backup, or a damaged WAL cut at start): ledger lists and cursors
        would silently go back with it, and ids this bookie holds would be handed out again."""
        assert self._store is not None
        held = await self.storage.ledger_ids()
        counter = await self._store.get(LEDGER_ID_COUNTER)
        if not held or counter is None:
            return  # a reset store (no counter) is the cookies' and instance id's business
        highest, handed_out = max(held), int(counter.value)
        if highest <= handed_out:
            return
        raise BookieIdentityError(
            f"{self.store_name} is behind this bookie's data: its ledger-id counter is at "
            f"{handed_out}, but this bookie holds ledger {highest}, which the counter handed "
            "out before. The store went back to an older state (restored from an older backup, "
            "or its write-ahead log was damaged and cut at start): topics and cursors would "
            "silently lose what happened since, and ledger ids would be handed out twice; the "
            f"bookie will not start. Restore {self.store_name} from its newest backup"
        )

    async def stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._store is not None and self._registered:
            with contextlib.suppress(MetadataError, OSError):
                await self._store.delete(registration_key(self.address))
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self.storage.close()
        if self._http is not None:
            await self._http.cleanup()
        if self._owns_store and self._store is not None:
            with contextlib.suppress(MetadataError, OSError):
                await self._store.close()
        log.info("bookie %s stopped", self.address)

    # -- registration ------------------------------------------------------------------

    def registration(self) -> BookieRegistration:
        return BookieRegistration(
            address=self.address,
            http_address=self.http_address,
            read_only=self.storage.read_only,
            free_bytes=self._usage.free_bytes,
            total_bytes=self._usage.total_bytes,
            max_entry_size=self.config.max_entry_size,
        )

    async def _register(self) -> None:
        assert self._store is not None
        await self._store.put(
            registration_key(self.address), self.registration().to_json(), ephemeral=True
        )
        self._registered = True

    async def _keep_registered(self) -> None:
        """Re-register after a lost session (a new session, for a store of our own)."""
        while True:
            await self._reregister.wait()
            self._reregister.clear()
            self._registered = False
            log.error("bookie %s lost its metadata session; registering again", self.address)
            while not self._registered:
                try:
                    if self._owns_store:
                        assert self._store is not None
                        with contextlib.suppress(Exception):
                            await self._store.close()
                        self._store = await open_store(
                            self.config.metadata_url,
                            session_ttl=self.config.session_ttl_s,
                            tls=self.config.etcd_tls(),
                        )
                        self._store.add_session_listener(self._reregister.set)
                    await self._register()
                    log.info("bookie %s registered again", self.address)
                except (MetadataError, OSError) as e:
                    log.error("re-registration of bookie %s failed (%s); retrying", self.address, e)
                    await asyncio.sleep(1.0)

    # -- autorecovery -------------------------------------------------------------------

    async def _start_autorecovery(self) -> None:
        if self.config.auto_recovery_daemon_enabled:
            self._tasks.append(asyncio.create_task(self._autorecovery(), name="autorecovery"))

    async def _autorecovery(self) -> None:
        """The auditor candidate and the replication worker, on the bookie's metadata session
        (its lease bounds the worker's ledger locks and the auditor role, as BookKeeper's
        autorecovery shares the bookie's ZooKeeper session). When the session is lost they stop
        and start again on the bookie's new one."""
        c = self.config
        while True:
            store = self._store
            if store is None or store.session_lost:
                await asyncio.sleep(0.5)  # _keep_registered opens a new session
                continue
            lost = asyncio.Event()
            store.add_session_listener(lost.set)
            self._recovery_store = store
            self._recovery_client = client = LedgerClient(store, tls=self.config.client_tls())
            worker = ReplicationWorker(
                client,
                self.address,
                ReplicationSettings(
                    rereplication_entry_batch_size=c.rereplication_entry_batch_size,
                    replication_rate_by_bytes=c.replication_rate_by_bytes,
                    open_ledger_rereplication_grace_period=c.open_ledger_rereplication_grace_period,
                    poll_interval_s=max(min(c.auditor_periodic_check_interval, 5.0), 0.5),
                ),
                self.metrics,
                enabled=self.autorecovery_enabled,
            )
            auditor = Auditor(
                client,
                self.address,
                AuditorSettings(
                    auditor_periodic_check_interval=c.auditor_periodic_check_interval,
                    auditor_periodic_bookie_check_interval=c.auditor_periodic_bookie_check_interval,
                ),
                self.metrics,
                enabled=self.autorecovery_enabled,
                delay=self.lost_bookie_recovery_delay,
            )
            tasks = [
                asyncio.create_task(self._keep_running(worker.run), name="replication-worker"),
                asyncio.create_task(self._keep_running(auditor.run), name="auditor"),
            ]
            try:
                await lost.wait()
                log.warning(
                    "bookie %s: autorecovery lost its metadata session; starting again on the "
                    "bookie's next one",
                    self.address,
                )
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await client.close()
                self._recovery_store = self._recovery_client = None
            await asyncio.sleep(1.0)

    async def autorecovery_enabled(self) -> bool:
        """The cluster-wide switch in the store (`magnetar bk autorecovery`); on when unset."""
        assert self._recovery_store is not None
        stored = (await read_settings(self._recovery_store)).auto_recovery_daemon_enabled
        return stored is None or stored

    async def lost_bookie_recovery_delay(self) -> float:
        """The cluster-wide value in the store if set, else this bookie's setting."""
        assert self._recovery_store is not None
        stored = (await read_settings(self._recovery_store)).lost_bookie_recovery_delay
        return self.config.lost_bookie_recovery_delay if stored is None else stored

    async def _keep_running(self, run: Callable[[], Awaitable[None]]) -> None:
        """Run an autorecovery loop; if it fails, say so and start it again."""
        while True:
            try:
                await run()
            except Exception as e:
                log.warning(
                    "bookie %s: %s stopped (%s: %s); restarting it",
                    self.address,
                    getattr(run, "__qualname__", run),
                    type(e).__name__,
                    e,
                )
            await asyncio.sleep(1.0)

    # -- periodic work ------------------------------------------------------------------

    async def _every(self, seconds: float, work: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await work()
            except Exception:
                log.exception(
                    "bookie %s: periodic %s failed", self.address, getattr(work, "__name__", work)
                )

    def _check_disk(self) -> bool:
        """Measure usage and flip read-only as the thresholds say; True if the state changed."""
        c = self.config
        self._usage = disk_checker.measure(
            self.storage.journal_dir, self.storage.ledger_dir, c.disk_quota_bytes
        )
        self.metrics.disk_usage.set(self._usage.usage)
        self.metrics.memtable_bytes.set(self.storage.memtable_bytes)
        was = self.storage.read_only
        reason = disk_checker.read_only_reason(
            self._usage.usage, was, c.disk_usage_threshold, c.disk_usage_lwm
        )
        if reason is None and self._draining:
            reason = "being decommissioned (magnetar bk decommissionbookie)"
        self.storage.set_read_only(reason)
        return was != self.storage.read_only

    async def _disk_check_round(self) -> None:
        if self._store is not None:
            with contextlib.suppress(MetadataError, OSError):  # kept as it was until next round
                found = await self._store.get(decommissioning_key(self.address))
                self._draining = found is not None
        if self._check_disk() and self._registered:
            await self._register()

    async def check_now(self) -> bool:
        """Run a disk check at once (also used by the admin API); returns read-only or not."""
        await self._disk_check_round()
        return self.storage.read_only

    # -- info and HTTP -------------------------------------------------------------------

    def info(self) -> pb.BookieInfoResponse:
        return pb.BookieInfoResponse(
            address=self.address,
            read_only=self.storage.read_only,
            free_bytes=self._usage.free_bytes,
            total_bytes=self._usage.total_bytes,
            disk_usage=self._usage.usage,
            max_entry_size=self.config.max_entry_size,
        )

    async def _start_http(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/api/v1/bookie/info", self._info_http)
        app.router.add_put("/api/v1/bookie/gc", self._gc_http)
        app.router.add_post("/api/v1/bookie/gc", self._gc_http)
        app.router.add_post("/api/v1/bookie/checkpoint", self._checkpoint_http)
        app.router.add_post("/api/v1/bookie/disk_check", self._disk_check_http)
        self._http = web.AppRunner(app, access_log=None)
        await self._http.setup()
        # reuse_port off: a port another process listens on must fail the bind, not be shared.
        site = web.TCPSite(
            self._http, self.config.bind_address, self.config.http_port, reuse_port=False
        )
        try:
            await site.start()
        except OSError as e:
            raise AddressInUseError(
                listen_error("http_port", self.config.bind_address, self.config.http_port, e)
            ) from None
        if self.config.http_port == 0:
            self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _ready(self, request: web.Request) -> web.Response:
        if self._registered and not self._stopping:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not registered in the metadata store\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.memtable_bytes.set(self.storage.memtable_bytes)
        gauges = await self.storage.storage_gauges()
        body = render(self.metrics.registry, self.metrics.bookkeeper.render(gauges))
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _info_http(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "address": self.address,
                "read_only": self.storage.read_only,
                "read_only_reason": self.storage.read_only_reason,
                "disk_usage": self._usage.usage,
                "free_bytes": self._usage.free_bytes,
                "total_bytes": self._usage.total_bytes,
                "memtable_bytes": self.storage.memtable_bytes,
                "entry_log_bytes": self.storage.entry_log_bytes(),
            }
        )

    async def _gc_http(self, request: web.Request) -> web.Response:
        """Run one GC round now (orphan ledgers, then entry logs)."""
        assert self.gc is not None
        result = await self.gc.run()
        read_only = await self.check_now()
        return web.json_response(
            {
                "orphan_ledgers": result.orphan_ledgers,
                "orphan_scan_skipped": result.orphan_scan_skipped,
                "removed_logs": result.entry_logs.removed_logs,
                "compacted_logs": result.entry_logs.compacted_logs,
                "freed_bytes": result.entry_logs.freed_bytes,
                "read_only": read_only,
            }
        )

    async def _checkpoint_http(self, request: web.Request) -> web.Response:
        await self.storage.checkpoint()
        return web.json_response({"entry_log_bytes": self.storage.entry_log_bytes()})

    async def _disk_check_http(self, request: web.Request) -> web.Response:
        read_only = await self.check_now()
        return web.json_response({"read_only": read_only, "disk_usage": self._usage.usage})
