"""Which address a client may be relayed to: Pulsar's ``BrokerProxyValidator`` plus the rule
that closes CVE-2022-24280 for good - the target must be a registered broker.

Checked before anything is dialled, cheapest and least revealing first: the address is parsed,
looked up among the registered brokers (no DNS for an address nobody registered), its port
matched against ``broker_proxy_allowed_target_ports``, its host name against
``broker_proxy_allowed_host_names`` and the addresses it resolves to against
``broker_proxy_allowed_ip_addresses``. Any failure is the same answer to the client, "Target
broker cannot be validated." (Pulsar's), with the precise reason only in the proxy's log.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import socket
from dataclasses import dataclass

from magnetar.proxy.brokers import Address, BrokerDirectory
from magnetar.proxy.config import ProxyConfig

#: What the client is told, whatever the reason (Pulsar's message).
REFUSAL = "Target broker cannot be validated."


class TargetRefused(Exception):
    """The relay target fails a rule; the message is the reason for the log."""


@dataclass(slots=True)
class TargetRules:
    ports: frozenset[int] | None
    host_patterns: tuple[str, ...]
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] | None

    @classmethod
    def of(cls, config: ProxyConfig) -> TargetRules:
        return cls(
            config.allowed_ports(), config.allowed_host_patterns(), config.allowed_networks()
        )

    def check_static(self, address: Address, directory: BrokerDirectory) -> None:
        """The rules that need no DNS (``TargetRefused``)."""
        if not directory.is_registered(address.host, address.port):
            raise TargetRefused(f"{address} is not a registered broker")
        if self.ports is not None and address.port not in self.ports:
            raise TargetRefused(f"port {address.port} is not in broker_proxy_allowed_target_ports")
        if not any(fnmatch.fnmatchcase(address.host, p.lower()) for p in self.host_patterns):
            raise TargetRefused(
                f"host {address.host} matches no broker_proxy_allowed_host_names pattern"
            )

    def check_addresses(self, address: Address, resolved: list[str]) -> None:
        if self.networks is None:
            return
        if not resolved:
            raise TargetRefused(f"{address.host} resolves to no address")
        for item in resolved:
            ip = ipaddress.ip_address(item.split("%", 1)[0])
            if not any(ip in network for network in self.networks):
                raise TargetRefused(
                    f"{address.host} resolves to {ip}, outside broker_proxy_allowed_ip_addresses"
                )


async def validate_target(
    value: str, rules: TargetRules, directory: BrokerDirectory
) -> tuple[Address, str]:
    """The broker address ``proxy_to_broker_url`` names and the host to dial for it: the IP
    address that was checked when addresses are restricted (so a second resolution cannot
    answer differently), else the host name (``TargetRefused`` when a rule fails)."""
    try:
        address = Address.parse(value)
    except ValueError as e:
        raise TargetRefused(str(e)) from None
    rules.check_static(address, directory)
    if rules.networks is not None:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
        except OSError as e:
            raise TargetRefused(f"{address.host} cannot be resolved: {e}") from None
        resolved = [str(info[4][0]) for info in infos]
        rules.check_addresses(address, resolved)
        return address, resolved[0]
    return address, address.host
