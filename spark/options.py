"""The data source's options, named as Pulsar's Spark connector names them, parsed once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from magnetar.common.ledger.bookie_client import BookieTls
from magnetar.common.metadata.etcd import EtcdTls

CLIENT_PREFIX = "pulsar.client."
READER_PREFIX = "pulsar.reader."
PRODUCER_PREFIX = "pulsar.producer."


class OptionError(ValueError):
    """A missing or malformed option; the message says which and what is expected."""


def _passthrough_value(text: str) -> object:
    """``pulsar.*`` option values are strings; the official client wants ints, floats, bools."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _prefixed(options: Mapping[str, str], prefix: str) -> dict[str, object]:
    return {
        key[len(prefix) :]: _passthrough_value(value)
        for key, value in options.items()
        if key.lower().startswith(prefix)
    }


def _flag(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise OptionError(f"option {name}: expected true or false, got {text!r}")
    return text.lower() == "true"


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {name}: expected a positive integer, got {text!r}") from None
    if value < 1:
        raise OptionError(f"option {name}: expected a positive integer, got {value}")
    return value


STORAGE_MODES = ("auto", "always", "never")

#: The TLS options of the storage path, by peer: ``<peer>.enabled`` and three PEM files,
#: named after the brokers' settings (``bookkeeperTLS*FilePath``, ``etcd_tls_*_file_path``).
TLS_FILES = ("trustCertsFilePath", "certificateFilePath", "keyFilePath")


def _tls_files(options: Mapping[str, str], prefix: str) -> tuple[str, str, str] | None:
    """``<prefix>.enabled`` and the files of one peer's TLS; None when TLS to it is off."""
    files = tuple(options.get(f"{prefix}.{name}", "") for name in TLS_FILES)
    enabled = _flag(options, f"{prefix}.enabled", any(files))
    if not enabled:
        if any(files):
            raise OptionError(
                f"options {prefix}.* name TLS files but {prefix}.enabled is false: remove "
                "the files or turn it on"
            )
        return None
    _trust, certificate, key = files
    if bool(certificate) != bool(key):
        raise OptionError(
            f"a client certificate needs both {prefix}.certificateFilePath and "
            f"{prefix}.keyFilePath (got {certificate!r} and {key!r})"
        )
    return files  # type: ignore[return-value]


def _metadata_tls(options: Mapping[str, str]) -> EtcdTls | None:
    files = _tls_files(options, "metadata.tls")
    if files is None:
        return None
    if not options.get("metadata.url", "").startswith("etcd://"):
        raise OptionError(
            "options metadata.tls.* apply to an etcd:// metadata.url (a cluster's), not to "
            f"{options.get('metadata.url')!r}"
        )
    return EtcdTls(*files)


def _bookkeeper_tls(options: Mapping[str, str]) -> BookieTls | None:
    files = _tls_files(options, "bookkeeper.tls")
    return None if files is None else BookieTls(*files)


def _storage_mode(options: Mapping[str, str]) -> str:
    text = options.get("readFromStorage", "auto").lower()
    if text not in STORAGE_MODES:
        raise OptionError(f"option readFromStorage: expected auto, always or never, got {text!r}")
    if text == "always" and not options.get("metadata.url"):
        raise OptionError(
            "option readFromStorage=always needs metadata.url (etcd://host:2379 for a cluster, "
            "local:///path/to/data/meta.db for a standalone)"
        )
    return text


@dataclass(slots=True, frozen=True)
class SourceOptions:
    """Everything the source needs, on the driver and (pickled) on the executors."""

    service_url: str
    admin_url: str
    topics: tuple[str, ...] = ()
    topics_pattern: str | None = None
    starting_offsets: str = "latest"
    ending_offsets: str = "latest"
    fail_on_data_loss: bool = True
    max_entries_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    poll_timeout_ms: int = 120_000
    min_partitions: int | None = None
    client: dict[str, object] = field(default_factory=dict)
    reader: dict[str, object] = field(default_factory=dict)
    #: ``auto``, ``always`` or ``never``: closed ledgers read from the bookies (storage.py).
    read_from_storage: str = "auto"
    #: The metadata store the storage path reads ledger lists and ledgers from.
    metadata_url: str | None = None
    #: TLS of the storage path to etcd (``metadata.tls.*``) and to bookies
    #: (``bookkeeper.tls.*``); None: plain gRPC.
    metadata_tls: EtcdTls | None = None
    bookkeeper_tls: BookieTls | None = None
    #: Rows handed to Spark as Arrow batches (False: tuples, row by row, as before issue 23).
    arrow: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> SourceOptions:
        service_url = options.get("service.url")
        admin_url = options.get("admin.url")
        if not service_url or not admin_url:
            raise OptionError(
                "options service.url (pulsar://host:6650) and admin.url (http://host:8080) "
                "are both required to read"
            )
        topic, topics, pattern = (options.get(k) for k in ("topic", "topics", "topicsPattern"))
        if sum(x is not None for x in (topic, topics, pattern)) != 1:
            raise OptionError("give exactly one of the options topic, topics, topicsPattern")
        names = (topic,) if topic else tuple(t.strip() for t in (topics or "").split(",") if t)
        return cls(
            service_url=service_url,
            admin_url=admin_url,
            topics=names,
            topics_pattern=pattern,
            starting_offsets=options.get("startingOffsets", "latest" if streaming else "earliest"),
            ending_offsets=options.get("endingOffsets", "latest"),
            fail_on_data_loss=_flag(options, "failOnDataLoss", True),
            max_entries_per_trigger=_positive(options, "maxEntriesPerTrigger"),
            max_bytes_per_trigger=_positive(options, "maxBytesPerTrigger"),
            poll_timeout_ms=_positive(options, "pollTimeoutMs") or 120_000,
            min_partitions=_positive(options, "minPartitions"),
            client=_prefixed(options, CLIENT_PREFIX),
            reader=_prefixed(options, READER_PREFIX),
            read_from_storage=_storage_mode(options),
            metadata_url=options.get("metadata.url") or None,
            metadata_tls=_metadata_tls(options),
            bookkeeper_tls=_bookkeeper_tls(options),
            arrow=_flag(options, "arrow", True),
        )


@dataclass(slots=True, frozen=True)
class SinkOptions:
    """The sink's options: where to connect, the default topic, passthrough to the client."""

    service_url: str
    topic: str | None = None
    client: dict[str, object] = field(default_factory=dict)
    producer: dict[str, object] = field(default_factory=dict)
    #: Rows taken from Spark as Arrow batches (False: Row objects, one by one, as before).
    arrow: bool = True

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        service_url = options.get("service.url")
        if not service_url:
            raise OptionError("option service.url (pulsar://host:6650) is required to write")
        return cls(
            service_url=service_url,
            topic=options.get("topic"),
            client=_prefixed(options, CLIENT_PREFIX),
            producer=_prefixed(options, PRODUCER_PREFIX),
            arrow=_flag(options, "arrow", True),
        )
