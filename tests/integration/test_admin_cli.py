"""``magnetar admin`` and ``magnetar client`` as an operator runs them, against one real
standalone: pulsar-admin's verbs and flags, their output, their exit codes, and the effect the
official client sees (messages produced with ``magnetar client`` are consumed with it too)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pulsar
import pytest

from tests.support.raw_client import admin, module_standalone
from tests.support.standalone import QUIET, StandaloneProcess, client


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneProcess]:
    yield from module_standalone(tmp_path_factory.mktemp("admin-cli") / "standalone")


def magnetar(node: StandaloneProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    if argv[0] == "admin":
        argv = ("admin", "--admin-url", f"http://127.0.0.1:{node.http_port}", *argv[1:])
    else:
        argv = (argv[0], "--url", node.url, *argv[1:])
    return subprocess.run(
        [sys.executable, "-m", "magnetar.cli", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(node: StandaloneProcess, *argv: str) -> str:
    done = magnetar(node, *argv)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def test_tenants_namespaces_and_policies(node: StandaloneProcess) -> None:
    ok(node, "admin", "tenants", "create", "acme", "-r", "ops", "-c", "standalone")
    info = json.loads(ok(node, "admin", "tenants", "get", "acme"))
    assert info == {"adminRoles": ["ops"], "allowedClusters": ["standalone"]}
    assert ok(node, "admin", "tenants", "list").split() == ["acme", "public"]
    ok(node, "admin", "namespaces", "create", "acme/orders", "-b", "4")
    assert ok(node, "admin", "namespaces", "list", "acme").split() == ["acme/orders"]
    ok(node, "admin", "namespaces", "set-retention", "acme/orders", "--size", "1G", "--time", "3d")
    retention = json.loads(ok(node, "admin", "namespaces", "get-retention", "acme/orders"))
    assert retention == {"retentionTimeInMinutes": 4320, "retentionSizeInMB": 1024}
    bundles = json.loads(ok(node, "admin", "namespaces", "bundles", "acme/orders"))
    assert bundles["numBundles"] == 4
    refused = magnetar(node, "admin", "tenants", "delete", "acme")
    assert refused.returncode == 1 and refused.stdout == ""
    assert (
        refused.stderr.strip() == "magnetar admin: HTTP 409: The tenant still has active namespaces"
    )
    ok(node, "admin", "namespaces", "delete", "acme/orders")
    ok(node, "admin", "tenants", "delete", "acme")
    [cluster] = ok(node, "admin", "clusters", "list").split()
    assert json.loads(ok(node, "admin", "clusters", "get", cluster))["brokerServiceUrl"]
    assert len(ok(node, "admin", "brokers", "list", cluster).split()) == 1
    usage = magnetar(node, "admin", "topics", "reset-cursor", "x", "-s", "s")
    assert usage.returncode == 2 and "one of -t/--time or -m/--messageId" in usage.stderr


def test_client_produce_consume_and_the_subscription_verbs(node: StandaloneProcess) -> None:
    topic = "persistent://public/default/cli"
    ok(
        node,
        "admin",
        "topics",
        "create-partitioned-topic",
        "persistent://public/default/parts",
        "-p",
        "4",
    )
    meta = json.loads(ok(node, "admin", "topics", "get-partitioned-topic-metadata", "parts"))
    assert meta["partitions"] == 4
    ok(node, "admin", "topics", "create", topic)
    ok(node, "admin", "topics", "create-subscription", topic, "-s", "ops", "-m", "earliest")
    out = ok(node, "client", "produce", topic, "-m", "a,b,c", "-n", "3", "-p", "k=v")
    assert "9 messages successfully produced" in out
    stats = json.loads(ok(node, "admin", "topics", "stats", topic))
    assert stats["msgInCounter"] == 9 and stats["subscriptions"]["ops"]["msgBacklog"] == 9
    peeked = json.loads(ok(node, "admin", "topics", "peek-messages", topic, "-s", "ops", "-n", "2"))
    assert [m["payload"] for m in peeked] == ["a", "b"] and peeked[0]["properties"] == {"k": "v"}
    ok(node, "admin", "topics", "skip", topic, "-s", "ops", "-n", "5")
    stats = json.loads(ok(node, "admin", "topics", "stats", topic))
    assert stats["subscriptions"]["ops"]["msgBacklog"] == 4  # five fewer
    got = ok(node, "client", "consume", topic, "-s", "ops", "-n", "4")
    assert got.count("----- got message -----") == 4 and "content:c" in got
    assert "4 messages successfully consumed" in got
    # Back ten minutes: everything again, from the first message.
    ok(node, "admin", "topics", "reset-cursor", topic, "-s", "ops", "-t", "10m")
    again = ok(node, "client", "consume", topic, "-s", "ops", "-n", "9")
    assert again.count("content:") == 9 and again.index("content:a") < again.index("content:b")
    last = json.loads(ok(node, "admin", "topics", "last-message-id", topic))
    first = json.loads(
        ok(node, "admin", "topics", "examine-message", topic, "-i", "earliest", "-m", "1")
    )
    assert first["payload"] == "a" and first["messageId"].startswith(f"{last['ledgerId']}:")
    by_id = json.loads(
        ok(node, "admin", "topics", "get-message-by-id", topic, "-l", str(last["ledgerId"]),
           "-e", str(last["entryId"]))
    )  # fmt: skip
    assert by_id["payload"] == "c"
    ok(node, "admin", "topics", "expire-messages-all-subscriptions", topic, "-t", "0")
    ok(node, "admin", "topics", "clear-backlog", topic, "-s", "ops")
    assert ok(node, "admin", "topics", "subscriptions", topic).split() == ["ops"]
    ok(node, "admin", "topics", "unsubscribe", topic, "-s", "ops")
    assert ok(node, "admin", "topics", "subscriptions", topic) == ""  # none left
    listed = ok(node, "admin", "topics", "list", "public/default").split()
    assert topic in listed and "persistent://public/default/parts-partition-3" in listed
    ok(node, "admin", "topics", "delete-partitioned-topic", "parts")
    ok(node, "admin", "topics", "delete", topic)
    missing = magnetar(node, "admin", "topics", "stats", topic)
    assert missing.returncode == 1 and missing.stderr.startswith("magnetar admin: HTTP 404: ")


def test_client_says_why_the_broker_refused(node: StandaloneProcess) -> None:
    topic = "persistent://public/default/client-refused"
    ok(node, "admin", "topics", "create", topic)
    ok(node, "admin", "topics", "terminate", topic)
    refused = magnetar(node, "client", "produce", topic, "-m", "x")
    assert refused.returncode == 1, refused.stderr
    assert "magnetar client: TopicTerminated: " in refused.stderr
    assert "Traceback" not in refused.stderr
    missing = magnetar(node, "client", "consume", "persistent://no-tenant/ns/t", "-s", "s")
    assert missing.returncode == 1, missing.stderr
    assert "magnetar client: TopicNotFound: " in missing.stderr
    assert "Traceback" not in missing.stderr


def test_consume_forever_until_interrupted(node: StandaloneProcess) -> None:
    consumer = subprocess.Popen(
        [sys.executable, "-m", "magnetar.cli", "client", "--url", node.url, "consume", "forever",
         "-s", "s", "-n", "0", "-p", "Earliest"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ok(node, "client", "produce", "forever", "-m", "x", "-n", "3")
        deadline = time.monotonic() + 20
        while True:
            stats = json.loads(ok(node, "admin", "topics", "stats", "forever"))
            sub = stats["subscriptions"].get("s")
            if sub and sub["msgOutCounter"] == 3:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.2)
        assert consumer.poll() is None  # -n 0: still consuming
    finally:
        consumer.terminate()
        consumer.wait(10)


def test_every_other_verb_against_the_standalone(
    node: StandaloneProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """The verbs the tests above and docs/admin.md's examples do not run, each against the
    standalone (in this process: a subprocess each would cost seconds), with its effect read
    back where it has one."""
    from magnetar import admin_cli
    from magnetar.cli import build_parser

    url = f"http://127.0.0.1:{node.http_port}"

    def admin(*argv: str) -> object:
        args = build_parser("admin").parse_args(["admin", "--admin-url", url, "--json", *argv])
        code = admin_cli.run(args)
        out, err = capsys.readouterr()
        assert code == 0, (argv, out, err)
        return json.loads(out) if out.strip() else None

    ns, topic, parted = (
        "public/cliall",
        "persistent://public/cliall/t",
        "persistent://public/cliall/p",
    )
    admin("namespaces", "create", ns, "--bundles", "2")
    admin("topics", "create", topic)
    # Clusters, brokers, broker stats.
    admin("clusters", "create", "other", "--url", "http://other:8080")
    admin(
        "clusters",
        "update",
        "other",
        "--url",
        "http://other:8081",
        "--broker-url",
        "pulsar://other:6650",
    )
    assert admin("clusters", "get", "other")["serviceUrl"] == "http://other:8081"  # type: ignore[index]
    admin("clusters", "delete", "other")
    [broker] = admin("brokers", "list", "standalone")  # type: ignore[misc]
    owned = admin("brokers", "namespaces", "standalone", "--url", broker)
    assert any(key.startswith(f"{ns}/") for key in owned)  # type: ignore[union-attr]
    assert admin("brokers", "list-dynamic-config") == []
    assert ns in admin("broker-stats", "topics")  # type: ignore[operator]
    assert admin("namespaces", "topics", ns) == [topic]
    # Namespace policies: set, read back, remove.
    admin("namespaces", "set-retention", ns, "--size", "1G", "--time", "1d")
    admin("namespaces", "remove-retention", ns)
    assert admin("namespaces", "get-retention", ns) is None
    admin("namespaces", "set-message-ttl", ns, "-ttl", "60")
    assert admin("namespaces", "get-message-ttl", ns) == 60
    admin("namespaces", "set-deduplication", ns, "--enable")
    assert admin("namespaces", "get-deduplication", ns) is True
    for name, flag in (
        ("max-producers-per-topic", "-p"),
        ("max-consumers-per-topic", "-c"),
        ("max-consumers-per-subscription", "-c"),
        ("max-unacked-messages-per-consumer", "-c"),
        ("max-unacked-messages-per-subscription", "-c"),
    ):
        admin("namespaces", f"set-{name}", ns, flag, "7")
        assert admin("namespaces", f"get-{name}", ns) == 7, name
        admin("namespaces", f"remove-{name}", ns)
        assert admin("namespaces", f"get-{name}", ns) is None, name
    admin("namespaces", "set-subscription-dispatch-rate", ns, "-md", "100", "-dt", "2")
    rate = admin("namespaces", "get-subscription-dispatch-rate", ns)
    assert rate["dispatchThrottlingRateInMsg"] == 100 and rate["ratePeriodInSecond"] == 2  # type: ignore[index]
    admin("namespaces", "remove-subscription-dispatch-rate", ns)
    assert admin("namespaces", "get-subscription-dispatch-rate", ns) is None
    admin("namespaces", "set-properties", ns, "-p", "team=payments")
    admin("namespaces", "clear-properties", ns)
    assert admin("namespaces", "get-properties", ns) == {}
    admin("namespaces", "set-backlog-quota", ns, "--limitSize", "1G", "-p", "producer_exception")
    admin("namespaces", "remove-backlog-quota", ns)
    assert admin("namespaces", "get-backlog-quotas", ns) == {}
    # pulsar-admin's own flags: -l/--limit for the size, -lt for the time.
    admin("namespaces", "set-backlog-quota", ns, "-l", "2K", "-p", "producer_request_hold")
    admin("namespaces", "set-backlog-quota", ns, "-lt", "1h", "-p", "producer_exception",
          "-t", "message_age")  # fmt: skip
    assert admin("namespaces", "get-backlog-quotas", ns) == {
        "destination_storage": {
            "limitSize": 2048, "limitTime": -1, "policy": "producer_request_hold"
        },
        "message_age": {"limitSize": -1, "limitTime": 3600, "policy": "producer_exception"},
    }  # fmt: skip
    admin("namespaces", "remove-backlog-quota", ns)
    admin("namespaces", "remove-backlog-quota", ns, "-t", "message_age")
    assert admin("namespaces", "get-backlog-quotas", ns) == {}
    admin(
        "namespaces",
        "set-inactive-topic-policies",
        ns,
        "-e",
        "-t",
        "1d",
        "-m",
        "delete_when_no_subscriptions",
    )
    admin("namespaces", "remove-inactive-topic-policies", ns)
    assert admin("namespaces", "get-inactive-topic-policies", ns) is None
    admin("topics", "create-subscription", topic, "-s", "gone")
    admin("namespaces", "unsubscribe", ns, "-s", "gone")
    assert admin("topics", "subscriptions", topic) == []
    # Bundles: unload, split.
    admin("namespaces", "unload", ns)
    first = admin("namespaces", "bundles", ns)["boundaries"][:2]  # type: ignore[index]
    admin("namespaces", "split-bundle", ns, "-b", "_".join(first))
    assert admin("namespaces", "bundles", ns)["numBundles"] == 3  # type: ignore[index]
    # Topics.
    admin("topics", "create-partitioned-topic", parted, "-p", "2")
    admin("topics", "update-partitioned-topic", parted, "-p", "3")
    assert admin("topics", "get-partitioned-topic-metadata", parted)["partitions"] == 3  # type: ignore[index]
    for name, flag in (
        ("max-consumers", "-c"),
        ("max-consumers-per-subscription", "-c"),
        ("max-unacked-messages-on-consumer", "-m"),
        ("max-unacked-messages-on-subscription", "-m"),
    ):
        admin("topics", f"set-{name}", topic, flag, "4")
        assert admin("topics", f"get-{name}", topic) == 4, name
        admin("topics", f"remove-{name}", topic)
        assert admin("topics", f"get-{name}", topic) is None, name
    admin("topics", "set-deduplication", topic, "--enable")
    assert admin("topics", "get-deduplication", topic) is True
    admin("topics", "remove-deduplication", topic)
    assert admin("topics", "get-retention", topic) is None
    admin("topics", "set-message-ttl", topic, "-t", "1h")
    assert admin("topics", "get-message-ttl", topic) == 3600
    admin("topics", "remove-message-ttl", topic)
    assert admin("topics", "get-message-ttl", topic) is None
    for name in ("dispatch-rate", "subscription-dispatch-rate"):
        admin("topics", f"set-{name}", topic, "-md", "10", "-rp")
        rate = admin("topics", f"get-{name}", topic)
        assert rate["dispatchThrottlingRateInMsg"] == 10  # type: ignore[index]
        assert rate["relativeToPublishRate"] is True  # type: ignore[index]
        admin("topics", f"remove-{name}", topic)
        assert admin("topics", f"get-{name}", topic) is None, name
    pc = pulsar.Client(node.url, operation_timeout_seconds=10, logger=QUIET)
    try:
        pc.create_producer(topic).send(b"dated")
    finally:
        pc.close()
    found = admin("topics", "get-message-id", topic, "-d", "2020-01-01T00:00:00")
    assert found["entryId"] == 0 and found["partitionIndex"] == -1  # type: ignore[index]
    admin("topics", "unload", topic)


def test_termination_publish_rate_and_subscription_expiration_verbs(
    node: StandaloneProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run in this process, as the test above (a subprocess each would cost seconds)."""
    from magnetar import admin_cli
    from magnetar.cli import build_parser

    url = f"http://127.0.0.1:{node.http_port}"

    def cli(*argv: str) -> object:
        args = build_parser("admin").parse_args(["admin", "--admin-url", url, "--json", *argv])
        code = admin_cli.run(args)
        out, err = capsys.readouterr()
        assert code == 0, (argv, out, err)
        return json.loads(out) if out.strip() else None

    ns = "public/lifecycle"
    assert admin(node, "PUT", f"/namespaces/{ns}")[0] == 204
    cli("namespaces", "set-publish-rate", ns, "-m", "100")
    rate = {"publishThrottlingRateInMsg": 100, "publishThrottlingRateInByte": -1}
    assert cli("namespaces", "get-publish-rate", ns) == rate
    cli("namespaces", "remove-publish-rate", ns)
    assert cli("namespaces", "get-publish-rate", ns) is None
    cli("namespaces", "set-subscription-expiration-time", ns, "-t", "30")
    assert cli("namespaces", "get-subscription-expiration-time", ns) == 30
    cli("namespaces", "remove-subscription-expiration-time", ns)
    assert cli("namespaces", "get-subscription-expiration-time", ns) is None
    topic = f"persistent://{ns}/t"
    assert admin(node, "PUT", f"/persistent/{ns}/t")[0] == 204
    cli("topics", "set-publish-rate", topic, "-b", "4096")
    own = {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": 4096}
    assert cli("topics", "get-publish-rate", topic) == own
    cli("topics", "remove-publish-rate", topic)
    assert cli("topics", "get-publish-rate", topic) is None
    pc = client(node)
    try:
        producer = pc.create_producer(topic)
        sent = [producer.send(b"a"), producer.send(b"b")]
        last = cli("topics", "terminate", topic)
        assert last == {
            "ledgerId": sent[-1].ledger_id(),
            "entryId": sent[-1].entry_id(),
            "partitionIndex": -1,
        }
        with pytest.raises(pulsar.TopicTerminated):
            pc.create_producer(topic)
    finally:
        pc.close()
    assert admin(node, "PUT", f"/persistent/{ns}/p/partitions", "2")[0] == 204
    ends = cli("topics", "partitioned-terminate", f"persistent://{ns}/p")
    assert sorted(ends) == ["0", "1"]  # type: ignore[arg-type]
    refused = magnetar(node, "admin", "topics", "terminate", f"persistent://{ns}/p")
    assert refused.returncode == 1
    assert "HTTP 405: Termination of a partitioned topic is not allowed" in refused.stderr
