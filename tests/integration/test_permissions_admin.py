"""Tenants and permissions over the admin REST of a real standalone, on Pulsar's paths, codes and
reasons: tenant records, namespace, subscription and topic grants, who may change them."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import pytest

from tests.support.standalone import StandaloneProcess

SECURED = ("--authentication-enabled", "--authorization-enabled", "--superuser-roles", "admin")


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., StandaloneProcess]]:
    nodes: list[StandaloneProcess] = []

    def starter(*extra: str) -> StandaloneProcess:
        node = StandaloneProcess(tmp_path / f"standalone-{len(nodes)}", extra=list(extra)).start()
        nodes.append(node)
        return node

    yield starter
    for node in nodes:
        node.stop()
        print(node.log_tail())


def admin(
    node: StandaloneProcess,
    method: str,
    path: str,
    body: object = None,
    raw: bytes | None = None,
    user: str | None = None,
) -> tuple[int, object]:
    """One admin call: anonymous, or as ``user`` (password ``pw``) with HTTP Basic."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(node.admin_url + path, method=method, data=data)
    if user is not None:
        basic = base64.b64encode(f"{user}:pw".encode()).decode()
        request.add_header("Authorization", f"Basic {basic}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode() or "null")


def reason(answer: tuple[int, object]) -> tuple[int, str]:
    status, body = answer
    assert isinstance(body, dict), answer
    return status, body["reason"]


def test_tenant_records(start: Callable[..., StandaloneProcess]) -> None:
    node = start(*SECURED, "--anonymous-user-role", "admin")
    info = {"adminRoles": ["boss"], "allowedClusters": ["standalone"]}
    assert admin(node, "PUT", "/tenants/acme", info)[0] == 204
    assert admin(node, "GET", "/tenants/acme") == (200, info)
    assert reason(admin(node, "PUT", "/tenants/acme", info)) == (409, "Tenant already exists")
    assert admin(node, "PUT", "/tenants/plain")[0] == 204  # no body: an empty record
    assert admin(node, "GET", "/tenants/plain") == (200, {"adminRoles": [], "allowedClusters": []})
    assert admin(node, "POST", "/tenants/plain", {"adminRoles": ["x", "y"]})[0] == 204
    assert admin(node, "GET", "/tenants/plain") == (
        200,
        {"adminRoles": ["x", "y"], "allowedClusters": []},
    )
    assert admin(node, "PUT", "/tenants/bad", {"adminRoles": "boss"})[0] == 412
    assert admin(node, "PUT", "/tenants/bad", [1])[0] == 412
    assert admin(node, "GET", "/tenants/bad")[0] == 404
    missing = (404, "Tenant does not exist")
    assert reason(admin(node, "GET", "/tenants/nosuch")) == missing
    assert reason(admin(node, "POST", "/tenants/nosuch", info)) == missing
    assert reason(admin(node, "DELETE", "/tenants/nosuch")) == missing

    assert admin(node, "PUT", "/namespaces/acme/orders")[0] == 204
    assert reason(admin(node, "DELETE", "/tenants/acme")) == (
        409,
        "The tenant still has active namespaces",
    )
    assert admin(node, "DELETE", "/tenants/plain")[0] == 204
    assert admin(node, "GET", "/tenants/plain")[0] == 404
    status, tenants = admin(node, "GET", "/tenants")
    assert status == 200 and "acme" in tenants and "plain" not in tenants  # type: ignore[operator]


def test_namespace_subscription_and_topic_grants(start: Callable[..., StandaloneProcess]) -> None:
    node = start(*SECURED, "--anonymous-user-role", "admin")
    assert admin(node, "PUT", "/tenants/acme", {"adminRoles": [], "allowedClusters": []})[0] == 204
    assert admin(node, "PUT", "/namespaces/acme/orders")[0] == 204
    ns = "/namespaces/acme/orders"
    assert admin(node, "GET", f"{ns}/permissions") == (200, {})
    assert admin(node, "POST", f"{ns}/permissions/alice", ["produce", "consume"])[0] == 204
    assert admin(node, "POST", f"{ns}/permissions/bob", ["consume"])[0] == 204
    assert admin(node, "GET", f"{ns}/permissions") == (
        200,
        {"alice": ["consume", "produce"], "bob": ["consume"]},
    )
    # Pulsar's policy document carries the grants.
    status, document = admin(node, "GET", ns)
    assert status == 200 and document["auth_policies"]["namespace_auth"]["bob"] == ["consume"]  # type: ignore[index]
    # Bad bodies are refused, nothing stored.
    assert admin(node, "POST", f"{ns}/permissions/carol", ["publish"])[0] == 412
    assert admin(node, "POST", f"{ns}/permissions/carol", {"produce": True})[0] == 412
    assert admin(node, "POST", f"{ns}/permissions/carol")[0] == 412
    assert admin(node, "POST", f"{ns}/permissions/carol", raw=b"[nope")[0] == 400
    assert admin(node, "DELETE", f"{ns}/permissions/alice")[0] == 204
    assert admin(node, "GET", f"{ns}/permissions") == (200, {"bob": ["consume"]})
    # A missing namespace.
    assert reason(admin(node, "GET", "/namespaces/acme/nosuch/permissions")) == (
        404,
        "Namespace does not exist",
    )
    assert admin(node, "POST", "/namespaces/acme/nosuch/permissions/x", ["produce"])[0] == 404
    assert admin(node, "GET", "/namespaces/nosuch/ns/permissions")[0] == 404

    # Subscriptions.
    assert admin(node, "GET", f"{ns}/permissions/subscription") == (200, {})
    assert admin(node, "POST", f"{ns}/permissions/subscription/billing", ["bob", "alice"])[0] == 204
    assert admin(node, "GET", f"{ns}/permissions/subscription") == (
        200,
        {"billing": ["alice", "bob"]},
    )
    assert admin(node, "POST", f"{ns}/permissions/subscription/billing", "bob")[0] == 412
    assert admin(node, "DELETE", f"{ns}/permissions/billing/alice")[0] == 204
    assert admin(node, "GET", f"{ns}/permissions/subscription") == (200, {"billing": ["bob"]})

    # Topics: the namespace's grants joined with the topic's.
    topic = "/persistent/acme/orders/events"
    assert admin(node, "POST", f"{topic}/permissions/bob", ["produce"])[0] == 204
    assert admin(node, "POST", f"{topic}/permissions/dave", ["consume"])[0] == 204
    assert admin(node, "GET", f"{topic}/permissions") == (
        200,
        {"bob": ["consume", "produce"], "dave": ["consume"]},
    )
    assert admin(node, "GET", "/persistent/acme/orders/other/permissions") == (
        200,
        {"bob": ["consume"]},
    )
    assert admin(node, "DELETE", f"{topic}/permissions/dave")[0] == 204
    assert reason(admin(node, "DELETE", f"{topic}/permissions/dave")) == (
        412,
        "Permissions are not set at the topic level",
    )
    assert admin(node, "POST", f"{topic}/permissions/dave", ["eat"])[0] == 412
    assert reason(admin(node, "GET", "/persistent/nosuch/orders/t/permissions")) == (
        404,
        "Tenant does not exist",
    )

    # A partitioned topic's grant reaches its partitions.
    assert admin(node, "PUT", "/persistent/acme/orders/parted/partitions", 2)[0] == 204
    assert (
        admin(node, "POST", "/persistent/acme/orders/parted/permissions/eve", ["produce"])[0] == 204
    )
    assert admin(node, "GET", "/persistent/acme/orders/parted-partition-1/permissions") == (
        200,
        {"bob": ["consume"], "eve": ["produce"]},
    )


def test_only_superusers_and_tenant_admins_manage_grants(
    start: Callable[..., StandaloneProcess], tmp_path: Path
) -> None:
    # "admin" (a superuser) signs in with Basic; anonymous callers are "guest", no superuser.
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"admin:{bcrypt.hashpw(b'pw', bcrypt.gensalt(4)).decode()}\n")
    node = start(
        *SECURED,
        "--anonymous-user-role",
        "guest",
        "--authentication-providers",
        "basic",
        "--basic-auth-conf",
        str(htpasswd),
    )
    # Tenants are the superusers' (Pulsar).
    superuser_only = (403, "This operation requires super-user access")
    assert reason(admin(node, "PUT", "/tenants/mine", {"adminRoles": ["guest"]})) == superuser_only
    assert reason(admin(node, "GET", "/tenants")) == superuser_only
    assert (
        admin(node, "PUT", "/tenants/theirs", {"adminRoles": ["someone"]}, user="admin")[0] == 204
    )
    assert admin(node, "PUT", "/tenants/ours", {"adminRoles": ["guest"]}, user="admin")[0] == 204
    assert reason(admin(node, "GET", "/tenants/ours")) == superuser_only
    assert reason(admin(node, "POST", "/tenants/theirs", {"adminRoles": ["guest"]})) == (
        superuser_only
    )
    assert reason(admin(node, "DELETE", "/tenants/theirs")) == superuser_only
    # Bookie rack information too (Pulsar's Bookies resource checks superuser access).
    rack = "/bookies/racks-info/10.0.0.1:3181"
    assert reason(admin(node, "GET", "/bookies/racks-info")) == superuser_only
    assert reason(admin(node, "POST", f"{rack}?group=g", {"rack": "r1"})) == superuser_only
    assert admin(node, "POST", f"{rack}?group=g", {"rack": "r1"}, user="admin")[0] == 204
    assert reason(admin(node, "GET", rack)) == superuser_only
    assert reason(admin(node, "DELETE", rack)) == superuser_only
    assert admin(node, "GET", rack, user="admin") == (200, {"rack": "/r1"})
    assert admin(node, "DELETE", rack, user="admin")[0] == 204
    # Pulsar's health check writes to the bookies: superusers only (the probes use /health).
    assert reason(admin(node, "GET", "/brokers/health")) == superuser_only
    check = urllib.request.Request(node.admin_url + "/brokers/health")
    check.add_header("Authorization", "Basic " + base64.b64encode(b"admin:pw").decode())
    with urllib.request.urlopen(check, timeout=30) as answer:
        assert (answer.status, answer.read()) == (200, b"ok")
    for tenant in ("theirs", "ours"):
        assert admin(node, "PUT", f"/namespaces/{tenant}/ns", user="admin")[0] == 204

    refused = reason(admin(node, "POST", "/namespaces/theirs/ns/permissions/x", ["produce"]))
    assert refused == (403, "Don't have admin permission")
    assert admin(node, "GET", "/namespaces/theirs/ns/permissions")[0] == 403
    assert admin(node, "DELETE", "/namespaces/theirs/ns/permissions/x")[0] == 403
    assert admin(node, "GET", "/namespaces/theirs/ns/permissions/subscription")[0] == 403
    assert reason(admin(node, "POST", "/persistent/theirs/ns/t/permissions/x", ["produce"])) == (
        403,
        "Don't have admin permission",
    )
    assert admin(node, "GET", "/persistent/theirs/ns/t/permissions")[0] == 403

    # A tenant admin manages its own tenant's grants.
    assert admin(node, "POST", "/namespaces/ours/ns/permissions/x", ["produce"])[0] == 204
    assert admin(node, "GET", "/namespaces/ours/ns/permissions") == (200, {"x": ["produce"]})
    assert admin(node, "POST", "/persistent/ours/ns/t/permissions/y", ["consume"])[0] == 204
    assert admin(node, "GET", "/persistent/ours/ns/t/permissions") == (
        200,
        {"x": ["produce"], "y": ["consume"]},
    )


def test_grants_need_authorization_on(start: Callable[..., StandaloneProcess]) -> None:
    node = start()
    assert admin(node, "PUT", "/namespaces/public/plain")[0] == 204
    assert reason(admin(node, "POST", "/namespaces/public/plain/permissions/x", ["produce"])) == (
        501,
        "Authorization is not enabled",
    )
    assert admin(node, "POST", "/persistent/public/plain/t/permissions/x", ["produce"])[0] == 501
    assert (
        admin(node, "POST", "/namespaces/public/plain/permissions/subscription/s", ["x"])[0] == 501
    )
    # Reading is allowed (Pulsar answers the stored grants).
    assert admin(node, "GET", "/namespaces/public/plain/permissions") == (200, {})
    assert admin(node, "GET", "/persistent/public/plain/t/permissions") == (200, {})
