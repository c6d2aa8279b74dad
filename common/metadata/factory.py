"""Open a metadata store from its URL: ``etcd://h1:2379,h2:2379`` or ``local:///abs/meta.db``."""

from __future__ import annotations

from pathlib import Path

from magnetar.common.metadata.store import MetadataStore

ACCEPTED_FORMS = "etcd://host:port[,host:port...] or local:///absolute/path/meta.db"

# Options every scheme accepts, so callers can pass one set regardless of the URL; the local
# store has no lease, so session_ttl and request_timeout mean nothing to it, and no network, so
# it takes tls only as None.
_OPTIONS = {"session_ttl", "request_timeout", "tls", "read_only"}


async def open_store(url: str, **options: object) -> MetadataStore:
    """Open the store named by ``url``.

    Options: ``session_ttl`` (seconds, default 10: how long etcd keeps our ephemeral keys after
    we stop answering), ``request_timeout`` (seconds, default 10, per etcd request) and ``tls``
    (an ``EtcdTls``: reach etcd over TLS; None, the default: plain gRPC); ``read_only`` (local
    only: read a file another process owns, without its lock; writes are refused).
    """
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(
            f"unknown metadata store option(s) {sorted(unknown)}; known: {sorted(_OPTIONS)}"
        )
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ValueError(
            f"malformed metadata store URL {url!r}: accepted forms are {ACCEPTED_FORMS}"
        )
    tls = options.get("tls")
    if scheme == "etcd":
        from magnetar.common.metadata.etcd import EtcdMetadataStore, EtcdTls

        if options.get("read_only"):
            raise ValueError("read_only applies to a local store; etcd is shared as it is")

        if tls is not None and not isinstance(tls, EtcdTls):
            raise ValueError(f"tls must be an EtcdTls or None, not {tls!r}")
        return await EtcdMetadataStore.connect(
            parse_etcd_endpoints(url),
            session_ttl=_positive_int(options.get("session_ttl", 10), "session_ttl"),
            request_timeout=_positive_float(
                options.get("request_timeout", 10.0), "request_timeout"
            ),
            tls=tls,
        )
    if tls is not None:
        raise ValueError(f"TLS settings apply to etcd only, not to {url!r}")
    if scheme == "local":
        from magnetar.common.metadata.local import LocalMetadataStore

        return await LocalMetadataStore.open(
            parse_local_path(url), read_only=bool(options.get("read_only", False))
        )
    raise ValueError(
        f"unknown metadata store scheme {scheme!r} in {url!r}: accepted forms are {ACCEPTED_FORMS}"
    )


def parse_etcd_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://h1:2379,h2:2379`` -> (host, port) pairs in the order given (tried in order)."""
    rest = url.removeprefix("etcd://").removesuffix("/")
    if not rest:
        raise _malformed(url, "no host:port given")
    return [_parse_endpoint(url, part.strip()) for part in rest.split(",")]


def parse_local_path(url: str) -> Path:
    """``local:///abs/path/meta.db`` -> ``/abs/path/meta.db``."""
    path = url.removeprefix("local://")
    if not path.startswith("/"):
        raise _malformed(url, "the path must be absolute (three slashes: local:///...)")
    if path.endswith("/") or any(c in path for c in "?#"):
        raise _malformed(url, "the path must name a file, without query or fragment")
    return Path(path)


def _parse_endpoint(url: str, part: str) -> tuple[str, int]:
    host, sep, port_text = part.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _malformed(url, f"endpoint {part!r} is not host:port")
    bracketed = host.startswith("[") and host.endswith("]")
    if ("/" in host or "@" in host) or (":" in host and not bracketed):
        raise _malformed(url, f"endpoint {part!r} is not host:port (IPv6 goes in [brackets])")
    return host, int(port_text)


def _malformed(url: str, why: str) -> ValueError:
    return ValueError(
        f"malformed metadata store URL {url!r}: {why}; accepted forms are {ACCEPTED_FORMS}"
    )


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive whole number of seconds, not {value!r}")
    return value


def _positive_float(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)
