"""Issue 18's authorization matrix, with real processes and the official client: six callers
(a superuser, a tenant's admin, a role granted only ``produce`` on the namespace, one granted
only ``consume``, a role with no grant, and an anonymous caller mapped to the ungranted
``anonymous`` role) times the operations of ``OPERATIONS`` (issue 18's eleven, with the
partitioned variants of topic create and delete), every cell asserted allowed or refused, on a
standalone and on a three-broker cluster.

On the cluster every client and every admin call is given a broker that neither owns the
namespace's bundle nor leads, so the caller's token has to be accepted wherever it is sent:

- a lookup of the owned bundle is answered, as Pulsar does, Connect (binary) or 200 (HTTP)
  with the owner's URLs, and the client goes there;
- a first lookup of an unowned bundle is redirected to the leader, which places it
  (``test_first_lookup``, binary and HTTP);
- topic admin calls are answered 307 to the owner; a partitioned topic's delete is carried to
  the owner by the entry with the brokers' own token (the superuser ``broker``).

The spec (Pulsar's default authorization provider): superusers may do everything; a tenant's
admins everything under their tenant but tenants themselves; ``produce`` grants lookup and
produce; ``consume`` grants lookup, consume and readers; anything else is refused. Binary
refusals are ``AuthorizationError`` (the official client raises ``pulsar.AuthorizationError``;
given an HTTP service URL it raises ``ConnectError`` for the 403), HTTP refusals 403 with
Pulsar's ``{"reason": ...}``. Allowed produce, consume and read cells count exactly ``COUNT``
messages; the logs hold no ERROR and no traceback when the module is done.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import jwt
import pulsar
import pytest

from magnetar.common.proto import pulsar_api_pb2 as pb
from magnetar.common.protocol import codec
from tests.support.cluster import BrokerProcess, MagnetarCluster, assert_no_traceback
from tests.support.polling import wait_until
from tests.support.raw_client import RawConnection, assert_log_clean
from tests.support.standalone import QUIET, StandaloneProcess

TENANT = "acme"
NAMESPACE = f"{TENANT}/ns"
CLUSTER_NAME = "standalone"  # the brokers' default cluster_name
#: Messages per allowed produce cell, and in the backlog every allowed consumer and reader drains.
COUNT = 10

#: Matrix role -> the role its token names (None: no credentials, the anonymous role).
ROLES: dict[str, str | None] = {
    "superuser": "admin",
    "tenant-admin": "boss",
    "produce-only": "writer",
    "consume-only": "reader",
    "ungranted": "stranger",
    "anonymous": None,
}
ANONYMOUS_ROLE = "anonymous"
BROKER_ROLE = "broker"  # how the cluster's brokers call each other
SUPERUSERS = f"admin,{BROKER_ROLE}"

OPERATIONS = (
    "lookup",
    "produce",
    "consume",
    "reader",
    "create-topic",
    "delete-topic",
    "create-partitioned-topic",
    "delete-partitioned-topic",
    "namespace-policy",
    "grant",
    "revoke",
    "tenant-create",
    "tenant-delete",
)
UNDER_THE_TENANT = set(OPERATIONS) - {"tenant-create", "tenant-delete"}
ALLOWED: dict[str, set[str]] = {
    "superuser": set(OPERATIONS),
    "tenant-admin": UNDER_THE_TENANT,
    "produce-only": {"lookup", "produce"},
    "consume-only": {"lookup", "consume", "reader"},
    "ungranted": set(),
    "anonymous": set(),
}

NOT_ADMIN = "Don't have admin permission"
NOT_SUPERUSER = "This operation requires super-user access"
NOT_LOOKUP = "Client is not authorized to Lookup"


def allowed(role: str, operation: str) -> bool:
    return operation in ALLOWED[role]


def topic(local: str) -> str:
    return f"persistent://{NAMESPACE}/{local}"


# -- the two deployments ---------------------------------------------------------------------


@dataclass
class Deployment:
    """Where the callers go: ``entry`` is given to every client and admin call; ``owner`` owns
    the namespace's one bundle (the same process on the standalone)."""

    kind: str
    secret: bytes
    entry: StandaloneProcess | BrokerProcess
    owner: StandaloneProcess | BrokerProcess
    #: The cluster (None: the standalone); its entry is neither the owner nor the leader.
    cluster: MagnetarCluster | None = None

    @property
    def redirected(self) -> bool:
        return self.entry is not self.owner

    def token(self, role: str | None) -> str | None:
        return None if role is None else jwt.encode({"sub": role}, self.secret, "HS256")

    def client(self, matrix_role: str, *, over_http: bool = False) -> pulsar.Client:
        """An official client given the entry's Pulsar URL (or its HTTP URL: lookups and
        partition counts over the REST API)."""
        return self.client_as(ROLES[matrix_role], over_http=over_http)

    def client_as(self, role: str | None, *, over_http: bool = False) -> pulsar.Client:
        token = self.token(role)
        return pulsar.Client(
            http_url(self.entry) if over_http else self.entry.url,
            authentication=None if token is None else pulsar.AuthenticationToken(token),
            operation_timeout_seconds=5,
            logger=QUIET,
        )

    def http(self, matrix_role: str | None, method: str, path: str, body: object = None) -> Answer:
        """One HTTP call to the entry as ``matrix_role`` (None: the superuser)."""
        role = ROLES[matrix_role] if matrix_role is not None else ROLES["superuser"]
        return http_call(http_url(self.entry), method, path, self.token(role), body)

    def admin(self, method: str, path: str, body: object = None) -> Any:
        """A superuser's admin call that must succeed; its JSON body."""
        answer = self.http(None, method, path, body)
        assert 200 <= answer.status < 300, f"{method} {path}: {answer}"
        return answer.body


def http_url(node: StandaloneProcess | BrokerProcess) -> str:
    return f"http://127.0.0.1:{node.http_port}"


def port_of(url: str) -> int | None:
    """The port of an advertised URL (the standalone advertises ``localhost``, brokers their
    ``--advertised-address``)."""
    return urllib.parse.urlsplit(url).port


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: Any
    #: The URLs 307/308 redirects sent the call to, in order.
    hops: tuple[str, ...]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # followed by hand, with the credentials, and recorded


_OPENER = urllib.request.build_opener(_NoRedirect)


def http_call(base: str, method: str, path: str, token: str | None, body: object) -> Answer:
    """One HTTP request with ``Authorization: Bearer`` (none for None); 307/308 followed with
    the same method, body and credentials, as Pulsar's admin client does."""
    url = base + path
    data = None if body is None else json.dumps(body).encode()
    hops: list[str] = []
    while True:
        request = urllib.request.Request(url, method=method, data=data)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with _OPENER.open(request, timeout=30) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
            location = e.headers.get("Location")
            if status in (307, 308) and location and len(hops) < 5:
                url = urllib.parse.urljoin(url, location)
                hops.append(url)
                continue
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return Answer(status, decoded, tuple(hops))


def _key_file(base: Path) -> tuple[bytes, Path]:
    secret = secrets.token_bytes(32)
    key_file = base / "secret.key"
    key_file.write_bytes(secret)
    return secret, key_file


def _security(key_file: Path) -> dict[str, object]:
    return {
        "authentication_enabled": True,
        "authentication_providers": "token",
        "token_secret_key": f"file://{key_file}",
        "anonymous_user_role": ANONYMOUS_ROLE,
        "authorization_enabled": True,
        "superuser_roles": SUPERUSERS,
    }


def _standalone(base: Path) -> Iterator[Deployment]:
    secret, key_file = _key_file(base)
    extra: list[str] = []
    for name, value in _security(key_file).items():
        option = "--" + name.replace("_", "-")
        extra += [option] if value is True else [option, str(value)]
    node = StandaloneProcess(base / "standalone", extra=extra).start()
    try:
        deployment = Deployment("standalone", secret, node, node)
        wait_until(
            lambda: deployment.http(None, "GET", "/admin/v2/tenants").status == 200,
            "the standalone's admin API answers",
            timeout=30,
        )
        _prepare(deployment)
        yield deployment
    finally:
        node.stop()
        print(node.log_tail())
    assert_log_clean(node)


def _cluster(base: Path) -> Iterator[Deployment]:
    secret, key_file = _key_file(base)
    broker_token = jwt.encode({"sub": BROKER_ROLE}, secret, "HS256")
    settings = {
        **_security(key_file),
        "broker_client_authentication_plugin": "token",
        "broker_client_authentication_parameters": f"token:{broker_token}",
    }
    cluster = MagnetarCluster(base / "cluster", bookies=3, brokers=3, broker_settings=settings)
    try:
        cluster.start()
        first = cluster.brokers[0]
        deployment = Deployment("cluster", secret, first, first)
        _create_namespace(deployment)
        # Place the namespace's one bundle (a lookup does), then enter by another broker.
        probe = topic("placement")
        assert deployment.http(None, "GET", _lookup_path(probe)).status == 200
        owner_id = cluster.wait_for(
            lambda: cluster.owner_of_topic(probe), what=f"an owner for {NAMESPACE}"
        )
        deployment.owner = cluster.broker(owner_id)
        # Neither the owner nor the leader: unowned bundles are redirected to the leader.
        leader = cluster.leader()
        deployment.entry = next(b for b in cluster.brokers if b.broker_id not in (owner_id, leader))
        deployment.cluster = cluster
        _prepare(deployment, namespace_made=True)
        yield deployment
        # Nothing moved while the matrix ran: every redirect went to the same owner.
        assert cluster.owner_of_topic(probe) == owner_id
    finally:
        cluster.close()
        print(cluster.logs())
    for broker in cluster.brokers:
        assert_no_traceback(broker)
        errors = broker.log_lines(" ERROR ", " CRITICAL ")
        assert not errors, f"broker {broker.broker_id} logged errors:\n" + "\n".join(errors[:40])


#: How a first lookup is made: a LOOKUP command, or the HTTP lookup.
CHANNELS = ("binary", "http")


def fresh(role: str, channel: str) -> str:
    """A namespace nobody looked up before ``role``'s first lookup over ``channel``."""
    return f"{TENANT}/fresh-{channel}-{role}"


def _create_namespace(deployment: Deployment) -> None:
    deployment.admin(
        "PUT",
        f"/admin/v2/tenants/{TENANT}",
        {"adminRoles": [ROLES["tenant-admin"]], "allowedClusters": [CLUSTER_NAME]},
    )
    deployment.admin("PUT", f"/admin/v2/namespaces/{NAMESPACE}", {"bundles": {"numBundles": 1}})


def _prepare(deployment: Deployment, *, namespace_made: bool = False) -> None:
    """The tenant and namespace, the two grants, and per caller: a topic and a tenant to delete
    and a grant to revoke; then the backlog the consumers and readers drain."""
    if not namespace_made:
        _create_namespace(deployment)
    for namespace in [NAMESPACE, *(fresh(role, c) for role in ROLES for c in CHANNELS)]:
        if namespace != NAMESPACE:
            body = {"bundles": {"numBundles": 1}}
            deployment.admin("PUT", f"/admin/v2/namespaces/{namespace}", body)
        grants = f"/admin/v2/namespaces/{namespace}/permissions"
        deployment.admin("POST", f"{grants}/{ROLES['produce-only']}", ["produce"])
        deployment.admin("POST", f"{grants}/{ROLES['consume-only']}", ["consume"])
    grants = f"/admin/v2/namespaces/{NAMESPACE}/permissions"
    for role in ROLES:
        deployment.admin("PUT", f"/admin/v2/persistent/{NAMESPACE}/doomed-{role}")
        deployment.admin(
            "PUT", f"/admin/v2/persistent/{NAMESPACE}/doomed-parted-{role}/partitions", 2
        )
        # Administered by the caller that tries to delete it: only superusers delete tenants.
        admins = [ROLES[role] or ANONYMOUS_ROLE]
        deployment.admin("PUT", f"/admin/v2/tenants/doomed-{role}", {"adminRoles": admins})
        deployment.admin("POST", f"{grants}/revocable-{role}", ["produce"])
    c = deployment.client("superuser")
    try:
        producer = c.create_producer(topic("backlog"), batching_enabled=False)
        for i in range(COUNT):
            producer.send(f"backlog-{i}".encode())
        producer.close()
        # The partitions stored, so their delete goes to where they are served (on the
        # cluster: the owner, called by the entry with the brokers' own credentials).
        for role in ROLES:
            for partition in range(2):
                name = topic(f"doomed-parted-{role}-partition-{partition}")
                c.create_producer(name).close()
    finally:
        c.close()


@pytest.fixture(scope="module", params=["standalone", "cluster"])
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    base = tmp_path_factory.mktemp(f"authz-{request.param}")
    yield from (_standalone(base) if request.param == "standalone" else _cluster(base))


each_role = pytest.mark.parametrize("role", list(ROLES))


def _assert_refused(answer: Answer, reason: str) -> None:
    assert answer.status == 403, answer
    assert answer.body == {"reason": reason}, answer


def _assert_redirected(deployment: Deployment, answer: Answer) -> None:
    """On the cluster the entry is not the owner: the call went there through a redirect."""
    if deployment.redirected:
        assert answer.hops, f"the entry broker answered without a redirect: {answer}"
        assert port_of(answer.hops[-1]) == deployment.owner.http_port, answer
    else:
        assert answer.hops == (), answer


# -- lookup ----------------------------------------------------------------------------------


def _lookup_path(name: str) -> str:
    return "/lookup/v2/topic/" + name.replace("://", "/", 1)


def _raw_connected(
    deployment: Deployment, node: StandaloneProcess | BrokerProcess, role: str | None
) -> RawConnection:
    """A raw connection to ``node`` that sent CONNECT with ``role``'s token (none for None)."""
    token = deployment.token(role)
    # RawConnection needs only the node's ``port``; a broker process has one too.
    raw = RawConnection(cast(StandaloneProcess, node))
    credentials = {"auth_method_name": "token", "auth_data": token.encode()} if token else {}
    try:
        raw.command(
            pb.CommandConnect(
                client_version="authz-matrix",
                protocol_version=codec.SERVER_PROTOCOL_VERSION,
                **credentials,
            )
        )
        raw.expect(pb.BaseCommand.CONNECTED)
    except BaseException:
        raw.close()
        raise
    return raw


def _raw_lookup(
    deployment: Deployment,
    node: StandaloneProcess | BrokerProcess,
    role: str | None,
    name: str,
    authoritative: bool = False,
) -> pb.CommandLookupTopicResponse:
    """CONNECT (with the role's token) and LOOKUP on a raw connection: the broker's answer."""
    with _raw_connected(deployment, node, role) as raw:
        raw.command(pb.CommandLookupTopic(topic=name, request_id=1, authoritative=authoritative))
        answer = raw.expect(pb.BaseCommand.LOOKUP_RESPONSE).body
        return cast(pb.CommandLookupTopicResponse, answer)


@each_role
def test_lookup(deployment: Deployment, role: str) -> None:
    name = topic(f"lookup-{role}")
    reply = pb.CommandLookupTopicResponse
    binary = _raw_lookup(deployment, deployment.entry, ROLES[role], name)
    for over_http in (False, True):
        c = deployment.client(role, over_http=over_http)
        try:
            if allowed(role, "lookup"):
                assert c.get_topic_partitions(name) == [name]
            else:
                # Over HTTP the broker answers 403 (asserted below); the official client turns
                # any HTTP error status of a lookup into ConnectError.
                refusal = pulsar.ConnectError if over_http else pulsar.AuthorizationError
                with pytest.raises(refusal):
                    c.get_topic_partitions(name)
        finally:
            c.close()
    answer = deployment.http(role, "GET", _lookup_path(name))
    # What the official client asks over HTTP for a partition count.
    partitions = deployment.http(
        role, "GET", f"/admin/v2/persistent/{NAMESPACE}/lookup-{role}/partitions"
    )

    if not allowed(role, "lookup"):
        assert (binary.response, binary.error, binary.message) == (
            reply.Failed,
            pb.AuthorizationError,
            NOT_LOOKUP,
        ), binary
        _assert_refused(answer, NOT_LOOKUP)
        _assert_refused(partitions, NOT_LOOKUP)
        return
    assert (partitions.status, partitions.body) == (200, {"partitions": 0}), partitions
    # As Pulsar: a bundle owned elsewhere is answered Connect (authoritative) with the
    # owner's URL, and the client goes there; on the cluster that is not the entry.
    assert (binary.response, binary.authoritative) == (reply.Connect, True), binary
    assert port_of(binary.brokerServiceUrl) == deployment.owner.port, binary
    if deployment.redirected:
        # The owner accepts the same caller and answers it the same.
        there = _raw_lookup(deployment, deployment.owner, ROLES[role], name)
        assert there.response == reply.Connect, there
        assert port_of(there.brokerServiceUrl) == deployment.owner.port, there
    assert answer.status == 200, answer
    assert port_of(answer.body["brokerUrl"]) == deployment.owner.port, answer
    assert port_of(answer.body["httpUrl"]) == deployment.owner.http_port, answer
    assert answer.hops == (), answer  # an owned bundle is answered with its owner's URLs


def _port_owner(deployment: Deployment, port: int) -> StandaloneProcess | BrokerProcess:
    if deployment.cluster is None:
        assert port == deployment.entry.port
        return deployment.entry
    return next(b for b in deployment.cluster.brokers if b.port == port)


def _bundle_owner(deployment: Deployment, name: str) -> int | None:
    """Pulsar port of the broker owning ``name``'s bundle, as the metadata store says (on the
    standalone: the node, once it answered a lookup)."""
    if deployment.cluster is None:
        return deployment.entry.port
    owner = deployment.cluster.owner_of_topic(name)
    return None if owner is None else deployment.cluster.broker(owner).port


@each_role
@pytest.mark.parametrize("channel", CHANNELS)
def test_first_lookup(deployment: Deployment, role: str, channel: str) -> None:
    """The lookup of a bundle nobody owns yet: on the cluster the entry (not the leader)
    redirects to the leader, which places the bundle; the caller's token is accepted at every
    hop. A refused lookup places nothing."""
    name = f"persistent://{fresh(role, channel)}/first"
    reply = pb.CommandLookupTopicResponse
    if channel == "http":
        answer = deployment.http(role, "GET", _lookup_path(name))
        if not allowed(role, "lookup"):
            _assert_refused(answer, NOT_LOOKUP)
        else:
            assert answer.status == 200, answer
            owner = _bundle_owner(deployment, name)
            assert port_of(answer.body["brokerUrl"]) == owner, answer
            if deployment.cluster is not None:
                leader = deployment.cluster.broker(deployment.cluster.leader() or "")
                assert answer.hops, answer
                assert port_of(answer.hops[0]) == leader.http_port, answer
            else:
                assert answer.hops == (), answer
    else:
        node = deployment.entry
        hops: list[pb.CommandLookupTopicResponse] = []
        authoritative = False
        while True:
            found = _raw_lookup(deployment, node, ROLES[role], name, authoritative)
            hops.append(found)
            if found.response != reply.Redirect or len(hops) > 3:
                break
            node = _port_owner(deployment, port_of(found.brokerServiceUrl) or 0)
            authoritative = found.authoritative
        if not allowed(role, "lookup"):
            assert len(hops) == 1, hops
            assert (hops[0].response, hops[0].error, hops[0].message) == (
                reply.Failed,
                pb.AuthorizationError,
                NOT_LOOKUP,
            ), hops
        else:
            assert hops[-1].response == reply.Connect, hops
            assert port_of(hops[-1].brokerServiceUrl) == _bundle_owner(deployment, name), hops
            if deployment.cluster is not None:
                leader = deployment.cluster.broker(deployment.cluster.leader() or "")
                assert hops[0].response == reply.Redirect, hops
                assert port_of(hops[0].brokerServiceUrl) == leader.port, hops
    if not allowed(role, "lookup") and deployment.cluster is not None:
        assert deployment.cluster.owner_of_topic(name) is None


# -- produce, consume, read ------------------------------------------------------------------


@each_role
def test_producer_and_subscribe_without_a_lookup(deployment: Deployment, role: str) -> None:
    """PRODUCER and SUBSCRIBE sent straight to the owner, as a client that skips the lookup
    would: checked there for themselves (the official client is refused at the lookup)."""
    name = topic(f"direct-{role}")
    with _raw_connected(deployment, deployment.owner, ROLES[role]) as raw:
        raw.command(pb.CommandProducer(topic=name, producer_id=1, request_id=1))
        answer = raw.next_frame()
        if allowed(role, "produce"):
            assert answer.type == pb.BaseCommand.PRODUCER_SUCCESS, answer.name
        else:
            assert answer.type == pb.BaseCommand.ERROR, answer.name
            error = answer.body
            assert (error.request_id, error.error, error.message) == (  # type: ignore[attr-defined]
                1,
                pb.AuthorizationError,
                "Client is not authorized to Produce",
            ), error
        raw.command(
            pb.CommandSubscribe(
                topic=name,
                subscription="direct",
                subType=pb.CommandSubscribe.Exclusive,
                consumer_id=2,
                request_id=2,
            )
        )
        answer = raw.next_frame()
        if allowed(role, "consume"):
            assert answer.type == pb.BaseCommand.SUCCESS, answer.name
        else:
            assert answer.type == pb.BaseCommand.ERROR, answer.name
            error = answer.body
            assert (error.request_id, error.error, error.message) == (  # type: ignore[attr-defined]
                2,
                pb.AuthorizationError,
                "Client is not authorized to subscribe",
            ), error


@each_role
def test_produce(deployment: Deployment, role: str) -> None:
    name = topic(f"produce-{role}")
    sent = [f"{role}-{i}".encode() for i in range(COUNT)]
    c = deployment.client(role)
    try:
        if not allowed(role, "produce"):
            with pytest.raises(pulsar.AuthorizationError):
                c.create_producer(name)
            return
        producer = c.create_producer(name, batching_enabled=False)
        for payload in sent:
            producer.send(payload)
        producer.close()
    finally:
        c.close()
    # Exactly what was sent is stored: a superuser drains the topic from its start.
    check = deployment.client("superuser")
    try:
        consumer = check.subscribe(name, "check", initial_position=pulsar.InitialPosition.Earliest)
        got = [consumer.receive(timeout_millis=10_000).data() for _ in range(COUNT)]
        assert got == sent
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        check.close()


BACKLOG = [f"backlog-{i}".encode() for i in range(COUNT)]


@each_role
def test_consume(deployment: Deployment, role: str) -> None:
    c = deployment.client(role)
    try:
        if not allowed(role, "consume"):
            with pytest.raises(pulsar.AuthorizationError):
                c.subscribe(topic("backlog"), f"sub-{role}")
            return
        consumer = c.subscribe(
            topic("backlog"), f"sub-{role}", initial_position=pulsar.InitialPosition.Earliest
        )
        got = []
        for _ in range(COUNT):
            message = consumer.receive(timeout_millis=10_000)
            consumer.acknowledge(message)
            got.append(message.data())
        assert got == BACKLOG
        with pytest.raises(pulsar.Timeout):
            consumer.receive(timeout_millis=500)
    finally:
        c.close()


@each_role
def test_reader(deployment: Deployment, role: str) -> None:
    c = deployment.client(role)
    try:
        if not allowed(role, "reader"):
            with pytest.raises(pulsar.AuthorizationError):
                c.create_reader(topic("backlog"), pulsar.MessageId.earliest)
            return
        reader = c.create_reader(topic("backlog"), pulsar.MessageId.earliest)
        got = [reader.read_next(timeout_millis=10_000).data() for _ in range(COUNT)]
        assert got == BACKLOG
        with pytest.raises(pulsar.Timeout):
            reader.read_next(timeout_millis=500)
    finally:
        c.close()


# -- topics ----------------------------------------------------------------------------------


def _topic_exists(deployment: Deployment, local: str) -> bool:
    answer = deployment.http(None, "GET", f"/admin/v2/persistent/{NAMESPACE}/{local}/stats")
    assert answer.status in (200, 404), answer
    return answer.status == 200


@each_role
def test_create_topic(deployment: Deployment, role: str) -> None:
    local = f"created-{role}"
    answer = deployment.http(role, "PUT", f"/admin/v2/persistent/{NAMESPACE}/{local}")
    if allowed(role, "create-topic"):
        assert answer.status == 204, answer
        _assert_redirected(deployment, answer)
        assert _topic_exists(deployment, local)
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert not _topic_exists(deployment, local)


@each_role
def test_delete_topic(deployment: Deployment, role: str) -> None:
    local = f"doomed-{role}"
    answer = deployment.http(role, "DELETE", f"/admin/v2/persistent/{NAMESPACE}/{local}")
    if allowed(role, "delete-topic"):
        assert answer.status == 204, answer
        _assert_redirected(deployment, answer)
        assert not _topic_exists(deployment, local)
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert _topic_exists(deployment, local)


def _partitions(deployment: Deployment, local: str) -> int:
    path = f"/admin/v2/persistent/{NAMESPACE}/{local}/partitions"
    return int(deployment.admin("GET", path)["partitions"])


@each_role
def test_create_partitioned_topic(deployment: Deployment, role: str) -> None:
    local = f"parted-{role}"
    path = f"/admin/v2/persistent/{NAMESPACE}/{local}/partitions"
    answer = deployment.http(role, "PUT", path, 3)
    if allowed(role, "create-partitioned-topic"):
        assert answer.status == 204, answer
        assert _partitions(deployment, local) == 3
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert _partitions(deployment, local) == 0


@each_role
def test_delete_partitioned_topic(deployment: Deployment, role: str) -> None:
    local = f"doomed-parted-{role}"
    path = f"/admin/v2/persistent/{NAMESPACE}/{local}/partitions"
    answer = deployment.http(role, "DELETE", path)
    partitions = [f"{local}-partition-{i}" for i in range(2)]
    if allowed(role, "delete-partitioned-topic"):
        assert answer.status == 204, answer
        assert _partitions(deployment, local) == 0
        assert not any(_topic_exists(deployment, p) for p in partitions)
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert _partitions(deployment, local) == 2
        assert all(_topic_exists(deployment, p) for p in partitions)


# -- the namespace: a policy and grants ------------------------------------------------------


@each_role
def test_namespace_policy(deployment: Deployment, role: str) -> None:
    index = list(ROLES).index(role)
    retention = {"retentionTimeInMinutes": 100 + index, "retentionSizeInMB": 10 + index}
    path = f"/admin/v2/namespaces/{NAMESPACE}/retention"
    answer = deployment.http(role, "POST", path, retention)
    stored = deployment.admin("GET", path)
    if allowed(role, "namespace-policy"):
        assert answer.status == 204, answer
        assert stored == retention
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert stored != retention


def _permissions(deployment: Deployment) -> dict[str, list[str]]:
    return cast(
        dict[str, list[str]],
        deployment.admin("GET", f"/admin/v2/namespaces/{NAMESPACE}/permissions"),
    )


def _may(deployment: Deployment, role: str, action: str) -> bool:
    """Whether ``role`` may now ``produce`` or ``consume`` (a new producer or consumer of a
    topic of the namespace is accepted, or refused with AuthorizationError)."""
    c = deployment.client_as(role)
    try:
        if action == "produce":
            c.create_producer(topic(f"effect-{role}")).close()
        else:
            c.subscribe(topic(f"effect-{role}"), "effect").close()
        return True
    except pulsar.AuthorizationError:
        return False
    finally:
        c.close()


def _takes_effect(deployment: Deployment, role: str, action: str, expected: bool) -> None:
    """A grant or revoke made at the entry is seen there at once (the standalone), and by the
    topic's owner within its 2 s cache of the namespace's grants (the cluster)."""
    if deployment.cluster is None:
        assert _may(deployment, role, action) is expected
    else:
        wait_until(
            lambda: _may(deployment, role, action) is expected,
            f"{role} {'may' if expected else 'may not'} {action} at the owner",
            timeout=10,
        )


@each_role
def test_grant(deployment: Deployment, role: str) -> None:
    grantee = f"granted-by-{role}"
    answer = deployment.http(
        role, "POST", f"/admin/v2/namespaces/{NAMESPACE}/permissions/{grantee}", ["consume"]
    )
    permissions = _permissions(deployment)
    if allowed(role, "grant"):
        assert answer.status == 204, answer
        assert permissions.get(grantee) == ["consume"], permissions
        _takes_effect(deployment, grantee, "consume", True)
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert grantee not in permissions, permissions
        assert not _may(deployment, grantee, "consume")
    # The matrix's own grants are untouched.
    assert permissions[ROLES["produce-only"] or ""] == ["produce"], permissions
    assert permissions[ROLES["consume-only"] or ""] == ["consume"], permissions


@each_role
def test_revoke(deployment: Deployment, role: str) -> None:
    grantee = f"revocable-{role}"
    answer = deployment.http(
        role, "DELETE", f"/admin/v2/namespaces/{NAMESPACE}/permissions/{grantee}"
    )
    permissions = _permissions(deployment)
    if allowed(role, "revoke"):
        assert answer.status == 204, answer
        assert grantee not in permissions, permissions
        _takes_effect(deployment, grantee, "produce", False)
    else:
        _assert_refused(answer, NOT_ADMIN)
        assert permissions.get(grantee) == ["produce"], permissions
        assert _may(deployment, grantee, "produce")


# -- tenants ---------------------------------------------------------------------------------


def _tenant_status(deployment: Deployment, tenant: str) -> int:
    return deployment.http(None, "GET", f"/admin/v2/tenants/{tenant}").status


@each_role
def test_tenant_create(deployment: Deployment, role: str) -> None:
    tenant = f"made-by-{role}"
    info = {"adminRoles": [ROLES[role] or ANONYMOUS_ROLE], "allowedClusters": [CLUSTER_NAME]}
    answer = deployment.http(role, "PUT", f"/admin/v2/tenants/{tenant}", info)
    if allowed(role, "tenant-create"):
        assert answer.status == 204, answer
        assert deployment.admin("GET", f"/admin/v2/tenants/{tenant}") == info
    else:
        _assert_refused(answer, NOT_SUPERUSER)
        assert _tenant_status(deployment, tenant) == 404


@each_role
def test_tenant_delete(deployment: Deployment, role: str) -> None:
    tenant = f"doomed-{role}"
    answer = deployment.http(role, "DELETE", f"/admin/v2/tenants/{tenant}")
    if allowed(role, "tenant-delete"):
        assert answer.status == 204, answer
        assert _tenant_status(deployment, tenant) == 404
    else:
        _assert_refused(answer, NOT_SUPERUSER)
        assert _tenant_status(deployment, tenant) == 200


def test_the_matrix_is_whole() -> None:
    """Every operation has its test above, and each is parametrized over every role."""
    tested = {
        name.removeprefix("test_").replace("_", "-")
        for name, value in globals().items()
        if name.startswith("test_") and callable(value)
    }
    assert set(OPERATIONS) <= tested, set(OPERATIONS) - tested
    assert set(ALLOWED) == set(ROLES)


def test_bad_credentials_with_an_anonymous_role(deployment: Deployment) -> None:
    """A token the broker cannot verify, where an anonymous role is set: refused on both
    sides, never taken for the anonymous role. Binary: CONNECT is refused (AuthenticationError),
    as Pulsar's ServerCnx does for a method it has a provider for. HTTP: 401 (Pulsar's HTTP
    side falls back to the anonymous role here; we refuse, as the binary side does, and say
    so in docs/decisions.md: credentials that were sent and are wrong are an error to report,
    not a request to treat as anonymous).
    """
    forged = jwt.encode({"sub": ROLES["superuser"]}, secrets.token_bytes(32), "HS256")
    with RawConnection(cast(StandaloneProcess, deployment.entry)) as raw:
        raw.command(
            pb.CommandConnect(
                client_version="authz-matrix",
                protocol_version=codec.SERVER_PROTOCOL_VERSION,
                auth_method_name="token",
                auth_data=forged.encode(),
            )
        )
        refused = raw.next_frame()
        assert refused.type == pb.BaseCommand.ERROR, refused.name
        assert refused.body.error == pb.AuthenticationError  # type: ignore[attr-defined]
    base = http_url(deployment.entry)
    tenants = http_call(base, "GET", "/admin/v2/tenants", forged, None)
    lookup = http_call(base, "GET", _lookup_path(topic("forged")), forged, None)
    assert (tenants.status, lookup.status) == (401, 401), (tenants, lookup)
    for answer in (tenants, lookup):
        assert "token not valid" in answer.body["reason"], answer
