"""Topic names as Pulsar users write them.

``persistent://tenant/namespace/local-name`` (or ``non-persistent://``). Short forms:
``my-topic`` is ``persistent://public/default/my-topic``; ``tenant/namespace/my-topic`` gets the
``persistent://`` domain. Partition ``i`` of a partitioned topic ``t`` is the topic
``t-partition-i``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PARTITION_SUFFIX = "-partition-"
DEFAULT_TENANT = "public"
DEFAULT_NAMESPACE = "default"
_DOMAINS = ("persistent", "non-persistent")
_PART = re.compile(r"^[-=:.\w]+$")


class InvalidTopicNameError(ValueError):
    """Not a topic name Pulsar would accept."""


@dataclass(slots=True, frozen=True)
class TopicName:
    domain: str
    tenant: str
    namespace: str
    local_name: str

    @classmethod
    def parse(cls, name: str) -> TopicName:
        if "://" in name:
            domain, _, rest = name.partition("://")
            if domain not in _DOMAINS:
                raise InvalidTopicNameError(
                    f"topic {name!r}: domain must be persistent or non-persistent"
                )
        else:
            domain, rest = "persistent", name
        parts = rest.split("/")
        if len(parts) == 1 and "://" not in name:
            parts = [DEFAULT_TENANT, DEFAULT_NAMESPACE, parts[0]]
        if len(parts) != 3:
            raise InvalidTopicNameError(
                f"topic {name!r}: expected persistent://tenant/namespace/topic, tenant/namespace/topic or topic"
            )
        tenant, namespace, local_name = parts
        for what, value in (("tenant", tenant), ("namespace", namespace), ("topic", local_name)):
            if not value or not _PART.match(value):
                raise InvalidTopicNameError(
                    f"topic {name!r}: {what} {value!r} is empty or has invalid characters"
                )
        return cls(domain, tenant, namespace, local_name)

    def __str__(self) -> str:
        return f"{self.domain}://{self.tenant}/{self.namespace}/{self.local_name}"

    @property
    def persistent(self) -> bool:
        return self.domain == "persistent"

    @property
    def namespace_name(self) -> str:
        return f"{self.tenant}/{self.namespace}"

    @property
    def partition_index(self) -> int:
        """The partition number, or -1 for a topic that is not a partition."""
        base, sep, index = self.local_name.rpartition(PARTITION_SUFFIX)
        if sep and base and index.isdigit():
            return int(index)
        return -1

    @property
    def partitioned_topic_name(self) -> TopicName:
        """The partitioned topic this partition belongs to (itself if not a partition)."""
        if self.partition_index < 0:
            return self
        base = self.local_name.rpartition(PARTITION_SUFFIX)[0]
        return TopicName(self.domain, self.tenant, self.namespace, base)

    def partition(self, index: int) -> TopicName:
        return TopicName(
            self.domain, self.tenant, self.namespace, f"{self.local_name}{PARTITION_SUFFIX}{index}"
        )

    @property
    def managed_ledger_name(self) -> str:
        """The key-safe name under which the topic's managed ledger is stored."""
        return f"{self.tenant}/{self.namespace}/{self.domain}/{self.local_name}"
