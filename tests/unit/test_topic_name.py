import pytest
from hypothesis import given
from hypothesis import strategies as st

from magnetar.broker.model.topic_name import InvalidTopicNameError, TopicName

part = st.from_regex(r"[a-zA-Z0-9_][-a-zA-Z0-9_.=:]{0,20}", fullmatch=True)


def test_short_forms() -> None:
    assert str(TopicName.parse("my-topic")) == "persistent://public/default/my-topic"
    assert str(TopicName.parse("t1/ns1/x")) == "persistent://t1/ns1/x"
    assert TopicName.parse("non-persistent://a/b/c").persistent is False


def test_partitions() -> None:
    t = TopicName.parse("persistent://public/default/orders-partition-3")
    assert t.partition_index == 3
    assert str(t.partitioned_topic_name) == "persistent://public/default/orders"
    assert TopicName.parse("orders").partition(3) == t
    assert TopicName.parse("orders").partition_index == -1
    assert TopicName.parse("x-partition-abc").partition_index == -1


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "http://a/b/c",
        "a/b",
        "a/b/c/d",
        "persistent://a//c",
        "persistent://a/b/c d",
        "persistent:///b/c",
    ],
)
def test_bad_names(bad: str) -> None:
    with pytest.raises(InvalidTopicNameError):
        TopicName.parse(bad)


@given(st.sampled_from(["persistent", "non-persistent"]), part, part, part)
def test_round_trip(domain: str, tenant: str, namespace: str, local: str) -> None:
    name = f"{domain}://{tenant}/{namespace}/{local}"
    assert str(TopicName.parse(name)) == name
