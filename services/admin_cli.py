"""``magnetar admin``: pulsar-admin's command groups, verbs and flags on Magnetar's admin REST.

``magnetar admin [--admin-url URL] [--token T] GROUP VERB ARGS``, for example::

    magnetar admin tenants create acme
    magnetar admin namespaces create acme/orders --bundles 8
    magnetar admin namespaces set-retention acme/orders --size 1G --time 3d
    magnetar admin topics create-partitioned-topic persistent://acme/orders/in -p 4
    magnetar admin topics stats persistent://acme/orders/in
    magnetar admin topics reset-cursor persistent://acme/orders/in -s billing -t 10m
    magnetar admin topics peek-messages persistent://acme/orders/in -s billing -n 5

Each verb is one REST call (the table :data:`VERBS`); a redirect to the topic's owner is followed
with the same method and body, as pulsar-admin does. Output is for people by default (lists one
per line, documents as indented JSON, which is Pulsar's JSON for stats); ``--json`` prints every
answer as JSON. A refused call prints one line, ``magnetar admin: HTTP <status>: <reason>``, and
exits 1 (2 for a usage error).
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import os
import re
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ADMIN_URL = "http://localhost:8080"
MAX_REDIRECTS = 5

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_UNITS_B = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class UsageError(Exception):
    """A flag's value cannot be used (exit 2)."""


class AdminCallError(Exception):
    """The broker refused the call, or could not be reached (exit 1)."""


def seconds(text: str) -> int:
    """pulsar-admin's relative times: ``30s``, ``10m``, ``2h``, ``3d``, ``1w``, ``1y``, or plain
    seconds; ``-1`` is kept (no limit)."""
    match = re.fullmatch(r"(-?\d+)([smhdwy]?)", text.strip().lower())
    if match is None:
        raise UsageError(f"not a time: {text!r} (e.g. 30s, 10m, 2h, 3d, 1w)")
    value = int(match.group(1))
    return value if value < 0 else value * _UNITS_S.get(match.group(2) or "s", 1)


def size_bytes(text: str) -> int:
    """pulsar-admin's sizes: ``500``, ``10K``, ``100M``, ``1G``, ``2T``; ``-1`` is kept."""
    match = re.fullmatch(r"(-?\d+)([kmgt]?)b?", text.strip().lower())
    if match is None:
        raise UsageError(f"not a size: {text!r} (e.g. 100M, 1G)")
    value = int(match.group(1))
    return value if value < 0 else value * _UNITS_B.get(match.group(2), 1)


def topic_path(name: str) -> str:
    """``persistent://t/ns/x`` (or ``t/ns/x``, or a bare ``x`` in public/default) as the REST
    path ``persistent/t/ns/x``."""
    domain, sep, rest = name.partition("://")
    if not sep:
        domain, rest = "persistent", name
    if domain not in ("persistent", "non-persistent"):
        raise UsageError(f"not a topic: {name!r} (persistent://tenant/namespace/topic)")
    parts = rest.split("/")
    if len(parts) == 1:
        parts = ["public", "default", *parts]
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"not a topic: {name!r} (persistent://tenant/namespace/topic)")
    return "/".join([domain, *(urllib.parse.quote(p, safe="") for p in parts)])


def namespace_path(name: str) -> str:
    parts = name.split("/")
    if len(parts) != 2 or not all(parts):
        raise UsageError(f"not a namespace: {name!r} (tenant/namespace)")
    return name


def message_id(text: str) -> dict[str, int]:
    """``ledger:entry`` (as pulsar-admin prints ids), ``earliest`` or ``latest``."""
    if text == "earliest":
        return {"ledgerId": -1, "entryId": -1}
    if text == "latest":
        return {"ledgerId": 2**63 - 1, "entryId": 2**63 - 1}
    parts = text.split(":")
    try:
        return {"ledgerId": int(parts[0]), "entryId": int(parts[1])}
    except (ValueError, IndexError):
        raise UsageError(f"not a message id: {text!r} (ledgerId:entryId)") from None


# -- the REST client ---------------------------------------------------------------------------


@dataclass(slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body as JSON; a body that is not JSON (``brokers/health``'s ``ok``) as text."""
        if not self.body:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return self.body.decode(errors="replace").strip()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # followed by AdminClient with the same method and body


@dataclass
class AdminClient:
    """Calls ``/admin/v2/...`` at ``url``, with a token and TLS settings when given."""

    url: str = DEFAULT_ADMIN_URL
    token: str | None = None
    basic: str | None = None
    trust_cert: str | None = None
    insecure: bool = False
    cert: tuple[str, str] | None = None
    timeout: float = 60.0
    _opener: urllib.request.OpenerDirector | None = field(default=None, repr=False)

    def _open(self) -> urllib.request.OpenerDirector:
        if self._opener is None:
            context = ssl.create_default_context(cafile=self.trust_cert)
            if self.insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if self.cert is not None:
                context.load_cert_chain(*self.cert)
            self._opener = urllib.request.build_opener(
                _NoRedirect(), urllib.request.HTTPSHandler(context=context)
            )
        return self._opener

    def call(self, method: str, path: str, body: Any = None, *, raw: bool = False) -> Answer:
        """One call; redirects followed; an error status raises :class:`AdminCallError`."""
        # A path from the root (``/lookup/...``) as given; others under ``/admin/v2/``.
        url = self.url.rstrip("/") + (path if path.startswith("/") else "/admin/v2/" + path)
        data = None
        if body is not None:
            data = body if raw else json.dumps(body).encode()
        for _ in range(MAX_REDIRECTS + 1):
            request = urllib.request.Request(url, data=data, method=method)
            if data is not None:
                request.add_header("Content-Type", "application/json")
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            elif self.basic:
                encoded = base64.b64encode(self.basic.encode()).decode()
                request.add_header("Authorization", f"Basic {encoded}")
            try:
                with self._open().open(request, timeout=self.timeout) as response:
                    return Answer(response.status, dict(response.headers), response.read())
            except urllib.error.HTTPError as e:
                if e.code in (301, 302, 307, 308) and e.headers.get("Location"):
                    url = urllib.parse.urljoin(url, e.headers["Location"])
                    continue
                raise AdminCallError(f"HTTP {e.code}: {_reason(e.code, e.read())}") from None
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, "reason", e)
                raise AdminCallError(f"cannot reach {self.url}: {reason}") from None
        raise AdminCallError(f"more than {MAX_REDIRECTS} redirects from {self.url}")


def _reason(status: int, body: bytes) -> str:
    try:
        return str(json.loads(body)["reason"])
    except (ValueError, KeyError, TypeError):
        text = body.decode(errors="replace").strip()
        return text[:300] or {401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}.get(
            status, "error"
        )


# -- the verbs ---------------------------------------------------------------------------------

Build = Callable[[argparse.Namespace], tuple[str, str, Any]]
Show = Callable[[AdminClient, argparse.Namespace, Answer], Any]


@dataclass(slots=True, frozen=True)
class Verb:
    help: str
    build: Build  # args -> (method, path, body)
    flags: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = ()
    positional: tuple[str, ...] = ()
    show: Show | None = None  # what to print, from the answer (default: its JSON)


def _flag(*names: str, **kwargs: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    return names, kwargs


SUB = _flag("-s", "--subscription", required=True, help="subscription name")
FORCE = _flag("-f", "--force", action="store_true", help="even with clients connected")
BOOKIE = _flag("-b", "--bookie", required=True, help="bookie address (host:port)")


def _bookie_rack(args: argparse.Namespace) -> str:
    return "bookies/racks-info/" + urllib.parse.quote(args.bookie, safe=":")


def _topic(args: argparse.Namespace, suffix: str = "") -> str:
    return topic_path(args.topic) + suffix


def _sub(args: argparse.Namespace, suffix: str = "") -> str:
    return _topic(args, f"/subscription/{urllib.parse.quote(args.subscription, safe='')}{suffix}")


def _force(args: argparse.Namespace) -> str:
    return "?force=true" if args.force else ""


def _replicated_status(args: argparse.Namespace) -> tuple[str, str, Any]:
    if args.enable == args.disable:
        raise UsageError(
            "set-replicated-subscription-status needs one of -e/--enable or -d/--disable"
        )
    return "POST", _sub(args, "/replicatedSubscriptionStatus"), bool(args.enable)


def _reset_cursor(args: argparse.Namespace) -> tuple[str, str, Any]:
    if (args.time is None) == (args.messageId is None):
        raise UsageError("reset-cursor needs one of -t/--time or -m/--messageId")
    if args.time is not None:
        at = int(time.time() * 1000) - seconds(args.time) * 1000
        return "POST", _sub(args, f"/resetcursor/{at}"), None
    body = {**message_id(args.messageId), "isExcluded": bool(args.exclude_reset_position)}
    return "POST", _sub(args, "/resetcursor"), body


def _peek(client: AdminClient, args: argparse.Namespace, first: Answer) -> list[dict[str, Any]]:
    """The subscription's next ``count`` messages, entry by entry (a call each, as pulsar-admin
    peeks), a batch split into its messages; fewer when the backlog has fewer."""
    shown = _messages(first)
    n = 1
    while len(shown) < args.count:
        n += 1
        try:
            answer = client.call("GET", _sub(args, f"/position/{n}"))
        except AdminCallError as e:
            if str(e).startswith("HTTP 404"):
                break  # fewer messages than asked for: those there are
            raise
        shown.extend(_messages(answer))
    return shown[: args.count]


def _text(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


def _messages(answer: Answer) -> list[dict[str, Any]]:
    """The messages of one answered entry: Pulsar answers a batch's whole payload with its size
    in ``X-Pulsar-num-batch-message``; its messages carry their own properties and keys."""
    from magnetar.common.protocol.codec import split_batch

    headers = {k.lower(): v for k, v in answer.headers.items()}
    properties = {
        k[len("x-pulsar-property-") :]: v
        for k, v in answer.headers.items()
        if k.lower().startswith("x-pulsar-property-")
    }
    common = {
        "messageId": headers.get("x-pulsar-message-id"),
        "publishTime": headers.get("x-pulsar-publish-time"),
        "producerName": headers.get("x-pulsar-producer-name"),
    }
    if "x-pulsar-num-batch-message" not in headers:
        return [{**common, "properties": properties, "payload": _text(answer.body)}]
    found = []
    batch = split_batch(answer.body, int(headers["x-pulsar-num-batch-message"]))
    for index, (single, data) in enumerate(batch):
        found.append(
            {
                **common,
                "messageId": f"{common['messageId']}:{index}",
                "key": single.partition_key or None,
                "properties": {p.key: p.value for p in single.properties},
                "payload": _text(data),
            }
        )
    return found


def _text_show(client: AdminClient, args: argparse.Namespace, answer: Answer) -> Any:
    return answer.body.decode(errors="replace").strip()


def _message_show(client: AdminClient, args: argparse.Namespace, answer: Answer) -> Any:
    messages = _messages(answer)
    return messages[0] if len(messages) == 1 else messages


CLUSTER_FLAGS = (
    _flag("--url", default="", help="the cluster's HTTP service URL (serviceUrl)"),
    _flag("--url-secure", default="", help="its HTTPS service URL (serviceUrlTls)"),
    _flag("--broker-url", default="", help="its binary service URL (brokerServiceUrl)"),
    _flag("--broker-url-secure", default="", help="its TLS binary URL (brokerServiceUrlTls)"),
)


def _cluster_body(args: argparse.Namespace) -> dict[str, str]:
    """Pulsar's ClusterData from pulsar-admin's flags."""
    return {
        "serviceUrl": args.url,
        "serviceUrlTls": args.url_secure,
        "brokerServiceUrl": args.broker_url,
        "brokerServiceUrlTls": args.broker_url_secure,
    }


def _policy(name: str) -> Callable[[argparse.Namespace], str]:
    return lambda a: f"namespaces/{namespace_path(a.namespace)}/{name}"


def _get_message_id(args: argparse.Namespace) -> tuple[str, str, Any]:
    try:
        moment = datetime.datetime.fromisoformat(args.datetime)
    except ValueError:
        raise UsageError(f"not a date and time: {args.datetime!r} (ISO 8601)") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return "GET", _topic(args, f"/messageid/{int(moment.timestamp() * 1000)}"), None


def _bundle_or_all(args: argparse.Namespace, action: str) -> str:
    namespace = namespace_path(args.namespace)
    if getattr(args, "bundle", None):
        return f"namespaces/{namespace}/{args.bundle}/{action}"
    return f"namespaces/{namespace}/{action}"


def _enable(args: argparse.Namespace) -> bool:
    if args.enable == args.disable:
        raise UsageError("give one of -e/--enable or -d/--disable")
    return bool(args.enable)


def _backlog_quota(args: argparse.Namespace) -> tuple[str, str, Any]:
    body = {
        "limitSize": size_bytes(args.limitSize) if args.limitSize else -1,
        "limitTime": seconds(args.limitTime) if args.limitTime else -1,
        "policy": args.policy,
    }
    path = f"{_policy('backlogQuota')(args)}?backlogQuotaType={args.type}"
    return "POST", path, body


def _inactive_topics(args: argparse.Namespace) -> tuple[str, str, Any]:
    if args.enable_delete_while_inactive == args.disable_delete_while_inactive:
        raise UsageError("give one of -e/--enable-delete-while-inactive or -d/--disable-...")
    body = {
        "inactiveTopicDeleteMode": args.delete_mode,
        "maxInactiveDurationSeconds": seconds(args.max_inactive_duration),
        "deleteWhileInactive": bool(args.enable_delete_while_inactive),
    }
    return "POST", _policy("inactiveTopicPolicies")(args), body


def _properties(args: argparse.Namespace) -> dict[str, str]:
    found = {}
    for item in args.property:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"not a property: {item!r} (key=value)")
        found[key] = value
    return found


def _tenant_body(args: argparse.Namespace) -> dict[str, list[str]]:
    def names(text: str | None) -> list[str]:
        return [n for n in (text or "").split(",") if n]

    return {
        "adminRoles": names(args.admin_roles),
        "allowedClusters": names(args.allowed_clusters),
    }


def _limit_verbs() -> dict[str, Verb]:
    """``set-|get-|remove-max-...`` for the namespace limits, with pulsar-admin's flags."""
    verbs: dict[str, Verb] = {}
    for name, policy, flag in (
        ("max-producers-per-topic", "maxProducersPerTopic", ("-p", "--max-producers-per-topic")),
        ("max-consumers-per-topic", "maxConsumersPerTopic", ("-c", "--max-consumers-per-topic")),
        (
            "max-consumers-per-subscription",
            "maxConsumersPerSubscription",
            ("-c", "--max-consumers-per-subscription"),
        ),
        (
            "max-unacked-messages-per-consumer",
            "maxUnackedMessagesPerConsumer",
            ("-c", "--max-unacked-messages-per-consumer"),
        ),
        (
            "max-unacked-messages-per-subscription",
            "maxUnackedMessagesPerSubscription",
            ("-c", "--max-unacked-messages-per-subscription"),
        ),
    ):
        dest = flag[1].removeprefix("--").replace("-", "_")
        path = _policy(policy)
        verbs[f"set-{name}"] = Verb(
            f"set {name.replace('-', ' ')} (0: no limit)",
            lambda a, path=path, dest=dest: ("POST", path(a), getattr(a, dest)),
            (_flag(*flag, dest=dest, type=int, required=True),),
            ("namespace",),
        )
        verbs[f"get-{name}"] = Verb(
            f"{name.replace('-', ' ')}",
            lambda a, path=path: ("GET", path(a), None),
            (),
            ("namespace",),
        )
        verbs[f"remove-{name}"] = Verb(
            f"back to the broker's {name.replace('-', ' ')}",
            lambda a, path=path: ("DELETE", path(a), None),
            (),
            ("namespace",),
        )
    return verbs


def _topic_policy_verbs() -> dict[str, Verb]:
    """``topics set-|get-|remove-...`` for a topic's own policies, with pulsar-admin's flags."""
    verbs: dict[str, Verb] = {}
    numbers = (
        ("max-producers", "maxProducers", ("-p", "--max-producers")),
        ("max-consumers", "maxConsumers", ("-c", "--max-consumers")),
        (
            "max-consumers-per-subscription",
            "maxConsumersPerSubscription",
            ("-c", "--max-consumers-per-subscription"),
        ),
        (
            "max-unacked-messages-on-consumer",
            "maxUnackedMessagesOnConsumer",
            ("-m", "--maxNum"),
        ),
        (
            "max-unacked-messages-on-subscription",
            "maxUnackedMessagesOnSubscription",
            ("-m", "--maxNum"),
        ),
    )
    for name, segment, flag in numbers:
        dest = flag[1].removeprefix("--").replace("-", "_")
        verbs[f"set-{name}"] = Verb(
            f"the topic's own {name.replace('-', ' ')} (0: no limit)",
            lambda a, s=segment, d=dest: ("POST", _topic(a, f"/{s}"), getattr(a, d)),
            (_flag(*flag, dest=dest, type=int, required=True),),
            ("topic",),
        )
    verbs["set-retention"] = Verb(
        "the topic's own retention",
        lambda a: (
            "POST",
            _topic(a, "/retention"),
            {
                "retentionTimeInMinutes": max(seconds(a.time) // 60, -1),
                "retentionSizeInMB": max(size_bytes(a.size) // (1 << 20), -1),
            },
        ),
        (
            _flag("-s", "--size", required=True, help="e.g. 100M, 1G; -1: no limit"),
            _flag("-t", "--time", required=True, help="e.g. 3h, 3d; -1: no limit"),
        ),
        ("topic",),
    )
    verbs["set-message-ttl"] = Verb(
        "the topic's own message TTL",
        lambda a: ("POST", _topic(a, f"/messageTTL?messageTTL={seconds(a.ttl)}"), None),
        (_flag("-t", "--ttl", required=True, help="e.g. 3600, 1h"),),
        ("topic",),
    )
    verbs["set-compaction-threshold"] = Verb(
        "the topic's own compaction threshold: compact once this much backlog awaits it",
        lambda a: ("POST", _topic(a, "/compactionThreshold"), size_bytes(a.threshold)),
        (_flag("-t", "--threshold", required=True, help="e.g. 10M, 1G; 0: never"),),
        ("topic",),
    )
    verbs["set-deduplication"] = Verb(
        "the topic's own deduplication",
        lambda a: ("POST", _topic(a, "/deduplicationEnabled"), _enable(a)),
        (
            _flag("-e", "--enable", action="store_true"),
            _flag("-d", "--disable", action="store_true"),
        ),
        ("topic",),
    )
    every = [(n, s) for n, s, _ in numbers] + [
        ("retention", "retention"),
        ("message-ttl", "messageTTL"),
        ("deduplication", "deduplicationEnabled"),
        ("compaction-threshold", "compactionThreshold"),
    ]
    for name, segment in every:
        verbs[f"get-{name}"] = Verb(
            f"the topic's own {name.replace('-', ' ')} (null: the namespace's applies)",
            lambda a, s=segment: ("GET", _topic(a, f"/{s}"), None),
            (),
            ("topic",),
        )
        verbs[f"remove-{name}"] = Verb(
            f"back to the namespace's {name.replace('-', ' ')}",
            lambda a, s=segment: ("DELETE", _topic(a, f"/{s}"), None),
            (),
            ("topic",),
        )
    return verbs


def _rate_verbs(path: Callable[[argparse.Namespace, str], str], what: str) -> dict[str, Verb]:
    """``set-|get-|remove-(subscription-)dispatch-rate`` with pulsar-admin's flags."""
    positional = ("namespace" if what == "a namespace" else "topic",)
    verbs: dict[str, Verb] = {}
    for name, segment in (
        ("dispatch-rate", "dispatchRate"),
        ("subscription-dispatch-rate", "subscriptionDispatchRate"),
    ):
        verbs[f"set-{name}"] = Verb(
            f"the {name.replace('-', ' ')} of {what}",
            lambda a, s=segment: (
                "POST",
                path(a, s),
                {
                    "dispatchThrottlingRateInMsg": a.msg_dispatch_rate,
                    "dispatchThrottlingRateInByte": a.byte_dispatch_rate,
                    "ratePeriodInSecond": a.dispatch_rate_period,
                    "relativeToPublishRate": a.relative_to_publish_rate,
                },
            ),
            (
                _flag("-md", "--msg-dispatch-rate", type=int, default=-1),
                _flag("-bd", "--byte-dispatch-rate", type=int, default=-1),
                _flag("-dt", "--dispatch-rate-period", type=int, default=1),
                _flag(
                    "-rp",
                    "--relative-to-publish-rate",
                    action="store_true",
                    help="the limits are over the topic's publish rate",
                ),
            ),
            positional,
        )
        verbs[f"get-{name}"] = Verb(
            f"the {name.replace('-', ' ')}",
            lambda a, s=segment: ("GET", path(a, s), None),
            (),
            positional,
        )
        verbs[f"remove-{name}"] = Verb(
            f"no {name.replace('-', ' ')}",
            lambda a, s=segment: ("DELETE", path(a, s), None),
            (),
            positional,
        )
    return verbs


def _publish_rate_verbs(path: Callable[[argparse.Namespace], str], what: str) -> dict[str, Verb]:
    """``set-|get-|remove-publish-rate`` with pulsar-admin's flags."""
    positional = ("namespace" if what == "a namespace" else "topic",)
    return {
        "set-publish-rate": Verb(
            f"messages and bytes a second per topic, for {what} (-1: no limit); a producer over "
            "it is paused, never refused",
            lambda a: (
                "POST",
                path(a),
                {
                    "publishThrottlingRateInMsg": a.msg_publish_rate,
                    "publishThrottlingRateInByte": a.byte_publish_rate,
                },
            ),
            (
                _flag("-m", "--msg-publish-rate", type=int, default=-1),
                _flag("-b", "--byte-publish-rate", type=int, default=-1),
            ),
            positional,
        ),
        "get-publish-rate": Verb(
            "the publish rate", lambda a: ("GET", path(a), None), (), positional
        ),
        "remove-publish-rate": Verb(
            "no publish rate of its own", lambda a: ("DELETE", path(a), None), (), positional
        ),
    }


VERBS: dict[str, dict[str, Verb]] = {
    "clusters": {
        "list": Verb("list the clusters", lambda a: ("GET", "clusters", None)),
        "get": Verb(
            "a cluster's data", lambda a: ("GET", f"clusters/{a.cluster}", None), (), ("cluster",)
        ),
        "create": Verb(
            "register a cluster (in the configuration store the clusters share)",
            lambda a: ("PUT", f"clusters/{a.cluster}", _cluster_body(a)),
            CLUSTER_FLAGS,
            ("cluster",),
        ),
        "update": Verb(
            "replace a cluster's URLs",
            lambda a: ("POST", f"clusters/{a.cluster}", _cluster_body(a)),
            CLUSTER_FLAGS,
            ("cluster",),
        ),
        "delete": Verb(
            "remove a cluster",
            lambda a: ("DELETE", f"clusters/{a.cluster}", None),
            (),
            ("cluster",),
        ),
    },
    "brokers": {
        "list": Verb(
            "active brokers of a cluster",
            lambda a: ("GET", f"brokers/{a.cluster}", None),
            (),
            ("cluster",),
        ),
        "leader-broker": Verb("the leader broker", lambda a: ("GET", "brokers/leaderBroker", None)),
        "namespaces": Verb(
            "bundles a broker owns",
            lambda a: ("GET", f"brokers/{a.cluster}/{a.url}/ownedNamespaces", None),
            (_flag("--url", required=True, help="the broker's id"),),
            ("cluster",),
        ),
        "healthcheck": Verb("the broker's health", lambda a: ("GET", "brokers/health", None)),
        "version": Verb(
            "the broker's version", lambda a: ("GET", "brokers/version", None), show=_text_show
        ),
        "get-runtime-config": Verb(
            "every setting in force (secrets masked)",
            lambda a: ("GET", "brokers/configuration/runtime", None),
        ),
        "list-dynamic-config": Verb(
            "settings changeable at runtime", lambda a: ("GET", "brokers/configuration", None)
        ),
    },
    "broker-stats": {
        "topics": Verb(
            "stats of every topic served", lambda a: ("GET", "broker-stats/topics", None)
        ),
        "load-report": Verb(
            "the broker's load report", lambda a: ("GET", "broker-stats/load-report", None)
        ),
    },
    "bookies": {
        "list-bookies": Verb("the registered bookies", lambda a: ("GET", "bookies/all", None)),
        "racks-placement": Verb(
            "every bookie's rack, by group", lambda a: ("GET", "bookies/racks-info", None)
        ),
        "get-bookie-rack": Verb(
            "a bookie's rack",
            lambda a: ("GET", _bookie_rack(a), None),
            (BOOKIE,),
        ),
        "set-bookie-rack": Verb(
            "set a bookie's rack (and group)",
            lambda a: (
                "POST",
                _bookie_rack(a) + "?group=" + urllib.parse.quote(a.group, safe=""),
                {"rack": a.rack} | ({"hostname": a.hostname} if a.hostname else {}),
            ),
            (
                BOOKIE,
                _flag("-r", "--rack", required=True, help="rack name"),
                _flag("--hostname", help="the bookie's host name"),
                _flag("-g", "--group", default="default", help="group [default: default]"),
            ),
        ),
        "delete-bookie-rack": Verb(
            "remove a bookie's rack", lambda a: ("DELETE", _bookie_rack(a), None), (BOOKIE,)
        ),
    },
    "tenants": {
        "list": Verb("list tenants", lambda a: ("GET", "tenants", None)),
        "get": Verb(
            "a tenant's info", lambda a: ("GET", f"tenants/{a.tenant}", None), (), ("tenant",)
        ),
        "create": Verb(
            "create a tenant",
            lambda a: ("PUT", f"tenants/{a.tenant}", _tenant_body(a)),
            (
                _flag("-r", "--admin-roles", help="comma-separated admin roles"),
                _flag("-c", "--allowed-clusters", help="comma-separated clusters"),
            ),
            ("tenant",),
        ),
        "update": Verb(
            "replace a tenant's admin roles and clusters",
            lambda a: ("POST", f"tenants/{a.tenant}", _tenant_body(a)),
            (
                _flag("-r", "--admin-roles", help="comma-separated admin roles"),
                _flag("-c", "--allowed-clusters", help="comma-separated clusters"),
            ),
            ("tenant",),
        ),
        "delete": Verb(
            "delete a tenant (it must have no namespaces)",
            lambda a: ("DELETE", f"tenants/{a.tenant}", None),
            (),
            ("tenant",),
        ),
    },
    "namespaces": {
        "list": Verb(
            "a tenant's namespaces",
            lambda a: ("GET", f"namespaces/{a.tenant}", None),
            (),
            ("tenant",),
        ),
        "create": Verb(
            "create a namespace",
            lambda a: (
                "PUT",
                f"namespaces/{namespace_path(a.namespace)}",
                {
                    **({"bundles": {"numBundles": a.bundles}} if a.bundles else {}),
                    **({"replication_clusters": a.clusters.split(",")} if a.clusters else {}),
                }
                or None,
            ),
            (
                _flag("-b", "--bundles", type=int, help="number of bundles"),
                _flag("-c", "--clusters", help="replication clusters, comma separated"),
            ),
            ("namespace",),
        ),
        "delete": Verb(
            "delete a namespace (it must have no topics, unless --force)",
            lambda a: ("DELETE", f"namespaces/{namespace_path(a.namespace)}{_force(a)}", None),
            (FORCE,),
            ("namespace",),
        ),
        "topics": Verb(
            "a namespace's topics",
            lambda a: ("GET", f"namespaces/{namespace_path(a.namespace)}/topics", None),
            (),
            ("namespace",),
        ),
        "policies": Verb(
            "a namespace's policies",
            lambda a: ("GET", f"namespaces/{namespace_path(a.namespace)}", None),
            (),
            ("namespace",),
        ),
        "bundles": Verb(
            "a namespace's bundles",
            lambda a: ("GET", f"namespaces/{namespace_path(a.namespace)}/bundles", None),
            (),
            ("namespace",),
        ),
        "unload": Verb(
            "unload a namespace, or one bundle",
            lambda a: ("PUT", _bundle_or_all(a, "unload"), None),
            (_flag("-b", "--bundle", help="the bundle, 0x00000000_0x40000000"),),
            ("namespace",),
        ),
        "split-bundle": Verb(
            "split a bundle in two",
            lambda a: (
                "PUT",
                f"namespaces/{namespace_path(a.namespace)}/{a.bundle}/split"
                + ("?unload=true" if a.unload else ""),
                None,
            ),
            (
                _flag("-b", "--bundle", required=True, help="the bundle to split"),
                _flag("-u", "--unload", action="store_true", help="unload the new bundles"),
            ),
            ("namespace",),
        ),
        "set-retention": Verb(
            "keep acknowledged messages for a time and size",
            lambda a: (
                "POST",
                _policy("retention")(a),
                {
                    "retentionTimeInMinutes": max(seconds(a.time) // 60, -1),
                    "retentionSizeInMB": max(size_bytes(a.size) // (1 << 20), -1),
                },
            ),
            (
                _flag("-s", "--size", required=True, help="e.g. 100M, 1G; -1: no limit"),
                _flag("-t", "--time", required=True, help="e.g. 3h, 3d; -1: no limit"),
            ),
            ("namespace",),
        ),
        "set-clusters": Verb(
            "replicate the namespace to these clusters (each allowed by the tenant)",
            lambda a: (
                "POST",
                _policy("replication")(a),
                [c for c in a.clusters.split(",") if c],
            ),
            (_flag("-c", "--clusters", required=True, help="comma-separated cluster names"),),
            ("namespace",),
        ),
        "get-clusters": Verb(
            "the clusters the namespace is replicated to",
            lambda a: ("GET", _policy("replication")(a), None),
            (),
            ("namespace",),
        ),
        "get-retention": Verb(
            "the retention policy",
            lambda a: ("GET", _policy("retention")(a), None),
            (),
            ("namespace",),
        ),
        "remove-retention": Verb(
            "back to the broker's retention",
            lambda a: ("DELETE", _policy("retention")(a), None),
            (),
            ("namespace",),
        ),
        "set-message-ttl": Verb(
            "expire unacknowledged messages after a time",
            lambda a: ("POST", _policy("messageTTL")(a), seconds(a.messageTTL)),
            (_flag("-ttl", "--messageTTL", required=True, help="e.g. 3600, 1h"),),
            ("namespace",),
        ),
        "get-message-ttl": Verb(
            "the message TTL", lambda a: ("GET", _policy("messageTTL")(a), None), (), ("namespace",)
        ),
        "remove-message-ttl": Verb(
            "back to the broker's TTL",
            lambda a: ("DELETE", _policy("messageTTL")(a), None),
            (),
            ("namespace",),
        ),
        "set-deduplication": Verb(
            "enable or disable deduplication",
            lambda a: ("POST", _policy("deduplication")(a), _enable(a)),
            (
                _flag("-e", "--enable", action="store_true"),
                _flag("-d", "--disable", action="store_true"),
            ),
            ("namespace",),
        ),
        "get-deduplication": Verb(
            "the deduplication policy",
            lambda a: ("GET", _policy("deduplication")(a), None),
            (),
            ("namespace",),
        ),
        **_limit_verbs(),
        "set-schema-compatibility-strategy": Verb(
            "the strategy a new schema version is checked with",
            lambda a: (
                "PUT",
                _policy("schemaCompatibilityStrategy")(a),
                a.compatibility.upper(),
            ),
            (_flag("-c", "--compatibility", required=True, help="e.g. BACKWARD, FULL"),),
            ("namespace",),
        ),
        "get-schema-compatibility-strategy": Verb(
            "the namespace's schema compatibility strategy (UNDEFINED: the broker's, FULL)",
            lambda a: ("GET", _policy("schemaCompatibilityStrategy")(a), None),
            (),
            ("namespace",),
        ),
        "set-compaction-threshold": Verb(
            "compact each topic once this much backlog awaits compaction",
            lambda a: ("PUT", _policy("compactionThreshold")(a), size_bytes(a.threshold)),
            (_flag("-t", "--threshold", required=True, help="e.g. 10M, 1G; 0: never"),),
            ("namespace",),
        ),
        "get-compaction-threshold": Verb(
            "the compaction threshold (bytes; null: the broker's)",
            lambda a: ("GET", _policy("compactionThreshold")(a), None),
            (),
            ("namespace",),
        ),
        "remove-compaction-threshold": Verb(
            "back to the broker's compaction threshold",
            lambda a: ("DELETE", _policy("compactionThreshold")(a), None),
            (),
            ("namespace",),
        ),
        **_rate_verbs(lambda a, s: _policy(s)(a), "a namespace"),
        **_publish_rate_verbs(_policy("publishRate"), "a namespace"),
        "set-subscription-expiration-time": Verb(
            "delete subscriptions with no consumer and no activity for this many minutes "
            "(0: never)",
            lambda a: ("POST", _policy("subscriptionExpirationTime")(a), a.time),
            (_flag("-t", "--time", type=int, required=True, help="minutes"),),
            ("namespace",),
        ),
        "get-subscription-expiration-time": Verb(
            "the subscription expiration time (null: the broker's)",
            lambda a: ("GET", _policy("subscriptionExpirationTime")(a), None),
            (),
            ("namespace",),
        ),
        "remove-subscription-expiration-time": Verb(
            "back to the broker's subscription expiration time",
            lambda a: ("DELETE", _policy("subscriptionExpirationTime")(a), None),
            (),
            ("namespace",),
        ),
        "get-properties": Verb(
            "the namespace's properties",
            lambda a: ("GET", _policy("properties")(a), None),
            (),
            ("namespace",),
        ),
        "set-properties": Verb(
            "add or change properties",
            lambda a: ("PUT", _policy("properties")(a), _properties(a)),
            (_flag("-p", "--property", action="append", required=True, help="key=value"),),
            ("namespace",),
        ),
        "clear-properties": Verb(
            "remove every property",
            lambda a: ("DELETE", _policy("properties")(a), None),
            (),
            ("namespace",),
        ),
        "set-backlog-quota": Verb(
            "what a subscription may leave unacknowledged, and what happens over it",
            _backlog_quota,
            (
                _flag(
                    "-l",
                    "--limit",
                    "--limitSize",
                    dest="limitSize",
                    help="e.g. 10G (destination_storage)",
                ),
                _flag("-lt", "--limitTime", dest="limitTime", help="e.g. 1h (message_age)"),
                _flag(
                    "-p",
                    "--policy",
                    required=True,
                    choices=[
                        "producer_request_hold",
                        "producer_exception",
                        "consumer_backlog_eviction",
                    ],
                ),
                _flag(
                    "-t",
                    "--type",
                    default="destination_storage",
                    choices=["destination_storage", "message_age"],
                ),
            ),
            ("namespace",),
        ),
        "get-backlog-quotas": Verb(
            "the backlog quotas",
            lambda a: ("GET", _policy("backlogQuotaMap")(a), None),
            (),
            ("namespace",),
        ),
        "remove-backlog-quota": Verb(
            "remove a backlog quota",
            lambda a: ("DELETE", f"{_policy('backlogQuota')(a)}?backlogQuotaType={a.type}", None),
            (
                _flag(
                    "-t",
                    "--type",
                    default="destination_storage",
                    choices=["destination_storage", "message_age"],
                ),
            ),
            ("namespace",),
        ),
        "set-inactive-topic-policies": Verb(
            "delete topics without clients after a time",
            _inactive_topics,
            (
                _flag("-e", "--enable-delete-while-inactive", action="store_true"),
                _flag("-d", "--disable-delete-while-inactive", action="store_true"),
                _flag("-t", "--max-inactive-duration", required=True, help="e.g. 1h"),
                _flag(
                    "-m",
                    "--delete-mode",
                    required=True,
                    choices=["delete_when_no_subscriptions", "delete_when_subscriptions_caught_up"],
                ),
            ),
            ("namespace",),
        ),
        "get-inactive-topic-policies": Verb(
            "the inactive-topic policy",
            lambda a: ("GET", _policy("inactiveTopicPolicies")(a), None),
            (),
            ("namespace",),
        ),
        "remove-inactive-topic-policies": Verb(
            "no inactive-topic deletion",
            lambda a: ("DELETE", _policy("inactiveTopicPolicies")(a), None),
            (),
            ("namespace",),
        ),
        "clear-backlog": Verb(
            "acknowledge everything in a namespace (or bundle, or subscription)",
            lambda a: (
                "POST",
                _bundle_or_all(a, "clearBacklog")
                + (f"/{urllib.parse.quote(a.sub, safe='')}" if a.sub else ""),
                None,
            ),
            (
                _flag("-s", "--sub", help="only this subscription"),
                _flag("-b", "--bundle", help="only this bundle"),
                _flag("--force", action="store_true", help="accepted, as pulsar-admin's"),
            ),
            ("namespace",),
        ),
        "unsubscribe": Verb(
            "delete a subscription from every topic of a namespace (or bundle)",
            lambda a: (
                "POST",
                _bundle_or_all(a, "unsubscribe") + f"/{urllib.parse.quote(a.sub, safe='')}",
                None,
            ),
            (
                _flag("-s", "--sub", required=True, help="the subscription"),
                _flag("-b", "--bundle", help="only this bundle"),
            ),
            ("namespace",),
        ),
    },
    "topics": {
        "list": Verb(
            "a namespace's topics",
            lambda a: ("GET", f"namespaces/{namespace_path(a.namespace)}/topics", None),
            (),
            ("namespace",),
        ),
        "list-partitioned-topics": Verb(
            "a namespace's partitioned topics",
            lambda a: ("GET", f"persistent/{namespace_path(a.namespace)}/partitioned", None),
            (),
            ("namespace",),
        ),
        "create": Verb(
            "create a non-partitioned topic", lambda a: ("PUT", _topic(a), None), (), ("topic",)
        ),
        "delete": Verb(
            "delete a topic",
            lambda a: ("DELETE", _topic(a) + _force(a), None),
            (FORCE,),
            ("topic",),
        ),
        "create-partitioned-topic": Verb(
            "create a partitioned topic",
            lambda a: ("PUT", _topic(a, "/partitions"), a.partitions),
            (_flag("-p", "--partitions", type=int, required=True),),
            ("topic",),
        ),
        "update-partitioned-topic": Verb(
            "add partitions",
            lambda a: ("POST", _topic(a, "/partitions"), a.partitions),
            (_flag("-p", "--partitions", type=int, required=True),),
            ("topic",),
        ),
        "create-missed-partitions": Verb(
            "store every partition not stored yet",
            lambda a: ("POST", _topic(a, "/createMissedPartitions"), None),
            (),
            ("topic",),
        ),
        "get-partitioned-topic-metadata": Verb(
            "a partitioned topic's partition count",
            lambda a: ("GET", _topic(a, "/partitions"), None),
            (),
            ("topic",),
        ),
        "delete-partitioned-topic": Verb(
            "delete a partitioned topic and every partition's data",
            lambda a: ("DELETE", _topic(a, "/partitions") + _force(a), None),
            (FORCE,),
            ("topic",),
        ),
        "stats": Verb(
            "a topic's stats", lambda a: ("GET", _topic(a, "/stats"), None), (), ("topic",)
        ),
        "partitioned-stats": Verb(
            "a partitioned topic's stats, added up over its partitions",
            lambda a: (
                "GET",
                _topic(a, "/partitioned-stats")
                + ("" if a.per_partition else "?perPartition=false"),
                None,
            ),
            (_flag("--per-partition", action="store_true", help="each partition's too"),),
            ("topic",),
        ),
        "partitioned-stats-internal": Verb(
            "each partition's storage view",
            lambda a: ("GET", _topic(a, "/partitioned-internalStats"), None),
            (),
            ("topic",),
        ),
        "terminate": Verb(
            "take no more messages on the topic, ever (consumers drain it); prints the last "
            "message id",
            lambda a: ("POST", _topic(a, "/terminate"), None),
            (),
            ("topic",),
        ),
        "partitioned-terminate": Verb(
            "terminate each partition of a partitioned topic; prints each one's last message id",
            lambda a: ("POST", _topic(a, "/terminate/partitions"), None),
            (),
            ("topic",),
        ),
        "stats-internal": Verb(
            "a topic's storage view",
            lambda a: ("GET", _topic(a, "/internalStats"), None),
            (),
            ("topic",),
        ),
        "subscriptions": Verb(
            "a topic's subscriptions",
            lambda a: ("GET", _topic(a, "/subscriptions"), None),
            (),
            ("topic",),
        ),
        "create-subscription": Verb(
            "create a subscription with no consumer",
            lambda a: ("PUT", _sub(a), message_id(a.messageId)),
            (SUB, _flag("-m", "--messageId", default="latest", help="latest, earliest or l:e")),
            ("topic",),
        ),
        "unsubscribe": Verb(
            "delete a subscription",
            lambda a: ("DELETE", _sub(a) + _force(a), None),
            (SUB, FORCE),
            ("topic",),
        ),
        "skip": Verb(
            "skip messages of a subscription",
            lambda a: ("POST", _sub(a, f"/skip/{a.count}"), None),
            (SUB, _flag("-n", "--count", type=int, required=True)),
            ("topic",),
        ),
        "clear-backlog": Verb(
            "skip every message of a subscription",
            lambda a: ("POST", _sub(a, "/skip_all"), None),
            (SUB,),
            ("topic",),
        ),
        "expire-messages": Verb(
            "expire a subscription's messages older than a time",
            lambda a: ("POST", _sub(a, f"/expireMessages/{seconds(a.expireTime)}"), None),
            (SUB, _flag("-t", "--expireTime", required=True, help="e.g. 3600, 1h")),
            ("topic",),
        ),
        "expire-messages-all-subscriptions": Verb(
            "expire every subscription's messages older than a time",
            lambda a: (
                "POST",
                _topic(a, f"/all_subscription/expireMessages/{seconds(a.expireTime)}"),
                None,
            ),
            (_flag("-t", "--expireTime", required=True, help="e.g. 3600, 1h"),),
            ("topic",),
        ),
        "set-replicated-subscription-status": Verb(
            "make a subscription replicated across the namespace's clusters, or not",
            _replicated_status,
            (
                SUB,
                _flag("-e", "--enable", action="store_true"),
                _flag("-d", "--disable", action="store_true"),
            ),
            ("topic",),
        ),
        "get-replicated-subscription-status": Verb(
            "whether a subscription is replicated",
            lambda a: ("GET", _sub(a, "/replicatedSubscriptionStatus"), None),
            (SUB,),
            ("topic",),
        ),
        "reset-cursor": Verb(
            "move a subscription back (or forward) to a time or a message",
            _reset_cursor,
            (
                SUB,
                _flag("-t", "--time", help="this long ago: 10m, 2h, 1d"),
                _flag("-m", "--messageId", help="ledgerId:entryId, earliest or latest"),
                _flag("-e", "--exclude-reset-position", action="store_true"),
            ),
            ("topic",),
        ),
        "peek-messages": Verb(
            "show a subscription's next messages without consuming them",
            lambda a: ("GET", _sub(a, "/position/1"), None),
            (SUB, _flag("-n", "--count", type=int, default=1)),
            ("topic",),
            _peek,
        ),
        "examine-message": Verb(
            "show the n-th message from the start or end",
            lambda a: (
                "GET",
                _topic(
                    a,
                    f"/examinemessage?initialPosition={a.initialPosition}"
                    f"&messagePosition={a.messagePosition}",
                ),
                None,
            ),
            (
                _flag("-i", "--initialPosition", default="latest", choices=["latest", "earliest"]),
                _flag("-m", "--messagePosition", type=int, default=1),
            ),
            ("topic",),
            _message_show,
        ),
        "get-message-by-id": Verb(
            "show a message by its id",
            lambda a: ("GET", _topic(a, f"/ledger/{a.ledgerId}/entry/{a.entryId}"), None),
            (
                _flag("-l", "--ledgerId", type=int, required=True),
                _flag("-e", "--entryId", type=int, required=True),
            ),
            ("topic",),
            _message_show,
        ),
        "last-message-id": Verb(
            "the id of the last message stored",
            lambda a: ("GET", _topic(a, "/lastMessageId"), None),
            (),
            ("topic",),
        ),
        "get-message-id": Verb(
            "the first message published at or after a time",
            _get_message_id,
            (_flag("-d", "--datetime", required=True, help="ISO 8601, e.g. 2024-05-01T10:00:00"),),
            ("topic",),
        ),
        **_topic_policy_verbs(),
        "set-schema-compatibility-strategy": Verb(
            "the topic's own schema compatibility strategy",
            lambda a: ("PUT", _topic(a, "/schemaCompatibilityStrategy"), a.strategy.upper()),
            (_flag("-s", "--strategy", required=True, help="e.g. BACKWARD, FULL"),),
            ("topic",),
        ),
        "get-schema-compatibility-strategy": Verb(
            "the topic's own strategy (null: the namespace's applies; -ap: the one in force)",
            lambda a: (
                "GET",
                _topic(a, "/schemaCompatibilityStrategy" + ("?applied=true" if a.applied else "")),
                None,
            ),
            (_flag("-ap", "--applied", action="store_true", help="the strategy in force"),),
            ("topic",),
        ),
        "remove-schema-compatibility-strategy": Verb(
            "back to the namespace's schema compatibility strategy",
            lambda a: ("DELETE", _topic(a, "/schemaCompatibilityStrategy"), None),
            (),
            ("topic",),
        ),
        **_rate_verbs(lambda a, s: _topic(a, f"/{s}"), "a topic"),
        **_publish_rate_verbs(lambda a: _topic(a, "/publishRate"), "a topic"),
        "bundle-range": Verb(
            "the bundle serving a topic",
            lambda a: ("GET", _topic(a, "/bundle"), None),
            (),
            ("topic",),
        ),
        "get-properties": Verb(
            "a topic's properties",
            lambda a: ("GET", _topic(a, "/properties"), None),
            (),
            ("topic",),
        ),
        "update-properties": Verb(
            "add or change a topic's properties",
            lambda a: ("PUT", _topic(a, "/properties"), _properties(a)),
            (_flag("-p", "--property", action="append", required=True, help="key=value"),),
            ("topic",),
        ),
        "remove-properties": Verb(
            "remove a topic's property",
            lambda a: (
                "DELETE",
                _topic(a, "/properties?key=" + urllib.parse.quote(a.key, safe="")),
                None,
            ),
            (_flag("-k", "--key", required=True),),
            ("topic",),
        ),
        "truncate": Verb(
            "move every subscription to the end and delete every closed ledger",
            lambda a: ("DELETE", _topic(a, "/truncate"), None),
            (),
            ("topic",),
        ),
        "compact": Verb(
            "start compacting a topic (each partition of a partitioned one)",
            lambda a: ("PUT", _topic(a, "/compaction"), None),
            (),
            ("topic",),
        ),
        "compaction-status": Verb(
            "the last compaction's status: NOT_RUN, RUNNING, SUCCESS or ERROR",
            lambda a: ("GET", _topic(a, "/compaction"), None),
            (),
            ("topic",),
        ),
        "trim-topic": Verb(
            "delete the ledgers retention no longer keeps, now",
            lambda a: ("POST", _topic(a, "/trim"), None),
            (),
            ("topic",),
        ),
        "unload": Verb(
            "unload a topic", lambda a: ("PUT", _topic(a, "/unload"), None), (), ("topic",)
        ),
        "lookup": Verb(
            "the broker serving a topic",
            lambda a: ("GET", "/lookup/v2/topic/" + topic_path(a.topic), None),
            (),
            ("topic",),
        ),
    },
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("MAGNETAR_ADMIN_URL", DEFAULT_ADMIN_URL),
        help=f"the broker's HTTP address [default: $MAGNETAR_ADMIN_URL or {DEFAULT_ADMIN_URL}]",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("MAGNETAR_TOKEN"),
        help="a JWT sent as 'Authorization: Bearer' [default: $MAGNETAR_TOKEN]",
    )
    parser.add_argument("--basic", help="user:password for the basic provider")
    parser.add_argument("--tls-trust-cert-path", help="CA bundle that signed the broker's cert")
    parser.add_argument("--tls-cert-file", help="client certificate (the tls provider)")
    parser.add_argument("--tls-key-file", help="the client certificate's key")
    parser.add_argument(
        "--tls-allow-insecure", action="store_true", help="do not verify the broker's certificate"
    )
    parser.add_argument("--json", action="store_true", help="print answers as JSON")
    groups = parser.add_subparsers(dest="admin_group", required=True, metavar="GROUP")
    for group, verbs in VERBS.items():
        g = groups.add_parser(group, help=f"{group} ({', '.join(verbs)})")
        sub = g.add_subparsers(dest="admin_verb", required=True, metavar="VERB")
        for name, verb in verbs.items():
            p = sub.add_parser(name, help=verb.help)
            for positional in verb.positional:
                p.add_argument(positional)
            for names, kwargs in verb.flags:
                p.add_argument(*names, **kwargs)
            p.set_defaults(admin_call=verb)


def client_from(args: argparse.Namespace) -> AdminClient:
    cert = None
    if args.tls_cert_file:
        cert = (args.tls_cert_file, args.tls_key_file or args.tls_cert_file)
    return AdminClient(
        args.admin_url,
        token=args.token,
        basic=args.basic,
        trust_cert=args.tls_trust_cert_path,
        insecure=args.tls_allow_insecure,
        cert=cert,
    )


def _print(value: Any, as_json: bool) -> None:
    if value is None:
        return
    if isinstance(value, str) and not as_json:
        print(value)
        return
    if as_json or not isinstance(value, list) or any(isinstance(v, dict | list) for v in value):
        print(json.dumps(value, indent=None if as_json else 2, sort_keys=not as_json))
        return
    for item in value:
        print(item)


def run(args: argparse.Namespace) -> int:
    verb: Verb = args.admin_call
    try:
        method, path, body = verb.build(args)
        client = client_from(args)
        answer = client.call(method, path, body)
        shown = verb.show(client, args, answer) if verb.show else answer.json()
    except UsageError as e:
        print(f"magnetar admin: {e}", file=sys.stderr)
        return 2
    except AdminCallError as e:
        print(f"magnetar admin: {e}", file=sys.stderr)
        return 1
    _print(shown, args.json)
    return 0
