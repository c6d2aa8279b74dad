"""Typed service configuration: defaults < config file < MAGNETAR_* environment < command line.

Each service declares one dataclass whose fields carry a ``help`` text in their metadata. The
same dataclass produces the ``--help`` output (with defaults), reads a TOML file given by
``--config``, and reads environment variables named ``MAGNETAR_<FIELD_NAME>`` (the way
Kubernetes manifests pass settings).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import tomllib
import typing
from collections.abc import Mapping
from typing import Any

ENV_PREFIX = "MAGNETAR_"
PROPERTIES_SUFFIXES = (".conf", ".properties")

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type."""


def setting(default: Any, help: str) -> Any:
    """A config field with its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse(kind: type, raw: Any, source: str, name: str) -> Any:
    if isinstance(raw, kind) and not (kind is int and isinstance(raw, bool)):
        return raw
    text = str(raw).strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text, 0)
        if kind is float:
            return float(text)
        return text
    except ValueError:
        raise ConfigError(f"{source}: {name} must be a {kind.__name__}, got {raw!r}") from None


def _field_types(cls: type) -> dict[str, type]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--config`` and one option per field (default None, so unset options are visible)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="settings file: TOML (keys as below), or Pulsar's/BookKeeper's properties format "
        "(broker.conf, standalone.conf, bookkeeper.conf, proxy.conf; camelCase keys) when it ends "
        "in .conf or .properties",
    )
    for field in dataclasses.fields(cls):
        kind = _field_types(cls)[field.name]
        env = ENV_PREFIX + field.name.upper()
        helptext = f"{field.metadata.get('help', '')} [default: {field.default!r}; env {env}]"
        if kind is bool:
            parser.add_argument(
                _option(field.name),
                dest=field.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=helptext,
            )
        else:
            parser.add_argument(
                _option(field.name),
                dest=field.name,
                default=None,
                metavar=field.name.upper(),
                help=helptext,
            )


def read_config_file(path: str, types: Mapping[str, type]) -> dict[str, Any]:
    """The settings of a TOML file, or of a Java properties file (``.conf``, ``.properties``:
    Pulsar's and BookKeeper's files). Keys may be ours, dashed, or Pulsar's camelCase names
    (``pulsar_conf.translate``). An unknown key stops a TOML file (a typo in our own format); a
    properties file is an operator's Pulsar file, full of settings Magnetar has no use for, so
    its unknown keys are named in one warning."""
    from magnetar.common import pulsar_conf

    properties = path.endswith(PROPERTIES_SUFFIXES)
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    if properties:
        pairs: list[tuple[str, Any]] = pulsar_conf.parse_properties(blob.decode("utf-8"))
    else:
        try:
            pairs = list(tomllib.loads(blob.decode("utf-8")).items())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"config file {path} is not valid TOML: {e} (Pulsar's .conf files must end in "
                ".conf or .properties)"
            ) from None
    try:
        translation = pulsar_conf.translate(pairs, types)
    except ValueError as e:
        raise ConfigError(f"config file {path}: {e}") from None
    if translation.unknown:
        if not properties:
            raise ConfigError(f"config file {path}: unknown setting {translation.unknown[0]!r}")
        log.warning(
            "config file %s: %d keys are not Magnetar settings and were ignored: %s",
            path,
            len(translation.unknown),
            ", ".join(translation.unknown),
        )
    return {
        name: _parse(types[name], raw, f"config file {path}", name)
        for name, raw in translation.values.items()
    }


def load_config(
    cls: type, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Any:
    """Build ``cls`` from its defaults, the ``--config`` file, the environment and ``args``."""
    environ = os.environ if environ is None else environ
    types = _field_types(cls)
    values: dict[str, Any] = {}

    path = getattr(args, "config", None) if args is not None else None
    path = path or environ.get(ENV_PREFIX + "CONFIG")
    if path:
        values.update(read_config_file(path, types))

    for name, kind in types.items():
        env = ENV_PREFIX + name.upper()
        if env in environ:
            values[name] = _parse(kind, environ[env], f"environment {env}", name)

    if args is not None:
        for name, kind in types.items():
            raw = getattr(args, name, None)
            if raw is not None:
                values[name] = _parse(kind, raw, f"option {_option(name)}", name)

    config = cls(**values)
    validate = getattr(config, "validate", None)
    if validate is not None:
        validate()
    return config
