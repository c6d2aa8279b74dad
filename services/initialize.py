"""``magnetar initialize-cluster-metadata``: what a new cluster needs in its metadata store
before clients come (Pulsar's ``pulsar initialize-cluster-metadata``): the ``public`` tenant and
``public/default`` namespace, in the configuration store (``--configuration-metadata-store``;
by default the metadata store itself), and, given Pulsar's ``--web-service-url`` /
``--broker-service-url`` (and their ``-tls`` forms), the cluster registered there. Idempotent: what exists is left as it is, so the Kubernetes Job
that runs it may run again (each broker also ensures the same at start).

The cluster's name is the brokers' ``cluster_name`` setting; the cluster's instance id is
created by the first bookie (its cookie names it)."""

from __future__ import annotations

import argparse
import os
import sys

from magnetar.common.metadata import open_store

DEFAULT_METADATA_URL = "etcd://127.0.0.1:2379"


#: Pulsar's options registering the cluster (argparse's dest), with the ClusterData key each sets.
CLUSTER_URL_OPTIONS = (
    ("web_service_url", "serviceUrl"),
    ("web_service_url_tls", "serviceUrlTls"),
    ("broker_service_url", "brokerServiceUrl"),
    ("broker_service_url_tls", "brokerServiceUrlTls"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metadata-url",
        default=None,
        help=f"metadata store URL [default: $MAGNETAR_METADATA_URL or {DEFAULT_METADATA_URL}]",
    )
    parser.add_argument(
        "--configuration-metadata-store",
        default=None,
        help="the configuration store shared by replicating clusters, where tenants and "
        "namespaces live (Pulsar's option) [default: $MAGNETAR_CONFIGURATION_METADATA_URL or "
        "the metadata store]",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        help="the cluster's name [default: $MAGNETAR_CLUSTER_NAME]",
    )
    for dest, what in CLUSTER_URL_OPTIONS:
        parser.add_argument(
            "--" + dest.replace("_", "-"),
            default=None,
            help=f"register the cluster in the configuration store with this {what} (Pulsar's "
            "option; a cluster registered already is left as it is)",
        )


async def run(args: argparse.Namespace) -> int:
    from magnetar.bkshell import ShellTls
    from magnetar.broker.namespace.clusters import ClusterData, ClusterDataError, cluster_key
    from magnetar.broker.namespace.records import ensure_default_namespace
    from magnetar.common.metadata import NOT_EXISTS, BadVersionError

    url = args.metadata_url or os.environ.get("MAGNETAR_METADATA_URL") or DEFAULT_METADATA_URL
    cluster = args.cluster or os.environ.get("MAGNETAR_CLUSTER_NAME") or "standalone"
    if "/" in cluster:
        print(f"initialize-cluster-metadata: bad cluster name {cluster!r}", file=sys.stderr)
        return 2
    url = (
        args.configuration_metadata_store
        or os.environ.get("MAGNETAR_CONFIGURATION_METADATA_URL")
        or url
    )
    try:
        store = await open_store(url, tls=ShellTls.from_environ().etcd_tls())
    except Exception as e:
        print(f"cannot open metadata store {url}: {e}", file=sys.stderr)
        return 1
    urls = {what: getattr(args, dest) for dest, what in CLUSTER_URL_OPTIONS}
    registered = ""
    try:
        await ensure_default_namespace(store)
        if any(urls.values()):
            try:
                data = ClusterData.from_json(urls)
            except ClusterDataError as e:
                print(f"initialize-cluster-metadata: {e}", file=sys.stderr)
                return 2
            try:
                await store.put(cluster_key(cluster), data.to_bytes(), NOT_EXISTS)
                registered = f", cluster {cluster} registered"
            except BadVersionError:
                registered = f", cluster {cluster} registered already (left as it is)"
    finally:
        await store.close()
    print(
        f"cluster {cluster}: configuration at {url} initialised (public/default present"
        f"{registered})"
    )
    return 0
