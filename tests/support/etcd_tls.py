"""A real etcd serving its clients over TLS, for tests of the metadata store's TLS settings.

:class:`TlsEtcdServer` is :class:`tests.support.etcd.EtcdServer` with https client URLs: its
certificate and key are given (``tests.support.certs.make_pki``'s server pair names localhost and
127.0.0.1), and with ``client_ca`` it also requires client certificates signed by that CA
(etcd's ``--client-cert-auth --trusted-ca-file``). Peers stay on plain http (one member).
Its ``url`` is still ``etcd://127.0.0.1:PORT``: TLS is the client's setting, not the URL's.
"""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.support.etcd import START_TIMEOUT_SECONDS, EtcdServer


class TlsEtcdServer(EtcdServer):
    def __init__(
        self,
        *,
        certificate: Path,
        key: Path,
        ca: Path,
        client_ca: Path | None = None,
        health_client: tuple[Path, Path] | None = None,
        name: str = "tls",
    ) -> None:
        """``ca`` verifies etcd's own certificate in the health check; ``client_ca`` turns on
        client certificate authentication, and then ``health_client`` (certificate, key) is the
        pair the health check shows."""
        super().__init__(name=name)
        self.certificate = certificate
        self.key = key
        self.ca = ca
        self.client_ca = client_ca
        self.health_client = health_client
        if client_ca is not None and health_client is None:
            raise ValueError("client_ca needs health_client, a certificate the check can show")

    @property
    def https_url(self) -> str:
        return f"https://127.0.0.1:{self.client_port}"

    def spawn(self) -> None:
        if self.running:
            return
        client = self.https_url
        peer = self.peer_url
        command = [
            self.binary,
            f"--name={self.name}",
            f"--data-dir={self.data_dir / 'member-data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--cert-file={self.certificate}",
            f"--key-file={self.key}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={self.name}={peer}",
            "--initial-cluster-state=new",
            "--logger=zap",
            "--log-level=warn",
            "--heartbeat-interval=50",
            "--election-timeout=500",
        ]
        if self.client_ca is not None:
            command += ["--client-cert-auth", f"--trusted-ca-file={self.client_ca}"]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _health_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if self.health_client is not None:
            certificate, key = self.health_client
            context.load_cert_chain(str(certificate), str(key))
        return context

    def wait_healthy(self) -> None:
        assert self.process is not None
        context = self._health_context()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        health = f"{self.https_url}/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"etcd (TLS) exited with code {self.process.returncode} during startup:\n"
                    + self._log_tail()
                )
            try:
                with urllib.request.urlopen(health, timeout=1, context=context) as response:
                    if b'"true"' in response.read():
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(
            f"etcd (TLS) did not become healthy within {START_TIMEOUT_SECONDS}s:\n"
            + self._log_tail()
        )
