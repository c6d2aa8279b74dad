"""The ``magnetar`` command: one entry point with a subcommand per service and tool."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import uvloop

from magnetar.common.config import ConfigError, add_arguments, load_config
from magnetar.common.metadata import MetadataError
from magnetar.common.runtime import tune_gc


class _RefusedRequestFilter(logging.Filter):
    """aiohttp logs a request its HTTP parser refused (a request line or header over 8190
    bytes, a malformed header) as an ERROR with the parser's traceback; it is the client's
    error, answered 400: one WARNING line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = f"{record.getMessage()}: {exc.message}", ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiohttp.server").addFilter(_RefusedRequestFilter())


async def _run_until_signalled(start, stop) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    try:
        await start()
    except (OSError, MetadataError, ValueError) as e:
        logging.getLogger("magnetar").error("cannot start: %s", e)
        await stop()
        raise SystemExit(1) from None
    try:
        await stopped.wait()
    finally:
        await stop()


def _cmd_bookie(args: argparse.Namespace) -> int:
    from magnetar.bookie.config import BookieConfig
    from magnetar.bookie.service import Bookie

    config = load_config(BookieConfig, args)
    bookie = Bookie(config)
    uvloop.run(_run_until_signalled(bookie.start, bookie.stop))
    return 0


def _cmd_broker(args: argparse.Namespace) -> int:
    from magnetar.broker.broker import Broker
    from magnetar.broker.config import BrokerConfig

    broker = Broker(load_config(BrokerConfig, args))
    uvloop.run(_run_until_signalled(broker.start, broker.stop))
    return 0


def _cmd_standalone(args: argparse.Namespace) -> int:
    from magnetar.standalone import Standalone, StandaloneConfig

    config = load_config(StandaloneConfig, args)
    node = Standalone(config)
    uvloop.run(_run_until_signalled(node.start, node.stop))
    return 0


def _cmd_proxy(args: argparse.Namespace) -> int:
    from magnetar.proxy.config import ProxyConfig
    from magnetar.proxy.proxy import Proxy

    proxy = Proxy(load_config(ProxyConfig, args))
    uvloop.run(_run_until_signalled(proxy.start, proxy.stop))
    return 0


def _cmd_initialize(args: argparse.Namespace) -> int:
    from magnetar import initialize

    return uvloop.run(initialize.run(args))


def _cmd_bk(args: argparse.Namespace) -> int:
    from magnetar import bkshell

    return uvloop.run(bkshell.run(args))


_COMMANDS = {
    "bookie": "run a storage node",
    "broker": "run a broker (Pulsar protocol)",
    "standalone": "run metadata, one bookie and one broker in one process",
    "proxy": "run a proxy: one address for clients, lookups answered, bytes relayed to brokers",
    "perf": "load generators (produce, consume) on the official client",
    "bk": "BookKeeper-style tools (bookiesanity, listledgers, recover, ...)",
    "tokens": "keys and JWTs for the token provider (create-secret-key, create, validate, ...)",
    "admin": "the admin REST from the command line, with pulsar-admin's groups, verbs and flags",
    "client": "produce or consume messages from the command line, as pulsar-client does",
    "initialize-cluster-metadata": "create public/default in a new cluster's metadata store "
    "(idempotent; the Kubernetes init Job)",
}


def _add_command(sub: argparse._SubParsersAction, name: str) -> None:  # type: ignore[type-arg]
    """The subcommand's options; imports only what that command needs."""
    p = sub.add_parser(
        name, help=_COMMANDS[name], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if name == "bookie":
        from magnetar.bookie.config import BookieConfig

        add_arguments(p, BookieConfig)
        p.set_defaults(func=_cmd_bookie)
    elif name == "broker":
        from magnetar.broker.config import BrokerConfig

        add_arguments(p, BrokerConfig)
        p.set_defaults(func=_cmd_broker)
    elif name == "standalone":
        from magnetar.standalone import StandaloneConfig

        add_arguments(p, StandaloneConfig)
        p.set_defaults(func=_cmd_standalone)
    elif name == "proxy":
        from magnetar.proxy.config import ProxyConfig

        add_arguments(p, ProxyConfig)
        p.set_defaults(func=_cmd_proxy)
    elif name == "perf":
        from magnetar import perf

        perf.add_arguments(p)
        p.set_defaults(func=perf.run)
    elif name == "initialize-cluster-metadata":
        from magnetar import initialize

        initialize.add_arguments(p)
        p.set_defaults(func=_cmd_initialize)
    elif name == "admin":
        from magnetar import admin_cli

        admin_cli.add_arguments(p)
        p.set_defaults(func=admin_cli.run)
    elif name == "client":
        from magnetar import client_cli

        client_cli.add_arguments(p)
        p.set_defaults(func=client_cli.run)
    elif name == "tokens":
        from magnetar import tokens

        tokens.add_arguments(p)
        p.set_defaults(func=tokens.run)
    else:
        from magnetar import bkshell

        bkshell.add_arguments(p)
        p.set_defaults(func=_cmd_bk)


def _requested_command(argv: list[str]) -> str | None:
    """The subcommand named on the command line (None: none, e.g. ``magnetar --help``)."""
    tokens = iter(argv)
    for token in tokens:
        if token == "--log-level":
            next(tokens, None)
        elif not token.startswith("-"):
            return token if token in _COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, that subcommand's options alone are built (a
    service process then does not import every other service's modules, ~0.3 s a start)."""
    parser = argparse.ArgumentParser(
        prog="magnetar", description="Magnetar messaging and streaming platform"
    )
    parser.add_argument(
        "--log-level",
        help="DEBUG, INFO, WARNING or ERROR [default: INFO for services, WARNING for tools]",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        if only is None or name == only:
            _add_command(sub, name)
        else:
            sub.add_parser(name, help=_COMMANDS[name])
    return parser


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    parser = build_parser(_requested_command(args_in))
    args = parser.parse_args(args_in)
    _setup_logging(
        args.log_level
        or (
            "WARNING"
            if args.command in ("bk", "perf", "tokens", "initialize-cluster-metadata")
            else "INFO"
        )
    )
    tune_gc()
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"magnetar {args.command}: configuration error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
