"""``magnetar client produce|consume``: pulsar-client's two verbs, on the official Python client.

    magnetar client produce my-topic -m "hello" -n 10
    magnetar client produce persistent://public/default/t -m "a,b,c" -k key -p env=test
    magnetar client consume my-topic -s sub -n 0          # until interrupted
    magnetar client consume my-topic -s sub -t Shared -p Earliest -n 5

The flags are pulsar-client's: ``-m/--messages`` (split on ``--separator``, ``,`` by default),
``-n/--num-produce`` (each message this many times), ``-r/--rate`` (messages per second, 0: no
limit), ``-k/--key``, ``-p/--properties key=value``; ``-s/--subscription-name``,
``-t/--subscription-type``, ``-p/--subscription-position``, ``-n/--num-messages`` (0: forever).
``--url`` (or ``--service-url``) and ``--token`` reach the broker; a failure is one line on stderr
and exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

DEFAULT_URL = "pulsar://localhost:6650"
SUBSCRIPTION_TYPES = ("Exclusive", "Shared", "Failover", "Key_Shared")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        "--service-url",
        dest="url",
        default=os.environ.get("MAGNETAR_SERVICE_URL", DEFAULT_URL),
        help=f"the broker or proxy [default: $MAGNETAR_SERVICE_URL or {DEFAULT_URL}]",
    )
    parser.add_argument(
        "--token", default=os.environ.get("MAGNETAR_TOKEN"), help="a JWT [default: $MAGNETAR_TOKEN]"
    )
    parser.add_argument("--tls-trust-cert-path", help="CA bundle for pulsar+ssl:// URLs")
    parser.add_argument("--tls-allow-insecure", action="store_true")
    sub = parser.add_subparsers(dest="client_command", required=True, metavar="VERB")
    p = sub.add_parser("produce", help="send messages")
    p.add_argument("topic")
    p.add_argument("-m", "--messages", action="append", default=[], help="message text(s)")
    p.add_argument("-f", "--files", action="append", default=[], help="a file sent as a message")
    p.add_argument("-n", "--num-produce", type=int, default=1, help="send each this many times")
    p.add_argument("-r", "--rate", type=float, default=0, help="messages per second (0: no limit)")
    p.add_argument("-s", "--separator", default=",", help="splits -m into messages [default: ,]")
    p.add_argument("-k", "--key", help="partitioning key")
    p.add_argument("-p", "--properties", action="append", default=[], help="key=value")
    p.add_argument("-db", "--disable-batching", action="store_true")
    p.set_defaults(func=run, verb=_produce)
    c = sub.add_parser("consume", help="receive messages")
    c.add_argument("topic")
    c.add_argument("-s", "--subscription-name", required=True)
    c.add_argument("-t", "--subscription-type", default="Exclusive", choices=SUBSCRIPTION_TYPES)
    c.add_argument(
        "-p", "--subscription-position", default="Latest", choices=("Latest", "Earliest")
    )
    c.add_argument("-n", "--num-messages", type=int, default=1, help="0: consume forever")
    c.add_argument("-r", "--rate", type=float, default=0, help="messages per second (0: no limit)")
    c.add_argument("--hex", action="store_true", help="print payloads as hex")
    c.add_argument("--receive-timeout", type=float, default=0, help="seconds; 0: wait forever")
    c.set_defaults(func=run, verb=_consume)


def _client(args: argparse.Namespace) -> Any:
    import pulsar

    # The client's own console logger: a Python logger makes the client abort at exit
    # (apache/pulsar-client-python#256).
    kwargs: dict[str, Any] = {"logger": pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn)}
    if args.token:
        kwargs["authentication"] = pulsar.AuthenticationToken(args.token)
    if args.tls_trust_cert_path:
        kwargs["tls_trust_certs_file_path"] = args.tls_trust_cert_path
    if args.tls_allow_insecure:
        kwargs["tls_allow_insecure_connection"] = True
    return pulsar.Client(args.url, **kwargs)


def _pace(rate: float, started: float, done: int) -> None:
    if rate > 0:
        delay = started + done / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def _produce(args: argparse.Namespace) -> int:
    payloads = [
        m.encode()
        for text in args.messages
        for m in (text.split(args.separator) if args.separator else [text])
    ]
    for path in args.files:
        with open(path, "rb") as f:
            payloads.append(f.read())
    if not payloads:
        print("magnetar client: give messages with -m or files with -f", file=sys.stderr)
        return 2
    properties = dict(p.split("=", 1) for p in args.properties if "=" in p)
    client = _client(args)
    try:
        producer = client.create_producer(args.topic, batching_enabled=not args.disable_batching)
        started, sent = time.monotonic(), 0
        for _ in range(args.num_produce):
            for payload in payloads:
                _pace(args.rate, started, sent)
                kwargs: dict[str, Any] = {"properties": properties}
                if args.key:
                    kwargs["partition_key"] = args.key
                producer.send(payload, **kwargs)
                sent += 1
        producer.flush()
        producer.close()
        print(f"{sent} messages successfully produced")
        return 0
    finally:
        client.close()


def _consume(args: argparse.Namespace) -> int:
    import pulsar

    client = _client(args)
    try:
        kind = getattr(pulsar.ConsumerType, args.subscription_type.replace("_", ""))
        position = getattr(pulsar.InitialPosition, args.subscription_position)
        consumer = client.subscribe(
            args.topic,
            args.subscription_name,
            consumer_type=kind,
            initial_position=position,
        )
        timeout = int(args.receive_timeout * 1000) if args.receive_timeout > 0 else None
        started, got = time.monotonic(), 0
        while args.num_messages <= 0 or got < args.num_messages:
            _pace(args.rate, started, got)
            try:
                message = consumer.receive(timeout) if timeout else consumer.receive()
            except pulsar.Timeout:
                break
            data = message.data()
            content = data.hex() if args.hex else data.decode(errors="replace")
            print("----- got message -----")
            print(
                f"key:[{message.partition_key() or 'null'}], "
                f"properties:[{', '.join(f'{k}={v}' for k, v in message.properties().items())}], "
                f"content:{content}",
                flush=True,
            )
            consumer.acknowledge(message)
            got += 1
        print(f"{got} messages successfully consumed")
        consumer.close()
        return 0
    finally:
        client.close()


def run(args: argparse.Namespace) -> int:
    try:
        import pulsar
    except ModuleNotFoundError:
        print(
            "magnetar client: the official client is missing: pip install pulsar-client",
            file=sys.stderr,
        )
        return 1
    try:
        return int(args.verb(args))
    except pulsar.PulsarException as e:
        print(f"magnetar client: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"magnetar client: {e}", file=sys.stderr)
        return 1
