"""TLS inside the cluster (issue 18), with real processes: an etcd serving TLS only (client
certificates required), bookie processes serving the bookie protocol over TLS and registering in
that etcd over TLS, ledger clients and ``magnetar bk`` reaching both.

Every refusal is asserted to come within a bounded wait and to say what went wrong.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pulsar
import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.broker.config import BrokerConfig
from magnetar.common.config import ConfigError
from magnetar.common.ledger.bookie_client import (
    BookieClient,
    BookieTls,
    BookieTlsConfigError,
    BookieUnavailableError,
)
from magnetar.common.ledger.client import LedgerClient, LedgerClientConfig
from magnetar.common.ledger.errors import LedgerError
from magnetar.common.metadata import MetadataError, MetadataStore, open_store
from magnetar.common.metadata.etcd import EtcdTls, EtcdTlsConfigError
from tests.support.bookie import BookieFactory, BookieProcess
from tests.support.certs import Pki, make_pki
from tests.support.cluster import BrokerProcess
from tests.support.etcd import REPO_ROOT
from tests.support.etcd_tls import TlsEtcdServer

#: Longest any refusal may take: the request timeout given below plus slack.
REFUSAL_BOUND_S = 20.0
REQUEST_TIMEOUT_S = 5.0
QUIET = pulsar.ConsoleLogger(pulsar.LoggerLevel.Error)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_etcd(pki: Pki) -> Iterator[TlsEtcdServer]:
    server = TlsEtcdServer(
        certificate=pki.server.certificate,
        key=pki.server.key,
        ca=pki.ca.certificate,
        client_ca=pki.ca.certificate,
        health_client=(pki.client.certificate, pki.client.key),
    )
    with server:
        yield server


def good_etcd_tls(pki: Pki) -> EtcdTls:
    return EtcdTls(str(pki.ca.certificate), str(pki.client.certificate), str(pki.client.key))


def etcd_settings(pki: Pki) -> dict[str, object]:
    """The bookie's settings for the TLS etcd."""
    return {
        "etcd_use_tls": True,
        "etcd_tls_trust_certs_file_path": pki.ca.certificate,
        "etcd_tls_certificate_file_path": pki.client.certificate,
        "etcd_tls_key_file_path": pki.client.key,
    }


def bookie_tls_settings(pki: Pki, *, client_authentication: bool = False) -> dict[str, object]:
    settings: dict[str, object] = {
        "journal_sync": False,
        "auto_recovery_daemon_enabled": False,
        "tls_certificate_path": pki.server.certificate,
        "tls_key_store": pki.server.key,
        **etcd_settings(pki),
    }
    if client_authentication:
        settings["tls_trust_store"] = pki.ca.certificate
        settings["tls_client_authentication"] = True
    return settings


@pytest.fixture(scope="module")
def tls_bookie(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, tls_etcd: TlsEtcdServer
) -> Iterator[BookieProcess]:
    """A bookie serving TLS without asking for client certificates."""
    with BookieFactory(tmp_path_factory.mktemp("tls-bookie")) as factory:
        yield factory.start(metadata_url=tls_etcd.url, **bookie_tls_settings(pki))


async def open_tls_store(etcd: TlsEtcdServer, pki: Pki) -> MetadataStore:
    return await open_store(etcd.url, tls=good_etcd_tls(pki), request_timeout=REQUEST_TIMEOUT_S)


# -- etcd ------------------------------------------------------------------------------------


async def test_metadata_store_over_tls_puts_and_gets(tls_etcd: TlsEtcdServer, pki: Pki) -> None:
    async with await open_tls_store(tls_etcd, pki) as store:
        version = await store.put("/tls-test/key", b"value")
        found = await store.get("/tls-test/key")
        assert found is not None and found.value == b"value" and found.version == version
        await store.put("/tls-test/ephemeral", b"mine", ephemeral=True)
        assert set(await store.scan("/tls-test/")) == {"/tls-test/key", "/tls-test/ephemeral"}
        await store.delete("/tls-test/key")
        assert await store.get("/tls-test/key") is None


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("plain", "cannot reach any etcd endpoint"),
        ("no CA", "CERTIFICATE_VERIFY_FAILED"),
        ("untrusted CA", "CERTIFICATE_VERIFY_FAILED"),
        ("no client certificate", "over TLS"),
    ],
)
async def test_metadata_store_refused_without_the_right_tls(
    tls_etcd: TlsEtcdServer, pki: Pki, case: str, expected: str
) -> None:
    tls = {
        "plain": None,
        # gRPC's public roots: the test CA is not among them.
        "no CA": EtcdTls("", str(pki.client.certificate), str(pki.client.key)),
        "untrusted CA": EtcdTls(
            str(pki.untrusted_ca.certificate), str(pki.client.certificate), str(pki.client.key)
        ),
        "no client certificate": EtcdTls(str(pki.ca.certificate)),
    }[case]
    with pytest.raises(MetadataError, match=expected) as refused:
        await asyncio.wait_for(
            open_store(tls_etcd.url, tls=tls, request_timeout=REQUEST_TIMEOUT_S), REFUSAL_BOUND_S
        )
    assert str(tls_etcd.client_port) in str(refused.value)
    if tls is not None:
        assert "etcd_tls_trust_certs_file_path" in str(refused.value)


async def test_unreadable_etcd_tls_file_is_named(tls_etcd: TlsEtcdServer, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(EtcdTlsConfigError, match=re.escape(str(missing))):
        await open_store(tls_etcd.url, tls=EtcdTls(str(missing)))
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate")
    with pytest.raises(EtcdTlsConfigError, match="no PEM CA certificates"):
        await open_store(tls_etcd.url, tls=EtcdTls(str(not_pem)))


async def test_tls_settings_are_refused_for_a_local_store(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="etcd only"):
        await open_store(f"local://{tmp_path}/meta.db", tls=EtcdTls())


# -- bookies ---------------------------------------------------------------------------------


async def test_ledger_written_and_read_over_tls(
    tls_bookie: BookieProcess, tls_etcd: TlsEtcdServer, pki: Pki
) -> None:
    async with await open_tls_store(tls_etcd, pki) as store:
        async with LedgerClient(store, tls=BookieTls(str(pki.ca.certificate))) as client:
            handle = await client.create_ledger(1, 1, 1)
            assert handle.ensemble == (tls_bookie.address,)
            payloads = [f"entry {i} over TLS".encode() * (i + 1) for i in range(20)]
            for payload in payloads:
                await handle.add(payload)
            await handle.close()
        async with LedgerClient(store, tls=BookieTls(str(pki.ca.certificate))) as reader:
            opened = await reader.open_ledger(handle.ledger_id)
            entries = await opened.read(0, len(payloads) - 1)
            assert [e.payload for e in entries] == payloads


@pytest.mark.parametrize("case", ["plain", "untrusted CA"])
async def test_client_without_the_right_tls_cannot_add(
    tls_bookie: BookieProcess, tls_etcd: TlsEtcdServer, pki: Pki, case: str
) -> None:
    tls = None if case == "plain" else BookieTls(str(pki.untrusted_ca.certificate))
    config = LedgerClientConfig(add_timeout_s=REQUEST_TIMEOUT_S, read_timeout_s=REQUEST_TIMEOUT_S)
    async with await open_tls_store(tls_etcd, pki) as store:
        async with LedgerClient(store, config, tls=tls) as client:
            handle = await client.create_ledger(1, 1, 1)
            with pytest.raises(LedgerError, match="cannot replace failed bookies"):
                await asyncio.wait_for(handle.add(b"refused"), REFUSAL_BOUND_S)
    credentials = None if tls is None else tls.channel_credentials()
    async with BookieClient(
        tls_bookie.address, timeout=REQUEST_TIMEOUT_S, credentials=credentials
    ) as bookie:
        with pytest.raises(BookieUnavailableError) as refused:
            await asyncio.wait_for(bookie.info(), REFUSAL_BOUND_S)
    if tls is not None:
        assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert tls_bookie.address in str(refused.value)


async def test_bookie_with_client_authentication(
    tmp_path: Path, tls_bookie: BookieProcess, tls_etcd: TlsEtcdServer, pki: Pki
) -> None:
    """The second bookie requires client certificates; a ledger on both bookies is written by
    a client showing one and refused to a client that shows none."""
    config = LedgerClientConfig(add_timeout_s=REQUEST_TIMEOUT_S, read_timeout_s=REQUEST_TIMEOUT_S)
    with BookieFactory(tmp_path) as factory:
        strict = factory.start(
            metadata_url=tls_etcd.url, **bookie_tls_settings(pki, client_authentication=True)
        )
        async with await open_tls_store(tls_etcd, pki) as store:
            shown = BookieTls(
                str(pki.ca.certificate), str(pki.client.certificate), str(pki.client.key)
            )
            async with LedgerClient(store, config, tls=shown) as client:
                handle = await client.create_ledger(2, 2, 2)
                assert set(handle.ensemble) == {tls_bookie.address, strict.address}
                await handle.add(b"shown a certificate")
                await handle.close()
                entries = await (await client.open_ledger(handle.ledger_id)).read(0, 0)
                assert entries[0].payload == b"shown a certificate"
            async with LedgerClient(
                store, config, tls=BookieTls(str(pki.ca.certificate))
            ) as client:
                handle = await client.create_ledger(2, 2, 2)
                with pytest.raises(LedgerError):
                    await asyncio.wait_for(handle.add(b"no certificate"), REFUSAL_BOUND_S)


def test_bk_tools_reach_tls_etcd_and_bookies(
    tls_bookie: BookieProcess, tls_etcd: TlsEtcdServer, pki: Pki
) -> None:
    """``magnetar bk`` takes the broker's TLS settings from the environment."""
    env = {
        **os.environ,
        "MAGNETAR_ETCD_USE_TLS": "true",
        "MAGNETAR_ETCD_TLS_TRUST_CERTS_FILE_PATH": str(pki.ca.certificate),
        "MAGNETAR_ETCD_TLS_CERTIFICATE_FILE_PATH": str(pki.client.certificate),
        "MAGNETAR_ETCD_TLS_KEY_FILE_PATH": str(pki.client.key),
        "MAGNETAR_BOOKKEEPER_TLS_ENABLED": "true",
        "MAGNETAR_BOOKKEEPER_TLS_TRUST_CERTS_FILE_PATH": str(pki.ca.certificate),
    }
    env.pop("MAGNETAR_CONFIG", None)

    def bk(*args: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "magnetar.cli", "bk", "--metadata-url", tls_etcd.url, *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO_ROOT,
            env=environ,
            check=False,
        )

    listed = bk("listbookies", environ=env)
    assert listed.returncode == 0, listed.stderr
    assert tls_bookie.address in listed.stdout
    sanity = bk("bookiesanity", "--bookie", tls_bookie.address, "--timeout", "5", environ=env)
    assert sanity.returncode == 0, sanity.stdout + sanity.stderr
    test = bk("simpletest", "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
              "--entries", "10", environ=env)  # fmt: skip
    assert test.returncode == 0, test.stdout + test.stderr
    plain = {k: v for k, v in env.items() if not k.startswith("MAGNETAR_ETCD_")}
    refused = bk("listbookies", environ=plain)
    assert refused.returncode == 2
    assert "cannot reach any etcd endpoint" in refused.stderr


def test_broker_stores_messages_over_tls(
    tmp_path: Path, tls_bookie: BookieProcess, tls_etcd: TlsEtcdServer, pki: Pki
) -> None:
    """A broker process with the TLS settings: its session in the TLS etcd, its ledgers on the
    TLS bookie; the official client produces and consumes through it."""
    broker = BrokerProcess(
        tmp_path / "broker",
        tls_etcd.url,
        settings={
            "ensemble_size": 1,
            "write_quorum": 1,
            "ack_quorum": 1,
            # Pulsar's switch: TLS with a client certificate (welcome at any bookie).
            "bookkeeper_tls_client_authentication": True,
            "bookkeeper_tls_trust_certs_file_path": pki.ca.certificate,
            "bookkeeper_tls_certificate_file_path": pki.client.certificate,
            "bookkeeper_tls_key_file_path": pki.client.key,
            **etcd_settings(pki),
        },
    )
    try:
        broker.start()
        client = pulsar.Client(broker.url, operation_timeout_seconds=15, logger=QUIET)
        try:
            topic = "persistent://public/default/internal-tls"
            consumer = client.subscribe(topic, "tls-sub")
            producer = client.create_producer(topic)
            sent = [f"over TLS {i}".encode() for i in range(10)]
            for body in sent:
                producer.send(body)
            received = []
            for _ in sent:
                message = consumer.receive(timeout_millis=15_000)
                received.append(message.data())
                consumer.acknowledge(message)
            assert received == sent
        finally:
            client.close()
        assert "Traceback" not in broker.log_text()
    finally:
        broker.stop()


# -- settings --------------------------------------------------------------------------------


def test_tls_is_off_by_default() -> None:
    assert BrokerConfig().bookkeeper_tls() is None
    assert BrokerConfig().etcd_tls() is None
    assert BookieConfig().client_tls() is None
    assert BookieConfig().etcd_tls() is None
    assert not BookieConfig().tls_enabled


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (BookieConfig(tls_certificate_path="c.pem"), "tls_key_store"),
        (
            BookieConfig(tls_certificate_path="c.pem", tls_key_store="k.pem", tls_client_authentication=True),
            "tls_trust_store",
        ),
        (BookieConfig(etcd_tls_trust_certs_file_path="ca.pem"), "etcd_use_tls"),
        (BrokerConfig(bookkeeper_tls_client_authentication=True), "bookkeeper_tls_key_file_path"),
        (BrokerConfig(bookkeeper_tls_trust_certs_file_path="ca.pem"), "bookkeeper_tls_enabled"),
        (BrokerConfig(bookkeeper_tls_enabled=True, bookkeeper_tls_certificate_file_path="c.pem"),
         "bookkeeper_tls_client_authentication"),
        (BrokerConfig(metadata_url="local:///tmp/meta.db", etcd_use_tls=True), "etcd://"),
    ],
)  # fmt: skip
def test_inconsistent_tls_settings_are_refused(
    config: BookieConfig | BrokerConfig, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        config.validate()


def test_unreadable_bookie_tls_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BookieTlsConfigError, match=re.escape("nowhere.pem")):
        BookieTls(str(tmp_path / "nowhere.pem")).channel_credentials()
    with pytest.raises(BookieTlsConfigError, match="both"):
        BookieTls("", str(tmp_path / "c.pem"), "").channel_credentials()
