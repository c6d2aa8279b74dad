"""Which relay target a client may name in ``proxy_to_broker_url`` (``magnetar.proxy.targets``):
registered brokers only, then Pulsar's ``BrokerProxyValidator`` rules (allowed ports, host name
patterns, IP addresses/CIDRs), and the checked address is the one dialled.

The real ``validate_target`` and ``TargetRules`` are exercised throughout. Registrations come
either from a real ``BrokerDirectory`` over a local metadata store, or - for the property tests,
which run hundreds of examples - from ``Registered``, a set with the one method the rules call.
DNS is the real resolver (IP literals and ``localhost``) except where an answer must change
between two lookups: there the event loop's ``getaddrinfo`` is scripted (``ScriptedLoop``), the
resolver ``validate_target`` uses.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from magnetar.common.cluster.broker_info import BROKERS_ROOT, BrokerInfo
from magnetar.common.config import ConfigError
from magnetar.common.metadata import MetadataStore, open_store
from magnetar.proxy.brokers import Address, BrokerDirectory
from magnetar.proxy.config import ProxyConfig
from magnetar.proxy.targets import TargetRefused, TargetRules, validate_target
from tests.support.polling import wait_until_async

T = TypeVar("T")


@dataclass(slots=True)
class Registered:
    """Registered broker addresses, answering ``is_registered`` as ``BrokerDirectory`` does."""

    addresses: frozenset[Address]

    @classmethod
    def of(cls, *values: str) -> Registered:
        return cls(frozenset(Address.parse(v) for v in values))

    def is_registered(self, host: str, port: int) -> bool:
        return Address(host.lower(), port) in self.addresses


class ScriptedLoop(asyncio.SelectorEventLoop):
    """An event loop whose resolver answers each lookup with the next scripted list of IPs."""

    def __init__(self, answers: Sequence[Sequence[str]]) -> None:
        super().__init__()
        self.answers = [list(a) for a in answers]
        self.lookups: list[str] = []

    async def getaddrinfo(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        self.lookups.append(str(host))
        if not self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "no scripted answer left")
        ips = self.answers.pop(0)
        return [
            (
                socket.AF_INET6 if ":" in ip else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (ip, port),
            )
            for ip in ips
        ]


def run(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """``coro`` on its own event loop (``loop``'s when given): hypothesis examples are sync."""
    with asyncio.Runner(loop_factory=(lambda: loop) if loop is not None else None) as runner:
        return runner.run(coro)


def rules(ports: str = "*", hosts: str = "*", ips: str = "*", **others: object) -> TargetRules:
    config = ProxyConfig(
        broker_proxy_allowed_target_ports=ports,
        broker_proxy_allowed_host_names=hosts,
        broker_proxy_allowed_ip_addresses=ips,
        **others,  # type: ignore[arg-type]
    )
    config.validate()
    return TargetRules.of(config)


def refused(value: str, target_rules: TargetRules, directory: Any) -> str:
    """The reason ``value`` is refused (fails the test when it is accepted)."""
    with pytest.raises(TargetRefused) as caught:
        run(validate_target(value, target_rules, directory))
    return str(caught.value)


def refusal(coro: Coroutine[Any, Any, object], loop: asyncio.AbstractEventLoop) -> TargetRefused:
    with pytest.raises(TargetRefused) as caught:
        run(coro, loop)
    return caught.value


# -- registered brokers only (CVE-2022-24280) ----------------------------------------------------


@dataclass
class Deployment:
    store: MetadataStore
    directory: BrokerDirectory

    async def register(self, broker_id: str, service_url: str, service_url_tls: str = "") -> None:
        info = BrokerInfo(broker_id, service_url, f"http://{broker_id}", service_url_tls)
        document = b'{"info": %s, "report": {}}' % info.to_json()
        await self.store.put(f"{BROKERS_ROOT}/{broker_id}", document)
        await self.seen(Address.parse(service_url), registered=True)

    async def unregister(self, broker_id: str, service_url: str) -> None:
        await self.store.delete(f"{BROKERS_ROOT}/{broker_id}")
        await self.seen(Address.parse(service_url), registered=False)

    async def seen(self, address: Address, *, registered: bool) -> None:
        """Wait for the directory's watch to have applied the change."""

        async def applied() -> bool:
            return (self.directory.broker_at(address) is not None) == registered

        assert await wait_until_async(applied, timeout=5), f"{address} registered={registered}"


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[Deployment]:
    store = await open_store(f"local://{tmp_path}/meta.db")
    directory = BrokerDirectory(store)
    await directory.start()
    try:
        yield Deployment(store, directory)
    finally:
        await directory.close()
        await store.close()


async def test_only_registered_brokers_plain_or_tls_are_targets(deployment: Deployment) -> None:
    await deployment.register("b1:8080", "pulsar://127.0.0.1:6650", "pulsar+ssl://127.0.0.1:6651")
    await deployment.register("b2:8081", "pulsar://localhost:6652")
    target_rules = rules()
    directory = deployment.directory

    for value, expected in [
        ("127.0.0.1:6650", Address("127.0.0.1", 6650)),
        ("pulsar://127.0.0.1:6650", Address("127.0.0.1", 6650)),
        ("pulsar+ssl://127.0.0.1:6651/", Address("127.0.0.1", 6651)),
        ("LOCALHOST:6652", Address("localhost", 6652)),  # host names compare without case
    ]:
        address, _ = await validate_target(value, target_rules, directory)
        assert address == expected

    # Everything else is refused, even when it is the same machine: another port of a
    # registered host, a registered port on another name of that host, an unknown name.
    for value in ("127.0.0.1:6652", "localhost:6650", "127.0.0.2:6650", "b3.example:6650"):
        with pytest.raises(TargetRefused, match="is not a registered broker"):
            await validate_target(value, target_rules, directory)


async def test_a_broker_whose_registration_is_gone_is_no_target(deployment: Deployment) -> None:
    await deployment.register("b1:8080", "pulsar://127.0.0.1:6650")
    await validate_target("127.0.0.1:6650", rules(), deployment.directory)
    await deployment.unregister("b1:8080", "pulsar://127.0.0.1:6650")
    with pytest.raises(TargetRefused, match="is not a registered broker"):
        await validate_target("127.0.0.1:6650", rules(), deployment.directory)


def test_the_proxy_itself_is_refused() -> None:
    """A client naming the proxy's own address gets no relay to it: the proxy is no registered
    broker. (There is no separate own-address rule: ``validate_target`` does not know the
    proxy's address, so the registration rule is what refuses it.)"""
    config = ProxyConfig(port=6650, advertised_address="127.0.0.1")
    brokers = Registered.of("127.0.0.1:6660", "127.0.0.1:6661")
    own = f"{config.advertised_address}:{config.port}"
    loop = ScriptedLoop([])
    assert "is not a registered broker" in str(
        refusal(validate_target(own, rules(ips="127.0.0.0/8"), brokers), loop)
    )
    assert loop.lookups == []  # refused before any DNS


hosts = st.from_regex(r"[a-z][a-z0-9-]{0,8}(\.[a-z][a-z0-9-]{0,8}){0,3}", fullmatch=True)
ports = st.integers(1, 65535)


@given(
    registered=st.frozensets(st.tuples(hosts, ports), max_size=4),
    host=hosts,
    port=ports,
)
@settings(max_examples=200, deadline=None)
def test_unregistered_targets_are_refused_before_any_lookup(
    registered: frozenset[tuple[str, int]], host: str, port: int
) -> None:
    """Whatever the allowances (all ``*`` here, the most permissive), a target that is not a
    registered address is refused, and no DNS lookup is made for it."""
    directory = Registered(frozenset(Address(h, p) for h, p in registered))
    loop = ScriptedLoop([["10.0.0.1"]])
    coro = validate_target(f"{host}:{port}", rules(ips="0.0.0.0/0"), directory)
    if (host, port) in registered:
        address, dial = run(coro, loop)
        assert address == Address(host, port) and dial == "10.0.0.1"
    else:
        assert "is not a registered broker" in str(refusal(coro, loop))
        assert loop.lookups == []


@given(value=st.text(max_size=40) | st.builds(lambda h, s: f"{h}:{s}", hosts, st.text(max_size=8)))
@settings(max_examples=300, deadline=None)
def test_any_string_is_either_a_registered_address_or_refused(value: str) -> None:
    """Malformed ``proxy_to_broker_url`` values are refusals (``TargetRefused``), never another
    exception that would end the connection task with a stack trace."""
    directory = Registered.of("127.0.0.1:6650", "localhost:6650")
    try:
        address, _ = run(validate_target(value, rules(), directory))
    except TargetRefused:
        return
    assert directory.is_registered(address.host, address.port)


# -- broker_proxy_allowed_target_ports ------------------------------------------------------------


@given(allowed=st.frozensets(ports, min_size=1, max_size=5), port=ports)
@settings(max_examples=200, deadline=None)
def test_only_allowed_ports_are_targets(allowed: frozenset[int], port: int) -> None:
    directory = Registered.of(f"127.0.0.1:{port}")
    target_rules = rules(ports=" , ".join(map(str, sorted(allowed))))
    if port in allowed:
        assert run(validate_target(f"127.0.0.1:{port}", target_rules, directory))[0].port == port
    else:
        reason = refused(f"127.0.0.1:{port}", target_rules, directory)
        assert "broker_proxy_allowed_target_ports" in reason


@given(listed=st.lists(ports, max_size=3), port=ports)
@settings(max_examples=100, deadline=None)
def test_a_star_among_the_ports_allows_any_port(listed: list[int], port: int) -> None:
    directory = Registered.of(f"127.0.0.1:{port}")
    setting = ",".join([*map(str, listed), "*"])
    assert rules(ports=setting).ports is None
    assert (
        run(validate_target(f"127.0.0.1:{port}", rules(ports=setting), directory))[0].port == port
    )


def test_the_default_ports_are_pulsars() -> None:
    directory = Registered.of("127.0.0.1:6650", "127.0.0.1:6651", "127.0.0.1:8080")
    target_rules = TargetRules.of(ProxyConfig())
    run(validate_target("127.0.0.1:6650", target_rules, directory))
    run(validate_target("127.0.0.1:6651", target_rules, directory))
    assert "8080" in refused("127.0.0.1:8080", target_rules, directory)


# -- broker_proxy_allowed_host_names --------------------------------------------------------------


def pulsar_host_allowed(patterns: list[str], host: str) -> bool:
    """Pulsar's ``BrokerProxyValidator.isHostAllowed``: ``*`` alone allows any host; otherwise
    each ``*`` of a pattern is ``.*`` (dots included), the rest literal, case-insensitive."""
    if "*" in patterns:
        return True
    for pattern in patterns:
        regex = ".*".join(re.escape(part) for part in pattern.split("*"))
        if re.fullmatch(regex, host, re.IGNORECASE):
            return True
    return False


def patterns_for(host: str) -> st.SearchStrategy[str]:
    """Patterns near ``host``: parts of it replaced by ``*``, letters changed, case changed."""

    @st.composite
    def near(draw: st.DrawFn) -> str:
        text = list(host)
        for _ in range(draw(st.integers(0, 3))):
            if not text:
                break
            i = draw(st.integers(0, len(text) - 1))
            j = draw(st.integers(i, min(len(text), i + 6)))
            text[i:j] = [draw(st.sampled_from(["*", "*", "x", ".", "-"]))]
        pattern = "".join(text)
        return pattern.upper() if draw(st.booleans()) else pattern

    return near()


@given(data=st.data(), host=hosts)
@settings(max_examples=200, deadline=None)
def test_host_names_match_as_pulsar_matches_them(data: st.DataObject, host: str) -> None:
    patterns = data.draw(st.lists(patterns_for(host) | hosts, min_size=1, max_size=3))
    directory = Registered.of(f"{host}:6650")
    target_rules = rules(hosts=",".join(patterns))
    if pulsar_host_allowed(patterns, host):
        run(validate_target(f"{host}:6650", target_rules, directory))
    else:
        reason = refused(f"{host}:6650", target_rules, directory)
        assert "broker_proxy_allowed_host_names" in reason


@pytest.mark.parametrize(
    ("pattern", "host", "allowed"),
    [
        ("*", "anything.example", True),
        ("broker-*.example.com", "broker-1.example.com", True),
        ("broker-*.example.com", "broker-1.zone-a.example.com", True),  # Pulsar's * spans dots
        ("broker-*.example.com", "broker-.example.com", True),  # and may be empty
        ("*.example.com", "example.com", False),
        ("*.example.com", "evil-example.com", False),
        ("BROKER.Example.COM", "broker.example.com", True),
        ("broker.example.com", "broker.example.com.evil", False),
        ("broker.example.com", "xbroker.example.com", False),
        ("10.0.0.*", "10.0.0.7", True),  # IP literals are host names to this rule
    ],
)
def test_host_name_patterns(pattern: str, host: str, allowed: bool) -> None:
    directory = Registered.of(f"{host}:6650")
    target_rules = rules(hosts=f"other.invalid, {pattern}")
    assert pulsar_host_allowed(["other.invalid", pattern], host) == allowed
    if allowed:
        run(validate_target(f"{host}:6650", target_rules, directory))
    else:
        refused(f"{host}:6650", target_rules, directory)


# -- broker_proxy_allowed_ip_addresses ------------------------------------------------------------

ipv4 = st.ip_addresses(v=4)
networks = st.builds(
    lambda ip, bits: ipaddress.ip_network(f"{ip}/{bits}", strict=False), ipv4, st.integers(0, 32)
)


@given(allowed=st.lists(networks, min_size=1, max_size=4), ip=ipv4)
@settings(max_examples=300, deadline=None)
def test_only_addresses_inside_the_allowed_ranges_are_dialled(
    allowed: list[ipaddress.IPv4Network], ip: ipaddress.IPv4Address
) -> None:
    """A registered IP-literal target (the real resolver answers it without DNS) is accepted iff
    it lies in one of the allowed addresses/CIDRs, and then it is what is dialled."""
    directory = Registered.of(f"{ip}:6650")
    setting = ",".join(
        str(n.network_address) if n.prefixlen == 32 else str(n) for n in allowed
    )  # single addresses written bare, as operators write them
    target_rules = rules(ips=setting)
    if any(ip in n for n in allowed):
        _, dial = run(validate_target(f"{ip}:6650", target_rules, directory))
        assert ipaddress.ip_address(dial) == ip
    else:
        assert "broker_proxy_allowed_ip_addresses" in refused(f"{ip}:6650", target_rules, directory)


def test_a_host_name_is_checked_by_the_addresses_it_resolves_to() -> None:
    directory = Registered.of("localhost:6650")
    assert run(validate_target("localhost:6650", rules(ips="127.0.0.0/8"), directory)) == (
        Address("localhost", 6650),
        "127.0.0.1",
    )
    reason = refused("localhost:6650", rules(ips="10.0.0.0/8, 192.168.0.0/16"), directory)
    assert "resolves to 127.0.0.1" in reason
    assert "cannot be resolved" in refused(
        "nothing.invalid:6650", rules(ips="10.0.0.0/8"), Registered.of("nothing.invalid:6650")
    )


def test_ipv6_ranges() -> None:
    directory = Registered.of("[::1]:6650", "[fd00::5]:6650")
    target_rules = rules(ips="::1, fd00::/8")
    assert run(validate_target("[::1]:6650", target_rules, directory))[1] == "::1"
    assert run(validate_target("[fd00::5]:6650", target_rules, directory))[1] == "fd00::5"
    assert "outside" in refused("[::1]:6650", rules(ips="fd00::/8"), directory)


def test_without_an_ip_rule_no_lookup_is_made_and_the_name_is_dialled() -> None:
    directory = Registered.of("broker.internal:6650")
    loop = ScriptedLoop([])
    assert run(validate_target("broker.internal:6650", rules(), directory), loop) == (
        Address("broker.internal", 6650),
        "broker.internal",
    )
    assert loop.lookups == []


# -- the address checked is the address dialled (no DNS rebinding) --------------------------------


def test_the_checked_address_is_dialled_whatever_a_later_lookup_answers() -> None:
    """A name that resolves to an allowed address once and to a forbidden one afterwards (DNS
    rebinding) is dialled at the address that was checked: one lookup, its IP returned."""
    directory = Registered.of("broker.internal:6650")
    loop = ScriptedLoop([["10.1.2.3"], ["169.254.169.254"]])
    address, dial = run(
        validate_target("broker.internal:6650", rules(ips="10.0.0.0/8"), directory), loop
    )
    assert (address, dial) == (Address("broker.internal", 6650), "10.1.2.3")
    assert loop.lookups == ["broker.internal"]
    assert ipaddress.ip_address(dial) in ipaddress.ip_network("10.0.0.0/8")


@given(
    allowed=st.lists(ipv4, min_size=1, max_size=3),
    forbidden=st.lists(ipv4, min_size=1, max_size=3),
    order=st.randoms(use_true_random=False),
)
@settings(max_examples=200, deadline=None)
def test_a_name_with_any_forbidden_address_is_refused(
    allowed: list[ipaddress.IPv4Address],
    forbidden: list[ipaddress.IPv4Address],
    order: Any,
) -> None:
    """Every address a name resolves to must be allowed: otherwise which one a dial would pick
    decides, and a name could pair an allowed address with a forbidden one."""
    forbidden = [ip for ip in forbidden if ip not in allowed]
    answer = [str(ip) for ip in allowed + forbidden]
    order.shuffle(answer)
    target_rules = rules(ips=",".join(map(str, allowed)))
    directory = Registered.of("broker.internal:6650")
    loop = ScriptedLoop([answer])
    coro = validate_target("broker.internal:6650", target_rules, directory)
    if forbidden:
        assert "outside broker_proxy_allowed_ip_addresses" in str(refusal(coro, loop))
    else:
        _, dial = run(coro, loop)
        assert dial == answer[0] and ipaddress.ip_address(dial) in allowed


def test_a_name_resolving_to_nothing_is_refused() -> None:
    loop = ScriptedLoop([[]])
    coro = validate_target(
        "broker.internal:6650", rules(ips="10.0.0.0/8"), Registered.of("broker.internal:6650")
    )
    assert "resolves to no address" in str(refusal(coro, loop))


# -- the settings themselves ----------------------------------------------------------------------


def test_rules_read_from_the_settings() -> None:
    target_rules = rules(ports="6650, 6651", hosts="a.example, *.b.example", ips="10.0.0.0/8,::1")
    assert target_rules.ports == frozenset({6650, 6651})
    assert target_rules.host_patterns == ("a.example", "*.b.example")
    assert target_rules.networks == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
    )
    assert rules(ips="10.0.0.0/8, *").networks is None


@pytest.mark.parametrize(
    "setting",
    [
        {"broker_proxy_allowed_target_ports": "66o"},
        {"broker_proxy_allowed_target_ports": "70000"},
        {"broker_proxy_allowed_host_names": " , "},
        {"broker_proxy_allowed_ip_addresses": "10.0.0.0/33"},
        {"broker_proxy_allowed_ip_addresses": ","},
    ],
)
def test_unusable_settings_are_refused_at_start(setting: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        ProxyConfig(**setting).validate()  # type: ignore[arg-type]


def test_a_question_mark_is_one_character_as_documented() -> None:
    """``?`` is a wildcard for one character in Magnetar (the setting's help says "* and ?
    wildcards"); Pulsar's ``BrokerProxyValidator`` knows only ``*`` and takes ``?`` literally."""
    directory = Registered.of("broker-1.example.com:6650", "broker-12.example.com:6650")
    target_rules = rules(hosts="broker-?.example.com")
    run(validate_target("broker-1.example.com:6650", target_rules, directory))
    refused("broker-12.example.com:6650", target_rules, directory)
