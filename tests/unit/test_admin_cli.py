"""``magnetar admin``'s argument reading: pulsar-admin's times, sizes, topic and message-id forms,
and the REST call each verb makes (no broker needed)."""

from __future__ import annotations

import pytest

from magnetar.admin_cli import UsageError, message_id, seconds, size_bytes, topic_path
from magnetar.cli import build_parser


def test_times_and_sizes_as_pulsar_admin_writes_them() -> None:
    assert [seconds(t) for t in ("30", "30s", "10m", "2h", "3d", "1w", "-1")] == [
        30, 30, 600, 7200, 259200, 604800, -1,
    ]  # fmt: skip
    assert [size_bytes(s) for s in ("500", "10K", "100M", "1G", "-1")] == [
        500, 10240, 100 << 20, 1 << 30, -1,
    ]  # fmt: skip
    for bad in ("ten", "5x", ""):
        with pytest.raises(UsageError):
            seconds(bad)


def test_topic_names_and_message_ids() -> None:
    assert topic_path("persistent://t/ns/x") == "persistent/t/ns/x"
    assert topic_path("non-persistent://t/ns/x") == "non-persistent/t/ns/x"
    assert topic_path("x") == "persistent/public/default/x"
    assert topic_path("t/ns/a b") == "persistent/t/ns/a%20b"
    with pytest.raises(UsageError):
        topic_path("kafka://t/ns/x")
    assert message_id("12:3") == {"ledgerId": 12, "entryId": 3}
    assert message_id("earliest") == {"ledgerId": -1, "entryId": -1}
    with pytest.raises(UsageError):
        message_id("12")


def _call(*argv: str) -> tuple[str, str, object]:
    args = build_parser("admin").parse_args(["admin", *argv])
    return args.admin_call.build(args)


def test_verbs_make_pulsars_rest_calls() -> None:
    assert _call("topics", "create-partitioned-topic", "persistent://t/n/x", "-p", "4") == (
        "PUT", "persistent/t/n/x/partitions", 4,
    )  # fmt: skip
    assert _call("topics", "skip", "t/n/x", "-s", "sub", "-n", "5") == (
        "POST", "persistent/t/n/x/subscription/sub/skip/5", None,
    )  # fmt: skip
    assert _call("namespaces", "set-retention", "t/n", "--size", "1G", "--time", "3d") == (
        "POST",
        "namespaces/t/n/retention",
        {"retentionTimeInMinutes": 4320, "retentionSizeInMB": 1024},
    )
    method, path, _ = _call("topics", "reset-cursor", "t/n/x", "-s", "sub", "-t", "10m")
    assert method == "POST" and path.startswith("persistent/t/n/x/subscription/sub/resetcursor/")
    assert _call("topics", "reset-cursor", "t/n/x", "-s", "s", "-m", "3:4")[2] == {
        "ledgerId": 3, "entryId": 4, "isExcluded": False,
    }  # fmt: skip
    assert _call("tenants", "create", "acme", "-r", "a,b", "-c", "c1") == (
        "PUT", "tenants/acme", {"adminRoles": ["a", "b"], "allowedClusters": ["c1"]},
    )  # fmt: skip
    assert _call("namespaces", "clear-backlog", "t/n", "-s", "sub", "-b", "0x0_0x1") == (
        "POST", "namespaces/t/n/0x0_0x1/clearBacklog/sub", None,
    )  # fmt: skip
    with pytest.raises(UsageError):
        _call("topics", "reset-cursor", "t/n/x", "-s", "sub")


def test_namespace_limit_verbs() -> None:
    assert _call("namespaces", "set-max-producers-per-topic", "t/n", "-p", "3") == (
        "POST", "namespaces/t/n/maxProducersPerTopic", 3,
    )  # fmt: skip
    assert _call("namespaces", "set-max-unacked-messages-per-consumer", "t/n", "-c", "0") == (
        "POST", "namespaces/t/n/maxUnackedMessagesPerConsumer", 0,
    )  # fmt: skip
    assert _call("namespaces", "remove-max-consumers-per-topic", "t/n")[0] == "DELETE"


def test_backlog_quota_and_inactive_topic_verbs() -> None:
    assert _call(
        "namespaces", "set-backlog-quota", "t/n", "--limitSize", "1G", "-p",
        "consumer_backlog_eviction",
    ) == (
        "POST",
        "namespaces/t/n/backlogQuota?backlogQuotaType=destination_storage",
        {"limitSize": 1 << 30, "limitTime": -1, "policy": "consumer_backlog_eviction"},
    )  # fmt: skip
    assert _call(
        "namespaces", "set-inactive-topic-policies", "t/n", "-e", "-t", "1h", "-m",
        "delete_when_no_subscriptions",
    )[2] == {
        "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
        "maxInactiveDurationSeconds": 3600,
        "deleteWhileInactive": True,
    }  # fmt: skip


def test_property_verbs() -> None:
    assert _call("topics", "update-properties", "t/n/x", "-p", "a=1", "-p", "b=x=y") == (
        "PUT", "persistent/t/n/x/properties", {"a": "1", "b": "x=y"},
    )  # fmt: skip
    assert _call("topics", "remove-properties", "t/n/x", "-k", "a b")[1] == (
        "persistent/t/n/x/properties?key=a%20b"
    )
    with pytest.raises(UsageError):
        _call("namespaces", "set-properties", "t/n", "-p", "novalue")


def test_topic_policy_verbs() -> None:
    assert _call("topics", "set-max-producers", "t/n/x", "-p", "2") == (
        "POST", "persistent/t/n/x/maxProducers", 2,
    )  # fmt: skip
    assert _call("topics", "set-message-ttl", "t/n/x", "-t", "1h")[1] == (
        "persistent/t/n/x/messageTTL?messageTTL=3600"
    )
    assert _call("topics", "remove-retention", "t/n/x") == (
        "DELETE", "persistent/t/n/x/retention", None,
    )  # fmt: skip


def test_dispatch_rate_verbs() -> None:
    assert _call("namespaces", "set-dispatch-rate", "t/n", "-md", "100", "-dt", "2") == (
        "POST",
        "namespaces/t/n/dispatchRate",
        {
            "dispatchThrottlingRateInMsg": 100,
            "dispatchThrottlingRateInByte": -1,
            "ratePeriodInSecond": 2,
            "relativeToPublishRate": False,
        },
    )
    assert _call("topics", "get-subscription-dispatch-rate", "t/n/x") == (
        "GET", "persistent/t/n/x/subscriptionDispatchRate", None,
    )  # fmt: skip
