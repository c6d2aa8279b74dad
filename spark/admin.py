"""What the Spark driver asks the broker's admin REST API: partitions, topics, ledgers, schemas.

Plain ``urllib`` (the driver has no event loop, and no extra dependency is needed); every call
has a timeout and an error that names the URL and what the broker answered.

``admin.url`` may name any broker of a cluster. As in Pulsar, a topic's admin calls are answered
by its bundle's owner: another broker answers 307 with the owner's URL, which ``urllib`` follows
for these GETs (through the load manager's leader when the bundle has no owner yet). While the
bundle moves (an unload, a broker's shutdown) the broker answers 503; the call is asked again
until it is answered or its time is up, so a bundle move is a short wait for the driver.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from magnetar.spark.offsets import LedgerExtent
from magnetar.spark.schema import TopicSchema

PARTITION_SUFFIX = "-partition-"

#: Pulsar's answer while a topic's bundle has no owner that can serve it (being unloaded).
UNAVAILABLE = 503
#: The first pause before asking again after a 503; doubled up to ``MAX_RETRY_PAUSE_S``.
FIRST_RETRY_PAUSE_S = 0.05
MAX_RETRY_PAUSE_S = 1.0


class AdminCallError(RuntimeError):
    """The admin API refused or could not be reached."""

    def __init__(self, url: str, status: int | None, detail: str) -> None:
        super().__init__(f"admin call {url} failed ({status or 'no answer'}): {detail}")
        self.status = status


@dataclass(slots=True, frozen=True)
class TopicName:
    """A fully qualified topic name, split the way the admin paths want it."""

    domain: str
    tenant: str
    namespace: str
    local: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        domain, sep, rest = name.partition("://")
        if not sep:
            domain, rest = "persistent", name
        parts = rest.split("/")
        if len(parts) == 1:
            parts = ["public", "default", parts[0]]
        if len(parts) != 3 or domain != "persistent":
            raise ValueError(f"topic {name!r}: expected [persistent://]tenant/namespace/topic")
        return cls(domain, *parts)

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local}"

    @property
    def path(self) -> str:
        return f"{self.domain}/{self.tenant}/{self.namespace}/{self.local}"

    def partition(self, index: int) -> TopicName:
        return TopicName(
            self.domain, self.tenant, self.namespace, f"{self.local}-partition-{index}"
        )


@dataclass(slots=True, frozen=True)
class LedgerStats:
    """A topic-partition's ledgers (oldest first) and its stored size."""

    ledgers: tuple[LedgerExtent, ...]
    total_size: int
    entries: int

    @property
    def bytes_per_entry(self) -> float:
        return self.total_size / self.entries if self.entries else 1.0


class Admin:
    """The admin API at ``admin_url`` (``http://host:port``, with or without ``/admin/v2``)."""

    def __init__(self, admin_url: str, timeout_s: float = 30.0) -> None:
        self.base = admin_url.rstrip("/").removesuffix("/admin/v2")
        self.timeout_s = timeout_s

    def _get(self, path: str) -> object:
        """The JSON answer to ``GET {path}``, redirects followed; a 503 (the topic's bundle is
        moving) is asked again, with growing pauses, until ``timeout_s`` has passed."""
        url = f"{self.base}/admin/v2/{path}"
        deadline = time.monotonic() + self.timeout_s
        pause = FIRST_RETRY_PAUSE_S
        while True:
            try:
                return self._get_once(url)
            except AdminCallError as e:
                if e.status != UNAVAILABLE or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, MAX_RETRY_PAUSE_S)

    def _get_once(self, url: str) -> object:
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AdminCallError(url, e.code, e.read().decode(errors="replace")) from None
        except OSError as e:
            raise AdminCallError(url, None, str(e)) from None

    def partition_count(self, topic: TopicName) -> int:
        """0 for a topic that is not partitioned (or does not exist yet)."""
        answer = self._get(f"{topic.path}/partitions")
        assert isinstance(answer, dict)
        return int(answer.get("partitions", 0))

    def topic_partitions(self, topic: TopicName) -> list[str]:
        """The topic-partitions a source reads for ``topic``: its partitions or itself."""
        count = self.partition_count(topic)
        if count == 0:
            return [str(topic)]
        return [str(topic.partition(i)) for i in range(count)]

    def matching_topics(self, pattern: str) -> list[str]:
        """The topics of the pattern's namespace whose full name matches ``pattern`` (a regex
        over ``persistent://tenant/namespace/topic``); partitions are listed as their topic."""
        full = pattern if "://" in pattern else f"persistent://{pattern}"
        domain, rest = full.split("://", 1)
        tenant, namespace = rest.split("/")[:2]
        regex = re.compile(full)
        base = f"{domain}/{tenant}/{namespace}"
        names = set(self._list(base)) | set(self._list(f"{base}/partitioned"))
        logical = {n.split(PARTITION_SUFFIX)[0] for n in names}
        return sorted(n for n in logical if regex.fullmatch(n))

    def _list(self, path: str) -> list[str]:
        answer = self._get(path)
        assert isinstance(answer, list)
        return [str(n) for n in answer]

    def ledger_stats(self, partition: str) -> LedgerStats:
        """The topic-partition's ledgers from ``internalStats``; none when it does not exist."""
        try:
            answer = self._get(f"{TopicName.parse(partition).path}/internalStats")
        except AdminCallError as e:
            if e.status == 404:
                return LedgerStats((), 0, 0)
            raise
        assert isinstance(answer, dict)
        ledgers = tuple(
            LedgerExtent(
                int(ledger["ledgerId"]), int(ledger["entries"]), int(ledger.get("size", 0))
            )
            for ledger in answer.get("ledgers", [])
        )
        return LedgerStats(
            ledgers, int(answer.get("totalSize", 0)), int(answer.get("numberOfEntries", 0))
        )

    def topic_schema(self, topic: TopicName, version: int | None = None) -> TopicSchema | None:
        """The topic's latest schema (or ``version`` of it); None when it has none. Partitions
        share their topic's schema."""
        local = topic.local.split(PARTITION_SUFFIX)[0]
        path = f"schemas/{topic.tenant}/{topic.namespace}/{local}/schema"
        try:
            answer = self._get(path if version is None else f"{path}/{version}")
        except AdminCallError as e:
            if e.status == 404:
                return None
            raise
        assert isinstance(answer, dict)
        return TopicSchema(str(answer["type"]), str(answer["data"]), int(answer["version"]))
