"""Bookie configuration: defaults < TOML file < MAGNETAR_* environment < command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from magnetar.bookie.config import BookieConfig
from magnetar.cli import build_parser
from magnetar.common.config import ConfigError, load_config


def load(argv: list[str] = (), environ: dict[str, str] | None = None) -> BookieConfig:
    args = build_parser().parse_args(["bookie", *argv])
    return load_config(BookieConfig, args, environ or {})


def write_toml(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bookie.toml"
    path.write_text(text)
    return str(path)


def test_defaults() -> None:
    config = load()
    assert config == BookieConfig()
    assert config.port == 3181
    assert config.journal_sync is True


def test_precedence_defaults_file_env_cli(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        'port = 4001\nhttp_port = 4002\njournal_dir = "/from/file"\nmax-entry-size = 1000\n'
        "journal_sync = false\ndisk_usage_threshold = 0.97\n",
    )
    env = {"MAGNETAR_HTTP_PORT": "5002", "MAGNETAR_JOURNAL_DIR": "/from/env"}
    config = load(["--config", path, "--journal-dir", "/from/cli"], env)
    assert config.port == 4001  # file only
    assert config.http_port == 5002  # env beats file
    assert config.journal_dir == "/from/cli"  # cli beats env and file
    assert config.max_entry_size == 1000  # dashed key in the file
    assert config.journal_sync is False
    assert config.disk_usage_threshold == 0.97
    assert config.ledger_dir == BookieConfig().ledger_dir  # default untouched


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = 4100\n")
    assert load([], {"MAGNETAR_CONFIG": path}).port == 4100


def test_bool_options_from_cli_and_env() -> None:
    assert load(["--no-journal-sync"]).journal_sync is False
    assert load(["--journal-sync"], {"MAGNETAR_JOURNAL_SYNC": "false"}).journal_sync is True
    assert load([], {"MAGNETAR_JOURNAL_SYNC": "off"}).journal_sync is False
    assert load([], {"MAGNETAR_JOURNAL_SYNC": "yes"}).journal_sync is True


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "port = 1\njournal_dri = 'typo'\n")
    with pytest.raises(ConfigError, match="unknown setting 'journal_dri'"):
        load(["--config", path])


@pytest.mark.parametrize(
    ("argv", "environ", "match"),
    [
        (["--port", "abc"], {}, "option --port: port must be"),
        ([], {"MAGNETAR_PORT": "12x"}, "MAGNETAR_PORT"),
        ([], {"MAGNETAR_JOURNAL_SYNC": "maybe"}, "MAGNETAR_JOURNAL_SYNC"),
        (["--disk-usage-threshold", "high"], {}, "disk_usage_threshold"),
        (["--port", "70000"], {}, "port must be a TCP port"),
        (["--http-port", "-1"], {}, "http_port must be a TCP port"),
        (["--disk-usage-lwm", "0.96"], {}, "disk_usage_lwm"),
        (["--disk-usage-threshold", "1.5", "--disk-usage-lwm", "0.5"], {}, "disk_usage"),
        (["--disk-usage-lwm", "0"], {}, "disk_usage_lwm"),
        (["--max-entry-size", str(100 * 2**20)], {}, "max_entry_size"),
        (["--journal-max-group-bytes", "0"], {}, "journal sizes"),
        (["--compaction-threshold", "1"], {}, "compaction_threshold"),
    ],
)
def test_bad_values_are_clear_config_errors(
    argv: list[str], environ: dict[str, str], match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        load(argv, environ)


def test_bad_value_in_file_names_the_file(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'port = "not a port"\n')
    with pytest.raises(ConfigError, match=r"bookie\.toml.*port"):
        load(["--config", path])


def test_unreadable_or_invalid_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(["--config", str(tmp_path / "missing.toml")])
    path = write_toml(tmp_path, "port = = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load(["--config", path])


def test_help_prints_defaults() -> None:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices["bookie"]  # type: ignore[union-attr]
    text = sub.format_help()
    assert "--journal-dir" in text
    assert "[default: 3181; env MAGNETAR_PORT]" in " ".join(text.split())


def test_cli_exits_2_with_the_error_and_no_traceback(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "bogus_setting = 1\n")
    result = subprocess.run(
        [sys.executable, "-m", "magnetar.cli", "bookie", "--config", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "configuration error" in result.stderr
    assert "bogus_setting" in result.stderr
    assert "Traceback" not in result.stderr
