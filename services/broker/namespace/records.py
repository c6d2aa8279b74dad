"""Tenants, namespaces and partitioned-topic records in the metadata store: where they live, how
their names are checked, and reading them. No HTTP here: the admin room answers with these, the
broker and the topics room read them, and the policies in force for a namespace.

Where they live (Pulsar's split, as in Pulsar 3.x's ``PulsarResources``): tenants, namespaces
(with their policies, grants and replication list) and partitioned-topic metadata are in the
**configuration store** (``configuration_metadata_url``, shared by the clusters that replicate
to each other; by default the local metadata store); topic-level policies, bundles, ownership,
managed ledgers and cursors are in each cluster's **local** store. Callers pass the store the
record lives in: ``configuration_store`` of the broker for the ones in ``CONFIGURATION_PATHS``.

Partitioned-topic metadata lives at
``/magnetar/admin/partitioned-topics/<tenant>/<namespace>/<domain>/<topic>`` as
``{"partitions": N}``, with ``"deleted": true`` while a delete is under way
(``policies.PartitionedTopicRecord``).
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any

from magnetar.broker.config import TopicSettings
from magnetar.broker.errors import NamespaceNotFoundError
from magnetar.broker.model.topic_name import TopicName
from magnetar.broker.namespace.policies import (
    PartitionedTopicRecord,
    Policies,
    effective,
    parse_document,
)
from magnetar.common.metadata import NOT_EXISTS, BadVersionError, MetadataStore, NoSuchKeyError

log = logging.getLogger(__name__)

PARTITIONED_PATH = "/magnetar/admin/partitioned-topics"
#: Topic-level policies: ``<tenant>/<namespace>/<domain>/<topic>``, the namespace document's
#: fields that a topic may set for itself (a partitioned topic's apply to its partitions).
TOPIC_POLICIES_PATH = "/magnetar/admin/topic-policies"
TENANTS_PATH = "/magnetar/admin/tenants"
NAMESPACES_PATH = "/magnetar/admin/namespaces"
#: The records kept in the configuration store (shared by replicating clusters).
CONFIGURATION_PATHS = (TENANTS_PATH, NAMESPACES_PATH, PARTITIONED_PATH)
_PROBE_PATH = "/magnetar/admin/configuration-store-probe"

#: Pulsar's NamedEntity.checkName pattern (Java's ``\w`` is ASCII-only, hence re.ASCII).
_NAMED_ENTITY = re.compile(r"[-=:.\w]+", re.ASCII)


def valid_name(name: str) -> bool:
    r"""A tenant or namespace name Pulsar accepts: ``[-=:.\w]`` only, and (beyond Pulsar's
    pattern, which an empty name or ``..`` passes) not empty and not dots only, since ``.`` and
    ``..`` mean "here" and "up" in URLs and would alias other keys."""
    return bool(_NAMED_ENTITY.fullmatch(name)) and name.strip(".") != ""


async def move_to_configuration_store(
    local: MetadataStore, configuration: MetadataStore
) -> dict[str, int]:
    """Move the tenant, namespace and partitioned-topic records a cluster kept in its local
    store (before it had a separate configuration store) to the configuration store, and delete
    the local copies so nothing reads or resurrects them later. A record the configuration
    store already has (another cluster's, or one moved by another broker) wins: the local copy
    is dropped with a warning when it differs. Idempotent; returns the count moved per path
    (nothing is moved when both are one store under two URLs: a probe key written in one is
    looked for in the other)."""
    moved: dict[str, int] = dict.fromkeys(CONFIGURATION_PATHS, 0)
    token = uuid.uuid4().hex
    probe_key = f"{_PROBE_PATH}/{token}"  # one per call: brokers may start together
    await local.put(probe_key, token.encode())
    try:
        probe = await configuration.get(probe_key)
    finally:
        await local.delete(probe_key)
    if probe is not None:
        return moved
    for path in CONFIGURATION_PATHS:
        count = 0
        for key, found in sorted((await local.scan(path + "/")).items()):
            try:
                await configuration.put(key, found.value, NOT_EXISTS)
                count += 1
            except BadVersionError:
                there = await configuration.get(key)
                if there is not None and there.value != found.value:
                    log.warning(
                        "%s: the configuration store has its own record; the local one (%s) is "
                        "dropped",
                        key,
                        found.value[:200].decode(errors="replace"),
                    )
            try:
                await local.delete(key, found.version)
            except (BadVersionError, NoSuchKeyError):
                pass  # another broker of this cluster moved it meanwhile
        moved[path] = count
    return moved


async def ensure_default_namespace(store: MetadataStore) -> None:
    """``public/default`` exists from the first start, as in Pulsar."""
    for key in (f"{TENANTS_PATH}/public", f"{NAMESPACES_PATH}/public/default"):
        try:
            await store.put(key, b"{}", NOT_EXISTS)
        except BadVersionError:
            pass


async def namespace_policies(
    store: MetadataStore, namespace: str, defaults: TopicSettings
) -> Policies:
    """The policies in force for ``namespace``: its own over the broker's ``defaults``."""
    found = await store.get(f"{NAMESPACES_PATH}/{namespace}")
    if found is None:
        raise NamespaceNotFoundError(
            f"namespace {namespace} does not exist (create it with the admin API)"
        )
    return effective(parse_document(found.value), defaults)


def topic_policies_key(name: TopicName) -> str:
    base = name.partitioned_topic_name
    return f"{TOPIC_POLICIES_PATH}/{base.tenant}/{base.namespace}/{base.domain}/{base.local_name}"


async def namespace_document(store: MetadataStore, namespace: str) -> dict[str, Any]:
    found = await store.get(f"{NAMESPACES_PATH}/{namespace}")
    if found is None:
        raise NamespaceNotFoundError(
            f"namespace {namespace} does not exist (create it with the admin API)"
        )
    return parse_document(found.value)


async def topic_documents(store: MetadataStore, namespace: str) -> dict[str, dict[str, Any]]:
    """Every topic-level policy document of ``namespace``, by full topic name."""
    prefix = f"{TOPIC_POLICIES_PATH}/{namespace}/"
    found: dict[str, dict[str, Any]] = {}
    for key, value in (await store.scan(prefix)).items():
        domain, _, local = key.removeprefix(prefix).partition("/")
        try:
            found[f"{domain}://{namespace}/{local}"] = parse_document(value.value)
        except ValueError:
            continue  # unreadable: the namespace's policies apply
    return found


def topic_effective(
    namespace_doc: dict[str, Any], topic_doc: dict[str, Any] | None, defaults: TopicSettings
) -> Policies:
    """Pulsar's resolution: the topic's policy, else the namespace's, else the broker's."""
    return effective({**namespace_doc, **(topic_doc or {})}, defaults)


async def topic_policies(
    configuration: MetadataStore, local: MetadataStore, name: TopicName, defaults: TopicSettings
) -> Policies:
    """The policies in force for topic ``name`` (its namespace's document is in the
    ``configuration`` store, its own in the ``local`` one)."""
    namespace_doc = await namespace_document(configuration, name.namespace_name)
    found = await local.get(topic_policies_key(name))
    topic_doc = parse_document(found.value) if found is not None else None
    return topic_effective(namespace_doc, topic_doc, defaults)


async def delete_topic_policies(store: MetadataStore, name: TopicName) -> None:
    """A deleted topic's own policies go with it (a new topic of that name starts without)."""
    try:
        await store.delete(topic_policies_key(name))
    except NoSuchKeyError:
        pass


def partitioned_key(name: TopicName) -> str:
    return f"{PARTITIONED_PATH}/{name.tenant}/{name.namespace}/{name.domain}/{name.local_name}"


async def read_partitioned(store: MetadataStore, name: TopicName) -> PartitionedTopicRecord | None:
    """The stored record of partitioned topic ``name`` (None: there is none). Raises
    PartitionedMetadataError for a damaged one. The count is not bounded here: callers that
    expand it check it against ``max_num_partitions_per_partitioned_topic``."""
    found = await store.get(partitioned_key(name))
    if found is None:
        return None
    return PartitionedTopicRecord.from_bytes(found.value, str(name))


async def partitioned_topics(
    store: MetadataStore, tenant: str, namespace: str, domain: str
) -> list[str]:
    """The partitioned topics of ``tenant/namespace`` in ``domain``, by full name."""
    names = await store.children(f"{PARTITIONED_PATH}/{tenant}/{namespace}/{domain}")
    return sorted(f"{domain}://{tenant}/{namespace}/{n}" for n in names)
