"""TLS listeners and clients over real sockets on 127.0.0.1, under both asyncio's and uvloop's
event loops: protocol versions, hostname checks, mutual TLS, and certificate files reloaded
without a restart (Pulsar's tlsCertRefreshCheckDurationSec)."""

from __future__ import annotations

import asyncio
import logging
import ssl
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web
from cryptography import x509

from magnetar.common.auth.provider import AuthenticationError, Credentials
from magnetar.common.auth.tls import TlsAuthenticator
from magnetar.common.tls import (
    ServerTls,
    TlsConfigError,
    client_context,
    peer_certificate_der,
)
from tests.support.certs import CertificateFiles, Pki, make_pki, reissue_server

TIMEOUT = 10.0
LOGGER = "magnetar.common.tls"

Run = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run:
    """Runs a test's coroutine on a fresh loop of either kind: uvloop brings its own SSL
    transport, and the reload relies on both calling the context's sni_callback."""
    factory = asyncio.new_event_loop if request.param == "asyncio" else uvloop.new_event_loop

    def run(coroutine: Coroutine[Any, Any, Any]) -> Any:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(asyncio.wait_for(coroutine, TIMEOUT * 3))

    return run


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", client_role="alice")


def server_tls(pki: Pki, **options: Any) -> ServerTls:
    return ServerTls(str(pki.server.certificate), str(pki.server.key), **options)


def trusting_client(pki: Pki, certificate: CertificateFiles | None = None) -> ssl.SSLContext:
    if certificate is None:
        return client_context(str(pki.ca.certificate))
    return client_context(
        str(pki.ca.certificate), str(certificate.certificate), str(certificate.key)
    )


@dataclass(slots=True)
class EchoServer:
    """A line echo server that remembers the client certificate each accepted connection
    showed (asyncio calls the handler only after a completed handshake)."""

    port: int = 0
    peer_certificates: list[bytes | None] = field(default_factory=list)


@asynccontextmanager
async def echo_server(tls: ServerTls) -> AsyncIterator[EchoServer]:
    echo = EchoServer()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        echo.peer_certificates.append(peer_certificate_der(writer.transport))
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=tls.context)
    echo.port = server.sockets[0].getsockname()[1]
    try:
        yield echo
    finally:
        server.close()
        await server.wait_closed()


@dataclass(slots=True)
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @property
    def ssl_object(self) -> ssl.SSLObject:
        return self.writer.get_extra_info("ssl_object")

    def server_serial(self) -> int:
        der = self.ssl_object.getpeercert(binary_form=True)
        return x509.load_der_x509_certificate(der).serial_number

    async def echo(self, line: bytes = b"ping\n") -> bytes:
        self.writer.write(line)
        await self.writer.drain()
        return await asyncio.wait_for(self.reader.readline(), TIMEOUT)

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, ssl.SSLError):
            pass


async def connect(
    port: int, context: ssl.SSLContext, server_hostname: str | None = "localhost"
) -> Connection:
    """Connects to 127.0.0.1; ``server_hostname`` is sent as SNI and checked against the
    certificate (None: the IP address is checked, and no SNI is sent)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            "127.0.0.1",
            port,
            ssl=context,
            server_hostname=server_hostname if server_hostname is not None else "127.0.0.1",
        ),
        TIMEOUT,
    )
    return Connection(reader, writer)


async def assert_refused(
    echo: EchoServer, context: ssl.SSLContext, server_hostname: str = "localhost"
) -> None:
    """The connection fails: in the handshake or, with TLS 1.3 (where the client finishes
    before the server has checked the client's certificate), at the first read. The server's
    handler is never called either way."""
    accepted = len(echo.peer_certificates)
    try:
        connection = await connect(echo.port, context, server_hostname)
        reply = await connection.echo()
        await connection.close()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        reply = b""
    assert reply == b""
    await asyncio.sleep(0.05)
    assert len(echo.peer_certificates) == accepted


def tls_1_1_client(pki: Pki) -> ssl.SSLContext:
    """A client that offers only TLS 1.0/1.1; security level 0 so that this OpenSSL really
    offers them (at level 1 it would refuse to, and the test would prove nothing)."""
    context = client_context(str(pki.ca.certificate))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def test_a_tls_1_1_client_is_refused(pki: Pki, run: Run) -> None:
    async def scenario() -> None:
        # Control: a server that allows TLS 1.1 accepts this client, if the local OpenSSL can
        # speak 1.1 at all; either way ours must refuse it.
        lenient = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        lenient.load_cert_chain(pki.server.certificate, pki.server.key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            lenient.minimum_version = ssl.TLSVersion.TLSv1
        lenient.set_ciphers("DEFAULT:@SECLEVEL=0")
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=lenient)
        try:
            control = await connect(server.sockets[0].getsockname()[1], tls_1_1_client(pki))
            assert control.ssl_object.version() == "TLSv1.1"
            await control.close()
        except (ssl.SSLError, ConnectionError):
            pass  # this OpenSSL cannot speak 1.1: the refusal below holds trivially
        finally:
            server.close()
            await server.wait_closed()

        async with echo_server(server_tls(pki)) as echo:
            await assert_refused(echo, tls_1_1_client(pki))

    run(scenario())


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_1_2_and_1_3_are_accepted_with_the_hostname_checked(
    pki: Pki, run: Run, version: ssl.TLSVersion
) -> None:
    async def scenario() -> None:
        context = trusting_client(pki)
        context.minimum_version = context.maximum_version = version
        async with echo_server(server_tls(pki)) as echo:
            connection = await connect(echo.port, context, "localhost")
            assert (
                connection.ssl_object.version()
                == {
                    ssl.TLSVersion.TLSv1_2: "TLSv1.2",
                    ssl.TLSVersion.TLSv1_3: "TLSv1.3",
                }[version]
            )
            assert await connection.echo() == b"ping\n"
            assert echo.peer_certificates == [None]
            await connection.close()
            # Without SNI (an IP address is never sent as one) the IP SAN is checked.
            connection = await connect(echo.port, context, None)
            assert await connection.echo() == b"ping\n"
            await connection.close()
            with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
                await connect(echo.port, context, "broker.example")
            unverified = client_context(str(pki.ca.certificate), verify_hostname=False)
            connection = await connect(echo.port, unverified, "broker.example")
            assert await connection.echo() == b"ping\n"
            await connection.close()
            with pytest.raises(ssl.SSLCertVerificationError):
                await connect(echo.port, client_context(str(pki.untrusted_ca.certificate)))

    run(scenario())


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_mutual_tls_refuses_missing_untrusted_and_expired_client_certificates(
    pki: Pki, run: Run, version: ssl.TLSVersion
) -> None:
    def client(certificate: CertificateFiles | None) -> ssl.SSLContext:
        context = trusting_client(pki, certificate)
        context.maximum_version = version
        return context

    async def scenario() -> None:
        tls = server_tls(pki, trust_file=str(pki.ca.certificate), require_client_cert=True)
        async with echo_server(tls) as echo:
            await assert_refused(echo, client(None))
            await assert_refused(echo, client(pki.untrusted_client))
            await assert_refused(echo, client(pki.expired_client))
            connection = await connect(echo.port, client(pki.client))
            assert await connection.echo() == b"ping\n"
            await connection.close()
            assert len(echo.peer_certificates) == 1
            der = echo.peer_certificates[0]
            assert der == pki.client.certificate_der()
            identity = TlsAuthenticator().authenticate(Credentials(peer_certificate=der))
            assert identity.role == "alice"

    run(scenario())


def test_optional_client_certificates_are_verified_when_shown(pki: Pki, run: Run) -> None:
    async def scenario() -> None:
        tls = server_tls(pki, trust_file=str(pki.ca.certificate))
        async with echo_server(tls) as echo:
            connection = await connect(echo.port, trusting_client(pki))
            assert await connection.echo() == b"ping\n"
            await connection.close()
            assert echo.peer_certificates == [None]
            with pytest.raises(AuthenticationError, match="did not present"):
                TlsAuthenticator().authenticate(Credentials(peer_certificate=None))

            await assert_refused(echo, trusting_client(pki, pki.untrusted_client))
            await assert_refused(echo, trusting_client(pki, pki.expired_client))

            connection = await connect(echo.port, trusting_client(pki, pki.nameless_client))
            assert await connection.echo() == b"ping\n"
            await connection.close()
            with pytest.raises(AuthenticationError, match="no common name"):
                TlsAuthenticator().authenticate(
                    Credentials(peer_certificate=echo.peer_certificates[-1])
                )

    run(scenario())


def test_a_certificate_replaced_on_disk_is_served_to_new_connections(
    pki: Pki, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)

    async def scenario() -> None:
        tls = server_tls(pki, refresh_seconds=0)
        old_serial = pki.server.serial()
        async with echo_server(tls) as echo:
            established = await connect(echo.port, trusting_client(pki))
            assert established.server_serial() == old_serial

            new_serial = reissue_server(pki)
            assert new_serial != old_serial
            for server_hostname in ("localhost", None):  # with SNI and without
                connection = await connect(echo.port, trusting_client(pki), server_hostname)
                assert connection.server_serial() == new_serial
                assert await connection.echo() == b"ping\n"
                await connection.close()

            assert await established.echo(b"still here\n") == b"still here\n"
            assert established.server_serial() == old_serial
            await established.close()
        assert tls.reloads == 1
        reloaded = [r for r in caplog.records if "TLS certificate reloaded from" in r.message]
        assert len(reloaded) == 1
        assert str(pki.server.certificate) in reloaded[0].message

    run(scenario())


def test_a_broken_replacement_keeps_the_old_certificate_and_warns_once(
    pki: Pki, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    old_certificate_pem = pki.server.certificate.read_bytes()
    old_key_pem = pki.server.key.read_bytes()
    stranger = make_pki(pki.directory / "stranger")

    def warnings_logged() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    async def serial_seen(port: int) -> int:
        connection = await connect(port, trusting_client(pki))
        assert await connection.echo() == b"ping\n"
        await connection.close()
        return connection.server_serial()

    async def scenario() -> None:
        tls = server_tls(pki, refresh_seconds=0)
        old_serial = pki.server.serial()
        async with echo_server(tls) as echo:
            pki.server.certificate.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64\n")
            for _ in range(3):
                assert await serial_seen(echo.port) == old_serial
            assert len(warnings_logged()) == 1
            assert "tls_certificate_file_path" in warnings_logged()[0]

            # Half a rotation: the old certificate back, next to somebody else's key.
            pki.server.certificate.write_bytes(old_certificate_pem)
            pki.server.key.write_bytes(stranger.server.key.read_bytes())
            for _ in range(3):
                assert await serial_seen(echo.port) == old_serial
            assert len(warnings_logged()) == 2
            assert "does not belong to the certificate" in warnings_logged()[1]

            new_serial = reissue_server(pki)
            assert await serial_seen(echo.port) == new_serial
        assert tls.reloads == 1
        for record in caplog.records:
            assert "PRIVATE KEY" not in record.getMessage()
            assert old_key_pem.decode() not in record.getMessage()

    run(scenario())


def test_files_are_checked_at_most_every_refresh_period(pki: Pki, run: Run) -> None:
    async def scenario() -> None:
        tls = server_tls(pki, refresh_seconds=3600)
        old_serial = pki.server.serial()
        async with echo_server(tls) as echo:
            new_serial = reissue_server(pki)
            connection = await connect(echo.port, trusting_client(pki))
            assert connection.server_serial() == old_serial
            await connection.close()
            # What the periodic check does when its time comes.
            assert tls.reload_if_changed()
            assert not tls.reload_if_changed()
            connection = await connect(echo.port, trusting_client(pki))
            assert connection.server_serial() == new_serial
            await connection.close()

    run(scenario())


def test_a_replaced_trust_file_decides_which_client_certificates_are_accepted(
    pki: Pki, run: Run
) -> None:
    trust_file = pki.directory / "trusted-cas.pem"
    trust_file.write_bytes(pki.ca.certificate.read_bytes())

    async def scenario() -> None:
        tls = server_tls(
            pki, trust_file=str(trust_file), require_client_cert=True, refresh_seconds=0
        )
        async with echo_server(tls) as echo:
            await assert_refused(echo, trusting_client(pki, pki.untrusted_client))
            trust_file.write_bytes(pki.untrusted_ca.certificate.read_bytes())
            connection = await connect(echo.port, trusting_client(pki, pki.untrusted_client))
            assert await connection.echo() == b"ping\n"
            await connection.close()
            await assert_refused(echo, trusting_client(pki, pki.client))

    run(scenario())


def test_an_aiohttp_site_serves_the_reloaded_certificate_and_reads_the_client_cn(
    pki: Pki, run: Run
) -> None:
    async def whoami(request: web.Request) -> web.Response:
        credentials = Credentials(peer_certificate=peer_certificate_der(request))
        return web.Response(text=TlsAuthenticator().authenticate(credentials).role)

    async def whoami_over_https(port: int) -> str:
        connector = aiohttp.TCPConnector(ssl=trusting_client(pki, pki.client), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(
                f"https://127.0.0.1:{port}/whoami", server_hostname="localhost"
            ) as response:
                assert response.status == 200
                return await response.text()

    async def serial_served(port: int) -> int:
        connection = await connect(port, trusting_client(pki))
        serial = connection.server_serial()
        await connection.close()
        return serial

    async def scenario() -> None:
        tls = server_tls(pki, trust_file=str(pki.ca.certificate), refresh_seconds=0)
        app = web.Application()
        app.router.add_get("/whoami", whoami)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
        await site.start()
        port = runner.addresses[0][1]
        try:
            assert await whoami_over_https(port) == "alice"
            assert await serial_served(port) == pki.server.serial()
            new_serial = reissue_server(pki)
            assert await serial_served(port) == new_serial
            assert await whoami_over_https(port) == "alice"
        finally:
            await runner.cleanup()

    run(scenario())


def test_a_plain_connection_has_no_peer_certificate(run: Run) -> None:
    async def scenario() -> None:
        seen: list[bytes | None] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(peer_certificate_der(writer.transport))
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1]
        )
        await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        assert seen == [None]

    run(scenario())


# -- start-up errors --------------------------------------------------------------------------


def test_missing_files_name_the_setting_and_the_file(pki: Pki) -> None:
    missing = str(pki.directory / "missing.pem")
    with pytest.raises(TlsConfigError, match=f"tls_certificate_file_path: {missing}"):
        ServerTls(missing, str(pki.server.key))
    with pytest.raises(TlsConfigError, match=f"tls_key_file_path: {missing}"):
        ServerTls(str(pki.server.certificate), missing)
    with pytest.raises(TlsConfigError, match=f"tls_trust_certs_file_path: {missing}"):
        server_tls(pki, trust_file=missing)
    with pytest.raises(TlsConfigError, match="both"):
        ServerTls(str(pki.server.certificate), "")


def test_unusable_files_are_start_up_errors_that_never_show_the_key(pki: Pki) -> None:
    key_pem = pki.server.key.read_bytes().decode()
    garbage = pki.directory / "garbage.pem"
    garbage.write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    errors = []
    with pytest.raises(TlsConfigError, match="tls_key_file_path: the key in") as e:
        ServerTls(str(pki.server.certificate), str(pki.client.key))
    errors.append(e.value)
    with pytest.raises(TlsConfigError, match="tls_certificate_file_path: no PEM certificate") as e:
        ServerTls(str(garbage), str(pki.server.key))
    errors.append(e.value)
    with pytest.raises(TlsConfigError, match="tls_key_file_path: no PEM private key") as e:
        ServerTls(str(pki.server.certificate), str(garbage))
    errors.append(e.value)
    with pytest.raises(TlsConfigError, match="tls_trust_certs_file_path: no PEM CA") as e:
        server_tls(pki, trust_file=str(garbage))
    errors.append(e.value)
    # A key file holding the certificate instead of a key: the message must not echo either.
    with pytest.raises(TlsConfigError, match="tls_key_file_path") as e:
        ServerTls(str(pki.server.certificate), str(pki.server.certificate))
    errors.append(e.value)
    for error in errors:
        assert "PRIVATE KEY" not in str(error)
        assert key_pem not in str(error)


def test_an_encrypted_key_is_refused_without_prompting(pki: Pki) -> None:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pki.server.key.read_bytes(), password=None)
    encrypted = pki.directory / "encrypted.key.pem"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsConfigError, match=r"tls_key_file_path: .* encrypted"):
        ServerTls(str(pki.server.certificate), str(encrypted))


def test_the_server_context_refuses_old_versions_and_renegotiation(pki: Pki) -> None:
    context = server_tls(pki).context
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_RENEGOTIATION
    assert context.verify_mode == ssl.CERT_NONE
    optional = server_tls(pki, trust_file=str(pki.ca.certificate)).context
    assert optional.verify_mode == ssl.CERT_OPTIONAL
    required = server_tls(pki, trust_file=str(pki.ca.certificate), require_client_cert=True)
    assert required.context.verify_mode == ssl.CERT_REQUIRED


def test_settings_that_contradict_each_other_are_refused(pki: Pki) -> None:
    with pytest.raises(TlsConfigError, match="needs tls_trust_certs_file_path"):
        server_tls(pki, require_client_cert=True)
    with pytest.raises(TlsConfigError, match="0 or more"):
        server_tls(pki, refresh_seconds=-1)


def test_client_context_checks_its_files_and_versions(pki: Pki) -> None:
    context = client_context(str(pki.ca.certificate))
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert client_context().verify_mode == ssl.CERT_REQUIRED
    assert not client_context(verify_hostname=False).check_hostname
    with pytest.raises(TlsConfigError, match="broker_client_trust_certs_file_path"):
        client_context(str(pki.directory / "missing.pem"))
    with pytest.raises(TlsConfigError, match="tlsKeyFile: the key in"):
        client_context(str(pki.ca.certificate), str(pki.client.certificate), str(pki.server.key))
    with pytest.raises(TlsConfigError, match="tlsCertFile is not"):
        client_context(str(pki.ca.certificate), key_file=str(pki.client.key))
