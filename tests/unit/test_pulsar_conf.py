"""Pulsar's and BookKeeper's .conf files read by ``--config`` (common/pulsar_conf.py)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.broker.config import BrokerConfig
from magnetar.common.config import ConfigError, load_config
from magnetar.common.pulsar_conf import NOT_PULSARS, metadata_url, parse_properties, translate
from magnetar.proxy.config import ProxyConfig
from magnetar.standalone import StandaloneConfig


def test_properties_syntax_as_java_reads_it() -> None:
    text = (
        "# comment\n"
        "! also a comment\n"
        "  \n"
        "a=1\n"
        "b : two words \n"
        "c three\n"
        "d=\n"
        "e=first,\\\n"
        "   second\n"
        "f=tab\\there\\u0041\n"
        "g\\=h=x\n"
    )
    assert parse_properties(text) == [
        ("a", "1"),
        ("b", "two words "),
        ("c", "three"),
        ("d", ""),
        ("e", "first,second"),
        ("f", "tab\thereA"),
        ("g=h", "x"),
    ]


def test_camel_case_keys_and_pulsar_names_with_units() -> None:
    fields = ["max_message_size", "bookkeeper_tls_key_file_path", "superuser_roles", "port"]
    fields += ["load_balancer_shedding_interval_seconds", "ensemble_size", "http_port"]
    t = translate(
        [
            ("maxMessageSize", "1024"),
            ("bookkeeperTLSKeyFilePath", "/k.pem"),
            ("superUserRoles", "admin"),
            ("brokerServicePort", "6650"),
            ("webServicePort", "8080"),
            ("loadBalancerSheddingIntervalMinutes", "2"),
            ("managedLedgerDefaultEnsembleSize", "3"),
            ("numIOThreads", ""),
            ("zookeeperServers", "z:2181"),
        ],
        fields,
    )
    assert t.values == {
        "max_message_size": "1024",
        "bookkeeper_tls_key_file_path": "/k.pem",
        "superuser_roles": "admin",
        "port": "6650",
        "http_port": "8080",
        "load_balancer_shedding_interval_seconds": 120.0,
        "ensemble_size": "3",
    }
    assert t.unknown == ["zookeeperServers"]


@pytest.mark.parametrize("service", [BrokerConfig, BookieConfig, ProxyConfig])
def test_every_setting_takes_its_camel_case_name(service: type) -> None:
    """Each setting is reached by the camelCase of its name (Pulsar's form of it), except
    those whose words mean something else in Pulsar (NOT_PULSARS). Settings Pulsar names
    otherwise are reached by Pulsar's name too (PULSAR_KEYS, the tests below)."""
    fields = [f.name for f in dataclasses.fields(service)]
    for name in fields:
        head, *rest = name.split("_")
        camel = head + "".join(word[:1].upper() + word[1:] for word in rest)
        t = translate([(camel, "7")], fields)
        if name in NOT_PULSARS:
            assert t.unknown == [camel], name
        else:
            # (the value converted where Pulsar's unit differs, e.g. BookKeeper's ms)
            assert list(t.values) == [name] and t.unknown == [], (name, camel, t)


def test_same_words_other_meaning_is_not_matched() -> None:
    t = translate([("compactionThreshold", "0.5")], ["compaction_threshold"])
    assert t.values == {} and t.unknown == ["compactionThreshold"]


def test_load_balancer_thresholds_take_pulsars_names_and_meanings() -> None:
    """loadBalancerBrokerOverloadedThresholdPercentage is Pulsar's absolute usage bound;
    loadBalancerBrokerThresholdShedderPercentage the ThresholdShedder's margin over the
    average: each lands on the setting of the same meaning."""
    t = translate(
        [
            ("loadBalancerBrokerOverloadedThresholdPercentage", "80"),
            ("loadBalancerBrokerThresholdShedderPercentage", "15"),
            ("loadBalancerOverrideBrokerNicSpeedGbps", "25"),
        ],
        [
            "load_balancer_broker_overloaded_threshold_percentage",
            "load_balancer_broker_threshold_shedder_percentage",
            "load_balancer_override_broker_nic_speed_gbps",
        ],
    )
    assert t.unknown == []
    assert t.values == {
        "load_balancer_broker_overloaded_threshold_percentage": "80",
        "load_balancer_broker_threshold_shedder_percentage": "15",
        "load_balancer_override_broker_nic_speed_gbps": "25",
    }


@pytest.mark.parametrize(
    ("given", "ours"),
    [
        ("etcd:http://a:2379", "etcd://a:2379"),
        ("etcd:http://a:2379,http://b:2379", "etcd://a:2379,b:2379"),
        ("metadata-store:etcd:http://a:2379", "etcd://a:2379"),
        ("etcd://a:2379/ledgers", "etcd://a:2379"),
        ("local:///tmp/meta.db", "local:///tmp/meta.db"),
    ],
)
def test_metadata_urls(given: str, ours: str) -> None:
    assert metadata_url(given) == ours


@pytest.mark.parametrize("zk", ["zk:z1:2181", "z1:2181,z2:2181", "zk+hierarchical://z1:2181/l"])
def test_zookeeper_is_refused_with_advice(zk: str) -> None:
    with pytest.raises(ConfigError, match="etcd"):
        metadata_url(zk)


class Args:
    def __init__(self, config: str) -> None:
        self.config = config


def test_broker_conf(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "broker.conf"
    path.write_text(
        "zookeeperServers=\n"
        "metadataStoreUrl=etcd:http://10.0.0.1:2379\n"
        "brokerServicePort=6660\n"
        "webServicePort=8090\n"
        "brokerServicePortTls=\n"
        "clusterName=west\n"
        "brokerDeduplicationEnabled=true\n"
        "managedLedgerDefaultEnsembleSize=3\n"
        "managedLedgerDefaultWriteQuorum=3\n"
        "managedLedgerDefaultAckQuorum=2\n"
        "defaultRetentionTimeInMinutes=60\n"
        "metadataStoreSessionTimeoutMillis=30000\n"
        "loadBalancerBrokerOverloadedThresholdPercentage=80\n"
        "loadBalancerBrokerThresholdShedderPercentage=15\n"
        "numIOThreads=8\n"
        "managedLedgerCacheEvictionFrequency=100\n"
        "maxMessageSize=5242880\n"
        "exposeTopicLevelMetricsInPrometheus=false\n"
    )
    with caplog.at_level(logging.WARNING):
        config = load_config(BrokerConfig, Args(str(path)), environ={})
    assert config.metadata_url == "etcd://10.0.0.1:2379"
    assert (config.port, config.http_port) == (6660, 8090)
    assert config.cluster_name == "west" and config.deduplication_enabled is True
    assert (config.ensemble_size, config.write_quorum, config.ack_quorum) == (3, 3, 2)
    assert config.default_retention_time_minutes == 60
    assert config.broker_session_ttl_seconds == 30
    assert config.max_message_size == 5242880
    assert config.expose_topic_level_metrics_in_prometheus is False
    assert config.load_balancer_broker_overloaded_threshold_percentage == 80
    assert config.load_balancer_broker_threshold_shedder_percentage == 15
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "numIOThreads, managedLedgerCacheEvictionFrequency" in warnings[0].message


def test_bookkeeper_conf(tmp_path: Path) -> None:
    path = tmp_path / "bookkeeper.conf"
    path.write_text(
        "bookiePort=3182\n"
        "httpServerPort=8001\n"
        "metadataServiceUri=metadata-store:etcd:http://10.0.0.1:2379\n"
        "journalDirectories=/data/journal,/data/journal2\n"
        "ledgerDirectories=/data/ledgers\n"
        "journalSyncData=false\n"
        "journalMaxGroupWaitMSec=2\n"
        "journalBufferedWritesThreshold=1048576\n"
        "dbStorage_writeCacheMaxSizeMb=16\n"
        "gcWaitTime=900000\n"
        "openLedgerRereplicationGracePeriod=30000\n"
        "autoRecoveryDaemonEnabled=false\n"
        "lostBookieRecoveryDelay=5\n"
        "diskUsageThreshold=0.9\n"
        "minorCompactionThreshold=0.2\n"
    )
    config = load_config(BookieConfig, Args(str(path)), environ={})
    assert (config.port, config.http_port) == (3182, 8001)
    assert config.metadata_url == "etcd://10.0.0.1:2379"
    assert (config.journal_dir, config.ledger_dir) == ("/data/journal", "/data/ledgers")
    assert config.journal_sync is False and config.journal_max_group_wait_ms == 2.0
    assert config.write_cache_bytes == 16 * 1024 * 1024
    assert config.journal_max_group_bytes == 1048576
    assert config.gc_interval_s == 900.0
    assert config.open_ledger_rereplication_grace_period == 30.0
    assert config.auto_recovery_daemon_enabled is False
    assert config.lost_bookie_recovery_delay == 5.0 and config.disk_usage_threshold == 0.9


def test_standalone_and_proxy_conf(tmp_path: Path) -> None:
    standalone = tmp_path / "standalone.conf"
    standalone.write_text("brokerServicePort=6651\nwebServicePort=8081\nmaxMessageSize=1000000\n")
    config = load_config(StandaloneConfig, Args(str(standalone)), environ={})
    assert (config.broker_port, config.http_port, config.max_message_size) == (6651, 8081, 10**6)
    proxy = tmp_path / "proxy.conf"
    proxy.write_text(
        "servicePort=6652\nwebServicePort=8082\nbrokerServiceURL=pulsar://b:6650\n"
        "metadataStoreUrl=etcd:http://e:2379\n"
    )
    config = load_config(ProxyConfig, Args(str(proxy)), environ={})
    assert (config.port, config.http_port) == (6652, 8082)
    assert config.broker_service_url == "pulsar://b:6650"
    assert config.metadata_url == "etcd://e:2379"


def test_later_sources_still_win(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("brokerServicePort=6660\n")
    config = load_config(BrokerConfig, Args(str(path)), environ={"MAGNETAR_PORT": "6670"})
    assert config.port == 6670


def test_toml_takes_camel_case_but_refuses_unknown(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text("maxMessageSize = 2048\nbrokerServicePort = 6661\n")
    config = load_config(BrokerConfig, Args(str(path)), environ={})
    assert (config.max_message_size, config.port) == (2048, 6661)
    path.write_text("nonsense = 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'nonsense'"):
        load_config(BrokerConfig, Args(str(path)), environ={})


def test_bad_value_names_the_file_and_setting(tmp_path: Path) -> None:
    path = tmp_path / "broker.conf"
    path.write_text("managedLedgerDefaultEnsembleSize=three\nmetadataStoreUrl=zk:z:2181\n")
    with pytest.raises(ConfigError, match=r"broker\.conf"):
        load_config(BrokerConfig, Args(str(path)), environ={})
