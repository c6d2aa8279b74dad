"""Pulsar's and BookKeeper's ``.conf`` files: the Java properties format and its key names.

An operator's ``broker.conf``, ``standalone.conf``, ``bookkeeper.conf`` or ``proxy.conf`` is read
as it is (``magnetar broker --config broker.conf``). Keys reach our settings in two ways:

- by name: a camelCase key is our snake_case setting when both read the same once case and
  underscores are ignored (``maxMessageSize`` is ``max_message_size``, ``bookkeeperTLSKeyFilePath``
  is ``bookkeeper_tls_key_file_path``), unless the setting is in ``NOT_PULSARS`` (same words,
  another meaning);
- by the table ``PULSAR_KEYS``: where Pulsar's name or unit differs from ours, the key, the
  settings it may fill (the first one the service has wins) and the conversion of the value.

Pure code: :func:`parse_properties` turns text into pairs, :func:`translate` turns pairs into
our settings and the keys it does not know; reading files and warning is ``config.py``'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from magnetar.common.config import ConfigError


def parse_properties(text: str) -> list[tuple[str, str]]:
    """``java.util.Properties.load``: ``#``/``!`` comments, ``key=value``, ``key: value`` or
    ``key value``, a trailing backslash continues the line, ``\\t \\n \\uXXXX`` escapes."""
    pairs: list[tuple[str, str]] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            logical += line[:-1]
            continue
        logical += line
        pairs.append(_split(logical))
        logical = ""
    if logical:
        pairs.append(_split(logical))
    return pairs


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _split(line: str) -> tuple[str, str]:
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=: \t\f":
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def normalize(name: str) -> str:
    """The form in which a camelCase key and a snake_case setting are compared."""
    return name.replace("_", "").replace("-", "").lower()


# -- value conversions -----------------------------------------------------------------------


def _scale(factor: float, integer: bool = False) -> Callable[[str], object]:
    def convert(value: str) -> object:
        number = float(value) * factor
        return int(number) if integer else number

    return convert


def _first(value: str) -> str:
    """BookKeeper's directory lists: Magnetar's bookie has one journal and one ledger dir."""
    return value.split(",")[0].strip()


def metadata_url(value: str) -> str:
    """Pulsar's ``metadataStoreUrl`` (``etcd:http://h:p[,http://h2:p]``) and BookKeeper's
    ``metadataServiceUri`` (``metadata-store:etcd:...`` or ``etcd://h:p/ledgers``) as our
    ``etcd://h:p[,h2:p]``; ZooKeeper is not supported."""
    url = value.strip()
    url = url.removeprefix("metadata-store:")
    if url.startswith(("zk:", "zk+", "zookeeper")) or re.fullmatch(r"[\w.-]+:\d+(,.*)?", url):
        raise ConfigError(
            f"metadata store {value!r} is ZooKeeper; Magnetar keeps metadata in etcd: "
            "set metadataStoreUrl/metadataServiceUri to etcd:http://host:2379"
        )
    if url.startswith("etcd:") and not url.startswith("etcd://"):
        hosts = url[len("etcd:") :].split(",")
        url = "etcd://" + ",".join(re.sub(r"^https?://", "", h.strip()).rstrip("/") for h in hosts)
    if url.startswith("etcd://"):
        hosts = url[len("etcd://") :].split("/", 1)[0]
        return "etcd://" + hosts
    return url


@dataclass(slots=True, frozen=True)
class PulsarKey:
    """A Pulsar/BookKeeper key whose name or unit is not ours."""

    key: str
    settings: tuple[str, ...]
    convert: Callable[[str], object] | None = None


_SECONDS_FROM_MS = _scale(0.001)
_SECONDS_FROM_MINUTES = _scale(60.0)
_BYTES_FROM_MB = _scale(1024 * 1024, integer=True)

PULSAR_KEYS: tuple[PulsarKey, ...] = (
    # broker.conf / standalone.conf
    PulsarKey("metadataStoreUrl", ("metadata_url",), metadata_url),
    PulsarKey("configurationMetadataStoreUrl", ("configuration_metadata_url",), metadata_url),
    PulsarKey("brokerServicePort", ("port", "broker_port")),
    PulsarKey("webServicePort", ("http_port",)),
    PulsarKey("managedLedgerDefaultEnsembleSize", ("ensemble_size",)),
    PulsarKey("managedLedgerDefaultWriteQuorum", ("write_quorum",)),
    PulsarKey("managedLedgerDefaultAckQuorum", ("ack_quorum",)),
    PulsarKey("managedLedgerMaxEntriesPerLedger", ("max_entries_per_ledger",)),
    PulsarKey("dispatcherMaxReadBatchSize", ("dispatch_batch",)),
    PulsarKey("brokerDeduplicationEnabled", ("deduplication_enabled",)),
    PulsarKey("defaultRetentionTimeInMinutes", ("default_retention_time_minutes",)),
    PulsarKey("defaultRetentionSizeInMB", ("default_retention_size_mb",)),
    PulsarKey("ttlDurationDefaultInSeconds", ("ttl_duration_default_seconds",)),
    PulsarKey(
        "metadataStoreSessionTimeoutMillis",
        ("broker_session_ttl_seconds",),
        _scale(0.001, integer=True),
    ),
    PulsarKey(
        "zooKeeperSessionTimeoutMillis",
        ("broker_session_ttl_seconds",),
        _scale(0.001, integer=True),
    ),
    PulsarKey(
        "loadBalancerReportUpdateMaxIntervalMinutes",
        ("load_balancer_report_update_interval_seconds",),
        _SECONDS_FROM_MINUTES,
    ),
    PulsarKey(
        "loadBalancerSheddingIntervalMinutes",
        ("load_balancer_shedding_interval_seconds",),
        _SECONDS_FROM_MINUTES,
    ),
    PulsarKey(
        "loadBalancerSheddingGracePeriodMinutes",
        ("load_balancer_shedding_grace_period_seconds",),
        _SECONDS_FROM_MINUTES,
    ),
    # bookkeeper.conf
    PulsarKey("metadataServiceUri", ("metadata_url",), metadata_url),
    PulsarKey("bookiePort", ("port", "bookie_port")),
    PulsarKey("httpServerPort", ("http_port", "bookie_http_port")),
    PulsarKey("journalDirectories", ("journal_dir",), _first),
    PulsarKey("journalDirectory", ("journal_dir",), _first),
    PulsarKey("ledgerDirectories", ("ledger_dir",), _first),
    PulsarKey("journalSyncData", ("journal_sync",)),
    PulsarKey("journalMaxGroupWaitMSec", ("journal_max_group_wait_ms",)),
    PulsarKey("journalBufferedWritesThreshold", ("journal_max_group_bytes",)),
    PulsarKey("journalMaxSizeMB", ("journal_file_max_bytes",), _BYTES_FROM_MB),
    PulsarKey("logSizeLimit", ("entry_log_max_bytes",)),
    PulsarKey("nettyMaxFrameSizeBytes", ("max_entry_size",)),
    PulsarKey("dbStorage_writeCacheMaxSizeMb", ("write_cache_bytes",), _BYTES_FROM_MB),
    PulsarKey("dbStorage_readAheadCacheMaxSizeMb", ("read_cache_bytes",), _BYTES_FROM_MB),
    PulsarKey("flushInterval", ("checkpoint_interval_s",), _SECONDS_FROM_MS),
    PulsarKey("gcWaitTime", ("gc_interval_s",), _SECONDS_FROM_MS),
    PulsarKey("diskUsageLwmThreshold", ("disk_usage_lwm",)),
    PulsarKey("diskCheckInterval", ("disk_check_interval_s",), _SECONDS_FROM_MS),
    PulsarKey("zkTimeout", ("session_ttl_s",), _scale(0.001, integer=True)),
    PulsarKey(
        "openLedgerRereplicationGracePeriod",
        ("open_ledger_rereplication_grace_period",),
        _SECONDS_FROM_MS,
    ),
    PulsarKey("tlsCertificatePath", ("tls_certificate_path",)),
    PulsarKey("tlsKeyStore", ("tls_key_store",)),
    PulsarKey("tlsTrustStore", ("tls_trust_store",)),
    # proxy.conf
    PulsarKey("servicePort", ("port",)),
    PulsarKey("webServicePort", ("http_port",)),
    PulsarKey("brokerServiceURL", ("broker_service_url",)),
)

# Settings whose camelCase form is a Pulsar key with another meaning: never matched by name.
NOT_PULSARS: frozenset[str] = frozenset(
    {
        # bookie: ours is the entry-log garbage ratio; BookKeeper has minor/major thresholds
        "compaction_threshold",
    }
)


@dataclass(slots=True)
class Translation:
    """Settings read from a file, and the keys no setting of the service takes."""

    values: dict[str, object]
    unknown: list[str]


def translate(pairs: Iterable[tuple[str, object]], fields: Iterable[str]) -> Translation:
    """Map a file's keys (snake_case, dashed, camelCase or Pulsar's own) to ``fields``.

    Empty values are skipped: Pulsar's files leave a key empty to mean "the default"."""
    names = list(fields)
    by_name = {normalize(f): f for f in names if f not in NOT_PULSARS}
    exact = set(names)
    table: dict[str, list[PulsarKey]] = {}
    for entry in PULSAR_KEYS:
        table.setdefault(entry.key, []).append(entry)
    values: dict[str, object] = {}
    unknown: list[str] = []
    for key, raw in pairs:
        if isinstance(raw, str) and raw.strip() == "":
            continue
        snake = key.replace("-", "_")
        if snake in exact:
            values[snake] = raw
            continue
        matched = False
        for entry in table.get(key, ()):
            target = next((s for s in entry.settings if s in exact), None)
            if target is not None:
                convert = entry.convert
                values[target] = convert(str(raw)) if convert else raw
                matched = True
                break
        if matched:
            continue
        field = by_name.get(normalize(key))
        if field is not None:
            values[field] = raw
            continue
        unknown.append(key)
    return Translation(values, unknown)
